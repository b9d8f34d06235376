"""The storage lifecycle (issue 24 item 4): the retention policy on real weights files, deleting
runs and experiments (API and dashboard), ``mtfl gc``, disk use, and the free-space check.

Rounds are driven through the control plane's own services with device results as agents send
them (weights files of the run's real model written where the round told each device to write;
tests/controlplane/test_aggregation_resume.py's helpers), with after-commit callbacks run, so the
policy runs where it runs in production: after each round's checkpoints are committed. Test
accuracies are chosen by the test (the evaluation is replaced), so which checkpoint is the best
is known. Every test has its own ``ARTIFACT_ROOT``.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.common.artifact_root import storage_space_problem
from controlplane.common.errors import ApplicationError
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Experiment, Round, Run, Task
from controlplane.storage.services import retention
from controlplane.storage.services.retention import CheckpointRow, checkpoints_kept
from tests.controlplane.test_aggregation_resume import begin, capture_dispatch, device_results, trained
from workers.fl.artifacts import device_weights_key, get_store, global_weights_key, server_state_key

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def own_artifact_root(tmp_path, monkeypatch) -> Path:
    """A fresh artifact store per test (gc removes folders of runs it does not know)."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv("ARTIFACT_ROOT", str(root))
    return root


def _api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


# --- the policy, pure ------------------------------------------------------------------------------


def test_the_policy_keeps_the_initial_the_last_n_the_best_and_the_latest_checkpoint():
    rows = [CheckpointRow(1, None, 0.1)] + [
        CheckpointRow(10 + i, i, acc) for i, acc in enumerate([0.5, 0.9, 0.6, 0.7, 0.65, 0.8])
    ]
    assert checkpoints_kept(rows, keep_last=2) == {1, 11, 14, 15}  # initial, best (round 1), rounds 4 and 5
    assert checkpoints_kept(rows, keep_last=10) == {r.id for r in rows}


def test_among_equally_good_checkpoints_the_newest_is_the_best_and_unscored_ones_never_are():
    rows = [CheckpointRow(1, None, None), CheckpointRow(2, 0, 0.8), CheckpointRow(3, 1, 0.8), CheckpointRow(4, 2, None)]
    assert checkpoints_kept(rows, keep_last=1) == {1, 3, 4}
    with pytest.raises(ValueError, match="keep_last must be at least 1"):
        checkpoints_kept(rows, keep_last=0)


def test_the_latest_checkpoint_is_kept_even_when_it_is_not_the_last_round():
    # a round redone after a restart: its checkpoint has the highest id but not the highest index
    rows = [CheckpointRow(1, None, 0.1), CheckpointRow(2, 3, 0.2), CheckpointRow(3, 2, 0.3)]
    assert 3 in checkpoints_kept(rows, keep_last=1)


# --- the policy on a run's real files --------------------------------------------------------------


@pytest.fixture
def accuracies(monkeypatch):
    """Test accuracies by round index (``None``: the initial model), instead of evaluating; each
    evaluation runs as soon as it is queued, as the control worker's second slot does."""
    from controlplane.experiments.services import dispatch, evaluation

    chosen: dict[int | None, float] = {None: 0.1}

    def fake(task, path):
        name = Path(path).name
        index = None if name.startswith("initial") else int(name.split("-")[1].split(".")[0])
        return chosen.get(index, 0.5), 1.0

    monkeypatch.setattr(evaluation, "model_evaluate", fake)
    monkeypatch.setattr(
        dispatch, "send_checkpoints_evaluate", lambda ids: evaluation.checkpoints_evaluate(checkpoint_ids=ids)
    )
    return chosen


@pytest.fixture
def one_task(make_device, make_task):
    devices = [make_device("dev-a"), make_device("dev-b")]
    task = make_task("t-mobilenet", "mobilenet_v3_small")
    counts = [{"device": d.id, "task": task.id, "num_samples": n} for d, n in zip(devices, (30, 10), strict=True)]
    return devices, [task], counts


def _experiment(make_experiment, one_task, **kw) -> Experiment:
    devices, tasks, counts = one_task
    return make_experiment(devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", **kw)


def _global(run: Run, index: int | None):
    from workers.fl.fedavg import load_state

    ckpt = Checkpoint.objects.filter(run=run, round__index=index).order_by("-id").first()
    return load_state(get_store().path(ckpt.artifact_path))


def _updates(run: Run, index: int, *, unchanged: bool = False) -> dict[tuple[str, str], bytes]:
    previous = Checkpoint.objects.filter(run=run).order_by("-id").first()
    if unchanged:
        data = get_store().path(previous.artifact_path).read_bytes()
        return {(d, "t-mobilenet"): data for d in ("dev-a", "dev-b")}
    state = _global(run, index - 1 if index else None)
    return {(d, "t-mobilenet"): trained(state, seed=10 * k + index) for k, d in enumerate(("dev-a", "dev-b"))}


def _play(run: Run, index: int, capture, *, unchanged: bool = False) -> Round:
    """Record round ``index`` (device results written to disk), with after-commit callbacks run
    (the policy among them), then start the next round if there is one."""
    rnd = Round.objects.get(run=run, index=index)
    results = device_results(rnd, _updates(run, index, unchanged=unchanged))
    with capture(execute=True):
        services.round_record(round_id=rnd.id, results=results)
    if index + 1 < run.experiment.rounds:
        services.round_enqueue(run_id=run.id, index=index + 1)
    rnd.refresh_from_db()
    return rnd


def test_device_weights_are_deleted_once_their_round_is_aggregated(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    run = begin(_experiment(make_experiment, one_task, rounds=2))
    store = get_store()
    rnd = Round.objects.get(run=run, index=0)
    results = device_results(rnd, _updates(run, 0))
    files = [store.path(device_weights_key(run.id, 0, d, one_task[1][0].id)) for d in ("dev-a", "dev-b")]
    assert all(f.is_file() for f in files)

    with django_capture_on_commit_callbacks(execute=True):
        services.round_record(round_id=rnd.id, results=results)

    assert not any(f.exists() for f in files)
    assert not store.path(f"runs/{run.id}/rounds/00000").exists()
    rows = Assignment.objects.filter(round=rnd)
    assert all(a.weights_deleted_at is not None and a.weights_path and a.weights_sha256 for a in rows)
    assert Checkpoint.objects.get(run=run, round=rnd).deleted_at is None


def test_device_weights_of_a_round_not_yet_aggregated_are_never_touched(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    run = begin(_experiment(make_experiment, one_task, rounds=3))
    _play(run, 0, django_capture_on_commit_callbacks)
    running = Round.objects.get(run=run, index=1)
    device_results(running, _updates(run, 1))  # the devices wrote their weights; no result recorded yet
    written = sorted(get_store().path(f"runs/{run.id}/rounds/00001").rglob("*.safetensors"))

    retention.run_retention_apply(run_id=run.id, round_index=1)
    report = retention.gc(dry_run=False)

    assert len(written) == 2 and all(p.is_file() for p in written)
    assert not Assignment.objects.filter(round=running, weights_deleted_at__isnull=False).exists()
    assert report.files == 0


def test_keep_device_weights_keeps_them_for_debugging(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    run = begin(_experiment(make_experiment, one_task, rounds=1, keep_device_weights=True))
    _play(run, 0, django_capture_on_commit_callbacks)
    retention.gc(dry_run=False)

    rows = list(Assignment.objects.filter(round__run=run))
    assert rows and all(a.weights_deleted_at is None and get_store().path(a.weights_path).is_file() for a in rows)


def test_global_checkpoints_are_pruned_to_the_initial_the_last_n_the_best_and_the_latest(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    accuracies.update({0: 0.5, 1: 0.9, 2: 0.6, 3: 0.7, 4: 0.65})
    run = begin(_experiment(make_experiment, one_task, rounds=5, keep_last_checkpoints=2, aggregation="fedavgm"))
    store = get_store()
    task = one_task[1][0]
    for index in range(5):
        _play(run, index, django_capture_on_commit_callbacks)

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    kept = {c.round.index if c.round else None for c in Checkpoint.objects.filter(run=run, deleted_at__isnull=True)}
    assert kept == {None, 1, 3, 4}  # initial, best (0.9), the last 2
    for ckpt in Checkpoint.objects.filter(run=run).select_related("round"):
        index = ckpt.round.index if ckpt.round else None
        assert ckpt.test_accuracy == accuracies[index]  # the metrics stay
        assert store.path(ckpt.artifact_path).is_file() == (index in kept)
        if index is not None:  # fedavgm keeps a server state beside each model
            assert ckpt.server_state_path == server_state_key(run.id, task.id, index)
            assert store.path(ckpt.server_state_path).is_file() == (index in kept)
    assert not store.path(f"runs/{run.id}/rounds").exists()


def test_a_file_that_a_kept_checkpoint_shares_with_a_deleted_one_is_kept(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    run = begin(_experiment(make_experiment, one_task, rounds=4, keep_last_checkpoints=1))
    _play(run, 0, django_capture_on_commit_callbacks)
    accuracies[1] = 0.9  # better than round 0's: round 0's model is not kept as the best
    _play(run, 1, django_capture_on_commit_callbacks)
    for index in (2, 3):  # every device sends round 1's model back unchanged: its file is kept
        _play(run, index, django_capture_on_commit_callbacks, unchanged=True)

    shared = global_weights_key(run.id, one_task[1][0].id, 1)
    rows = {c.round.index: c for c in Checkpoint.objects.filter(run=run, round__isnull=False).select_related("round")}
    assert [rows[i].artifact_path for i in (1, 2, 3)] == [shared] * 3
    assert rows[1].deleted_at is not None and rows[2].deleted_at is not None and rows[3].deleted_at is None
    assert get_store().path(shared).is_file()
    assert not get_store().path(global_weights_key(run.id, one_task[1][0].id, 0)).exists()


def test_a_run_whose_old_checkpoints_were_pruned_resumes_from_its_latest_model_and_state(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks
):
    capture_dispatch(monkeypatch)
    run = begin(_experiment(make_experiment, one_task, rounds=3, keep_last_checkpoints=1, aggregation="fedavgm"))
    _play(run, 0, django_capture_on_commit_callbacks)
    _play(run, 1, django_capture_on_commit_callbacks)
    rnd = Round.objects.get(run=run, index=2)
    results = device_results(rnd, _updates(run, 2))
    # the control worker died while aggregating round 2: the round is taken back and redone
    Round.objects.filter(id=rnd.id).update(status=Round.Status.AGGREGATING, aggregating_at=T0, claimed_by="gone")
    with django_capture_on_commit_callbacks(execute=True):
        services.runs_resume(nodename="control@new", now=T0 + dt.timedelta(days=1))
        services.round_record(round_id=rnd.id, results=results)

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    latest = Checkpoint.objects.filter(run=run).order_by("-id").first()
    assert latest.round.index == 2 and latest.deleted_at is None
    assert get_store().path(latest.server_state_path).is_file()


def test_a_failing_policy_is_logged_and_never_fails_the_run(
    make_experiment, one_task, accuracies, monkeypatch, django_capture_on_commit_callbacks, caplog
):
    sent = capture_dispatch(monkeypatch)
    run = begin(_experiment(make_experiment, one_task, rounds=2))

    def broken(**_kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(retention, "run_retention_apply", broken)
    with caplog.at_level(logging.ERROR):
        rnd = _play(run, 0, django_capture_on_commit_callbacks)

    assert rnd.status == Round.Status.SUCCEEDED
    assert (run.id, 1) in sent["round_enqueue"]
    assert "the retention policy failed after round 0" in caplog.text


# --- gc ------------------------------------------------------------------------------------------


def _old_run(experiment: Experiment, store, *, rounds: int = 4) -> Run:
    """A finished run from before the policy: every round's device weights and global model on
    disk, nothing marked."""
    run = Run.objects.create(
        experiment=experiment, strategy="sharing", status=Run.Status.SUCCEEDED, started_at=T0, finished_at=T0
    )
    shards = list(experiment.shards.select_related("device", "task").filter(num_samples__gt=0))
    for task in experiment.tasks.all():
        key = global_weights_key(run.id, task.id, None)
        store.write_bytes(key, b"i" * 100)
        Checkpoint.objects.create(run=run, task=task, round=None, artifact_path=key, sha256="0" * 64)
    for index in range(rounds):
        rnd = Round.objects.create(run=run, index=index, status=Round.Status.SUCCEEDED, started_at=T0)
        for shard in shards:
            key = device_weights_key(run.id, index, shard.device.name, shard.task_id)
            store.write_bytes(key, b"d" * 1000)
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=8,
                active_thread_percentage=100,
                samples=shard.num_samples,
                status=Assignment.Status.SUCCEEDED,
                weights_path=key,
                weights_sha256="0" * 64,
            )
        for task in experiment.tasks.all():
            key = global_weights_key(run.id, task.id, index)
            store.write_bytes(key, b"g" * 10_000)
            Checkpoint.objects.create(
                run=run, task=task, round=rnd, artifact_path=key, sha256="0" * 64, test_accuracy=0.1 * index
            )
    return run


def test_gc_reports_in_a_dry_run_exactly_what_it_then_frees(make_experiment):
    store = get_store()
    experiment = make_experiment(name="old", rounds=4)  # two devices × two tasks
    run = _old_run(experiment, store)
    store.write_bytes("runs/987654/rounds/00000/dev-x/task-1.safetensors", b"o" * 500)  # a deleted run's
    before = retention.run_disk_use(run.id)

    dry = retention.gc(dry_run=True)
    assert retention.run_disk_use(run.id) == before and store.path("runs/987654").exists()
    real = retention.gc(dry_run=False)

    # 4 rounds × 4 device weights (1000 B) + round 0's model of each task (10,000 B): the last 3
    # (MTFL_KEEP_LAST_CHECKPOINTS), the best (round 3) and the initial stay; and the orphan's file.
    assert [(e.experiment_id, e.files, e.bytes) for e in dry.entries] == [
        (experiment.id, 16 + 2, 16 * 1000 + 2 * 10_000),
        (None, 1, 500),
    ]
    assert [(e.experiment_id, e.files, e.bytes) for e in real.entries] == [
        (e.experiment_id, e.files, e.bytes) for e in dry.entries
    ]
    assert (real.files, real.bytes) == (19, 36_500)
    assert retention.run_disk_use(run.id).bytes == before.bytes - 36_000
    assert not store.path("runs/987654").exists()
    assert Assignment.objects.filter(round__run=run, weights_deleted_at__isnull=True).count() == 0
    assert Checkpoint.objects.filter(run=run, deleted_at__isnull=False).count() == 2
    assert retention.gc(dry_run=False).entries == []


def test_gc_counts_the_bytes_of_a_hard_linked_file_only_when_its_last_link_goes(make_experiment):
    store = get_store()
    experiment = make_experiment(name="linked", rounds=1, keep_last_checkpoints=1)
    run = _old_run(experiment, store, rounds=1)
    # the simulated backend links a device's weights to the model it passed through unchanged
    shard = experiment.shards.select_related("device").filter(num_samples__gt=0).first()
    linked = store.path(device_weights_key(run.id, 0, shard.device.name, shard.task_id))
    linked.unlink()
    os.link(store.path(global_weights_key(run.id, shard.task_id, None)), linked)

    report = retention.gc(dry_run=False)

    assert (report.files, report.bytes) == (4, 3 * 1000)
    assert store.path(global_weights_key(run.id, shard.task_id, None)).read_bytes() == b"i" * 100


def test_gc_leaves_runs_in_progress_to_their_rounds(make_experiment):
    store = get_store()
    run = _old_run(make_experiment(name="busy", rounds=4), store)
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)

    assert retention.gc(dry_run=True).entries == []


def test_mtfl_gc_prints_each_experiment_and_the_total(make_experiment):
    store = get_store()
    experiment = make_experiment(name="printed", rounds=4)
    _old_run(experiment, store)
    out = io.StringIO()

    call_command("gc", "--dry-run", stdout=out)
    dry = out.getvalue()
    out = io.StringIO()
    call_command("gc", stdout=out)

    assert f"printed (experiment {experiment.id})" in dry and "would free 35.2 KiB in 18 file(s)" in dry
    assert "freed 35.2 KiB in 18 file(s)" in out.getvalue()
    out = io.StringIO()
    call_command("gc", stdout=out)
    assert "nothing to free" in out.getvalue()


# --- deleting runs and experiments -----------------------------------------------------------------


@pytest.fixture
def lab(user, make_experiment):
    """The ``user`` fixture owns an experiment with a finished run (files on disk) and a running
    one; ``carol`` collaborates on it; ``oscar`` is an outsider."""
    User = get_user_model()
    carol = User.objects.create_user("carol", password="carol-pass-1")
    oscar = User.objects.create_user("oscar", password="oscar-pass-1")
    experiment = make_experiment(name="deletable", rounds=2)
    experiment.collaborators.add(carol)
    done = _old_run(experiment, get_store(), rounds=2)
    running = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.RUNNING, started_at=T0)
    get_store().write_bytes(f"runs/{running.id}/tasks/1/global/initial.safetensors", b"r")
    return {"experiment": experiment, "done": done, "running": running, "owner": user, "carol": carol, "oscar": oscar}


def test_the_owner_deletes_a_finished_run_with_its_rows_and_artifacts(lab, django_capture_on_commit_callbacks):
    run = lab["done"]
    with django_capture_on_commit_callbacks(execute=True):
        response = _api_for(lab["owner"]).delete(f"/api/runs/{run.id}/")

    assert response.status_code == 204, response.content
    assert not Run.objects.filter(id=run.id).exists()
    assert not Round.objects.filter(run_id=run.id).exists() and not Checkpoint.objects.filter(run_id=run.id).exists()
    assert not get_store().path(f"runs/{run.id}").exists()
    assert Experiment.objects.filter(id=lab["experiment"].id).exists()


def test_a_collaborator_may_not_delete_a_run_and_an_outsider_does_not_see_it(lab):
    run = lab["done"]
    refused = _api_for(lab["carol"]).delete(f"/api/runs/{run.id}/")
    hidden = _api_for(lab["oscar"]).delete(f"/api/runs/{run.id}/")

    assert refused.status_code == 403
    assert refused.json() == {
        "message": "only the experiment's owner can delete its runs",
        "errors": {"non_field_errors": ["only the experiment's owner can delete its runs"]},
    }
    assert hidden.status_code == 404
    assert Run.objects.filter(id=run.id).exists() and get_store().path(f"runs/{run.id}").exists()


def test_a_running_run_is_not_deleted_until_it_is_cancelled(lab, django_capture_on_commit_callbacks):
    run = lab["running"]
    response = _api_for(lab["owner"]).delete(f"/api/runs/{run.id}/")

    assert response.status_code == 409
    assert response.json()["errors"] == {
        "status": [f"run {run.id} is running: cancel it first (POST /api/runs/{run.id}/cancel/), then delete it"]
    }
    assert get_store().path(f"runs/{run.id}").exists()
    services.run_cancel(run=run)
    with django_capture_on_commit_callbacks(execute=True):
        assert _api_for(lab["owner"]).delete(f"/api/runs/{run.id}/").status_code == 204
    assert not get_store().path(f"runs/{run.id}").exists()


def test_an_experiment_is_deleted_by_its_owner_once_no_run_is_in_progress(lab, django_capture_on_commit_callbacks):
    experiment = lab["experiment"]
    tasks = list(experiment.tasks.values_list("id", flat=True))
    owner = _api_for(lab["owner"])

    busy = owner.delete(f"/api/experiments/{experiment.id}/")
    refused = _api_for(lab["carol"]).delete(f"/api/experiments/{experiment.id}/")
    assert (busy.status_code, refused.status_code) == (409, 403)
    assert busy.json()["errors"] == {
        "runs": [
            f"experiment {experiment.id} has runs in progress ({lab['running'].id}): cancel them first "
            "(POST /api/runs/{id}/cancel/), then delete it"
        ]
    }
    services.run_cancel(run=lab["running"])
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.delete(f"/api/experiments/{experiment.id}/")

    assert response.status_code == 204
    assert not Experiment.objects.filter(id=experiment.id).exists()
    assert not Run.objects.filter(id__in=[lab["done"].id, lab["running"].id]).exists()
    assert not any(get_store().path(f"runs/{r.id}").exists() for r in (lab["done"], lab["running"]))
    assert Task.objects.filter(id__in=tasks).count() == len(tasks)  # the catalogue keeps its tasks


def test_the_command_line_deletes_any_finished_run_and_reports_what_it_held(lab, django_capture_on_commit_callbacks):
    run = lab["done"]
    held = retention.run_disk_use(run.id)
    with django_capture_on_commit_callbacks(execute=True):
        assert retention.run_delete(run=run) == held
    assert held.files == 2 * 4 + 2 + 2 * 2  # device weights, initial models, global models
    assert not Run.objects.filter(id=run.id).exists()


# --- disk use and free space -------------------------------------------------------------------------


def test_storage_shows_the_total_the_free_space_and_each_visible_experiments_share(lab, make_experiment):
    theirs = lab["experiment"]
    hidden = make_experiment(
        name="someone-elses", owner=lab["oscar"], devices=list(theirs.devices.all()), tasks=list(theirs.tasks.all())
    )
    _old_run(hidden, get_store(), rounds=1)

    body = _api_for(lab["carol"]).get("/api/storage/").json()

    mine = retention.experiments_disk_use([lab["experiment"].id])[lab["experiment"].id]
    assert body["experiments"] == [
        {"experiment": lab["experiment"].id, "name": "deletable", "files": mine.files, "bytes": mine.bytes}
    ]
    assert mine.bytes == 2 * 4 * 1000 + 2 * 100 + 2 * 2 * 10_000 + 1  # weights, initial, models, the running run's
    assert body["bytes"] > mine.bytes and body["files"] > mine.files  # the other experiment's run too
    assert body["free_bytes"] > 0 and body["min_free_bytes"] == 1024**3
    assert body["artifact_root"] == str(get_store().root) and body["problem"] is None


def test_a_round_start_is_refused_below_the_free_space_threshold_with_a_message_naming_it(settings):
    settings.MTFL = {**getattr(settings, "MTFL", {}), "MIN_FREE_BYTES": 2**50}
    problem = storage_space_problem()

    root = get_store().root
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"ARTIFACT_ROOT {root} has ")
    assert f"below MTFL_MIN_FREE_BYTES={2**50} (1024.0 TiB): free space (`mtfl gc`" in problem
    settings.MTFL = {**settings.MTFL, "MIN_FREE_BYTES": 0}
    assert storage_space_problem() is None


# --- settings ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_retention_settings_are_checked_and_can_change_at_any_time(api, make_experiment):
    experiment = make_experiment(name="settings")
    assert (experiment.keep_device_weights, experiment.keep_last_checkpoints) == (False, None)
    Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.SUCCEEDED)

    bad = api.patch(f"/api/experiments/{experiment.id}/", {"keep_last_checkpoints": 0}, format="json")
    bad_flag = api.patch(f"/api/experiments/{experiment.id}/", {"keep_device_weights": "yes"}, format="json")
    good = api.patch(
        f"/api/experiments/{experiment.id}/",
        {"keep_device_weights": True, "keep_last_checkpoints": 5},
        format="json",
    )

    assert bad.status_code == 400 and bad.json()["message"] == (
        "keep_last_checkpoints: must be at least 1: allowed 1 to 10000"
    )
    assert bad_flag.status_code == 400 and bad_flag.json()["errors"] == {
        "keep_device_weights": ["must be true or false"]
    }
    assert good.status_code == 200, good.content
    assert (good.json()["keep_device_weights"], good.json()["keep_last_checkpoints"]) == (True, 5)
    with pytest.raises(ApplicationError, match=r"keep_last_checkpoints=20000 is out of range: allowed \[1, 10000\]"):
        services.experiment_update(experiment=experiment, keep_last_checkpoints=20_000)


def test_create_experiment_takes_the_retention_settings(api, make_device, make_task):
    devices = [make_device("dev-a")]
    task = make_task()
    response = api.post(
        "/api/experiments/",
        {
            "name": "kept",
            "tasks": [task.id],
            "devices": [d.id for d in devices],
            "rounds": 2,
            "keep_device_weights": True,
            "keep_last_checkpoints": 2,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert (response.json()["keep_device_weights"], response.json()["keep_last_checkpoints"]) == (True, 2)


def test_mtfl_create_experiment_sets_the_retention_policy(make_device, capsys):
    make_device("dev-a")
    call_command(
        "create_experiment",
        "--template",
        "light",
        "--devices",
        "dev-a",
        "--keep-device-weights",
        "--keep-last-checkpoints",
        "2",
    )

    experiment = Experiment.objects.get()
    assert (experiment.keep_device_weights, experiment.keep_last_checkpoints) == (True, 2)
    out = capsys.readouterr().out
    assert "retention: device weights kept; global checkpoints kept per run and task: the last 2, the best" in out


@pytest.mark.parametrize(
    "value,message",
    [
        ("0", "keep_last_checkpoints=0 is out of range: allowed [1, 10000]"),
        ("two", "--keep-last-checkpoints must be an integer, got 'two'"),
    ],
)
def test_mtfl_create_experiment_refuses_a_bad_retention_setting_in_one_line(make_device, value, message):
    from django.core.management.base import CommandError

    make_device("dev-a")
    with pytest.raises(CommandError) as error:
        call_command("create_experiment", "--template", "light", "--devices", "dev-a", "--keep-last-checkpoints", value)

    assert str(error.value) == message and error.value.returncode == 2
    assert not Experiment.objects.exists()


# --- the dashboard -----------------------------------------------------------------------------------


def _browser_for(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_the_index_shows_each_experiments_disk_use_and_the_total(lab):
    html = _browser_for(lab["owner"]).get("/").content.decode()

    use = retention.experiments_disk_use([lab["experiment"].id])[lab["experiment"].id]
    assert f'title="{use.files} files of its runs\' artifacts">{use.bytes / 1024:.1f}\xa0KB</td>' in html
    assert 'id="storage-total"' in html and "free" in html and 'id="storage-problem"' not in html


def test_the_index_warns_when_rounds_would_refuse_to_start(lab, settings):
    settings.MTFL = {**getattr(settings, "MTFL", {}), "MIN_FREE_BYTES": 2**50}
    html = _browser_for(lab["owner"]).get("/").content.decode()
    assert 'id="storage-problem"' in html and "below MTFL_MIN_FREE_BYTES" in html


def test_only_the_owner_sees_the_delete_buttons(lab):
    experiment, done = lab["experiment"], lab["done"]
    owner, carol = _browser_for(lab["owner"]), _browser_for(lab["carol"])

    mine = owner.get(f"/experiments/{experiment.id}/").content.decode()
    theirs = carol.get(f"/experiments/{experiment.id}/").content.decode()
    run_page = owner.get(f"/runs/{done.id}/").content.decode()

    assert 'id="delete-experiment"' in mine and 'id="delete-experiment"' not in theirs
    assert f'action="/runs/{done.id}/delete/"' in mine and f'action="/runs/{done.id}/delete/"' not in theirs
    assert f'action="/runs/{lab["running"].id}/delete/"' not in mine  # in progress: cancel, not delete
    assert 'id="delete-run"' in run_page and "data-confirm=" in run_page
    assert 'id="delete-run"' not in carol.get(f"/runs/{done.id}/").content.decode()
    assert 'id="experiment-disk"' in mine and 'id="run-disk"' in run_page


def test_deleting_a_run_from_its_page_returns_to_the_experiment_saying_what_was_freed(
    lab, django_capture_on_commit_callbacks
):
    done = lab["done"]
    refused = _browser_for(lab["carol"]).post(f"/runs/{done.id}/delete/")
    assert (
        refused.status_code == 403
        and "only the experiment&#x27;s owner can delete its runs" in refused.content.decode()
    )

    with django_capture_on_commit_callbacks(execute=True):
        response = _browser_for(lab["owner"]).post(f"/runs/{done.id}/delete/", follow=True)

    assert response.redirect_chain == [(f"/experiments/{lab['experiment'].id}/", 302)]
    assert f"Run {done.id} deleted: 47.1 KiB of artifacts freed." in response.content.decode()
    assert not Run.objects.filter(id=done.id).exists() and not get_store().path(f"runs/{done.id}").exists()


def test_deleting_an_experiment_from_its_page_needs_its_runs_ended(lab, django_capture_on_commit_callbacks):
    experiment = lab["experiment"]
    owner = _browser_for(lab["owner"])

    busy = owner.post(f"/experiments/{experiment.id}/delete/")
    assert busy.status_code == 409 and 'id="delete-error"' in busy.content.decode()
    services.run_cancel(run=lab["running"])
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post(f"/experiments/{experiment.id}/delete/", follow=True)

    assert response.redirect_chain == [("/", 302)]
    assert "Experiment &#x27;deletable&#x27; deleted" in response.content.decode()
    assert not Experiment.objects.filter(id=experiment.id).exists()


def test_the_experiment_form_sets_the_retention_policy(make_device, make_task, user):
    devices = [make_device("dev-a")]
    task = make_task()
    form = {
        "name": "kept-from-the-form",
        "tasks": [task.id],
        "devices": [d.id for d in devices],
        "rounds": "2",
        "partition_rule": "iid",
        "keep_device_weights": "on",
        "keep_last_checkpoints": "4",
    }
    response = _browser_for(user).post("/experiments/new/", form)

    experiment = Experiment.objects.get(name="kept-from-the-form")
    assert response.status_code == 302
    assert (experiment.keep_device_weights, experiment.keep_last_checkpoints) == (True, 4)
    bad = _browser_for(user).post("/experiments/new/", {**form, "name": "bad", "keep_last_checkpoints": "0"})
    assert bad.status_code == 400 and "must be at least 1: allowed 1 to 10000" in bad.content.decode()


def test_the_experiment_export_names_its_retention_policy(browser_client, make_experiment):
    import json

    experiment = make_experiment(name="exported", keep_last_checkpoints=7)
    response = browser_client.get(f"/experiments/{experiment.id}/results.json")
    summary = json.loads(b"".join(response.streaming_content))["experiment"]

    assert (summary["keep_device_weights"], summary["keep_last_checkpoints"]) == (False, 7)
