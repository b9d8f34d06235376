"""Closed-loop replanning and the planner's guard.

Pure parts (no Django): the residual model, the move-or-keep rule and the recovery of a run
whose first plan is wrong, checked against a known contention law (``contention_law``) whose
"real" devices differ from what the predictor was fitted on. Service parts: a vres run replans
before round 1 and stores why, ``replan: never`` keeps the first plan, the guard's warnings and
the experiment's ``untrusted_predictor`` choices, and the too-short assignments rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.planning.closed_loop import (
    MeasuredConfiguration,
    corrected_context,
    device_residual,
    replan,
)
from controlplane.planning.guard import PredictorFacts, predictor_warnings
from controlplane.planning.planner import DeviceCapacity, PlannerContext
from controlplane.planning.predictor import MixTask, fit_predictor
from controlplane.planning.seconds import SecondsModel, SecondsModels, timeslice_throughput
from controlplane.planning.strategies import make_plan
from controlplane.planning.types import PlanningInput
from tests.controlplane.contention_law import WORKLOADS, alone, law, synthetic

ARCH = {1: "resnet18", 2: "mobilenet_v3_large", 3: "shufflenet_v2_x1_0"}
SHARDS = {(10, 1): 2400, (10, 2): 300, (10, 3): 900, (11, 1): 200, (11, 2): 1800, (11, 3): 600}


@pytest.fixture(scope="module")
def predictor():
    fitted, _report = fit_predictor(synthetic(300), WORKLOADS, cores=100, families=("extra_trees",), folds=3)
    return fitted


def _spec() -> PlanningInput:
    return PlanningInput(device_ids=(10, 11), task_ids=(1, 2, 3), samples=SHARDS)


NO_FIXED_COSTS = SecondsModels(SecondsModel(warmup_weight=0.0, bn_weight=0.0, constant_s=0.0))
"""The contention law has no fixed costs per assignment: its seconds are ``E·|D| / P``."""


def _ctx(predictor, seconds: SecondsModels = NO_FIXED_COSTS) -> PlannerContext:
    return PlannerContext(architectures=ARCH, devices={d: DeviceCapacity(predictor) for d in (10, 11)}, seconds=seconds)


def _real(factor: dict[tuple[int, int], float]):
    """A device that is the law times a per-task factor (what the predictor does not know);
    time-sliced (a ``timeslice`` baseline's plan kept on it), its tasks take turns at their
    speed alone (:func:`~controlplane.planning.seconds.timeslice_throughput`)."""

    def measure(device_id: int, assignments, partitioning: str = "mps") -> list[float]:
        scale = np.array([factor.get((device_id, a.task_id), 1.0) for a in assignments])
        if partitioning == "timeslice":
            batch = np.array([[a.batch_size for a in assignments]], dtype=float)
            solo = np.array([[alone(ARCH[a.task_id], a.batch_size) for a in assignments]]) * scale
            return list(timeslice_throughput(batch, np.array([a.samples for a in assignments]), solo, 1)[0])
        mix = tuple(MixTask(ARCH[a.task_id], a.batch_size, a.active_thread_percentage) for a in assignments)
        return [law(mix, j) * scale[j] for j in range(len(assignments))]

    return measure


def _measured(plan, measure, round_index: int) -> list[MeasuredConfiguration]:
    out = []
    for device_id in sorted({a.device_id for a in plan.assignments}):
        mine = plan.on_device(device_id)
        part = plan.partitioning_of(device_id)
        out.append(
            MeasuredConfiguration(
                device_id=device_id,
                round_index=round_index,
                task_ids=tuple(a.task_id for a in mine),
                batch_size=tuple(a.batch_size for a in mine),
                active_thread_percentage=tuple(a.active_thread_percentage for a in mine),
                throughput_sps=tuple(measure(device_id, mine, part)),
                partitioning=part,
            )
        )
    return out


def _round_time(plan, measure) -> float:
    times = []
    for d in {a.device_id for a in plan.assignments}:
        mine = plan.on_device(d)
        speeds = measure(d, mine, plan.partitioning_of(d))
        times.append(max(a.samples / p for a, p in zip(mine, speeds, strict=True)))
    return max(times)


def test_the_residual_model_learns_a_device_offset_from_one_round(predictor):
    """A device 40 % slower on one task than predicted: after one measured configuration the
    corrected prediction there is within the noise, and far away the offset carries over with
    an uncertainty near the shape error rather than the offset."""
    archs = ["resnet18", "mobilenet_v3_large"]
    mix = (MixTask(archs[0], 64, 50), MixTask(archs[1], 64, 50))
    truth = [law(mix, 0), law(mix, 1) * 0.6]
    h = MeasuredConfiguration(1, 0, (1, 2), (64, 64), (50, 50), tuple(truth))
    model = device_residual(predictor, archs, [h], heldout_rmsle=0.08)
    base = predictor.predict([mix])[0]
    mean, std = model.predict(np.array([[64.0, 64.0]]), np.array([[50.0, 50.0]]))
    corrected = np.array(base) * np.exp(mean[0])
    assert corrected == pytest.approx(truth, rel=0.02)
    assert std[0].max() < 0.05
    # The offset's prior scale is the RMS of what was measured, not the held-out error.
    assert model.offset_scale == pytest.approx(float(np.sqrt(np.mean(model.residual**2))))
    assert model.offset_scale > 0.3
    far_mean, far_std = model.predict(np.array([[256.0, 16.0]]), np.array([[90.0, 10.0]]))
    assert far_mean[0, 1] < -0.3  # the offset carries over (log 0.6 = -0.51, shrunk a little)
    assert 0.07 < far_std[0, 1] < 0.16  # about the held-out shape error (0.08), not the offset (0.35)


def test_a_device_keeps_its_best_measured_plan_when_the_gain_is_within_the_uncertainty(predictor):
    """The predictor is right: replanning finds nothing it can tell apart from what was
    measured, so every device keeps its configuration and says why."""
    spec, ctx = _spec(), _ctx(predictor)
    measure = _real({})
    first = make_plan("vres_sync", spec, planner=ctx)
    plan, decisions = replan("vres_sync", spec, ctx, _measured(first, measure, 0), heldout_rmsle={10: 0.1, 11: 0.1})
    assert {d.device_id for d in decisions} == {10, 11}
    for d in decisions:
        assert d.action in {"kept", "moved", "slack"} and d.reason
        if d.action == "kept":
            assert d.predicted_gain is None or d.predicted_gain <= d.uncertainty or "best configuration" in d.reason
    # A device that kept its configuration trains exactly what it measured.
    for d in decisions:
        if d.action == "kept" and "slack" not in d.reason:
            before = [(a.batch_size, a.active_thread_percentage) for a in first.on_device(d.device_id)]
            after = [(a.batch_size, a.active_thread_percentage) for a in plan.on_device(d.device_id)]
            assert before == after


def test_a_run_whose_first_plan_is_wrong_recovers_within_a_few_rounds(predictor):
    """Device 11's mobilenet runs at a third of the predicted speed, device 10's resnet18 at
    1.5×: the open-loop plan leaves device 11 the straggler. Closed loop: by round 3 the true
    round time is well below open loop's, and never worse than the best measured so far."""
    spec, ctx = _spec(), _ctx(predictor)
    measure = _real({(11, 2): 0.33, (10, 1): 1.5})
    plan = make_plan("vres_sync", spec, planner=ctx)
    open_loop = _round_time(plan, measure)
    history: list[MeasuredConfiguration] = []
    times = [open_loop]
    for r in range(4):
        history += _measured(plan, measure, r)
        plan, decisions = replan("vres_sync", spec, ctx, history, heldout_rmsle={10: 0.1, 11: 0.1})
        times.append(_round_time(plan, measure))
    assert min(times[1:4]) < 0.85 * open_loop, times
    assert times[-1] <= open_loop * 1.001, times


def test_devices_measured_in_other_mixes_are_not_corrected(predictor):
    spec, ctx = _spec(), _ctx(predictor)
    other = MeasuredConfiguration(10, 0, (1, 2), (64, 64), (50, 50), (100.0, 100.0))  # not device 10's 3 tasks
    corrected_ctx, corrected = corrected_context(spec, ctx, [other], {10: 0.1})
    assert corrected == {} and corrected_ctx.devices[10].predictor is predictor


def test_the_guard_names_each_reason_once():
    facts = [
        PredictorFacts("dev-a", "v3 (cpu, cpu-1cores)", 0.37, ["resnet18", "vgg16"], 3, {"resnet18"}),
        PredictorFacts("dev-b", "v3 (cpu, cpu-1cores)", 0.37, ["resnet18", "vgg16"], 3, {"resnet18"}),
        PredictorFacts("dev-c", "v1 (cpu, cpu-2cores)", 0.05, ["a", "b", "c", "d"], 3, {"a", "b", "c", "d"}),
        PredictorFacts("dev-d", "v1 (cpu, cpu-2cores)", 0.05, ["a"], 1, set()),
        PredictorFacts("dev-e", "v2 (cpu, cpu-4cores)", None, ["a", "b"], 2, {"a", "b"}),
    ]
    warnings = predictor_warnings(facts, max_rmsle=0.2)
    assert len(warnings) == 4, warnings
    assert "held-out RMSLE of 0.370, above the threshold 0.2" in warnings[0] and "dev-a" in warnings[0]
    assert "never saw vgg16 beside another task" in warnings[1]
    assert "trains 4 tasks together" in warnings[2] and "at most 3" in warnings[2]
    assert "RMSLE of unknown" in warnings[3]
    assert predictor_warnings(facts[2:4], max_rmsle=0.2) == [warnings[2]]
    assert predictor_warnings([facts[3]], max_rmsle=0.2) == []


# --------------------------------------------------------------- P_alone of replanned batch sizes


def _replanned_to(monkeypatch, batch_size: int) -> None:
    """Make round 1 on train a plan that gives every task ``batch_size`` (a replanning would)."""
    from dataclasses import replace as dc_replace

    from controlplane.experiments.services.planning import run_plan
    from controlplane.experiments.services.rounds import dispatch

    def fake_round_plan(run, index, *, device_ids=None):
        plan = run_plan(run, device_ids=device_ids)
        if index == 0:
            return plan, None
        moved = tuple(dc_replace(a, batch_size=min(batch_size, a.samples)) for a in plan.assignments)
        return dc_replace(plan, assignments=moved), {"decisions": [], "note": "test"}

    monkeypatch.setattr(dispatch, "round_plan", fake_round_plan)


def test_a_replanned_batch_size_is_measured_alone_before_its_round(
    started_round, monkeypatch, django_capture_on_commit_callbacks
):
    from controlplane.experiments import services
    from controlplane.experiments.models import Round, Run
    from controlplane.experiments.services import dispatch
    from tests.controlplane.test_round_protocol import _device_results

    run, rnd = started_round(rounds=3)
    _replanned_to(monkeypatch, 8)
    sent = []
    monkeypatch.setattr(dispatch, "send_standalone", lambda run_id, requests, **kw: sent.append((requests, kw)))
    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    with django_capture_on_commit_callbacks(execute=True):
        waiting = services.round_enqueue(run_id=run.id, index=1)
    # leased its devices, and measures P_alone at batch 8 on them before it trains
    assert waiting.status == Round.Status.RUNNING and not waiting.assignments.exists()
    run.refresh_from_db()
    assert run.planned["pending_round"]["index"] == 1
    [(requests, kw)] = sent
    assert kw["before_round"] == 1
    assert sorted((r.device, [i.batch_size for i in r.items]) for r in requests) == [("dev-a", [8]), ("dev-b", [8])]
    results = [
        {
            "run_id": run.id,
            "device": r.device,
            "status": "succeeded",
            "measurements": [
                {"task_id": i.task.task_id, "batch_size": i.batch_size, "throughput_sps": 40.0} for i in r.items
            ],
        }
        for r in requests
    ]
    services.standalone_record(run_id=run.id, results=results, before_round=1)
    second = Round.objects.get(run=run, index=1)
    assert [a.batch_size for a in second.assignments.all()] == [8, 8]
    assert all(a.standalone_throughput_sps == 40.0 for a in second.assignments.all())
    assert second.flags == [] and second.replan == {"decisions": [], "note": "test"}
    assert Run.objects.get(id=run.id).status == Run.Status.RUNNING


def test_the_standalone_watchdog_starts_a_replanned_round_without_the_missing_p_alone(started_round, monkeypatch):
    from controlplane.experiments import services
    from controlplane.experiments.models import Round, StandaloneThroughput
    from controlplane.experiments.services import dispatch
    from tests.controlplane.test_round_protocol import _device_results

    run, rnd = started_round(rounds=3)
    _replanned_to(monkeypatch, 8)
    monkeypatch.setattr(dispatch, "send_standalone", lambda *a, **kw: None)
    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    assert not services.round_enqueue(run_id=run.id, index=1).assignments.exists()  # measuring P_alone
    services.standalone_watchdog(run_id=run.id, before_round=0)  # round 0's firing: nothing to do
    assert not Round.objects.get(run=run, index=1).assignments.exists()
    services.standalone_watchdog(run_id=run.id, before_round=1)
    second = Round.objects.get(run=run, index=1)
    assert [a.batch_size for a in second.assignments.all()] == [8, 8]
    assert len(second.flags) == 2 and all("unknown" in f for f in second.flags)
    failed = StandaloneThroughput.objects.filter(run=run, batch_size=8)
    assert failed.count() == 2 and all("no standalone measurement" in f.error for f in failed)
    services.standalone_watchdog(run_id=run.id, before_round=1)  # a second firing changes nothing
    assert Round.objects.filter(run=run).count() == 2


HALVES_PLUGIN = """
from controlplane.planning.planner import predict_plan
from controlplane.planning.strategies import Strategy, plan_isolation

CALLS = []


def plan(spec, ctx):
    CALLS.append(ctx.planner)
    return predict_plan(plan_isolation(spec, batch_size=64), spec, ctx.planner)


halves = Strategy(
    "halves",
    "halves — isolation at batch 64, predicted (needs a predictor)",
    "mps",
    plan,
    needs_predictor=True,
    clock="throughput",
)
"""


def test_a_plugin_strategy_that_needs_the_predictor_is_replanned_as_it_declares(predictor, tmp_path):
    """A plug-in planner on the throughput clock is replanned with its own plan function (given
    the corrected predictors) and judged by its objective, not as ``vres_sync`` (round time,
    slack)."""
    import sys

    from controlplane.planning.closed_loop import CorrectedPredictor
    from controlplane.planning.strategies import STRATEGY_REGISTRY
    from tests.plugin_dist import installed_distribution

    spec = _spec()
    ctx = _ctx(predictor)
    with installed_distribution(
        tmp_path,
        "mtfl-halves",
        "0.1",
        {"mtfl_halves": HALVES_PLUGIN},
        "[mtfl.strategies]\nhalves = mtfl_halves:halves\n",
        registries=(STRATEGY_REGISTRY,),
    ):
        first = make_plan("halves", spec, planner=ctx)
        history = _measured(first, _real({(10, 1): 0.6, (11, 2): 0.7}), 0)
        plan, decisions = replan("halves", spec, ctx, history, heldout_rmsle={10: 0.05, 11: 0.05})
        calls = list(sys.modules["mtfl_halves"].CALLS)

    assert plan.strategy == "halves" and plan.partitioning == "mps"
    # its own plan function made both plans, the second with the run's corrected predictors
    assert len(calls) == 2
    assert all(isinstance(calls[1].devices[d].predictor, CorrectedPredictor) for d in (10, 11))
    for a in plan.assignments:
        tasks = spec.tasks_on(a.device_id)
        assert (a.batch_size, a.active_thread_percentage) == (min(64, a.samples), 100 // len(tasks))
    # judged on its declared clock: throughput with the context's objective, never round time,
    # and no slack (which it does not declare)
    assert [d.device_id for d in decisions] == [10, 11]
    assert all(d.objective == "raw" and d.action != "slack" for d in decisions)
