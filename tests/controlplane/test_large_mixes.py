"""Up to 8 co-located tasks per device (issue 22, item 5), on predictors fitted to the known
contention law (no Django, no torch): the design matrix's empty slots change nothing, a mix
larger than the learned slots gets the physical baseline, 6- and 8-task devices plan with both
planners, 9 tasks are refused, and a predictor pickled before the change still loads."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from controlplane.planning.planner import DeviceCapacity, PlannerContext, plan_vres_greedy, plan_vres_sync
from controlplane.planning.predictor import (
    LEGACY_MAX_MIX,
    MAX_MIX,
    EncodedMixes,
    MixTask,
    PredictorError,
    ThroughputPredictor,
    encode_mixes,
    fit_family,
    rmsle,
)
from controlplane.planning.strategies import plan_sharing
from controlplane.planning.types import PlanningError, PlanningInput
from tests.controlplane.contention_law import ARCHS, WORKLOADS, law, synthetic

# Nine tasks over the law's four models: tasks of the same model with their own data.
ARCH9 = {t: ARCHS[(t - 1) % len(ARCHS)] for t in range(1, 10)}


@pytest.fixture(scope="module")
def narrow() -> ThroughputPredictor:
    """Fitted on mixes of 1 to 4 tasks: larger ones are extrapolations."""
    return fit_family(synthetic(300), WORKLOADS, cores=100, family="extra_trees")


@pytest.fixture(scope="module")
def wide() -> ThroughputPredictor:
    """Fitted on mixes of 1 to 8 tasks."""
    return fit_family(synthetic(400, max_mix=MAX_MIX), WORKLOADS, cores=100, family="extra_trees")


def _legacy(predictor: ThroughputPredictor) -> ThroughputPredictor:
    """What unpickling a predictor fitted before issue 22 gives: its space has none of the
    fields added since (they read their class defaults)."""
    old = pickle.loads(pickle.dumps(predictor))
    for name in ("slots", "max_mix", "max_fitted_mix"):
        del old.space.__dict__[name]
    return pickle.loads(pickle.dumps(old))


def _mixes(n: int, sizes: tuple[int, ...], seed: int) -> list[tuple[MixTask, ...]]:
    rng = np.random.default_rng(seed)
    return [
        tuple(
            MixTask(ARCHS[rng.integers(len(ARCHS))], int(rng.choice([16, 64, 256])), int(rng.choice([10, 25, 50])))
            for _ in range(int(rng.choice(sizes)))
        )
        for _ in range(n)
    ]


def _widened(enc: EncodedMixes, width: int) -> EncodedMixes:
    pad = width - enc.width
    return EncodedMixes(
        enc.architectures,
        np.pad(enc.arch, ((0, 0), (0, pad)), constant_values=-1),
        np.pad(enc.batch, ((0, 0), (0, pad))),
        np.pad(enc.share, ((0, 0), (0, pad))),
    )


def test_a_fit_records_its_slots_its_largest_mix_and_the_limit(narrow, wide):
    assert MAX_MIX == 8 and LEGACY_MAX_MIX == 4
    assert (narrow.space.slots, narrow.max_fitted_mix, narrow.max_mix) == (4, 4, 8)
    assert (wide.space.slots, wide.max_fitted_mix, wide.max_mix) == (8, 8, 8)
    assert {k: wide.space.spec()[k] for k in ("max_mix", "slots", "max_fitted_mix")} == {
        "max_mix": 8,
        "slots": 8,
        "max_fitted_mix": 8,
    }
    small = fit_family(synthetic(120, max_mix=2), WORKLOADS, cores=100, family="baseline")
    assert (small.space.slots, small.max_fitted_mix) == (4, 2)  # never fewer than 4 slots


@pytest.mark.parametrize("which", ["narrow", "wide"])
def test_empty_slots_change_no_prediction(request, which):
    predictor = request.getfixturevalue(which)
    enc = encode_mixes(_mixes(300, (1, 2, 3), seed=5), predictor.space.architectures)
    assert enc.width == 3
    want = predictor.predict_arrays(enc)
    for width in (4, 6, 8):
        got = predictor.predict_arrays(_widened(enc, width))
        assert got.shape == (300, width) and np.isnan(got[:, 3:]).all()
        np.testing.assert_array_equal(got[:, :3], want)  # bit for bit


def test_a_mix_larger_than_the_learned_slots_gets_the_physical_baseline(narrow):
    mixes = _mixes(50, (5, 6, 7, 8), seed=6)
    enc = encode_mixes(mixes, narrow.space.architectures)
    predicted = narrow.predict_arrays(enc)
    baseline = narrow.space.slot_arrays(enc)["baseline"]
    np.testing.assert_allclose(predicted[enc.present], baseline[enc.present])
    # Beside them, a mix the trees do correct still is corrected, in the same call.
    both = encode_mixes([*mixes, (MixTask("resnet18", 64, 50), MixTask("mobilenet_v3_small", 32, 50))], ARCHS)
    answer = narrow.predict_arrays(both)
    np.testing.assert_allclose(answer[:50][enc.present], predicted[enc.present])
    assert answer[50, :2] != pytest.approx(narrow.space.slot_arrays(both)["baseline"][50, :2], rel=1e-6)


def test_a_predictor_fitted_on_large_mixes_tracks_the_law_on_them(wide):
    fresh = [s for s in synthetic(150, seed=99, noise=0.0, max_mix=MAX_MIX) if len(s.mix) >= 6]
    assert len(fresh) > 100
    answers = wide.predict([s.mix for s in fresh])
    predicted = np.array([row[s.task_index] for row, s in zip(answers, fresh, strict=True)])
    measured = np.array([s.throughput_sps for s in fresh])
    baseline = np.array(
        [wide.space.slot_arrays(encode_mixes([s.mix], ARCHS))["baseline"][0, s.task_index] for s in fresh]
    )
    assert rmsle(predicted, measured) < rmsle(baseline, measured)  # the trees learned the large mixes


def _spec(tasks_per_device: dict[int, int]) -> PlanningInput:
    samples = {(d, t): 400 + 150 * t + 50 * d for d, k in tasks_per_device.items() for t in range(1, k + 1)}
    tasks = tuple(range(1, max(tasks_per_device.values()) + 1))
    return PlanningInput(device_ids=tuple(sorted(tasks_per_device)), task_ids=tasks, samples=samples)


def _ctx(predictor: ThroughputPredictor, spec: PlanningInput, **kw) -> PlannerContext:
    return PlannerContext(
        architectures=ARCH9, devices={d: DeviceCapacity(predictor, None) for d in spec.device_ids}, **kw
    )


def _true_round_time(plan, spec: PlanningInput) -> float:
    worst = 0.0
    for device_id in spec.device_ids:
        mine = plan.on_device(device_id)
        mix = tuple(MixTask(ARCH9[a.task_id], a.batch_size, a.active_thread_percentage) for a in mine)
        worst = max(worst, *(a.samples / law(mix, j) for j, a in enumerate(mine)))
    return worst


@pytest.mark.parametrize("which", ["narrow", "wide"])
def test_devices_of_6_and_8_tasks_plan_with_both_planners(request, which):
    predictor = request.getfixturevalue(which)
    spec = _spec({20: 6, 21: 8, 22: 3})
    ctx = _ctx(predictor, spec, slack="none")
    greedy = plan_vres_greedy(spec, ctx)
    sync = plan_vres_sync(spec, ctx)
    for plan in (greedy, sync):
        for device_id, k in ((20, 6), (21, 8), (22, 3)):
            mine = plan.on_device(device_id)
            assert [a.task_id for a in mine] == list(range(1, k + 1)), plan.strategy
            for a in mine:
                assert 8 <= a.batch_size <= a.samples and 1 <= a.active_thread_percentage <= 100
                assert a.predicted_throughput_sps > 0
    # The round's longest device is an 8-task one, and the synchronous plan shortens the
    # law's own round time against an equal split of the device.
    assert _true_round_time(sync, spec) < _true_round_time(plan_sharing(spec), spec)


def test_nine_tasks_on_a_device_are_refused_naming_the_limit(wide):
    spec = _spec({30: 9})
    for planner in (plan_vres_greedy, plan_vres_sync):
        with pytest.raises(
            PlanningError, match="device 30: 9 tasks on one device: the predictor plans at most 8"
        ) as info:
            planner(spec, _ctx(wide, spec))
        assert info.value.field == "tasks"
    with pytest.raises(PredictorError, match="plans at most 8 tasks per device"):
        wide.predict([tuple(MixTask("resnet18", 32, 10) for _ in range(9))])


def test_a_predictor_pickled_before_8_tasks_loads_predicts_and_asks_for_a_refit_past_4(narrow):
    old = _legacy(narrow)
    assert (old.max_mix, old.max_fitted_mix, old.space.slots) == (4, None, 4)
    assert old.space.spec()["max_mix"] == 4
    mixes = _mixes(200, (1, 2, 3, 4), seed=8)
    assert old.predict(mixes) == narrow.predict(mixes)  # the same model, the same answers
    with pytest.raises(PredictorError, match="fitted for at most 4 tasks per device; refit it .* up to 8"):
        old.predict([tuple(MixTask("resnet18", 32, 10) for _ in range(5))])
    spec = _spec({40: 6})
    with pytest.raises(PlanningError, match="device 40: 6 tasks .* fitted for at most 4 tasks per device") as info:
        plan_vres_sync(spec, _ctx(old, spec))
    assert info.value.field == "tasks"
    assert plan_vres_sync(_spec({40: 4}), _ctx(old, _spec({40: 4}))).on_device(40)


def test_a_profiling_sweep_designs_mixes_of_up_to_8_and_refuses_9():
    import itertools

    from pydantic import ValidationError

    from workers.profiling.sweep import sweep_design
    from workers.protocol.messages import ProfileSweepRequest

    fields = dict(sweep_id=1, device="sim", backend="simulated", budget_s=60, architectures=ARCHS, seed=0)
    assert ProfileSweepRequest(**fields).max_mix == 4  # the default stays where the paper's mixes stop
    configs = list(itertools.islice(sweep_design(ProfileSweepRequest(**fields, max_mix=MAX_MIX)), 64))
    assert {len(c) for c in configs} == set(range(1, MAX_MIX + 1))
    with pytest.raises(ValidationError, match="max_mix"):
        ProfileSweepRequest(**fields, max_mix=MAX_MIX + 1)
