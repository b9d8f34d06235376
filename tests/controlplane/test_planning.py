"""The paper's baselines and the metrics, on plain data (no Django, no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from controlplane.planning import metrics
from controlplane.planning.strategies import make_plan, plan_isolation, plan_sharing, plan_temporal
from controlplane.planning.types import PlanningError, PlanningInput


@pytest.fixture
def spec() -> PlanningInput:
    # device 1 holds all three tasks; device 2 holds no data of task 12 and a small shard of 11.
    return PlanningInput(
        device_ids=(1, 2),
        task_ids=(10, 11, 12),
        samples={(1, 10): 500, (1, 11): 300, (1, 12): 200, (2, 10): 700, (2, 11): 40},
    )


def test_temporal_timeslices_at_full_share_and_batch_128(spec):
    plan = plan_temporal(spec)
    assert plan.partitioning == "timeslice"
    assert {a.active_thread_percentage for a in plan.assignments} == {100}
    assert {(a.device_id, a.task_id): a.batch_size for a in plan.assignments}[(1, 10)] == 128


def test_isolation_splits_each_device_evenly_among_tasks_that_run_there(spec):
    plan = plan_isolation(spec)
    shares = {(a.device_id, a.task_id): a.active_thread_percentage for a in plan.assignments}
    assert shares[(1, 10)] == shares[(1, 11)] == shares[(1, 12)] == 33
    assert shares[(2, 10)] == shares[(2, 11)] == 50
    for device_id in spec.device_ids:
        assert sum(a.active_thread_percentage for a in plan.on_device(device_id)) <= 100
    assert plan.partitioning == "mps"


def test_sharing_gives_every_task_the_whole_device(spec):
    plan = plan_sharing(spec)
    assert {a.active_thread_percentage for a in plan.assignments} == {100}
    assert sum(a.active_thread_percentage for a in plan.on_device(1)) == 300


def test_baseline_batch_is_clipped_to_the_shard(spec):
    plan = plan_sharing(spec)
    batch = {(a.device_id, a.task_id): a.batch_size for a in plan.assignments}
    assert batch[(2, 11)] == 40
    assert batch[(1, 12)] == 128


def test_tasks_without_data_on_a_device_are_not_planned_there(spec):
    plan = plan_isolation(spec)
    assert (2, 12) not in {(a.device_id, a.task_id) for a in plan.assignments}
    assert len(plan.assignments) == 5


def test_unknown_strategy_names_the_allowed_ones(spec):
    with pytest.raises(
        PlanningError, match="allowed: temporal, isolation, sharing, vres_greedy, vres_sync, manual"
    ) as info:
        make_plan("fastest", spec)
    assert info.value.field == "strategy"


def test_manual_plan_is_checked(spec):
    entries = [
        {"device_id": d, "task_id": t, "batch_size": 16, "active_thread_percentage": 50} for (d, t) in spec.samples
    ]
    plan = make_plan("manual", spec, manual_entries=entries)
    assert len(plan.assignments) == 5 and plan.partitioning == "mps"

    too_big = [dict(e, batch_size=41) if (e["device_id"], e["task_id"]) == (2, 11) else e for e in entries]
    with pytest.raises(PlanningError, match="batch_size=41 is out of range: allowed 2 to 40") as info:
        make_plan("manual", spec, manual_entries=too_big)
    assert info.value.field == "batch_size"

    bad_share = [dict(entries[0], active_thread_percentage=150), *entries[1:]]
    with pytest.raises(PlanningError, match="allowed 1 to 100") as info:
        make_plan("manual", spec, manual_entries=bad_share)
    assert info.value.field == "active_thread_percentage"

    with pytest.raises(PlanningError, match="no entry for device"):
        make_plan("manual", spec, manual_entries=entries[:-1])


def test_fair_throughput_normalises_by_standalone_speed():
    assert metrics.fair_throughput([50.0, 30.0], [100.0, 60.0]) == pytest.approx(1.0)
    assert metrics.raw_throughput([50.0, 30.0]) == 80.0
    with pytest.raises(ValueError, match="positive and finite"):
        metrics.fair_throughput([1.0], [0.0])


def test_speedup_and_round_metrics():
    assert metrics.speedup(3.0, 1.5) == 2.0
    assert metrics.speedup(3.0, None) is None
    assert metrics.speedup(3.0, 0.0) is None
    assert metrics.round_time([(10.0, 12.0), (10.5, 15.0)]) == 5.0
    assert metrics.round_time([]) is None
    assert metrics.fl_throughput(100, 4.0) == 25.0
    assert metrics.mean_or_none([None, 1.0, 3.0]) == 2.0


def test_planning_imports_no_django_celery_or_torch():
    code = (
        "import sys; import controlplane.planning.strategies, controlplane.planning.metrics; "
        "bad = [m for m in ('django', 'celery', 'torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
