"""The planners on a predictor fitted to a known contention law (no Django, no torch): plans are
checked against the law itself, not only against the predictor."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.planning.planner import (
    BATCH_MAX,
    SHARE_STEP,
    SLACK_MARGIN,
    DeviceCapacity,
    PlannerContext,
    batch_options,
    data_matched_batches,
    plan_vres_greedy,
    plan_vres_sync,
)
from controlplane.planning.predictor import MixTask, fit_predictor
from controlplane.planning.seconds import SecondsModel, SecondsModels
from controlplane.planning.strategies import make_plan, plan_isolation, plan_sharing
from controlplane.planning.types import PlanningError, PlanningInput
from tests.controlplane.contention_law import WORKLOADS, alone, law, synthetic

ARCH = {1: "resnet18", 2: "mobilenet_v3_large", 3: "shufflenet_v2_x1_0"}


@pytest.fixture(scope="module")
def predictor():
    fitted, _report = fit_predictor(synthetic(300), WORKLOADS, cores=100, families=("extra_trees",), folds=3)
    return fitted


def _spec(samples: dict[tuple[int, int], int], epochs: int = 1) -> PlanningInput:
    devices = tuple(sorted({d for d, _ in samples}))
    return PlanningInput(device_ids=devices, task_ids=tuple(ARCH), samples=samples, local_epochs=epochs)


NO_FIXED_COSTS = SecondsModels(SecondsModel(warmup_weight=0.0, bn_weight=0.0, constant_s=0.0))
"""The contention law has no fixed costs per assignment: its seconds are ``E·|D| / P``."""


def _ctx(predictor, devices, memory=None, **kw) -> PlannerContext:
    kw.setdefault("seconds", NO_FIXED_COSTS)
    return PlannerContext(architectures=ARCH, devices={d: DeviceCapacity(predictor, memory) for d in devices}, **kw)


def _true_round_time(plan, spec) -> float:
    """The law's round time of a plan: what the devices would really take."""
    worst = 0.0
    for device_id in spec.device_ids:
        mine = plan.on_device(device_id)
        mix = tuple(MixTask(ARCH[a.task_id], a.batch_size, a.active_thread_percentage) for a in mine)
        for j, a in enumerate(mine):
            worst = max(worst, spec.local_epochs * a.samples / law(mix, j))
    return worst


SKEWED = {
    (10, 1): 2400,
    (10, 2): 300,
    (10, 3): 900,
    (11, 1): 200,
    (11, 2): 1800,
    (11, 3): 600,
    (12, 1): 800,
    (12, 2): 800,
    (12, 3): 3000,
}


def test_batch_options_are_multiples_of_eight_within_the_shard():
    assert list(batch_options(30)) == [8, 16, 24]
    assert batch_options(5000)[-1] == BATCH_MAX
    assert list(batch_options(5)) == [5]
    with pytest.raises(PlanningError, match="at least 2") as info:
        batch_options(1)
    assert info.value.field == "shards"


def test_data_matched_batches_follow_data_over_flops():
    flops = np.array([1e8, 1e7])
    batches = data_matched_batches(np.array([[1000, 1000], [4000, 100]]), flops, largest=128)
    # Device 0: equal data, 10× fewer FLOPs → 10× the batch of task 0 (rounded to 8).
    assert list(batches[0]) == [16, 128]
    # Device 1: 4× more data per FLOP for task 0 → the largest batch, a quarter for task 1.
    assert list(batches[1]) == [128, 32]
    # A tiny shard caps its task's batch at the largest multiple of 8 it holds.
    assert list(data_matched_batches(np.array([[4000, 20]]), np.array([1e8, 1e6]), largest=128)[0]) == [128, 16]
    assert all(b % 8 == 0 for b in batches.ravel())


def test_vres_greedy_beats_the_equal_split_it_starts_from(predictor):
    spec = _spec(SKEWED)
    plan = plan_vres_greedy(spec, _ctx(predictor, spec.device_ids))
    assert plan.strategy == "vres_greedy" and plan.partitioning == "mps"
    assert len(plan.assignments) == 9
    for a in plan.assignments:
        assert a.active_thread_percentage % SHARE_STEP == 0 and 5 <= a.active_thread_percentage <= 100
        assert a.batch_size % 8 == 0 and 8 <= a.batch_size <= min(512, a.samples)
        assert a.predicted_throughput_sps > 0
    # Step 1: on device 10 resnet18 holds the most data but costs the most FLOPs per sample.
    on10 = {a.task_id: a for a in plan.on_device(10)}
    w = {t: SKEWED[(10, t)] / WORKLOADS[ARCH[t]].train_flops_per_sample for t in ARCH}
    assert sorted(ARCH, key=lambda t: on10[t].batch_size) == sorted(ARCH, key=lambda t: w[t])
    # Step 2 never ends below where it starts: the equal split at the same batches.
    for device_id in spec.device_ids:
        mine = plan.on_device(device_id)
        chosen = predictor.predict(
            [tuple(MixTask(ARCH[a.task_id], a.batch_size, a.active_thread_percentage) for a in mine)]
        )[0]
        equal = predictor.predict([tuple(MixTask(ARCH[a.task_id], a.batch_size, 30) for a in mine)])[0]
        assert sum(chosen) >= sum(equal) * 0.999


def test_vres_greedy_fair_objective_weighs_each_task_by_its_alone_speed(predictor):
    spec = _spec(SKEWED)
    raw = plan_vres_greedy(spec, _ctx(predictor, spec.device_ids, objective="raw"))
    fair = plan_vres_greedy(spec, _ctx(predictor, spec.device_ids, objective="fair"))

    def fair_value(plan):
        total = 0.0
        for device_id in spec.device_ids:
            for a in plan.on_device(device_id):
                total += (
                    a.predicted_throughput_sps
                    / predictor.predict([(MixTask(ARCH[a.task_id], a.batch_size, 100),)])[0][0]
                )
        return total

    assert fair_value(fair) >= fair_value(raw) * 0.999
    with pytest.raises(PlanningError) as info:
        plan_vres_greedy(spec, _ctx(predictor, spec.device_ids, objective="fastest"))
    assert info.value.field == "objective"


def test_vres_sync_shortens_the_true_round_time_over_the_baselines_and_the_greedy(predictor):
    spec = _spec(SKEWED)
    ctx = _ctx(predictor, spec.device_ids, slack="none")
    sync = plan_vres_sync(spec, ctx)
    assert sync.predicted_round_time_s == pytest.approx(
        max(a.samples / a.predicted_throughput_sps for a in sync.assignments)
    )
    true_sync = _true_round_time(sync, spec)
    for other in (plan_isolation(spec), plan_sharing(spec), plan_vres_greedy(spec, ctx)):
        assert true_sync < _true_round_time(other, spec), other.strategy


def test_vres_sync_is_deterministic_for_a_seed(predictor):
    spec = _spec(SKEWED)
    first = plan_vres_sync(spec, _ctx(predictor, spec.device_ids, seed=7))
    again = plan_vres_sync(spec, _ctx(predictor, spec.device_ids, seed=7))
    assert first == again


def test_vres_sync_gives_early_devices_smaller_batches_within_the_margin(predictor):
    # Device 21 holds a tenth of device 20's data: it would wait for device 20 most of the round.
    samples = {(20, 1): 3000, (20, 2): 3000, (20, 3): 3000, (21, 1): 300, (21, 2): 300, (21, 3): 300}
    spec = _spec(samples)
    tight = plan_vres_sync(spec, _ctx(predictor, spec.device_ids, slack="none"))
    relaxed = plan_vres_sync(spec, _ctx(predictor, spec.device_ids, slack="smaller_batches"))
    assert relaxed.predicted_round_time_s == tight.predicted_round_time_s

    def steps(plan, device_id):
        return sum(-(-a.samples // a.batch_size) for a in plan.on_device(device_id))

    def time_of(plan, device_id):
        return max(a.samples / a.predicted_throughput_sps for a in plan.on_device(device_id))

    assert steps(relaxed, 21) > steps(tight, 21)
    assert time_of(relaxed, 21) <= SLACK_MARGIN * relaxed.predicted_round_time_s
    assert relaxed.on_device(20) == tight.on_device(20)  # the slowest device keeps its fastest plan


def test_a_device_too_small_for_its_tasks_is_refused_before_planning(predictor):
    spec = _spec(SKEWED)
    with pytest.raises(PlanningError, match="smallest batch sizes but the device has") as info:
        plan_vres_sync(spec, _ctx(predictor, spec.device_ids, memory=100e6))
    assert info.value.field == "batch_size"


def test_memory_lowers_batches_until_they_fit(predictor):
    spec = _spec({(30, 1): 4000, (30, 2): 4000, (30, 3): 4000})
    roomy = plan_vres_greedy(spec, _ctx(predictor, (30,)))
    memory = predictor.memory
    need = sum(float(memory.predict(ARCH[a.task_id], a.batch_size)) for a in roomy.assignments)
    cap = 0.8 * need
    tight = plan_vres_greedy(spec, _ctx(predictor, (30,), memory=cap))
    assert sum(float(memory.predict(ARCH[a.task_id], a.batch_size)) for a in tight.assignments) <= cap
    synced = plan_vres_sync(spec, _ctx(predictor, (30,), memory=cap))
    assert sum(float(memory.predict(ARCH[a.task_id], a.batch_size)) for a in synced.assignments) <= cap


@pytest.mark.parametrize(
    ("samples", "architectures", "devices", "field", "message"),
    [
        ({(40, 1): 1, (40, 2): 50, (40, 3): 50}, ARCH, (40,), "shards", "at least 2"),
        ({(40, 1): 0, (40, 2): 50, (40, 3): 50}, ARCH, (40,), "shards", "no data on any device"),
        ({(40, 1): 50, (40, 2): 50, (40, 3): 50}, {**ARCH, 3: "vgg16"}, (40,), "tasks", "unknown to the predictor"),
        ({(40, 1): 50, (40, 2): 50, (40, 3): 50}, ARCH, (), "devices", "no fitted predictor"),
    ],
)
def test_planner_errors_name_the_field(predictor, samples, architectures, devices, field, message):
    spec = _spec(samples)
    ctx = PlannerContext(architectures=architectures, devices={d: DeviceCapacity(predictor) for d in devices})
    for planner in (plan_vres_greedy, plan_vres_sync):
        with pytest.raises(PlanningError, match=message) as info:
            planner(spec, ctx)
        assert info.value.field == field


def test_planned_strategies_need_a_predictor_through_make_plan(predictor):
    spec = _spec(SKEWED)
    with pytest.raises(PlanningError, match="needs a fitted throughput predictor"):
        make_plan("vres_sync", spec)
    assert make_plan("vres_sync", spec, planner=_ctx(predictor, spec.device_ids)).strategy == "vres_sync"


def test_alone_law_is_what_the_predictor_learned(predictor):
    # Guard for the tests above: the fixture's predictor tracks the law it is checked against.
    [[p]] = predictor.predict([(MixTask("resnet18", 64, 100),)])
    assert p == pytest.approx(alone("resnet18", 64), rel=0.25)


def test_plans_stay_within_the_profiled_batch_sizes(predictor):
    # The synthetic sweep profiles batches up to 256: 512 would be an extrapolation.
    spec = _spec({(50, 1): 20_000, (50, 2): 20_000, (50, 3): 20_000})
    for planner in (plan_vres_greedy, plan_vres_sync):
        plan = planner(spec, _ctx(predictor, (50,)))
        assert max(a.batch_size for a in plan.assignments) <= 256, planner.__name__
