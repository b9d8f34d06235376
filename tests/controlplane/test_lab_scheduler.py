"""The lab scheduler's services on the database: leases, queued rounds, the policies, pools,
pause, and the two-researcher scenario of issue 24's first paragraph through the round protocol."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from controlplane.common.errors import ApplicationError
from controlplane.experiments import services
from controlplane.experiments.models import Round, Run
from controlplane.lab.models import DeviceLease, UserShare
from controlplane.lab.services import admin, leases, scheduler
from controlplane.planning.scheduling import order_waiting
from tests.controlplane.queue_world import queued_round, running_round, running_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def dispatched(monkeypatch):
    """Rounds the scheduler hands to round_dispatch, in order (nothing is planned or sent)."""
    calls: list[int] = []
    monkeypatch.setattr(scheduler, "round_dispatch", lambda *, round_id: calls.append(round_id))
    return calls


@pytest.fixture
def policy(settings):
    def use(name: str) -> None:
        settings.MTFL = {**settings.MTFL, "SCHEDULER_POLICY": name}

    return use


def _colleague(name: str = "colleague"):
    return get_user_model().objects.create_user(name, password="s3cret-pass")


def test_a_claim_takes_every_device_or_none(make_experiment, make_device):
    devices = [make_device("dev-a"), make_device("dev-b"), make_device("dev-c")]
    experiment = make_experiment(devices=devices)
    now = timezone.now()
    holder = running_round(running_run(experiment), devices=[devices[1]], started_at=now)
    other = queued_round(running_run(experiment), queued_at=now)

    assert not leases.leases_claim(rnd=other, device_ids=[d.id for d in devices], owner_id=None, now=now)
    assert DeviceLease.objects.filter(round=other).count() == 0  # nothing half-claimed
    assert leases.leases_claim(rnd=other, device_ids=[devices[0].id, devices[2].id], owner_id=None, now=now)
    assert sorted(leases.held_leases().values_list("device__name", flat=True)) == ["dev-a", "dev-b", "dev-c"]
    assert DeviceLease.objects.get(device=devices[1], released_at__isnull=True).round_id == holder.id


def test_a_round_waits_queued_while_another_run_holds_its_device_then_gets_it(
    make_experiment, make_device, user, dispatched
):
    devices = [make_device("dev-a"), make_device("dev-b")]
    mine = make_experiment(name="mine", devices=devices)
    theirs = make_experiment(name="theirs", devices=devices, tasks=list(mine.tasks.all()), owner=_colleague())
    now = timezone.now()
    holder = running_round(running_run(mine), devices=devices, started_at=now - dt.timedelta(seconds=5))
    waiter_run = running_run(theirs)

    waiting = services.round_enqueue(run_id=waiter_run.id, index=0)

    assert waiting.status == Round.Status.QUEUED and waiting.queued_at is not None and waiting.started_at is None
    assert dispatched == []
    # the holder's results are in: its leases go, and the next pass grants the waiter
    assert leases.leases_release(round_ids=[holder.id], reason="its round's results are in") == 2
    assert scheduler.lab_schedule() == [waiting.id]
    waiting.refresh_from_db()
    assert waiting.status == Round.Status.RUNNING and dispatched == [waiting.id]
    assert waiting.queue_s == pytest.approx((waiting.started_at - waiting.queued_at).total_seconds())
    held = DeviceLease.objects.filter(released_at__isnull=True)
    assert {(lease.device_id, lease.round_id, lease.owner_id) for lease in held} == {
        (d.id, waiting.id, theirs.owner_id) for d in devices
    }


def test_a_dead_runs_lease_is_released_by_the_next_pass(make_experiment, dispatched):
    experiment = make_experiment()
    devices = list(experiment.devices.all())
    crashed = running_run(experiment)
    running_round(crashed, devices=devices, started_at=timezone.now())
    # a crash that failed the run without the services (a worker killed mid-update)
    Run.objects.filter(id=crashed.id).update(status=Run.Status.FAILED)
    waiter = running_run(experiment)
    rnd = services.round_enqueue(run_id=waiter.id, index=0)

    assert rnd.status == Round.Status.RUNNING
    released = DeviceLease.objects.get(run=crashed, device=devices[0])
    assert released.released_at is not None and "ended" in released.release_reason


def test_failing_a_run_cancels_its_queued_round_and_frees_its_devices(make_experiment, dispatched):
    experiment = make_experiment()
    devices = list(experiment.devices.all())
    run = running_run(experiment)
    held = running_round(run, devices=devices, started_at=timezone.now())
    nxt = queued_round(run, index=1, queued_at=timezone.now())

    services.run_fail(run_id=run.id, error="device lost")

    held.refresh_from_db(), nxt.refresh_from_db()
    assert nxt.status == Round.Status.CANCELLED
    assert not leases.held_leases().exists()
    assert DeviceLease.objects.filter(run=run).first().release_reason.startswith("its run failed")


def test_fifo_serves_arrival_order_and_fair_the_user_with_the_least_device_time(
    make_experiment, make_device, user, dispatched, policy
):
    device = make_device("dev-a")
    greedy_owner, light_owner = user, _colleague()
    greedy = make_experiment(name="greedy", devices=[device])
    light = make_experiment(name="light", devices=[device], tasks=list(greedy.tasks.all()), owner=light_owner)
    now = timezone.now()
    # the greedy user held the device for 100 s just now
    past = running_round(running_run(greedy), devices=[device], started_at=now - dt.timedelta(seconds=100))
    leases.leases_release(round_ids=[past.id], reason="done", now=now)
    Round.objects.filter(id=past.id).update(status=Round.Status.SUCCEEDED)
    first = queued_round(running_run(greedy), queued_at=now - dt.timedelta(seconds=2))
    second = queued_round(running_run(light), queued_at=now - dt.timedelta(seconds=1))

    policy("fifo")
    assert scheduler.lab_schedule() == [first.id]

    Round.objects.filter(id=first.id).update(status=Round.Status.QUEUED, started_at=None)
    DeviceLease.objects.filter(round=first).delete()
    policy("fair")
    assert scheduler.lab_schedule() == [second.id]
    usage, _ = scheduler.lab_usage()
    assert usage[greedy_owner.id] == pytest.approx(100.0, abs=1.0)
    # The light user has now held the device 50 s; an admin weighs the greedy user x100, whose
    # 100 device-s then count 1: the greedy user's round goes first.
    DeviceLease.objects.filter(round=second).update(
        granted_at=timezone.now() - dt.timedelta(seconds=50), released_at=timezone.now()
    )
    Round.objects.filter(id=second.id).update(status=Round.Status.SUCCEEDED)
    third = queued_round(running_run(light), queued_at=now - dt.timedelta(seconds=5))

    def fair_order() -> list[int]:
        usage, weights = scheduler.lab_usage()
        return [r.key for r in order_waiting(scheduler.waiting_rounds(), policy="fair", usage=usage, weights=weights)]

    assert fair_order() == [third.id, first.id]
    UserShare.objects.create(user=greedy_owner, weight=100.0)
    assert fair_order() == [first.id, third.id]
    assert scheduler.lab_schedule() == [first.id]


def test_priority_goes_before_the_policy(make_experiment, make_device, dispatched, policy):
    device = make_device("dev-a")
    experiment = make_experiment(devices=[device])
    now = timezone.now()
    early = queued_round(running_run(experiment), queued_at=now - dt.timedelta(seconds=10))
    urgent = queued_round(running_run(experiment, priority=5), queued_at=now)
    policy("fifo")
    assert scheduler.lab_schedule() == [urgent.id]
    assert Round.objects.get(id=early.id).status == Round.Status.QUEUED


def test_a_paused_device_is_leased_to_no_round_until_resumed(make_experiment, user, dispatched):
    experiment = make_experiment()
    device = experiment.devices.first()
    admin_user = _colleague("admin")
    admin_user.is_staff = True
    admin_user.save()
    with pytest.raises(ApplicationError, match="only a lab admin"):
        admin.device_pause(device=device, user=user)

    admin.device_pause(device=device, user=admin_user, reason="fan replaced")
    rnd = services.round_enqueue(run_id=running_run(experiment).id, index=0)
    assert rnd.status == Round.Status.QUEUED

    admin.device_resume(device=device, user=admin_user)
    assert scheduler.lab_schedule() == [rnd.id]


def test_a_pool_run_is_placed_on_the_free_devices_of_its_pool(make_experiment, make_device, user, dispatched):
    devices = [make_device(f"dev-{k}") for k in range(4)]
    admin_user = _colleague("admin")
    admin_user.is_superuser = True
    admin_user.save()
    pool = admin.pool_create(name="rack-1", devices=[d.name for d in devices[:3]], user=admin_user)
    experiment = make_experiment(devices=devices, clients_per_round=2)
    other = make_experiment(name="other", devices=devices[:1], tasks=list(experiment.tasks.all()))
    running_round(running_run(other), devices=devices[:1], started_at=timezone.now())  # dev-0 busy

    with pytest.raises(ApplicationError) as refused:
        services.run_create(experiment=other, strategy="sharing", pool="no-such-pool")
    assert refused.value.field == "pool"
    run = running_run(experiment, pool=pool)
    rnd = services.round_enqueue(run_id=run.id, index=0)

    assert rnd.status == Round.Status.RUNNING
    assert rnd.participants == [devices[1].id, devices[2].id]  # the pool's free ones; dev-3 is not in it


def test_pool_devices_must_be_of_one_class(make_device, user):
    admin_user = _colleague("admin")
    admin_user.is_staff = True
    admin_user.save()
    cpu, sim = make_device("dev-cpu"), make_device("dev-sim", backend="simulated")
    with pytest.raises(ApplicationError, match="one device class") as refused:
        admin.pool_create(name="mixed", devices=[cpu.id, sim.id], user=admin_user)
    assert refused.value.field == "devices"


def test_two_researchers_on_the_same_devices_the_second_is_queued_with_its_deadline_from_its_start(
    started_round, make_experiment, django_capture_on_commit_callbacks, monkeypatch, settings
):
    """Issue 24's first paragraph through the round protocol: a colleague's run on the devices
    a round holds waits queued; when the round's results are in, its devices go to the colleague,
    whose deadline counts from then."""
    from controlplane.experiments.services import dispatch
    from tests.controlplane.test_round_protocol import _device_results

    # The colleague's run measures its P_alone on the leased devices (the phase whose time must
    # not count against its deadline): the cross-run cache, which would vouch for them, is off.
    settings.MTFL = {**settings.MTFL, "STANDALONE_CACHE_MAX_AGE_S": 0}
    run, rnd = started_round(rounds=2)
    colleague = _colleague()
    theirs = make_experiment(
        name="theirs",
        devices=list(run.experiment.devices.all()),
        tasks=list(run.experiment.tasks.all()),
        owner=colleague,
        partition_rule="explicit",
        counts=[
            {"device": s.device_id, "task": s.task_id, "num_samples": s.num_samples}
            for s in run.experiment.shards.all()
        ],
    )
    sent: list[str] = []
    monkeypatch.setattr(dispatch, "send_standalone", lambda run_id, requests, **kw: sent.append("standalone"))
    with django_capture_on_commit_callbacks(execute=True):
        their_run = services.run_create(experiment=theirs, strategy="sharing")
        services.run_begin(run_id=their_run.id)
    waiting = Round.objects.get(run=their_run, index=0)
    assert waiting.status == Round.Status.QUEUED and sent == []
    holder = DeviceLease.objects.filter(released_at__isnull=True).values_list("run_id", flat=True).distinct()
    assert list(holder) == [run.id]

    with django_capture_on_commit_callbacks(execute=True):
        services.round_record(round_id=rnd.id, results=_device_results(rnd))
        nxt = services.round_enqueue(run_id=run.id, index=1)  # what ROUND_ENQUEUE does after the aggregation
    waiting.refresh_from_db()
    # The fair policy: the colleague has had no device-time yet, so its round gets the devices
    # and the first researcher's next round waits, queued.
    assert waiting.status == Round.Status.RUNNING and waiting.queue_s > 0 and sent == ["standalone"]
    assert nxt.status == Round.Status.QUEUED
    held = DeviceLease.objects.filter(released_at__isnull=True)
    assert set(held.values_list("run_id", flat=True)) == {their_run.id}

    answers = [
        {
            "run_id": their_run.id,
            "device": s.device.name,
            "status": "succeeded",
            "measurements": [{"task_id": s.task_id, "batch_size": s.num_samples, "throughput_sps": 100.0}],
        }
        for s in theirs.shards.select_related("device")
    ]
    with django_capture_on_commit_callbacks(execute=True):
        services.standalone_record(run_id=their_run.id, results=answers)
    waiting.refresh_from_db()
    # its deadline counts from its dispatch, after the wait: not from when it was enqueued
    assert waiting.assignments.count() == 2
    assert waiting.deadline_at >= waiting.started_at + dt.timedelta(seconds=waiting.deadline_s)
    assert waiting.deadline_at > waiting.queued_at + dt.timedelta(seconds=waiting.deadline_s + waiting.queue_s - 0.01)


def test_deleting_a_run_does_not_erase_its_owners_device_time(make_experiment, user):
    """A user cannot look lighter to the fair policy by deleting runs: their leases stay."""
    from controlplane.storage.services.retention import run_delete

    experiment = make_experiment()
    run = running_run(experiment)
    now = timezone.now()
    held = running_round(run, devices=list(experiment.devices.all()), started_at=now - dt.timedelta(seconds=30))
    leases.leases_release(round_ids=[held.id], reason="done", now=now)
    Run.objects.filter(id=run.id).update(status=Run.Status.SUCCEEDED)
    before, _ = scheduler.lab_usage(now=now)

    run_delete(run=Run.objects.get(id=run.id), actor=user)

    after, _ = scheduler.lab_usage(now=now)
    assert not Run.objects.filter(id=run.id).exists()
    assert after[user.id] == pytest.approx(before[user.id]) == pytest.approx(60.0)  # 2 devices x 30 s
    assert DeviceLease.objects.filter(owner=user, run__isnull=True).count() == 2


def test_the_liveness_sweep_grants_a_round_whose_scheduling_pass_was_lost(make_experiment, make_device, dispatched):
    devices = [make_device("dev-a"), make_device("dev-b")]
    experiment = make_experiment(devices=devices)
    now = timezone.now()
    # Queued a minute ago with both devices free: the LAB_SCHEDULE that should have granted
    # them never arrived (a broker restart).
    waiting = queued_round(running_run(experiment), queued_at=now - dt.timedelta(seconds=60))

    counts = services.runs_liveness_sweep(now=now)

    waiting.refresh_from_db()
    assert counts["passes"] == 1 and dispatched == [waiting.id] and waiting.status == Round.Status.RUNNING


def test_the_liveness_sweep_leaves_a_just_queued_round_to_its_own_pass(make_experiment, make_device, dispatched):
    devices = [make_device("dev-a")]
    experiment = make_experiment(devices=devices)
    now = timezone.now()
    queued_round(running_run(experiment), queued_at=now - dt.timedelta(seconds=1))

    assert services.runs_liveness_sweep(now=now) == {"passes": 0, "advanced": 0}
    assert dispatched == []


def test_the_liveness_sweep_sends_the_next_round_again_of_a_run_left_with_none_in_flight(
    make_experiment, make_device, monkeypatch, django_capture_on_commit_callbacks
):
    from controlplane.experiments.services import dispatch, reliability

    devices = [make_device("dev-a")]
    experiment = make_experiment(devices=devices, rounds=3)
    now = timezone.now()
    grace = reliability.liveness_grace_s()
    stuck, fresh = running_run(experiment), running_run(experiment)
    for run, ended in ((stuck, now - dt.timedelta(seconds=grace + 5)), (fresh, now - dt.timedelta(seconds=1))):
        Round.objects.create(run=run, index=0, status=Round.Status.SUCCEEDED, queued_at=ended, finished_at=ended)
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(dispatch, "send_round_enqueue", lambda run_id, index: sent.append((run_id, index)))

    with django_capture_on_commit_callbacks(execute=True):
        counts = services.runs_liveness_sweep(now=now)

    # the run whose ROUND_ENQUEUE was lost gets it again; the one that just aggregated is left alone
    assert counts == {"passes": 0, "advanced": 1} and sent == [(stuck.id, 1)]


def test_an_agents_heartbeat_runs_the_liveness_sweep_at_most_once_per_check_interval(
    make_experiment, make_device, dispatched, monkeypatch
):
    from controlplane.experiments import receivers
    from controlplane.fleet.tasks import device_heartbeat
    from tests.conftest import inventory

    devices = [make_device("dev-a"), make_device("dev-b")]
    experiment = make_experiment(devices=devices)
    first = queued_round(running_run(experiment), queued_at=timezone.now() - dt.timedelta(minutes=5))
    monkeypatch.setitem(receivers._last_sweep, "at", float("-inf"))

    device_heartbeat(inventory("dev-a"))
    second = queued_round(running_run(experiment), queued_at=timezone.now() - dt.timedelta(minutes=5))
    leases.leases_release(round_ids=[first.id], reason="test")
    device_heartbeat(inventory("dev-b"))  # within MTFL_ROUND_CHECK_S of the first: no sweep

    assert dispatched == [first.id]
    second.refresh_from_db()
    assert second.status == Round.Status.QUEUED


def test_a_device_being_profiled_is_granted_to_no_round_and_a_leased_one_is_not_profiled(
    make_experiment, make_device, dispatched, django_capture_on_commit_callbacks
):
    from controlplane.profiling.models import ProfileSweep
    from controlplane.profiling.services import profile_done, sweep_start
    from tests.controlplane.test_api import _queued_control_messages
    from workers.protocol.queues import TaskName

    devices = [make_device("dev-a"), make_device("dev-b")]
    experiment = make_experiment(devices=devices)
    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        sweep = sweep_start(device=devices[0], budget_s=30, architectures=["mobilenet_v3_small"])
    waiting = queued_round(running_run(experiment), queued_at=timezone.now())

    assert scheduler.lab_schedule() == [] and dispatched == []  # dev-a profiles; the round needs both

    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        profile_done(summary={"sweep_id": sweep.id, "device": "dev-a", "status": "succeeded", "configs": 0})
    assert ProfileSweep.objects.get(id=sweep.id).status == "succeeded"
    assert TaskName.LAB_SCHEDULE in [name for name, _ in _queued_control_messages()]  # the device is free again
    assert scheduler.lab_schedule() == [waiting.id]

    with pytest.raises(ApplicationError) as refused:
        sweep_start(device=devices[1], budget_s=30, architectures=["mobilenet_v3_small"])
    assert refused.value.status_code == 409 and refused.value.field == "device"
    assert f"round 0 of run {waiting.run_id}" in refused.value.message and "device-pause" in refused.value.message


def test_a_run_that_outranks_every_waiting_round_keeps_its_turn_between_its_rounds(make_experiment, make_device):
    from controlplane.experiments.services.rounds.record import _outranks_the_queue

    def _loaded(rnd):
        return Round.objects.select_related("run__experiment").get(id=rnd.id)

    devices = [make_device("dev-a")]
    urgent = make_experiment(name="urgent", devices=devices, rounds=3)
    other = make_experiment(name="other", devices=devices, rounds=3, tasks=list(urgent.tasks.all()))
    now = timezone.now()
    first = running_round(running_run(urgent, priority=2), devices=devices, started_at=now)
    waiter = queued_round(running_run(other, priority=0), queued_at=now)

    # its next round's enqueue runs the pass, so the priority-0 round cannot slip in between
    assert _outranks_the_queue(_loaded(first))
    Run.objects.filter(id=waiter.run_id).update(priority=2)
    assert not _outranks_the_queue(_loaded(first))  # an equal: the policy decides, at once
    last = running_round(first.run, index=2, devices=[], started_at=now)
    Run.objects.filter(id=waiter.run_id).update(priority=0)
    assert not _outranks_the_queue(_loaded(last))  # the run ends: nothing of it comes back


@pytest.mark.django_db
def test_the_moved_models_content_types_and_their_permissions_follow_them_to_the_lab():
    """lab 0002: an upgraded database's ``experiments.usershare`` content type (and the permissions
    pointing at it) becomes ``lab.usershare``; one that already exists under ``lab`` is left alone."""
    import importlib

    from django.apps import apps as django_apps
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    migration = importlib.import_module("controlplane.lab.migrations.0002_content_types")
    ContentType.objects.filter(app_label="lab", model="usershare").delete()
    old = ContentType.objects.create(app_label="experiments", model="usershare")
    permission = Permission.objects.create(content_type=old, codename="change_usershare", name="Can change")

    migration.relabel(django_apps, None, source="experiments", target="lab")

    permission.refresh_from_db()
    assert (permission.content_type.app_label, permission.content_type.model) == ("lab", "usershare")
    lease_types = ContentType.objects.filter(model="devicelease").values_list("app_label", flat=True)
    assert list(lease_types) == ["lab"]  # already under lab: untouched, nothing duplicated
