"""Aggregation with a server state in the control plane (issue 23), and resuming it after the
control worker died.

The rounds are driven through the control plane's own services (``round_enqueue``,
``round_record``, ``runs_resume``) with device results as agents send them and weights files of
the run's real models (mobilenet_v3_small, shufflenet_v2_x1_0) written where the round told
each device to write. Messages the control plane sends are captured at the dispatch boundary.

Resume: a run fed recorded device updates ends with bit-identical global models and server
states whether its control worker ran it through, or was "killed" between rounds and in the
middle of an aggregation — the rounds after the kill are run by fresh Python processes
(:func:`restarted_control_worker`) that share nothing with the test's process but the database
and the artifact store, as a restarted control worker does.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from django.utils import timezone

from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.rounds.requests import round_device_request_load
from controlplane.storage.services.retention import retention_after_round
from tests.conftest import in_a_fresh_django_process
from tests.controlplane import stateful_aggregator
from workers.fl.artifacts import (
    device_weights_key,
    get_store,
    parse_global_weights_key,
    server_state_key,
    sha256_file,
)
from workers.fl.fedavg import load_state, save_state
from workers.protocol.messages import round_idempotency_key

MOMENTUM = stateful_aggregator.NAME
MOMENTUM_DEFAULTS = {"server_learning_rate": 1.0, "server_momentum": 0.9, "mu": 0.0}


# --- driving rounds ------------------------------------------------------------------------------


def capture_dispatch(target) -> dict[str, list]:
    """Replace what the control plane sends through :mod:`dispatch` with recorders (``target``:
    pytest's ``monkeypatch``, or anything with its ``setattr``)."""
    sent: dict[str, list] = defaultdict(list)
    target.setattr(dispatch, "send_run_begin", lambda run_id: sent["run_begin"].append(run_id))
    target.setattr(dispatch, "send_round_enqueue", lambda run_id, index: sent["round_enqueue"].append((run_id, index)))
    target.setattr(
        dispatch,
        "send_round",
        lambda round_id, requests, *, task_ids, check_after_s: sent["round"].append((round_id, requests)),
    )
    target.setattr(dispatch, "send_round_watchdog", lambda round_id, *, countdown_s: sent["watchdog"].append(round_id))
    target.setattr(dispatch, "send_standalone", lambda *a, **kw: sent["standalone"].append(a))
    target.setattr(dispatch, "send_standalone_watchdog", lambda *a, **kw: None)

    def retention(run_id: int, index: int) -> None:
        # At once, as the control worker's other slot runs RUN_RETENTION beside the next round.
        sent["retention"].append((run_id, index))
        retention_after_round(run_id, index)

    target.setattr(dispatch, "send_run_retention", retention)
    return sent


def standalone_at_100_sps(run: Run, devices) -> list[dict]:
    """Every device's ``P_alone`` result for ``run``: 100 samples/s for each task it holds data
    of, at the batch sizes a round may plan (128, or the shard's size when smaller)."""
    return [
        {
            "run_id": run.id,
            "device": d.name,
            "status": "succeeded",
            "measurements": [
                {"task_id": s.task_id, "batch_size": b, "throughput_sps": 100.0}
                for s in run.experiment.shards.filter(device=d, num_samples__gt=0)
                for b in (min(128, s.num_samples), 128)
            ],
        }
        for d in devices
    ]


def begin(experiment, strategy: str = "sharing") -> Run:
    """Create and begin a run (initial models), record ``P_alone`` (100 samples/s at every
    batch size), which starts round 0."""
    run = services.run_create(experiment=experiment, strategy=strategy)
    services.run_begin(run_id=run.id)
    services.standalone_record(run_id=run.id, results=standalone_at_100_sps(run, experiment.devices.order_by("id")))
    return run


def device_results(rnd: Round, weights: dict[tuple[str, str], bytes], *, failed: frozenset[str] = frozenset()):
    """Every device's result for ``rnd`` as its agent sends it: each assignment's weights are
    ``weights[(device name, task name)]`` (a safetensors file's bytes), written at the device's key;
    a device in ``failed`` reports its trainers failed."""
    store = get_store()
    by_device: dict[str, list[Assignment]] = defaultdict(list)
    for a in rnd.assignments.select_related("device", "task").order_by("device__name", "task_id"):
        by_device[a.device.name].append(a)
    results = []
    for name, rows in by_device.items():
        entries = []
        for a in rows:
            entry = {
                "assignment_id": a.id,
                "task_id": a.task_id,
                "status": "failed" if name in failed else "succeeded",
                "samples_trained": 0 if name in failed else a.samples,
                "seconds": 2.0,
                "throughput_sps": None if name in failed else 50.0,
                "started_at": 1000.0,
                "finished_at": 1002.0,
            }
            if name not in failed:
                key = device_weights_key(rnd.run_id, rnd.index, name, a.task_id)
                path = store.path(key)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(weights[(name, a.task.name)])
                entry |= {"weights": key, "weights_sha256": sha256_file(path)}
            entries.append(entry)
        results.append(
            {
                "run_id": rnd.run_id,
                "round_id": rnd.id,
                "device": name,
                "status": "failed" if name in failed else "succeeded",
                "error": "RuntimeError: boom" if name in failed else "",
                "attempt": rows[0].attempt,
                "idempotency_key": round_idempotency_key(rnd.id, name, rows[0].attempt),
                "assignments": entries,
            }
        )
    return results


def global_state(run: Run, task_name: str, index: int | None) -> dict[str, np.ndarray]:
    """A task's global model after round ``index`` (``None``: the initial one)."""
    ckpt = Checkpoint.objects.get(run=run, task__name=task_name, round__index=index)
    return load_state(get_store().path(ckpt.artifact_path))


def trained(previous: dict[str, np.ndarray], *, seed: int, scale: float = 0.01, steps: int = 3) -> bytes:
    """A device's update as a safetensors file's bytes: every floating tensor moved by seeded
    noise, every integer one (BatchNorm's ``num_batches_tracked``) advanced by ``steps``."""
    rng = np.random.default_rng(seed)
    out = {
        k: (v + rng.normal(0.0, scale, v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v + steps
        for k, v in previous.items()
    }
    path = get_store().path(f"scratch/{seed}.safetensors")
    save_state(out, path)
    return path.read_bytes()


def unchanged(previous_path: Path) -> bytes:
    return previous_path.read_bytes()


# --- the experiment ------------------------------------------------------------------------------


def _experiment(make_experiment, two_tasks, **kw):
    devices, tasks, counts = two_tasks
    return make_experiment(devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", **kw)


def _round_updates(run: Run, index: int, *, seed: int = 0) -> dict[tuple[str, str], bytes]:
    """Fresh device updates of round ``index`` from the run's current global models."""
    return {
        (device, task): trained(global_state(run, task, index - 1 if index else None), seed=seed + 10 * k + index)
        for k, (device, task) in enumerate(
            [("dev-a", "t-mobilenet"), ("dev-b", "t-mobilenet"), ("dev-b", "t-shufflenet")]
        )
    }


# --- aggregation with a server state --------------------------------------------------------------

pytestmark_db = pytest.mark.django_db


@pytestmark_db
def test_a_stateful_aggregator_keeps_its_state_beside_each_global_model(
    make_experiment, two_tasks, momentum, monkeypatch
):
    capture_dispatch(monkeypatch)
    experiment = _experiment(make_experiment, two_tasks, rounds=2, aggregation=MOMENTUM)
    run = begin(experiment)

    for index in range(2):
        rnd = Round.objects.get(run=run, index=index)
        services.round_record(round_id=rnd.id, results=device_results(rnd, _round_updates(run, index)))
        if index == 0:
            services.round_enqueue(run_id=run.id, index=1)

    store = get_store()
    for index in range(2):
        for task in experiment.tasks.all():
            ckpt = Checkpoint.objects.get(run=run, task=task, round__index=index)
            assert ckpt.aggregation == MOMENTUM
            assert ckpt.server_state_path == server_state_key(run.id, task.id, index)
            assert ckpt.server_state_sha256 == sha256_file(store.path(ckpt.server_state_path))
            assert int(load_state(store.path(ckpt.server_state_path))["rounds"]) == index + 1
    # the second round's momentum is β v_0 + Δ_1 (Hsu et al. 2019): the state was handed back
    key = next(k for k, v in global_state(run, "t-mobilenet", 0).items() if v.dtype.kind == "f" and v.size > 100)
    v0 = load_state(store.path(server_state_key(run.id, experiment.tasks.get(name="t-mobilenet").id, 0)))
    v1 = load_state(store.path(server_state_key(run.id, experiment.tasks.get(name="t-mobilenet").id, 1)))
    w0, w1 = global_state(run, "t-mobilenet", 0)[key], global_state(run, "t-mobilenet", 1)[key]
    np.testing.assert_allclose(w1 - w0, v1[f"momentum/{key}"], atol=1e-6)  # η = 1
    assert not np.allclose(v1[f"momentum/{key}"], v1[f"momentum/{key}"] - 0.9 * v0[f"momentum/{key}"])
    assert Run.objects.get(id=run.id).status == Run.Status.SUCCEEDED


def test_the_server_state_lies_beside_the_global_model_and_is_never_served_to_agents():
    key = server_state_key(3, 7, 2)

    assert key == "runs/3/tasks/7/global/server-state-round-00002.safetensors"
    assert parse_global_weights_key(key) is None  # the agents' download endpoint refuses it
    with pytest.raises(ValueError, match="round_index must be an integer >= 0"):
        server_state_key(3, 7, -1)


@pytestmark_db
def test_a_task_no_device_trained_carries_its_server_state_to_the_next_round(
    make_experiment, two_tasks, momentum, monkeypatch
):
    capture_dispatch(monkeypatch)
    experiment = _experiment(make_experiment, two_tasks, rounds=3, aggregation=MOMENTUM)
    shufflenet = experiment.tasks.get(name="t-shufflenet")
    run = begin(experiment)

    rnd = Round.objects.get(run=run, index=0)
    services.round_record(round_id=rnd.id, results=device_results(rnd, _round_updates(run, 0)))
    services.round_enqueue(run_id=run.id, index=1)
    rnd = Round.objects.get(run=run, index=1)
    # dev-b, the only device holding t-shufflenet, fails: the task is not trained this round
    services.round_record(
        round_id=rnd.id, results=device_results(rnd, _round_updates(run, 1), failed=frozenset({"dev-b"}))
    )
    kept = Checkpoint.objects.get(run=run, task=shufflenet, round__index=1)
    first = Checkpoint.objects.get(run=run, task=shufflenet, round__index=0)
    assert kept.kept_previous and kept.artifact_path == first.artifact_path
    assert (kept.aggregation, kept.server_state_path, kept.server_state_sha256) == (
        MOMENTUM,
        first.server_state_path,
        first.server_state_sha256,
    )
    services.round_enqueue(run_id=run.id, index=2)
    rnd = Round.objects.get(run=run, index=2)
    services.round_record(round_id=rnd.id, results=device_results(rnd, _round_updates(run, 2)))

    third = Checkpoint.objects.get(run=run, task=shufflenet, round__index=2)
    # the state round 0 left was handed back: this is the task's second aggregation
    assert int(load_state(get_store().path(third.server_state_path))["rounds"]) == 2


@pytestmark_db
def test_unchanged_device_models_are_still_stepped_by_a_stateful_aggregator(
    make_experiment, two_tasks, momentum, monkeypatch
):
    capture_dispatch(monkeypatch)
    experiment = _experiment(
        make_experiment,
        two_tasks,
        rounds=2,
        aggregation=MOMENTUM,
        task_aggregation={"t-shufflenet": {"aggregation": "fedavg"}},
    )
    run = begin(experiment)
    rnd = Round.objects.get(run=run, index=0)
    services.round_record(round_id=rnd.id, results=device_results(rnd, _round_updates(run, 0)))
    services.round_enqueue(run_id=run.id, index=1)
    store = get_store()
    previous = {t.name: Checkpoint.objects.get(run=run, task=t, round__index=0) for t in experiment.tasks.all()}

    # every device sends the global model back unchanged (as the simulated backend does)
    rnd = Round.objects.get(run=run, index=1)
    same = {
        (device, task): unchanged(store.path(previous[task].artifact_path))
        for device, task in [("dev-a", "t-mobilenet"), ("dev-b", "t-mobilenet"), ("dev-b", "t-shufflenet")]
    }
    services.round_record(round_id=rnd.id, results=device_results(rnd, same))

    stepped = Checkpoint.objects.get(run=run, task__name="t-mobilenet", round__index=1)
    averaged = Checkpoint.objects.get(run=run, task__name="t-shufflenet", round__index=1)
    # momentum moves the model on a zero update: a new model, not the previous file
    assert stepped.artifact_path != previous["t-mobilenet"].artifact_path
    assert stepped.sha256 != previous["t-mobilenet"].sha256 and stepped.server_state_path
    # FedAvg (the override) keeps the previous file and has no state
    assert averaged.artifact_path == previous["t-shufflenet"].artifact_path
    assert (averaged.aggregation, averaged.server_state_path) == ("fedavg", "")


@pytestmark_db
@pytest.mark.parametrize("aggregator", [MOMENTUM])
def test_integer_buffers_stay_integers_through_stateful_aggregation(
    make_experiment, two_tasks, momentum, monkeypatch, aggregator
):
    capture_dispatch(monkeypatch)
    experiment = _experiment(make_experiment, two_tasks, rounds=1, aggregation=aggregator)
    run = begin(experiment)
    initial = global_state(run, "t-mobilenet", None)
    integer_keys = [k for k, v in initial.items() if v.dtype.kind in "iu"]
    assert integer_keys, "mobilenet_v3_small has BatchNorm's num_batches_tracked"

    # dev-a (30 samples) tracked 7 batches more, dev-b (10 samples) 2: the mean is 5.75
    rnd = Round.objects.get(run=run, index=0)
    updates = _round_updates(run, 0)
    updates[("dev-a", "t-mobilenet")] = trained(initial, seed=1, steps=7)
    updates[("dev-b", "t-mobilenet")] = trained(initial, seed=2, steps=2)
    services.round_record(round_id=rnd.id, results=device_results(rnd, updates))

    ckpt = Checkpoint.objects.get(run=run, task__name="t-mobilenet", round__index=0)
    model = load_state(get_store().path(ckpt.artifact_path))
    state = load_state(get_store().path(ckpt.server_state_path))
    for key in integer_keys:
        assert model[key].dtype == initial[key].dtype and model[key].shape == initial[key].shape
        assert int(model[key]) == int(initial[key]) + 6  # FedAvg's mean, rounded half to even: not 5.75
        assert not any(k.endswith(f"/{key}") for k in state), "an integer buffer has no server state"
    assert all(v.dtype.kind == "f" for k, v in state.items() if k != "rounds")


@pytestmark_db
def test_the_tasks_aggregator_sets_what_its_trainers_are_asked(
    make_experiment, two_tasks, momentum, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    experiment = _experiment(
        make_experiment,
        two_tasks,
        rounds=1,
        task_aggregation={"t-mobilenet": {"aggregation": MOMENTUM, "aggregation_params": {"mu": 0.05}}},
    )
    mobilenet = experiment.tasks.get(name="t-mobilenet")

    with django_capture_on_commit_callbacks(execute=True):
        run = begin(experiment)

    (_, requests), *_ = sent["round"]
    specs = [(s.task.task_id, s.aggregator, s.client_options.get("mu", 0.0)) for r in requests for s in r.assignments]
    assert (
        sorted(specs)
        == sorted(
            (task_id, MOMENTUM, 0.05) if task_id == mobilenet.id else (task_id, None, 0.0) for task_id, _, _ in specs
        )
        and len(specs) == 3
    )
    # a retry is sent the same
    rnd = Round.objects.get(run=run, index=0)
    retry = round_device_request_load(rnd=rnd, device_id=experiment.devices.get(name="dev-b").id, attempt=1)
    assert {s.task.task_id: (s.aggregator, s.client_options) for s in retry.assignments} == {
        mobilenet.id: (MOMENTUM, {"mu": 0.05}),
        experiment.tasks.get(name="t-shufflenet").id: (None, {}),
    }


# --- resume after the control worker died ---------------------------------------------------------


def restarted_control_worker(run_id: int, recorded: str, finish: int, die_aggregating: int | None) -> dict:
    """What a restarted control worker does, in a fresh process: the resume sweep, then the work
    it sends itself, run here — the round it starts (or takes back), finished with the recorded
    device updates of round ``finish`` (files ``r<round>~<device>~<task>.safetensors`` in
    ``recorded``, :func:`_record`). With ``die_aggregating``, it then starts that round and claims its aggregation
    — and "dies" there, leaving the round ``aggregating`` and a stale server state file.

    Returns what it did, for the test to check (printed as JSON by ``__main__``).
    """
    import contextlib

    class _Patch:
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    done: dict = {}
    with stateful_aggregator.registered() if MOMENTUM not in _registered() else contextlib.nullcontext():
        sent = capture_dispatch(_Patch())
        done["resume"] = services.runs_resume(nodename="control@host", booted_at=time.time())
        for run, index in sent["round_enqueue"]:
            services.round_enqueue(run_id=run, index=index)
        rnd = Round.objects.get(run_id=run_id, index=finish)
        done["finish_status_before"] = rnd.status
        weights = _recorded(Path(recorded), finish)
        finished = services.round_record(round_id=rnd.id, results=device_results(rnd, weights), claimant="control@host")
        done["finished"] = finished.status if finished else None
        if die_aggregating is not None:
            services.round_enqueue(run_id=run_id, index=die_aggregating)
            dying = Round.objects.get(run_id=run_id, index=die_aggregating)
            claimed = Round.objects.filter(id=dying.id, status=Round.Status.RUNNING).update(
                status=Round.Status.AGGREGATING, aggregating_at=timezone.now(), claimed_by="control@host"
            )
            done["claimed"] = claimed
            # it had written this round's server state before it died, but not its checkpoint
            for task in Run.objects.get(id=run_id).experiment.tasks.all():
                get_store().write_bytes(server_state_key(run_id, task.id, die_aggregating), b"half-done")
    return done


def _registered() -> tuple[str, ...]:
    from workers.registry.aggregators import AGGREGATOR_REGISTRY

    return AGGREGATOR_REGISTRY.names()


def _recorded(folder: Path, index: int) -> dict[tuple[str, str], bytes]:
    """The device updates of round ``index`` :func:`_record` kept in ``folder``."""
    out = {}
    for path in folder.glob(f"r{index}~*.safetensors"):
        _, device, task = path.stem.split("~")
        out[(device, task)] = path.read_bytes()
    return out


def _record(folder: Path, index: int, updates: dict[tuple[str, str], bytes]) -> None:
    for (device, task), blob in updates.items():
        (folder / f"r{index}~{device}~{task}.safetensors").write_bytes(blob)


def _in_a_fresh_process(run_id: int, recorded: Path, finish: int, die_aggregating: int | None) -> dict:
    return in_a_fresh_django_process(
        "tests.controlplane.test_aggregation_resume:restarted_control_worker",
        run_id,
        str(recorded),
        finish,
        die_aggregating,
    )


def _digests(run: Run) -> dict[tuple[str, int], tuple[str, str]]:
    """``{(task, round): (global model SHA-256, server state SHA-256)}`` from the files."""
    store = get_store()
    out = {}
    for ckpt in Checkpoint.objects.filter(run=run, round__isnull=False).select_related("task", "round"):
        model = hashlib.sha256(store.path(ckpt.artifact_path).read_bytes()).hexdigest()
        state = (
            hashlib.sha256(store.path(ckpt.server_state_path).read_bytes()).hexdigest()
            if ckpt.server_state_path
            else ""
        )
        assert (model, state) == (ckpt.sha256, ckpt.server_state_sha256 or "")
        out[(ckpt.task.name, ckpt.round.index)] = (model, state)
    return out


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("aggregator", [MOMENTUM])
def test_a_run_resumed_after_the_control_worker_died_ends_with_the_same_models_and_states(
    make_experiment, two_tasks, momentum, monkeypatch, tmp_path, aggregator
):
    capture_dispatch(monkeypatch)
    experiment = _experiment(
        make_experiment,
        two_tasks,
        rounds=3,
        aggregation=aggregator,
        task_aggregation={"t-shufflenet": {"aggregation": MOMENTUM, "aggregation_params": {"server_momentum": 0.5}}},
    )

    # (a) uninterrupted, recording every device update
    through = begin(experiment)
    for index in range(3):
        if index:
            services.round_enqueue(run_id=through.id, index=index)
        rnd = Round.objects.get(run=through, index=index)
        updates = _round_updates(through, index)
        _record(tmp_path, index, updates)
        services.round_record(round_id=rnd.id, results=device_results(rnd, updates))
    through.refresh_from_db()
    assert through.status == Run.Status.SUCCEEDED, through.error

    # (b) the same updates; the control worker dies after round 0 (its ROUND_ENQUEUE is lost) and
    # again in the middle of aggregating round 2
    resumed = begin(experiment)
    rnd = Round.objects.get(run=resumed, index=0)
    services.round_record(round_id=rnd.id, results=device_results(rnd, _recorded(tmp_path, 0)))
    assert not Round.objects.filter(run=resumed, index=1).exists()

    first = _in_a_fresh_process(resumed.id, tmp_path, finish=1, die_aggregating=2)
    assert first["resume"]["advanced"] == 1 and first["finished"] == Round.Status.SUCCEEDED
    assert first["claimed"] == 1
    assert Round.objects.get(run=resumed, index=2).status == Round.Status.AGGREGATING

    second = _in_a_fresh_process(resumed.id, tmp_path, finish=2, die_aggregating=None)
    assert second["resume"]["reclaimed"] == 1 and second["finish_status_before"] == Round.Status.RUNNING
    assert second["finished"] == Round.Status.SUCCEEDED
    resumed.refresh_from_db()
    assert resumed.status == Run.Status.SUCCEEDED, resumed.error

    expected, got = _digests(through), _digests(resumed)
    assert len(expected) == 6 and all(state for (task, _), (_, state) in expected.items())
    assert got == expected
    if aggregator == MOMENTUM:  # each process was handed the state the one before it left
        last = Checkpoint.objects.get(run=resumed, task__name="t-mobilenet", round__index=2)
        assert int(load_state(get_store().path(last.server_state_path))["rounds"]) == 3
