"""The round protocol's services: recording device results, FedAvg over the devices that
succeeded, metrics, partial and failed rounds, the watchdog, duplicate deliveries.

Device results are built here as the agents would send them (the message schema is the
process boundary); weights are real safetensors files derived from the real initial model.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run, StandaloneThroughput
from workers.fl.artifacts import device_weights_key, get_store
from workers.fl.fedavg import load_state, save_state

pytestmark = pytest.mark.django_db


def _device_results(rnd: Round, *, failed: set[str] = frozenset(), scale: dict[str, float] | None = None) -> list[dict]:
    """Results as agents send them: each device's weights = initial weights × its scale."""
    store = get_store()
    results = {}
    for a in rnd.assignments.select_related("device", "task"):
        initial = Checkpoint.objects.get(run=rnd.run, task=a.task, round=None)
        state = load_state(store.path(initial.artifact_path))
        factor = (scale or {}).get(a.device.name, 1.0)
        state = {k: (v * factor).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in state.items()}
        key = device_weights_key(rnd.run_id, rnd.index, a.device.name, a.task_id)
        sha = save_state(state, store.path(key))
        ok = a.device.name not in failed
        entry = results.setdefault(
            a.device.name,
            {
                "run_id": rnd.run_id,
                "round_id": rnd.id,
                "device": a.device.name,
                "status": "succeeded" if ok else "failed",
                "error": "" if ok else f"task {a.task.name} failed: RuntimeError: boom",
                "assignments": [],
            },
        )
        entry["assignments"].append(
            {
                "assignment_id": a.id,
                "task_id": a.task_id,
                "status": "succeeded" if ok else "failed",
                "error": "" if ok else "RuntimeError: boom",
                "samples_trained": a.samples if ok else 0,
                "seconds": 2.0,
                "throughput_sps": 50.0 if ok else None,
                "train_loss": 1.5,
                "started_at": 1000.0 + (0.5 if a.device.name == "dev-b" else 0.0),
                "finished_at": 1003.0 + (1.0 if a.device.name == "dev-b" else 0.0),
                "weights": key if ok else None,
                "weights_sha256": sha if ok else None,
            }
        )
    return list(results.values())


def test_round_is_planned_with_standalone_throughput(started_round):
    run, rnd = started_round()
    assert rnd.status == Round.Status.RUNNING
    rows = list(rnd.assignments.order_by("device__name"))
    assert [(a.batch_size, a.active_thread_percentage, a.samples) for a in rows] == [(30, 100, 30), (10, 100, 10)]
    assert all(a.standalone_throughput_sps == 100.0 for a in rows)
    assert Checkpoint.objects.filter(run=run, round=None).count() == 1
    assert StandaloneThroughput.objects.filter(run=run).count() == 2


def test_round_finish_averages_by_samples_and_records_metrics(started_round):
    run, rnd = started_round()
    services.round_record(round_id=rnd.id, results=_device_results(rnd, scale={"dev-a": 1.0, "dev-b": 2.0}))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.SUCCEEDED
    assert rnd.round_time_s == pytest.approx(4.0)  # 1000.0 → 1004.0
    assert rnd.samples_trained == 40
    assert rnd.fl_throughput_sps == pytest.approx(10.0)
    assert rnd.raw_throughput_sps == pytest.approx(50.0)  # one task per device at 50 samples/s
    assert rnd.fair_throughput == pytest.approx(0.5)  # 50 / P_alone 100
    store = get_store()
    initial = load_state(store.path(Checkpoint.objects.get(run=run, round=None).artifact_path))
    ckpt = Checkpoint.objects.get(run=run, round=rnd)
    averaged = load_state(store.path(ckpt.artifact_path))
    key = next(k for k, v in initial.items() if v.dtype == np.float32 and v.size > 100)
    # weights 30 and 10: (30 × W + 10 × 2W) / 40 = 1.25 W
    np.testing.assert_allclose(averaged[key], 1.25 * initial[key], rtol=1e-6)
    assert 0.0 <= ckpt.test_accuracy <= 1.0
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert run.raw_throughput_sps == pytest.approx(50.0)


def test_failed_device_makes_round_partial_and_stays_out_of_fedavg(started_round):
    run, rnd = started_round()
    services.round_record(round_id=rnd.id, results=_device_results(rnd, failed={"dev-b"}, scale={"dev-a": 3.0}))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL
    assert "dev-b" in rnd.error and "boom" in rnd.error
    failed = Assignment.objects.get(round=rnd, device__name="dev-b")
    assert failed.status == Assignment.Status.FAILED and "boom" in failed.error
    store = get_store()
    initial = load_state(store.path(Checkpoint.objects.get(run=run, round=None).artifact_path))
    averaged = load_state(store.path(Checkpoint.objects.get(run=run, round=rnd).artifact_path))
    key = next(k for k, v in initial.items() if v.dtype == np.float32 and v.size > 100)
    np.testing.assert_allclose(averaged[key], 3.0 * initial[key], rtol=1e-6)  # dev-a alone
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED


def test_every_device_failing_fails_the_round_and_the_run(started_round):
    run, rnd = started_round(rounds=3)
    services.round_record(round_id=rnd.id, results=_device_results(rnd, failed={"dev-a", "dev-b"}))
    rnd.refresh_from_db()
    run.refresh_from_db()
    assert rnd.status == Round.Status.FAILED
    assert run.status == Run.Status.FAILED and "round 0 failed" in run.error
    assert not Round.objects.filter(run=run, index=1).exists()


def test_task_without_a_successful_device_keeps_its_model_and_is_flagged(started_round, make_task):
    tasks = [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")]

    def counts(devices, tasks):  # dev-a holds both tasks, dev-b only the first
        a, b = devices
        return [
            {"device": a.id, "task": tasks[0].id, "num_samples": 20},
            {"device": a.id, "task": tasks[1].id, "num_samples": 20},
            {"device": b.id, "task": tasks[0].id, "num_samples": 20},
        ]

    run, rnd = started_round(tasks=tasks, counts_fn=counts)
    services.round_record(round_id=rnd.id, results=_device_results(rnd, failed={"dev-a"}))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL
    assert any("t-shufflenet" in flag and "previous global model was kept" in flag for flag in rnd.flags)
    kept = Checkpoint.objects.get(run=run, round=rnd, task=tasks[1])
    assert kept.kept_previous
    assert kept.artifact_path == Checkpoint.objects.get(run=run, round=None, task=tasks[1]).artifact_path


def test_watchdog_fails_devices_that_did_not_report_and_late_results_are_ignored(started_round):
    run, rnd = started_round()
    results = _device_results(rnd)
    assert services.round_watchdog(round_id=rnd.id) is None  # before the deadline: it waits
    services.round_watchdog(round_id=rnd.id, now=rnd.deadline_at + dt.timedelta(seconds=1))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.FAILED
    assert "round deadline" in rnd.error
    assert set(rnd.assignments.values_list("status", flat=True)) == {Assignment.Status.FAILED}
    assert services.round_record(round_id=rnd.id, results=results) is None
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED


def test_duplicate_round_finish_is_recorded_once(started_round):
    run, rnd = started_round()
    results = _device_results(rnd)
    assert services.round_record(round_id=rnd.id, results=results) is not None
    assert services.round_record(round_id=rnd.id, results=results) is None
    assert Checkpoint.objects.filter(run=run, round=rnd).count() == 1


def test_next_round_starts_after_a_round_finishes(started_round, django_capture_on_commit_callbacks):
    run, rnd = started_round(rounds=2)
    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    services.round_enqueue(run_id=run.id, index=1)
    nxt = Round.objects.get(run=run, index=1)
    assert nxt.status == Round.Status.RUNNING
    assert services.round_enqueue(run_id=run.id, index=1) is None  # duplicate delivery


def test_cancelled_run_starts_no_further_round(started_round):
    run, rnd = started_round(rounds=2)
    services.run_cancel(run=run)
    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.CANCELLED  # its trainers were stopped: a late result is ignored
    assert set(rnd.assignments.values_list("error", flat=True)) == {"cancelled: the run was cancelled by a user"}
    assert services.round_enqueue(run_id=run.id, index=1) is None
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_standalone_watchdog_starts_round_zero_and_flags_missing_p_alone(
    make_experiment, django_capture_on_commit_callbacks
):
    experiment = make_experiment()
    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_create(experiment=experiment, strategy="isolation")
    services.run_begin(run_id=run.id)
    device_a = experiment.devices.get(name="dev-a")
    for shard in experiment.shards.filter(device=device_a):  # only dev-a answered before the deadline
        StandaloneThroughput.objects.create(
            run=run, device=device_a, task=shard.task, batch_size=shard.num_samples, throughput_sps=80.0
        )
    services.standalone_watchdog(run_id=run.id)
    rnd = Round.objects.get(run=run, index=0)
    assert rnd.status == Round.Status.RUNNING
    assert len(rnd.flags) == 2 and all("dev-b" in f and "unknown" in f for f in rnd.flags)
    missing = StandaloneThroughput.objects.filter(run=run, device__name="dev-b")
    assert missing.count() == 2 and all("no standalone measurement" in m.error for m in missing)
    services.standalone_watchdog(run_id=run.id)  # a second firing changes nothing
    assert Round.objects.filter(run=run).count() == 1


def test_weights_reported_anywhere_but_the_devices_own_key_fail_the_device(started_round):
    """Agents on other hosts can only upload to their own device's keys (agent tokens), so a
    result pointing elsewhere, e.g. at another device's upload, is refused, not averaged."""
    run, rnd = started_round()
    results = _device_results(rnd)
    forged = next(r for r in results if r["device"] == "dev-b")
    other = next(r for r in results if r["device"] == "dev-a")
    forged["assignments"][0]["weights"] = other["assignments"][0]["weights"]
    forged["assignments"][0]["weights_sha256"] = other["assignments"][0]["weights_sha256"]
    services.round_record(round_id=rnd.id, results=results)
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL and "not at this device's key" in rnd.error
    assert rnd.samples_trained == 30  # dev-a's shard only
    forged_row = Assignment.objects.get(round=rnd, device__name="dev-b")
    assert forged_row.status == Assignment.Status.FAILED and "dev-b" in forged_row.error


def test_a_request_naming_what_the_registries_do_not_know_is_refused_as_it_is_built(started_round, monkeypatch):
    """Names are checked where a device's request is built, inside the transaction that stores the
    round (a retry's, or the round's dispatch), not later in an on-commit send that could leave a
    round running with nothing sent."""
    from pydantic import ValidationError

    from controlplane.experiments.services.rounds.requests import round_device_request_load
    from workers.registry import names
    from workers.registry.base import Registry
    from workers.registry.models import Model

    _, rnd = started_round()
    device_id = rnd.assignments.values_list("device_id", flat=True).first()
    assert round_device_request_load(rnd=rnd, device_id=device_id, attempt=1).assignments  # known: built

    monkeypatch.setitem(names.REGISTRIES, "model", Registry("model", "mtfl.test-no-models", Model))
    with pytest.raises(ValidationError, match="architecture"):
        round_device_request_load(rnd=rnd, device_id=device_id, attempt=1)


def test_messages_queued_under_the_previous_task_names_are_still_served(monkeypatch):
    """An upgrade does not drop what the previous release queued: ``mtfl.round_start`` and a chord
    callback signed ``mtfl.round_finish`` reach the same services as the renamed tasks."""
    from controlplane.celery import app
    from controlplane.experiments import tasks
    from workers.protocol.queues import TaskName

    called: list[tuple] = []
    monkeypatch.setattr(services, "round_enqueue", lambda **kw: called.append(("enqueue", kw)))
    monkeypatch.setattr(services, "round_settle", lambda **kw: called.append(("settle", kw["round_id"])))

    app.tasks["mtfl.round_start"].apply(args=[7, 2])
    app.tasks["mtfl.round_finish"].apply(args=[[], 9])

    assert called == [("enqueue", {"run_id": 7, "index": 2}), ("settle", 9)]
    assert set(tasks.PREVIOUS_TASK_NAMES) == {TaskName.ROUND_ENQUEUE, TaskName.ROUND_SETTLE}
