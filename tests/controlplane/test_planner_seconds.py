"""The seconds model (a fixed part and a per-sample part learned from measured seconds), the
planners' round time with it, a planner that never chooses a plan predicted slower than a
baseline's, and the closed loop going back to the best plan measured on a device (issue 31).

Pure: no Django, no torch; the predictor is fitted on a known contention law."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.planning.closed_loop import MeasuredConfiguration, replan
from controlplane.planning.planner import DeviceCapacity, PlannerContext, never_worse, predict_plan
from controlplane.planning.predictor import fit_predictor
from controlplane.planning.seconds import (
    MeasuredSeconds,
    SecondsModel,
    SecondsModels,
    fit_device_seconds,
    fit_seconds_model,
    timeslice_throughput,
)
from controlplane.planning.strategies import baseline_plans, make_plan, plan_manual, plan_temporal
from controlplane.planning.types import PlanningError, PlanningInput
from tests.controlplane.contention_law import WORKLOADS, synthetic

ARCH = {1: "resnet18", 2: "mobilenet_v3_large", 3: "shufflenet_v2_x1_0"}
SHARDS = {(10, 1): 1431, (10, 2): 853, (10, 3): 93, (11, 1): 600, (11, 2): 584, (11, 3): 1344}


@pytest.fixture(scope="module")
def predictor():
    fitted, _report = fit_predictor(synthetic(150), WORKLOADS, cores=100, families=("extra_trees",), folds=3)
    return fitted


def _spec() -> PlanningInput:
    return PlanningInput(device_ids=(10, 11), task_ids=(1, 2, 3), samples=SHARDS)


def _ctx(predictor, seconds: SecondsModels | None = None, **kw) -> PlannerContext:
    return PlannerContext(
        architectures=ARCH,
        devices={d: DeviceCapacity(predictor) for d in (10, 11)},
        seconds=seconds or SecondsModels(),
        **kw,
    )


def _synthetic_seconds(truth: SecondsModel, rng: np.random.Generator, device_id: int = 1) -> list[MeasuredSeconds]:
    out = []
    for _ in range(40):
        batch = int(rng.choice([8, 32, 128, 512]))
        samples = int(rng.integers(50, 3000))
        throughput = float(rng.uniform(20, 400))
        seconds = float(truth.seconds(batch, samples, throughput, 1)) * math.exp(rng.normal(0, 0.01))
        out.append(MeasuredSeconds(device_id, batch, samples, throughput, seconds))
    return out


def test_the_fixed_part_is_fitted_from_measured_seconds():
    truth = SecondsModel(warmup_weight=2.5, bn_weight=0.2, constant_s=0.4)
    fitted = fit_seconds_model(_synthetic_seconds(truth, np.random.default_rng(0)))
    assert fitted.measurements == 40
    assert fitted.warmup_weight == pytest.approx(2.5, rel=0.1)
    assert fitted.bn_weight == pytest.approx(0.2, abs=0.05)
    assert fitted.constant_s == pytest.approx(0.4, abs=0.1)


def test_before_any_measurement_the_prior_counts_warmup_steps_and_the_batchnorm_pass():
    prior = fit_seconds_model([], warmup_iterations=2)
    assert prior.measurements == 0 and prior.warmup_iterations == 2
    # 1,431 samples at batch 512, 100 samples/s: 3 iterations, 2 of them warm-up (one 512-sample
    # step in all), then a third of a step per sample for BatchNorm's pass.
    fixed = float(prior.fixed_seconds(512, 1431, 100.0, 1))
    assert fixed == pytest.approx((512 + 1431 / 3) / 100.0)
    # A shard of one batch has one iteration: half that warm-up charge.
    assert float(prior.fixed_seconds(512, 93, 100.0, 1)) == pytest.approx((93 / 2 + 93 / 3) / 100.0)
    assert fit_seconds_model([], warmup_iterations=4).warmup_weight == pytest.approx(0.25)
    assert float(prior.seconds(512, 1431, 100.0, 1)) == pytest.approx(fixed + 14.31)


def test_a_negative_slope_is_held_at_zero():
    rng = np.random.default_rng(1)
    truth = SecondsModel(warmup_weight=0.0, bn_weight=0.0, constant_s=1.0)
    measured = [
        MeasuredSeconds(1, m.batch_size, m.samples, m.throughput_sps, m.seconds - 0.2 * m.batch_size / m.throughput_sps)
        for m in _synthetic_seconds(truth, rng)
    ]
    fitted = fit_seconds_model(measured)
    assert fitted.warmup_weight >= 0.0 and fitted.bn_weight >= 0.0


def test_a_device_measured_once_borrows_the_pooled_slopes_and_learns_its_constant():
    rng = np.random.default_rng(2)
    pooled_truth = SecondsModel(warmup_weight=2.0, bn_weight=0.3, constant_s=0.0)
    measured = _synthetic_seconds(pooled_truth, rng, device_id=1)
    # Device 2 measured one round of three tasks, each 3 s slower than the pooled model says.
    slow = SecondsModel(warmup_weight=2.0, bn_weight=0.3, constant_s=3.0)
    for batch, samples, throughput in ((128, 1000, 100.0), (64, 300, 200.0), (256, 2000, 80.0)):
        seconds = float(slow.seconds(batch, samples, throughput, 1))
        measured.append(MeasuredSeconds(2, batch, samples, throughput, seconds))
    models = fit_device_seconds(measured)
    assert models.of(2).constant_s == pytest.approx(3.0, abs=1.0)
    assert models.of(2).warmup_weight == pytest.approx(models.default.warmup_weight, rel=0.1)
    assert models.of(1).constant_s == pytest.approx(0.0, abs=0.3)
    assert models.of(99) is models.default  # a device never measured takes the pooled fit


def test_time_sliced_tasks_take_turns_and_a_short_task_finishes_first():
    # Task 0: 2 iterations of 1 s alone, task 1: 6 iterations of 0.5 s alone.
    batch = np.array([[100.0, 100.0]])
    samples = np.array([200.0, 600.0])
    alone = np.array([[100.0, 200.0]])
    P = timeslice_throughput(batch, samples, alone, 1)[0]
    # Task 0 ends after its 2 steps and 2 of task 1's: 3 s; task 1 after all 5 s of work.
    assert samples[0] / P[0] == pytest.approx(3.0)
    assert samples[1] / P[1] == pytest.approx(5.0)


def test_the_round_time_is_the_slowest_assignments_seconds_with_its_fixed_part(predictor):
    spec = _spec()
    plan = make_plan("vres_sync", spec, planner=_ctx(predictor))
    model = SecondsModel()
    for a in plan.assignments:
        assert a.predicted_throughput_sps and a.predicted_seconds
        expected = float(model.seconds(a.batch_size, a.samples, a.predicted_throughput_sps, 1))
        assert a.predicted_seconds == pytest.approx(expected, rel=1e-6)
        assert a.predicted_seconds > a.samples / a.predicted_throughput_sps
    assert plan.predicted_round_time_s == pytest.approx(max(a.predicted_seconds or 0.0 for a in plan.assignments))


def test_a_large_fixed_part_steers_vres_sync_away_from_few_large_batches(predictor):
    """With warm-up steps costing ten steps each, a batch of 512 on a shard of 1,431 samples
    (3 iterations) is predicted far slower than its throughput says: the plan's predicted
    round time under that model is no worse than the plan made without it."""
    spec = _spec()
    heavy = SecondsModels(SecondsModel(warmup_weight=10.0))
    blind = make_plan("vres_sync", spec, planner=_ctx(predictor, SecondsModels(SecondsModel(0.0, 0.0, 0.0))))
    aware = make_plan("vres_sync", spec, planner=_ctx(predictor, heavy))
    judged = predict_plan(blind, spec, _ctx(predictor, heavy))
    assert aware.predicted_round_time_s is not None and judged.predicted_round_time_s is not None
    assert aware.predicted_round_time_s <= judged.predicted_round_time_s * 1.001


def test_a_plan_predicted_slower_than_the_best_baseline_is_replaced_by_it_per_device(predictor):
    spec = _spec()
    ctx = _ctx(predictor)
    # Device 10 gets a deliberately poor plan (5 % shares, batch 8); device 11 a sensible one.
    entries = [{"device_id": 10, "task_id": t, "batch_size": 8, "active_thread_percentage": 5} for t in (1, 2, 3)] + [
        {"device_id": 11, "task_id": t, "batch_size": 64, "active_thread_percentage": 35} for t in (1, 2, 3)
    ]
    poor = plan_manual(spec, entries=entries)
    baselines = baseline_plans(spec)
    fixed = never_worse(poor, baselines, spec, ctx, clock="round_time", slack=True)
    predicted = {b.strategy: predict_plan(b, spec, ctx) for b in baselines}

    def device_time(plan, d):
        return max(a.predicted_seconds or 0.0 for a in plan.on_device(d))

    best_10 = min(predicted.values(), key=lambda p: device_time(p, 10))
    assert device_time(fixed, 10) == pytest.approx(device_time(best_10, 10))
    assert [(a.batch_size, a.active_thread_percentage) for a in fixed.on_device(10)] == [
        (a.batch_size, a.active_thread_percentage) for a in best_10.on_device(10)
    ]
    assert fixed.partitioning_of(10) == best_10.partitioning
    assert any(n.startswith(f"device 10: {best_10.strategy}'s plan") for n in fixed.notes)
    assert fixed.predicted_round_time_s == pytest.approx(max(a.predicted_seconds or 0.0 for a in fixed.assignments))


def test_the_planners_never_return_a_plan_predicted_worse_than_a_baseline(predictor):
    spec = _spec()
    for strategy, clock in (("vres_sync", "round_time"), ("vres_greedy", "throughput")):
        ctx = _ctx(predictor, slack="none")
        plan = make_plan(strategy, spec, planner=ctx)
        for base in baseline_plans(spec):
            predicted = predict_plan(base, spec, ctx)
            for d in spec.device_ids:
                mine, theirs = plan.on_device(d), predicted.on_device(d)
                if clock == "round_time":
                    assert max(a.predicted_seconds or 0 for a in mine) <= max(
                        a.predicted_seconds or 0 for a in theirs
                    ) * (1 + 1e-9), (strategy, base.strategy, d)
                else:
                    assert sum(a.predicted_throughput_sps or 0 for a in mine) >= sum(
                        a.predicted_throughput_sps or 0 for a in theirs
                    ) * (1 - 1e-9), (strategy, base.strategy, d)


def test_a_baseline_the_device_cannot_realise_is_not_chosen(predictor):
    spec = _spec()
    ctx = PlannerContext(
        architectures=ARCH, devices={d: DeviceCapacity(predictor, partitionings=("mps",)) for d in (10, 11)}
    )
    plan = make_plan("vres_sync", spec, planner=ctx)
    assert {plan.partitioning_of(d) for d in spec.device_ids} == {"mps"}


def test_never_worse_refuses_an_unknown_clock(predictor):
    spec = _spec()
    with pytest.raises(PlanningError) as info:
        never_worse(plan_temporal(spec), [], spec, _ctx(predictor), clock="fastest", slack=False)  # type: ignore[arg-type]
    assert info.value.field == "strategy"


def _configuration(plan, device_id, round_index, seconds, *, strategy=None):
    mine = plan.on_device(device_id)
    return MeasuredConfiguration(
        device_id=device_id,
        round_index=round_index,
        task_ids=tuple(a.task_id for a in mine),
        batch_size=tuple(a.batch_size for a in mine),
        active_thread_percentage=tuple(a.active_thread_percentage for a in mine),
        throughput_sps=tuple(a.samples / s for a, s in zip(mine, seconds, strict=True)),
        seconds=tuple(seconds),
        partitioning=plan.partitioning_of(device_id),
        strategy=strategy,
    )


def test_the_closed_loop_returns_a_device_to_its_best_measured_plan_a_baselines_included(predictor):
    spec = _spec()
    ctx = _ctx(predictor)
    first = make_plan("vres_sync", spec, planner=ctx)
    temporal = plan_temporal(spec)
    history = [
        # The experiment's finished temporal run measured device 10 at 10 s ...
        _configuration(temporal, 10, 0, [10.0, 9.0, 2.0], strategy="temporal"),
        _configuration(temporal, 11, 0, [6.0, 6.0, 7.0], strategy="temporal"),
        # ... and this run's first plan measured it at 30 s: slower than temporal's.
        _configuration(first, 10, 0, [30.0, 12.0, 3.0]),
        _configuration(first, 11, 0, [1.0, 1.0, 1.0]),
    ]
    plan, decisions = replan("vres_sync", spec, ctx, history, heldout_rmsle={10: 0.05, 11: 0.05})
    by_device = {d.device_id: d for d in decisions}
    assert by_device[10].action == "kept"
    assert "temporal's plan (round 0)" in by_device[10].reason and "back to that plan" in by_device[10].reason
    assert plan.partitioning_of(10) == "timeslice"
    assert [a.batch_size for a in plan.on_device(10)] == [a.batch_size for a in temporal.on_device(10)]
    # Predicted from what it measured: its seconds are the measured ones.
    assert max(a.predicted_seconds or 0.0 for a in plan.on_device(10)) == pytest.approx(10.0)
    # Device 11's own plan measured faster than temporal's: it is not sent back.
    assert "back to that plan" not in by_device[11].reason


def test_the_closed_loop_learns_the_fixed_part_from_measured_seconds(predictor):
    """Every assignment measured 5 s beyond samples ÷ throughput: the replanned round's
    predicted seconds carry that fixed part."""
    spec = _spec()
    ctx = _ctx(predictor, SecondsModels(SecondsModel(0.0, 0.0, 0.0)))
    first = make_plan("vres_sync", spec, planner=ctx)
    history = []
    for d in spec.device_ids:
        mine = first.on_device(d)
        history.append(
            MeasuredConfiguration(
                device_id=d,
                round_index=0,
                task_ids=tuple(a.task_id for a in mine),
                batch_size=tuple(a.batch_size for a in mine),
                active_thread_percentage=tuple(a.active_thread_percentage for a in mine),
                throughput_sps=tuple(a.predicted_throughput_sps or 1.0 for a in mine),
                seconds=tuple(a.samples / (a.predicted_throughput_sps or 1.0) + 5.0 for a in mine),
            )
        )
    plan, _decisions = replan("vres_sync", spec, ctx, history, heldout_rmsle={10: 0.05, 11: 0.05})
    for a in plan.assignments:
        assert a.predicted_seconds is not None and a.predicted_throughput_sps
        assert a.predicted_seconds - a.samples / a.predicted_throughput_sps > 3.0
