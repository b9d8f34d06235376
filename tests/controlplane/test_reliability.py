"""Reliability of the round protocol (controlplane/experiments/services/reliability.py):
deadlines from the predicted round time, lost agents, retries with idempotency keys, stragglers,
cancellation and resuming after a control-plane restart.

Device results are what agents send (the message schema is the process boundary); the result
backend is Celery's in-memory one, where the tests put what an agent's task would have stored
under its id; the messages the control plane sends are captured at the dispatch boundary.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from django.utils import timezone

from controlplane.celery import app
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.fleet.models import Device
from workers.fl.artifacts import device_weights_key, get_store
from workers.fl.fedavg import load_state, save_state
from workers.protocol.messages import round_idempotency_key
from workers.protocol.queues import CANCELLED_STATE, cancel_marker_id

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    """What the control plane sends through :mod:`dispatch`, captured instead of queued."""
    log: dict[str, list] = {"watchdog": [], "device_round": [], "round_enqueue": [], "round": [], "run_begin": []}
    monkeypatch.setattr(
        dispatch,
        "send_round_watchdog",
        lambda round_id, *, countdown_s: log["watchdog"].append((round_id, countdown_s)),
    )
    monkeypatch.setattr(
        dispatch, "send_device_round", lambda request, *, task_id: log["device_round"].append((request, task_id))
    )
    monkeypatch.setattr(
        dispatch, "send_round_enqueue", lambda run_id, index: log["round_enqueue"].append((run_id, index))
    )
    monkeypatch.setattr(dispatch, "send_run_begin", lambda run_id: log["run_begin"].append(run_id))
    monkeypatch.setattr(
        dispatch,
        "send_round",
        lambda round_id, requests, *, task_ids, check_after_s: log["round"].append(
            (round_id, requests, task_ids, check_after_s)
        ),
    )
    return log


@pytest.fixture
def running_round(make_experiment, make_device, make_task, django_capture_on_commit_callbacks, sent):
    """A sharing run of one task on dev-a (30 samples) and dev-b (10), P_alone recorded, round 0
    dispatched (captured)."""

    def start(*, rounds: int = 1, device_retries: int = 0):
        devices = [make_device("dev-a"), make_device("dev-b")]
        task = make_task("t-mobilenet", "mobilenet_v3_small")
        counts = [
            {"device": devices[0].id, "task": task.id, "num_samples": 30},
            {"device": devices[1].id, "task": task.id, "num_samples": 10},
        ]
        experiment = make_experiment(
            devices=devices,
            tasks=[task],
            counts=counts,
            partition_rule="explicit",
            rounds=rounds,
            device_retries=device_retries,
        )
        with django_capture_on_commit_callbacks(execute=True):
            run = services.run_create(experiment=experiment, strategy="sharing")
        services.run_begin(run_id=run.id)
        standalone = [
            {
                "run_id": run.id,
                "device": d.name,
                "status": "succeeded",
                "measurements": [{"task_id": task.id, "batch_size": n, "throughput_sps": 100.0}],
            }
            for d, n in zip(devices, (30, 10), strict=True)
        ]
        with django_capture_on_commit_callbacks(execute=True):
            services.standalone_record(run_id=run.id, results=standalone)
        return run, Round.objects.get(run=run, index=0)

    return start


def _task_id(rnd: Round, device: str) -> str:
    return Assignment.objects.filter(round=rnd, device__name=device).values_list("device_task_id", flat=True).get()


def _result(rnd: Round, device: str, *, scale: float = 1.0, attempt: int = 0, failed: bool = False) -> dict:
    """A device's result as its agent sends it, its weights the initial model × ``scale``,
    written where the round told the device to write them."""
    store = get_store()
    a = Assignment.objects.select_related("task").get(round=rnd, device__name=device)
    initial = load_state(store.path(Checkpoint.objects.get(run=rnd.run, task=a.task, round=None).artifact_path))
    key = device_weights_key(rnd.run_id, rnd.index, device, a.task_id)
    sha = save_state(
        {k: (v * scale).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in initial.items()}, store.path(key)
    )
    return {
        "run_id": rnd.run_id,
        "round_id": rnd.id,
        "device": device,
        "status": "failed" if failed else "succeeded",
        "error": "RuntimeError: boom" if failed else "",
        "attempt": attempt,
        "idempotency_key": round_idempotency_key(rnd.id, device, attempt),
        "assignments": [
            {
                "assignment_id": a.id,
                "task_id": a.task_id,
                "status": "failed" if failed else "succeeded",
                "samples_trained": 0 if failed else a.samples,
                "seconds": 2.0,
                "throughput_sps": None if failed else 50.0,
                "started_at": 1000.0,
                "finished_at": 1002.0,
                "weights": None if failed else key,
                "weights_sha256": None if failed else sha,
            }
        ],
    }


def _averaged_over_initial(run: Run, rnd: Round) -> float:
    """The round's global model as a multiple of the initial one (on a large float tensor)."""
    store = get_store()
    initial = load_state(store.path(Checkpoint.objects.get(run=run, round=None).artifact_path))
    averaged = load_state(store.path(Checkpoint.objects.get(run=run, round=rnd).artifact_path))
    key = next(k for k, v in initial.items() if v.dtype == np.float32 and np.count_nonzero(v) > 100)
    nonzero = initial[key] != 0
    return float(np.median(averaged[key][nonzero] / initial[key][nonzero]))


def _heartbeat(name: str, seconds_ago: float, *, pid: int | None = None) -> None:
    device = Device.objects.get(name=name)
    device.last_heartbeat_at = timezone.now() - dt.timedelta(seconds=seconds_ago)
    if pid is not None:
        device.inventory = {**device.inventory, "agent_pid": pid}
    device.save()


# ----------------------------------------------------------------------------- deadlines


def test_deadline_is_the_factor_times_the_predicted_round_time_never_below_the_floor(settings):
    settings.MTFL = {
        **settings.MTFL,
        "DEADLINE_FACTOR": 3.0,
        "ROUND_DEADLINE_FLOOR_S": 60.0,
        "ROUND_DEADLINE_S": 1800.0,
    }
    assert services.round_deadline_s(predicted_round_time_s=100.0) == 300.0
    assert services.round_deadline_s(predicted_round_time_s=100.0, factor=1.5) == 150.0
    assert services.round_deadline_s(predicted_round_time_s=5.0) == 60.0  # the floor
    assert services.round_deadline_s(predicted_round_time_s=None) == 1800.0  # no prediction


def test_round_start_stores_the_deadline_and_one_task_id_per_device(running_round, sent):
    run, rnd = running_round()
    assert rnd.deadline_s == 1800.0  # a baseline: no predicted round time
    # counted from the training dispatch, after the lease (started_at) and P_alone
    assert rnd.started_at + dt.timedelta(seconds=1800) <= rnd.deadline_at <= timezone.now() + dt.timedelta(seconds=1800)
    ((round_id, requests, task_ids, check_after_s),) = sent["round"]
    assert round_id == rnd.id and check_after_s == 30.0
    assert task_ids == {"dev-a": _task_id(rnd, "dev-a"), "dev-b": _task_id(rnd, "dev-b")}
    assert len(set(task_ids.values())) == 2
    assert {(r.device, r.attempt, r.idempotency_key) for r in requests} == {
        ("dev-a", 0, f"round-{rnd.id}/dev-a/attempt-0"),
        ("dev-b", 0, f"round-{rnd.id}/dev-b/attempt-0"),
    }


# ---------------------------------------------------------------------------- agent loss


def test_watchdog_waits_before_the_deadline_and_rearms(running_round, sent, django_capture_on_commit_callbacks):
    run, rnd = running_round()
    with django_capture_on_commit_callbacks(execute=True):
        assert services.round_watchdog(round_id=rnd.id) is None
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.RUNNING
    assert sent["watchdog"] == [(rnd.id, 30.0)]


def test_a_silent_agent_is_failed_with_the_cause_and_the_round_is_partial(running_round, sent):
    # dev-a answered (its result waits in the result backend: the chord cannot complete without
    # dev-b), dev-b's agent was killed: no heartbeat for longer than MTFL_HEARTBEAT_OFFLINE_S.
    run, rnd = running_round()
    app.backend.store_result(_task_id(rnd, "dev-a"), _result(rnd, "dev-a", scale=3.0), "SUCCESS")
    _heartbeat("dev-a", 1)
    _heartbeat("dev-b", 120)

    services.round_watchdog(round_id=rnd.id)

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL
    lost = Assignment.objects.get(round=rnd, device__name="dev-b")
    assert lost.status == Assignment.Status.FAILED
    assert lost.error.startswith("agent lost: no heartbeat from device dev-b for 1")
    assert "dev-b: agent lost" in rnd.error
    assert _averaged_over_initial(run, rnd) == pytest.approx(3.0, rel=1e-5)  # dev-a alone
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED  # the run went on (and ended: one round)


def test_a_restarted_agent_is_lost_and_its_device_is_retried_within_the_budget(
    running_round, sent, django_capture_on_commit_callbacks
):
    run, rnd = running_round(device_retries=1)
    old_id = _task_id(rnd, "dev-b")
    app.backend.store_result(old_id, {"pid": 111, "hostname": "host-b"}, "STARTED")
    _heartbeat("dev-b", 0, pid=222)  # a new agent process registered for dev-b

    with django_capture_on_commit_callbacks(execute=True):
        assert services.round_watchdog(round_id=rnd.id) is None

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.RUNNING
    assert any(
        "dev-b: attempt 0 failed (agent lost: the agent process that started this round on device dev-b "
        "(pid 111 on host-b) is gone"
        in f
        and f.endswith("retried as attempt 1")
        for f in rnd.flags
    )
    retried = Assignment.objects.get(round=rnd, device__name="dev-b")
    assert retried.attempt == 1 and retried.device_task_id not in ("", old_id)
    ((request, task_id),) = sent["device_round"]
    assert task_id == retried.device_task_id
    assert (request.device, request.attempt, request.idempotency_key) == ("dev-b", 1, f"round-{rnd.id}/dev-b/attempt-1")
    assert [a.assignment_id for a in request.assignments] == [retried.id]
    assert app.backend.get_task_meta(cancel_marker_id(old_id))["status"] == CANCELLED_STATE
    # a second check racing the first retries nothing more
    with django_capture_on_commit_callbacks(execute=True):
        services.round_watchdog(round_id=rnd.id)
    assert len(sent["device_round"]) == 1


def test_results_are_recorded_once_per_device_and_only_from_its_current_attempt(
    running_round, sent, django_capture_on_commit_callbacks
):
    run, rnd = running_round(device_retries=1)
    app.backend.store_result(_task_id(rnd, "dev-b"), _result(rnd, "dev-b", failed=True), "SUCCESS")
    with django_capture_on_commit_callbacks(execute=True):
        services.round_watchdog(round_id=rnd.id)  # dev-b failed: retried as attempt 1
    assert Assignment.objects.get(round=rnd, device__name="dev-b").attempt == 1

    stale = _result(rnd, "dev-b", scale=5.0, attempt=0)  # the superseded attempt, answering late
    current = _result(rnd, "dev-b", scale=2.0, attempt=1)
    forged = {**current, "idempotency_key": f"round-{rnd.id}/dev-a/attempt-1"}
    services.round_settle(round_id=rnd.id, results=[stale, forged, _result(rnd, "dev-a", scale=1.0), current, current])

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.SUCCEEDED
    # (30 × 1 W + 10 × 2 W) / 40: dev-b's attempt 1 counted once; attempt 0 never
    assert _averaged_over_initial(run, rnd) == pytest.approx(1.25, rel=1e-5)
    assert rnd.samples_trained == 40


def test_a_straggler_past_the_deadline_is_excluded_flagged_and_stopped(
    running_round, sent, django_capture_on_commit_callbacks
):
    run, rnd = running_round()
    app.backend.store_result(_task_id(rnd, "dev-a"), _result(rnd, "dev-a"), "SUCCESS")
    services.round_progress(round_id=rnd.id, device="dev-b", phase="started")  # dev-b trains, alive
    now = rnd.deadline_at + dt.timedelta(seconds=1)
    Device.objects.update(last_heartbeat_at=now)

    with django_capture_on_commit_callbacks(execute=True):
        services.round_watchdog(round_id=rnd.id, now=now)

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL
    straggler = Assignment.objects.get(round=rnd, device__name="dev-b")
    assert straggler.error == (
        "straggler: device dev-b was still training at the round deadline (1800 s, "
        "MTFL_ROUND_DEADLINE_S); excluded from this round's aggregate"
    )
    assert (
        "straggler: dev-b missed the deadline (1800 s, MTFL_ROUND_DEADLINE_S) and was left out of the aggregate"
        in rnd.flags
    )
    marker = app.backend.get_task_meta(cancel_marker_id(straggler.device_task_id))
    assert marker["status"] == CANCELLED_STATE and "passed its deadline" in marker["result"]["reason"]
    assert rnd.samples_trained == 30  # dev-a only


# ------------------------------------------------------------------------ cancel and resume


def test_cancelling_a_run_cancels_its_round_and_marks_its_device_tasks(
    running_round, django_capture_on_commit_callbacks
):
    run, rnd = running_round(rounds=2)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run=run)
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.CANCELLED
    for device in ("dev-a", "dev-b"):
        marker = app.backend.get_task_meta(cancel_marker_id(_task_id(rnd, device)))
        assert marker["status"] == CANCELLED_STATE
        assert marker["result"]["reason"] == "cancelled: the run was cancelled by a user"


def test_resume_redoes_an_aggregation_its_worker_abandoned_and_rechecks_running_rounds(
    running_round, sent, django_capture_on_commit_callbacks
):
    run, rnd = running_round()
    booted = time.time()
    Round.objects.filter(id=rnd.id).update(
        status=Round.Status.AGGREGATING,
        claimed_by="control@host",
        aggregating_at=timezone.now() - dt.timedelta(seconds=5),
    )
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.runs_resume(nodename="control@other", booted_at=booted)
    assert counts["reclaimed"] == 0  # another worker's, and recent: it may still be at work
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.runs_resume(nodename="control@host", booted_at=booted)
    assert counts["reclaimed"] == 1 and counts["rechecked"] == 1
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.RUNNING
    assert sent["watchdog"] == [(rnd.id, 0.0)]
    # the check then records it from the result backend
    for device in ("dev-a", "dev-b"):
        app.backend.store_result(_task_id(rnd, device), _result(rnd, device), "SUCCESS")
    services.round_watchdog(round_id=rnd.id)
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.SUCCEEDED


def test_resume_sends_the_next_round_of_a_run_whose_round_start_was_lost(
    running_round, sent, django_capture_on_commit_callbacks
):
    run, rnd = running_round(rounds=2)
    services.round_record(round_id=rnd.id, results=[_result(rnd, "dev-a"), _result(rnd, "dev-b")])
    sent["round_enqueue"].clear()  # ROUND_ENQUEUE was lost with the worker
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.runs_resume()
    assert counts["advanced"] == 1
    assert sent["round_enqueue"] == [(run.id, 1)]


def test_the_visibility_timeout_must_exceed_the_round_deadline():
    env = {**os.environ, "MTFL_ROUND_DEADLINE_S": "30000", "MTFL_BROKER_VISIBILITY_TIMEOUT_S": "21600"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "MTFL_BROKER_VISIBILITY_TIMEOUT_S (21600 s) must exceed MTFL_ROUND_DEADLINE_S (30000 s)" in done.stderr
