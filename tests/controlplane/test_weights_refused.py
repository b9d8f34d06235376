"""Malformed weights files a device result points at: the device's assignment fails with the
reason, the round goes partial with the other devices aggregated, nothing raises.

Device results are built as agents send them (tests/controlplane/test_round_protocol.py does
the same); then one device's file in the artifact store is spoilt.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from workers.fl.artifacts import InvalidSafetensorsError, device_weights_key, get_store
from workers.fl.fedavg import load_state, save_state

pytestmark = pytest.mark.django_db


@pytest.fixture
def round0(started_round):
    """Round 0 of a one-round sharing run of one task on dev-a (30 samples) and dev-b (10)."""
    return started_round()[1]


def _results(rnd: Round) -> list[dict]:
    """Both devices succeeded; dev-a's weights are the initial ones × 2, dev-b's × 3."""
    store = get_store()
    results = []
    for a in rnd.assignments.select_related("device", "task").order_by("device__name"):
        initial = Checkpoint.objects.get(run=rnd.run, task=a.task, round=None)
        factor = {"dev-a": 2.0, "dev-b": 3.0}[a.device.name]
        state = {
            k: (v * factor).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in load_state(store.path(initial.artifact_path)).items()
        }
        key = device_weights_key(rnd.run_id, rnd.index, a.device.name, a.task_id)
        sha = save_state(state, store.path(key))
        results.append(
            {
                "run_id": rnd.run_id,
                "round_id": rnd.id,
                "device": a.device.name,
                "status": "succeeded",
                "error": "",
                "assignments": [
                    {
                        "assignment_id": a.id,
                        "task_id": a.task_id,
                        "status": "succeeded",
                        "error": "",
                        "samples_trained": a.samples,
                        "seconds": 2.0,
                        "throughput_sps": 50.0,
                        "train_loss": 1.5,
                        "started_at": 1000.0,
                        "finished_at": 1003.0,
                        "weights": key,
                        "weights_sha256": sha,
                    }
                ],
            }
        )
    return results


def _spoil(rnd: Round, device: str, how: str) -> None:
    path = get_store().path(device_weights_key(rnd.run_id, rnd.index, device, rnd.run.experiment.tasks.get().id))
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "pickle":
        path.write_bytes(pickle.dumps({"fc.weight": [1.0, 2.0]}))
    elif how == "other model":
        save_state({"fc.weight": np.zeros((3, 3), dtype=np.float32)}, path)
    elif how == "missing":
        path.unlink()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("truncated", "not a valid safetensors file"),
        ("pickle", "not a valid safetensors file"),
        ("other model", "not this task's model"),
        ("missing", "no such file"),
    ],
)
def test_a_malformed_weights_file_fails_its_device_and_the_round_goes_partial(round0, how, reason):
    rnd = round0
    results = _results(rnd)
    _spoil(rnd, "dev-b", how)

    services.round_record(round_id=rnd.id, results=results)

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL
    assert rnd.error.startswith("dev-b: task t-mobilenet: weights file ")
    assert reason in rnd.error
    by_device = {a.device.name: a for a in rnd.assignments.select_related("device")}
    assert by_device["dev-a"].status == Assignment.Status.SUCCEEDED
    assert by_device["dev-b"].status == Assignment.Status.FAILED
    assert reason in by_device["dev-b"].error
    # FedAvg over dev-a alone: the global model is dev-a's weights (initial × 2).
    store = get_store()
    initial = load_state(store.path(Checkpoint.objects.get(run=rnd.run, round=None).artifact_path))
    averaged = load_state(store.path(Checkpoint.objects.get(run=rnd.run, round=rnd).artifact_path))
    key = next(k for k, v in initial.items() if v.dtype == np.float32 and v.size > 100)
    np.testing.assert_allclose(averaged[key], 2.0 * initial[key], rtol=1e-6)
    assert Run.objects.get(id=rnd.run_id).status == Run.Status.SUCCEEDED


def test_when_every_device_sent_malformed_weights_the_round_fails_with_the_reasons(round0):
    rnd = round0
    results = _results(rnd)
    _spoil(rnd, "dev-a", "truncated")
    _spoil(rnd, "dev-b", "pickle")

    services.round_record(round_id=rnd.id, results=results)

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.FAILED
    assert "dev-a: task t-mobilenet: weights file" in rnd.error and "dev-b: task t-mobilenet: weights file" in rnd.error
    assert not Checkpoint.objects.filter(round=rnd).exclude(kept_previous=True).exists()
    run = Run.objects.get(id=rnd.run_id)
    assert run.status == Run.Status.FAILED and "round 0 failed on every device" in run.error


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "shorter than the 8-byte header length"),
        (b"<!doctype html><html><body>502 Bad Gateway</body></html>", "not a safetensors file"),
        (pickle.dumps([1, 2, 3]), "not a safetensors file"),
        (b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ", "invalid JSON in header"),
    ],
)
def test_load_state_names_the_file_and_what_is_wrong(tmp_path, content, words):
    path = tmp_path / "w.safetensors"
    path.write_bytes(content)

    with pytest.raises(InvalidSafetensorsError) as caught:
        load_state(path)

    assert str(path) in str(caught.value) and words in str(caught.value)


def test_load_state_refuses_a_truncated_file(tmp_path):
    path = tmp_path / "w.safetensors"
    save_state({"w": np.ones((64, 64), dtype=np.float32)}, path)
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(InvalidSafetensorsError, match="truncated"):
        load_state(path)
