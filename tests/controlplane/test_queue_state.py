"""The lab queue as the selectors read it (issue 24, item 3): holders, waiting rounds in the
policy's order, expected starts, paused devices, pools, and bounded queries."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Round
from controlplane.fleet.models import Device, DevicePool
from controlplane.lab import selectors as lab_selectors
from controlplane.lab.models import DeviceLease, UserShare
from controlplane.lab.selectors import pool_by_ref, queue_state, run_queue_entry
from controlplane.planning.scheduling import DEFAULT_ROUND_S
from tests.controlplane.queue_world import queued_round, running_round, running_run, two_researchers

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def lab(make_experiment, make_device, user, now):
    return two_researchers(make_experiment, make_device, user, now=now)


def _mtfl(settings, **values):
    settings.MTFL = {**settings.MTFL, **values}


def test_queue_names_the_holder_of_each_device_and_since_when(lab):
    state = queue_state(now=lab.now)

    assert [d["name"] for d in state["devices"]] == ["dev-a", "dev-b"]
    for row in state["devices"]:
        holder = row["holder"]
        assert holder["run"] == lab.holder.id
        assert holder["owner"] == "researcher"
        assert holder["experiment_name"] == "mine"
        assert holder["round_index"] == 0
        assert holder["since"] == lab.now - dt.timedelta(seconds=5)
        assert row["waiting"] == [lab.waiter_round.id]
        assert row["waiting_count"] == 1
    assert state["devices_held"] == 2
    assert state["devices_total"] == 2


def test_a_waiting_round_names_who_blocks_it_and_when_it_should_start(lab):
    state = queue_state(now=lab.now)

    [entry] = state["waiting"]
    assert entry["position"] == 1
    assert entry["run"] == lab.waiter.id
    assert entry["owner"] == "colleague"
    assert entry["round_index"] == 0
    assert entry["waited_s"] == pytest.approx(3.0)
    assert entry["devices"] == ["dev-a", "dev-b"]
    assert entry["devices_count"] == 2
    assert [(b["device"], b["holder_run"], b["holder_owner"]) for b in entry["blockers"]] == [
        ("dev-a", lab.holder.id, "researcher"),
        ("dev-b", lab.holder.id, "researcher"),
    ]
    # started 5 s ago, predicted 20 s: free (and the waiting round started) 15 s from now
    assert entry["estimated_start"] == lab.now + dt.timedelta(seconds=15)
    assert state["devices"][0]["next_start"] == entry["estimated_start"]
    assert state["waiting_total"] == 1


def test_without_a_prediction_a_holder_is_expected_for_its_last_round_wall_time(lab, now):
    lab.holder_round.predicted_round_time_s = None
    lab.holder_round.index = 1
    lab.holder_round.save()
    Round.objects.create(run=lab.holder, index=0, status=Round.Status.SUCCEEDED, wall_time_s=8.0)

    [entry] = queue_state(now=now)["waiting"]

    assert entry["estimated_start"] == now + dt.timedelta(seconds=3)


def test_with_nothing_known_a_holder_is_expected_for_the_schedulers_default_round(lab, now):
    Round.objects.filter(id=lab.holder_round.id).update(predicted_round_time_s=None)

    [entry] = queue_state(now=now)["waiting"]

    # started 5 s ago; the scheduler expects a round nothing predicts to take DEFAULT_ROUND_S
    assert entry["estimated_start"] == now + dt.timedelta(seconds=DEFAULT_ROUND_S - 5)


def test_a_holder_past_its_expected_end_is_expected_free_any_moment(lab, now):
    Round.objects.filter(id=lab.holder_round.id).update(started_at=now - dt.timedelta(seconds=90))

    [entry] = queue_state(now=now)["waiting"]

    assert entry["estimated_start"] == now


def test_fair_policy_serves_the_user_with_less_device_time_first(lab, make_experiment, now, settings):
    # the researcher held two devices for 10 minutes in the window; the colleague nothing
    old = running_run(lab.holder.experiment)
    old_round = Round.objects.create(run=old, index=0, status=Round.Status.SUCCEEDED)
    for device in lab.devices:
        DeviceLease.objects.create(
            device=device,
            run=old,
            round=old_round,
            owner=lab.owner,
            granted_at=now - dt.timedelta(minutes=20),
            released_at=now - dt.timedelta(minutes=10),
        )
    mine_waiting = running_run(lab.holder.experiment)
    early = queued_round(mine_waiting, queued_at=now - dt.timedelta(seconds=30))  # before the colleague's

    _mtfl(settings, SCHEDULER_POLICY="fair")
    fair = queue_state(now=now)
    _mtfl(settings, SCHEDULER_POLICY="fifo")
    fifo = queue_state(now=now)

    assert fair["policy"] == "fair"
    assert [w["round"] for w in fair["waiting"]] == [lab.waiter_round.id, early.id]
    assert fifo["policy"] == "fifo"
    assert [w["round"] for w in fifo["waiting"]] == [early.id, lab.waiter_round.id]
    assert [w["position"] for w in fifo["waiting"]] == [1, 2]


def test_an_admins_weight_can_put_a_heavier_user_first(lab, now, settings):
    _mtfl(settings, SCHEDULER_POLICY="fair")
    mine_waiting = running_run(lab.holder.experiment)
    mine = queued_round(mine_waiting, queued_at=now - dt.timedelta(seconds=1))
    # the colleague has used a little device time; the researcher more, but weighs 100
    UserShare.objects.create(user=lab.owner, weight=100.0)
    other = running_run(lab.waiter.experiment)
    done = Round.objects.create(run=other, index=0, status=Round.Status.SUCCEEDED)
    DeviceLease.objects.create(
        device=lab.devices[0],
        run=other,
        round=done,
        owner=lab.colleague,
        granted_at=now - dt.timedelta(seconds=100),
        released_at=now - dt.timedelta(seconds=50),
    )

    order = [w["round"] for w in queue_state(now=now)["waiting"]]

    # researcher: 10 s held now (2 devices x 5 s) / 100; colleague: 50 s / 1
    assert order == [mine.id, lab.waiter_round.id]


def test_a_higher_priority_run_goes_first_under_either_policy(lab, now, settings):
    urgent = running_run(lab.holder.experiment, priority=5)
    late = queued_round(urgent, queued_at=now)
    for policy in ("fifo", "fair"):
        _mtfl(settings, SCHEDULER_POLICY=policy)
        state = queue_state(now=now)
        assert [w["round"] for w in state["waiting"]] == [late.id, lab.waiter_round.id], policy
        assert state["waiting"][0]["priority"] == 5


def test_a_paused_device_is_listed_with_its_reason_and_blocks_its_rounds(lab, now):
    Device.objects.filter(id=lab.devices[1].id).update(paused=True, paused_reason="fan replaced", paused_at=now)
    DeviceLease.objects.update(released_at=now)  # the holder is done: only the pause blocks
    Round.objects.filter(id=lab.holder_round.id).update(status=Round.Status.SUCCEEDED)

    state = queue_state(now=now)

    rows = {d["name"]: d for d in state["devices"]}
    assert rows["dev-b"]["paused"] is True
    assert rows["dev-b"]["paused_reason"] == "fan replaced"
    assert rows["dev-b"]["holder"] is None
    [entry] = state["waiting"]
    assert entry["estimated_start"] is None
    assert [(b["device"], b["paused"]) for b in entry["blockers"]] == [("dev-b", True)]
    assert state["devices_paused"] == 1


def test_a_device_being_profiled_is_listed_with_its_sweep_and_delays_the_rounds_that_need_it(lab, now):
    from controlplane.profiling.models import ProfileSweep

    DeviceLease.objects.update(released_at=now)  # the holder is done: only the sweep blocks
    Round.objects.filter(id=lab.holder_round.id).update(status=Round.Status.SUCCEEDED)
    sweep = ProfileSweep.objects.create(
        device=lab.devices[1], backend="cpu", budget_s=120, request={}, status=ProfileSweep.Status.RUNNING
    )
    ProfileSweep.objects.filter(id=sweep.id).update(started_at=now - dt.timedelta(seconds=20))

    state = queue_state(now=now)

    row = {d["name"]: d for d in state["devices"]}["dev-b"]
    assert row["holder"] is None and row["profiling"]["sweep"] == sweep.id
    assert row["profiling"]["expected_end"] == now + dt.timedelta(seconds=100)
    [entry] = state["waiting"]
    assert [(b["device"], b["profiling_sweep"]) for b in entry["blockers"]] == [("dev-b", sweep.id)]
    assert entry["estimated_start"] == now + dt.timedelta(seconds=100)


def test_a_pool_rounds_slots_and_the_pools_counts(lab, now):
    pool = DevicePool.objects.create(name="cpu-pool")
    Device.objects.filter(id__in=[d.id for d in lab.devices]).update(pool=pool)
    pooled = running_run(lab.waiter.experiment, pool=pool)
    rnd = queued_round(pooled, queued_at=now - dt.timedelta(seconds=1))

    state = queue_state(now=now)

    entry = next(w for w in state["waiting"] if w["round"] == rnd.id)
    assert entry["pool"] == "cpu-pool"
    assert entry["slots"] == 2
    assert entry["devices"] == []
    assert entry["devices_count"] == 2
    assert {b["device"] for b in entry["blockers"]} == {"dev-a", "dev-b"}
    assert entry["estimated_start"] is not None
    assert state["pools"] == [
        {"id": pool.id, "name": "cpu-pool", "devices": 2, "held": 2, "paused": 0, "free": 0, "waiting": 1}
    ]


def test_a_pools_counts_agree_with_the_queues_totals_for_a_paused_device_still_held(lab, now):
    pool = DevicePool.objects.create(name="cpu-pool")
    Device.objects.filter(id__in=[d.id for d in lab.devices]).update(pool=pool)
    Device.objects.filter(id=lab.devices[0].id).update(paused=True, paused_at=now)

    state = queue_state(now=now)

    assert (state["devices_held"], state["devices_paused"]) == (2, 1)
    [row] = state["pools"]
    assert (row["held"], row["paused"], row["free"]) == (2, 1, 0)


def test_an_empty_lab_has_an_empty_queue(db):
    state = queue_state()

    assert state["waiting"] == [] and state["devices"] == [] and state["pools"] == []
    assert state["policy"] in ("fifo", "fair")


def test_run_queue_entry_is_the_waiting_runs_and_nobody_elses(lab):
    state = queue_state(now=lab.now)

    assert run_queue_entry(lab.waiter, state)["round"] == lab.waiter_round.id
    assert run_queue_entry(lab.holder, state) is None


def test_only_held_paused_and_waited_for_devices_are_listed_and_at_most_the_cap(
    lab, make_experiment, make_device, now, monkeypatch
):
    idle = [make_device(f"idle-{k}") for k in range(3)]
    wanted = [make_device(f"wanted-{k}") for k in range(3)]
    other = make_experiment(name="wide", devices=wanted, tasks=list(lab.holder.experiment.tasks.all()))
    queued_round(running_run(other), queued_at=now)

    state = queue_state(now=now)
    assert {d["name"] for d in state["devices"]} == {"dev-a", "dev-b", "wanted-0", "wanted-1", "wanted-2"}
    assert state["devices_total"] == 2 + len(idle) + len(wanted)

    monkeypatch.setattr(lab_selectors, "MAX_DEVICES_LISTED", 3)
    capped = queue_state(now=now)
    # held devices first, then those the queue waits for
    assert [d["name"] for d in capped["devices"]] == ["dev-a", "dev-b", "wanted-0"]
    assert capped["devices_listed"] == 3
    assert capped["devices_involved"] == 5


def _world(make_experiment, make_device, tasks, *, users: int, devices_per_user: int, now):
    """``users`` researchers, each with a running round holding their own devices and two
    runs waiting for them."""
    for u in range(users):
        owner = get_user_model().objects.create_user(f"user-{u}")
        devices = [make_device(f"u{u}-d{k}") for k in range(devices_per_user)]
        experiment = make_experiment(name=f"exp-{u}", devices=devices, tasks=tasks, owner=owner)
        running_round(running_run(experiment), devices=devices, started_at=now, predicted_round_time_s=5.0)
        for k in range(2):
            queued_round(running_run(experiment, priority=k), queued_at=now)


def test_the_queue_costs_the_same_queries_for_a_small_and_a_large_lab(
    lab, make_experiment, make_device, now, settings, django_assert_max_num_queries
):
    _mtfl(settings, SCHEDULER_POLICY="fair")
    tasks = list(lab.holder.experiment.tasks.all())
    pool = DevicePool.objects.create(name="p")
    Device.objects.filter(id=lab.devices[0].id).update(pool=pool, paused=True)
    queued_round(running_run(lab.waiter.experiment, pool=pool), queued_at=now)
    with django_assert_max_num_queries(20) as small:
        queue_state(now=now)

    _world(make_experiment, make_device, tasks, users=6, devices_per_user=8, now=now)
    with django_assert_max_num_queries(len(small.captured_queries)):
        state = queue_state(now=now)

    assert state["waiting_total"] == 2 + 6 * 2
    assert state["devices_held"] == 2 + 6 * 8


def test_pool_by_ref_takes_an_id_or_a_name_and_names_the_field(db):
    pool = DevicePool.objects.create(name="gpus")

    assert pool_by_ref(pool.id) == pool
    assert pool_by_ref(str(pool.id)) == pool
    assert pool_by_ref("gpus") == pool
    with pytest.raises(ApplicationError) as err:
        pool_by_ref("nope")
    assert err.value.field == "pool"
    assert err.value.message == "no device pool 'nope'; pools: gpus"
