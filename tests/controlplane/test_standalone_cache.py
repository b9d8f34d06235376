"""Issue 30, what a run's start and round life cycle must not do: measure ``P_alone`` it already
knows (the cross-run cache), wait for workload features, leave a cancelled start's files behind,
forget when a restarted run first began, or stamp a lease before the device was free.

The services run on the database with real initial models (torchvision builds them); what the
control plane sends to agents is recorded instead of sent (:func:`capture_dispatch`), and
``P_alone`` answers are built as agents send them.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from controlplane.celery import app
from controlplane.common.artifact_root import run_folder
from controlplane.common.errors import ApplicationError
from controlplane.experiments import services
from controlplane.experiments.models import (
    Checkpoint,
    Round,
    Run,
    StandaloneCacheEntry,
    StandaloneThroughput,
)
from controlplane.experiments.services import standalone
from controlplane.fleet.services import device_report
from controlplane.lab.models import DeviceLease
from controlplane.lab.services import leases, scheduler
from controlplane.profiling.models import ModelWorkload
from controlplane.profiling.services.workloads import workload_get
from tests.conftest import inventory
from tests.controlplane.queue_world import queued_round, running_round, running_run
from tests.controlplane.test_aggregation_resume import capture_dispatch, standalone_at_100_sps
from workers.fl import artifacts
from workers.fl.artifacts import get_store
from workers.protocol.queues import TaskName

pytestmark = pytest.mark.django_db


def _one_task(
    make_experiment, make_device, make_task, *, names=("dev-a", "dev-b"), task=None, name="exp", samples=(30, 10)
):
    """One task on two devices (30 and 10 samples unless ``samples`` says), one round."""
    devices = [make_device(n) for n in names]
    task = task or make_task("t-mobilenet", "mobilenet_v3_small")
    counts = [
        {"device": devices[0].id, "task": task.id, "num_samples": samples[0]},
        {"device": devices[1].id, "task": task.id, "num_samples": samples[1]},
    ]
    experiment = make_experiment(
        name=name, devices=devices, tasks=[task], counts=counts, partition_rule="explicit", rounds=1
    )
    return experiment, devices


def _measured_devices(sent) -> list[str]:
    """Names of the devices asked for ``P_alone`` by the recorded dispatches."""
    return sorted(r.device for _, requests in sent["standalone"] for r in requests)


def _first_run_measured(experiment, devices, capture) -> Run:
    """A run that measured ``P_alone`` on ``devices`` (100 samples/s), then was cancelled in
    round 0 (its devices free again)."""
    run = services.run_create(experiment=experiment, strategy="sharing")
    with capture(execute=True):
        services.run_begin(run_id=run.id)
    with capture(execute=True):
        services.standalone_record(run_id=run.id, results=standalone_at_100_sps(run, devices))
    assert Round.objects.get(run=run, index=0).deadline_at is not None  # round 0 was dispatched
    with capture(execute=True):
        services.run_cancel(run=run)
    return run


# ------------------------------------------------------------------------------ P_alone cache


def test_a_second_run_of_the_same_workload_asks_no_device_for_p_alone(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    first = services.run_create(experiment=experiment, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=first.id)
    assert _measured_devices(sent) == ["dev-a", "dev-b"]  # nothing cached yet: both measured
    with django_capture_on_commit_callbacks(execute=True):
        services.standalone_record(run_id=first.id, results=standalone_at_100_sps(first, devices))
    entries = StandaloneCacheEntry.objects.all()
    assert {(e.device.name, e.batch_size, e.share, e.throughput_sps, e.run_id) for e in entries} >= {
        ("dev-a", 30, 100, 100.0, first.id),
        ("dev-b", 10, 100, 100.0, first.id),
    }
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run=first)

    sent.clear()
    second = services.run_create(experiment=experiment, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=second.id)

    assert sent["standalone"] == []  # no measurement at all: round 0 went straight to training
    rnd = Round.objects.get(run=second, index=0)
    assert rnd.status == Round.Status.RUNNING and rnd.deadline_at is not None
    assert [round_id for round_id, _ in sent["round"]] == [rnd.id]
    rows = StandaloneThroughput.objects.filter(run=second)
    assert sorted((r.device.name, r.batch_size, r.source, r.throughput_sps) for r in rows) == [
        ("dev-a", 30, "cache", 100.0),
        ("dev-b", 10, "cache", 100.0),
    ]
    assert sorted(rnd.assignments.values_list("standalone_throughput_sps", flat=True)) == [100.0, 100.0]
    assert not rnd.flags  # every P_alone is known: fair throughput covers both devices
    # The tasks' workload features were queued at creation, never computed (the on-commit
    # callbacks of make_task did not run): the runs' start never needed them.
    assert not ModelWorkload.objects.exists()


def test_a_task_of_the_same_workload_under_another_name_shares_the_cache(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    _first_run_measured(experiment, devices, django_capture_on_commit_callbacks)
    # Same model, data, input shape and optimizer; another name and learning rate: same speed.
    twin = make_task("t-mobilenet-fast", "mobilenet_v3_small", learning_rate=0.2)
    other, _ = _one_task(make_experiment, lambda n: devices[0 if n == "dev-a" else 1], make_task, task=twin, name="b")
    # Another optimizer changes the step's work: measured again.
    adam = make_task("t-mobilenet-adam", "mobilenet_v3_small", optimizer="adam", weight_decay=0.0)
    third, _ = _one_task(make_experiment, lambda n: devices[0 if n == "dev-a" else 1], make_task, task=adam, name="c")

    sent.clear()
    run = services.run_create(experiment=other, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)
    assert sent["standalone"] == []
    assert set(StandaloneThroughput.objects.filter(run=run).values_list("source", flat=True)) == {"cache"}
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run=run)

    run = services.run_create(experiment=third, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)
    assert _measured_devices(sent) == ["dev-a", "dev-b"]


@pytest.mark.parametrize("change", ["expired", "cache off", "agent upgraded on dev-b", "another device"])
def test_what_the_cache_cannot_vouch_for_is_measured(
    change, make_experiment, make_device, make_task, monkeypatch, settings, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    _first_run_measured(experiment, devices, django_capture_on_commit_callbacks)
    expected = {"dev-b"}
    if change == "expired":
        # 7 days is the default age limit: an entry of 8 days ago is measured again.
        StandaloneCacheEntry.objects.update(measured_at=timezone.now() - dt.timedelta(days=8))
        expected = {"dev-a", "dev-b"}
    elif change == "cache off":
        settings.MTFL = {**settings.MTFL, "STANDALONE_CACHE_MAX_AGE_S": 0}
        expected = {"dev-a", "dev-b"}
    elif change == "agent upgraded on dev-b":
        device_report(inventory={**inventory("dev-b"), "agent_version": "99.0", "torch_version": "9.9"})
    else:
        # dev-c holds what dev-b held: dev-b's P_alone is never used for it, even of one class.
        experiment, _ = _one_task(
            make_experiment,
            lambda n: devices[0] if n == "dev-a" else make_device(n),
            make_task,
            task=experiment.tasks.get(),
            names=("dev-a", "dev-c"),
            name="on dev-c",
        )
        expected = {"dev-c"}

    sent.clear()
    run = services.run_create(experiment=experiment, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)

    assert set(_measured_devices(sent)) == expected
    cached = set(StandaloneThroughput.objects.filter(run=run, source="cache").values_list("device__name", flat=True))
    assert cached == {d.name for d in experiment.devices.all()} - expected
    rnd = Round.objects.get(run=run, index=0)
    assert rnd.deadline_at is None  # round 0 waits for the missing measurements only
    measured = [d for d in experiment.devices.all() if d.name in expected]
    with django_capture_on_commit_callbacks(execute=True):
        services.standalone_record(run_id=run.id, results=standalone_at_100_sps(run, measured))
    rnd.refresh_from_db()
    assert rnd.deadline_at is not None
    assert all(a.standalone_throughput_sps == 100.0 for a in rnd.assignments.all())


def test_a_failed_measurement_is_not_cached(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    run = services.run_create(experiment=experiment, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)
    results = standalone_at_100_sps(run, devices[:1]) + [
        {"run_id": run.id, "device": "dev-b", "status": "failed", "error": "trainer crashed"}
    ]
    with django_capture_on_commit_callbacks(execute=True):
        services.standalone_record(run_id=run.id, results=results)
    assert set(StandaloneCacheEntry.objects.values_list("device__name", flat=True)) == {"dev-a"}


# --------------------------------------------------------------------------- workload features


def test_workload_features_are_computed_when_the_task_is_created(user, monkeypatch, django_capture_on_commit_callbacks):
    queued: list[tuple] = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **kw: queued.append((name, args)))
    with django_capture_on_commit_callbacks(execute=True):
        queued_task = services.task_create(name="queued", architecture="mobilenet_v3_small", owner=user)
    assert queued == [(TaskName.TASK_FEATURES, ["mobilenet_v3_small", 10, list(queued_task.input_shape)])]

    now = services.task_create(name="now", architecture="shufflenet_v2_x1_0", owner=user, features="now")
    workload = workload_get(architecture="shufflenet_v2_x1_0", num_classes=10, input_shape=now.input_shape)
    assert workload is not None and workload.train_flops_per_sample > workload.forward_flops_per_sample > 0

    with pytest.raises(ApplicationError) as err:
        services.task_create(name="bad", architecture="mobilenet_v3_small", owner=user, features="later")
    assert err.value.field == "features"


# ---------------------------------------------------------------------------------- life cycle


def test_a_run_cancelled_while_writing_its_initial_models_stops_and_removes_them(
    make_experiment, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    experiment = make_experiment()  # two tasks: two initial models to write
    run = services.run_create(experiment=experiment, strategy="sharing")
    real = artifacts.save_model_weights
    written: list[str] = []

    def save_then_cancel(model, path):
        sha = real(model, path)
        written.append(str(path))
        if len(written) == 1:  # a user cancels while the first model is being written
            services.run_cancel(run=Run.objects.get(id=run.id))
        return sha

    # run_begin writes through the name it imported from the artifact module
    monkeypatch.setattr(standalone, "save_model_weights", save_then_cancel)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert len(written) == 1  # the start stopped: the second model was never written
    assert not Checkpoint.objects.filter(run=run).exists()
    assert not Round.objects.filter(run=run).exists() and sent["standalone"] == []
    assert not get_store().path(run_folder(run.id)).exists()


def test_a_run_cancelled_while_measuring_p_alone_removes_its_initial_models(
    make_experiment, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    run = services.run_create(experiment=make_experiment(), strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)
    assert sent["standalone"] and Checkpoint.objects.filter(run=run).count() == 2
    folder = get_store().path(run_folder(run.id))
    assert any(folder.rglob("*.safetensors"))

    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run=run)

    assert not Checkpoint.objects.filter(run=run).exists()
    assert not folder.exists()
    assert Round.objects.get(run=run, index=0).status == Round.Status.CANCELLED


def test_a_run_that_trained_keeps_its_initial_models_when_cancelled(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    run = _first_run_measured(experiment, devices, django_capture_on_commit_callbacks)
    initial = Checkpoint.objects.get(run=run, round=None)
    assert get_store().path(initial.artifact_path).is_file()


def test_a_run_begun_again_after_a_restart_keeps_its_first_started_at_and_counts_the_restart(
    make_experiment, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    run = services.run_create(experiment=make_experiment(), strategy="sharing")
    first = timezone.now() - dt.timedelta(hours=2)
    # A control worker that is gone began it two hours ago and died writing its initial models.
    Run.objects.filter(id=run.id).update(
        status=Run.Status.RUNNING, started_at=first, claimed_at=first, claimed_by="control@gone"
    )

    with django_capture_on_commit_callbacks(execute=True):
        counts = services.runs_resume(nodename="control@new", booted_at=time.time())

    assert counts["restarted"] == 1 and sent["run_begin"] == [run.id]
    run.refresh_from_db()
    assert run.status == Run.Status.PENDING
    assert run.started_at == first and run.restarts == 1 and run.last_restart_at > first

    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id, claimant="control@new")
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.claimed_by == "control@new"
    assert run.started_at == first  # its wall time counts from the first begin
    assert run.claimed_at >= run.last_restart_at
    # A second resume right away finds a fresh claim: nothing restarts again.
    with django_capture_on_commit_callbacks(execute=True):
        assert services.runs_resume(nodename="control@other")["restarted"] == 0
    run.refresh_from_db()
    assert run.restarts == 1


def test_a_lease_is_stamped_when_it_is_claimed_not_when_the_pass_began(make_experiment, make_device, monkeypatch):
    dispatched: list[int] = []
    monkeypatch.setattr(scheduler, "round_dispatch", lambda *, round_id: dispatched.append(round_id))
    devices = [make_device("dev-a"), make_device("dev-b")]
    experiment = make_experiment(devices=devices)
    pass_began = timezone.now()
    holder = running_round(running_run(experiment), devices=devices, started_at=pass_began - dt.timedelta(seconds=5))
    waiter = queued_round(running_run(experiment), queued_at=pass_began - dt.timedelta(seconds=1))
    # The holder's release commits after the pass began (its results came in meanwhile).
    released_at = pass_began + dt.timedelta(milliseconds=16)
    while timezone.now() <= released_at:
        time.sleep(0.005)
    assert leases.leases_release(round_ids=[holder.id], reason="its round's results are in", now=released_at) == 2

    assert scheduler.lab_schedule(now=pass_began) == [waiter.id] == dispatched

    granted = list(DeviceLease.objects.filter(round=waiter))
    assert len(granted) == 2 and all(lease.granted_at >= released_at for lease in granted)
    waiter.refresh_from_db()
    assert waiter.started_at >= released_at
    assert waiter.queue_s == pytest.approx((waiter.started_at - waiter.queued_at).total_seconds())


def test_a_shard_smaller_than_the_batch_is_cached_at_the_batch_it_trains(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    # P_alone of a 30-sample shard trains batches of 30, whatever the batch size: another
    # experiment giving dev-a 60 samples trains batches of 60, and must be measured.
    sent = capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    _first_run_measured(experiment, devices, django_capture_on_commit_callbacks)
    larger, _ = _one_task(
        make_experiment,
        lambda n: devices[0 if n == "dev-a" else 1],
        make_task,
        task=experiment.tasks.get(),
        name="larger shard on dev-a",
        samples=(60, 10),
    )

    sent.clear()
    run = services.run_create(experiment=larger, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)

    assert _measured_devices(sent) == ["dev-a"]
    assert StandaloneThroughput.objects.get(run=run, device__name="dev-b").source == "cache"


def test_the_simulated_backend_is_never_cached(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    # Its noise comes from the run's seed: a cached answer would tie a run's figures to its past.
    sent = capture_dispatch(monkeypatch)
    experiment, devices = _one_task(
        make_experiment, lambda n: make_device(n, backend="simulated"), make_task, name="simulated"
    )
    _first_run_measured(experiment, devices, django_capture_on_commit_callbacks)
    assert not StandaloneCacheEntry.objects.exists()

    sent.clear()
    run = services.run_create(experiment=experiment, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)

    assert _measured_devices(sent) == ["dev-a", "dev-b"]


def test_the_agent_reports_a_code_version_that_follows_its_training_code(tmp_path, monkeypatch):
    import workers
    from workers.agent import app as agent_app

    assert agent_app.agent_version().startswith(f"{workers.__version__}+src.")
    # A copy of the package whose trainer differs by one line reports another version.
    package = tmp_path / "workers"
    (package / "training").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "training" / "trainer.py").write_text("STEP = 1\n")
    monkeypatch.setattr(workers, "__file__", str(package / "__init__.py"))
    agent_app.agent_version.cache_clear()
    before = agent_app.agent_version()
    (package / "training" / "trainer.py").write_text("STEP = 2\n")
    agent_app.agent_version.cache_clear()
    after = agent_app.agent_version()
    agent_app.agent_version.cache_clear()
    assert before != after
