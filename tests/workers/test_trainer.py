"""The trainer's pieces in-process, and its command line in a subprocess."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import workers
from workers.training.trainer import (
    EXIT_BAD_SPEC,
    IterationRecord,
    TrainerSpec,
    epoch_batches,
    steady_state,
    train,
)

REPO = Path(workers.__file__).parents[1]


def _records(*samples: int) -> list[IterationRecord]:
    return [IterationRecord(epoch=0, samples=n, seconds=0.5, loss=1.0) for n in samples]


def test_steady_state_skips_warmup_iterations():
    timed, throughput = steady_state(_records(16, 16, 16, 8), warmup_iterations=2)

    assert len(timed) == 2
    assert throughput == pytest.approx(24 / 1.0)


@pytest.mark.parametrize("samples,expected_timed", [((16, 16), 1), ((16,), 1), ((), 0)])
def test_steady_state_falls_back_when_run_is_short(samples, expected_timed):
    timed, throughput = steady_state(_records(*samples), warmup_iterations=5)

    assert len(timed) == expected_timed
    assert (throughput is None) == (expected_timed == 0)


@pytest.mark.parametrize(
    "n,batch,sizes", [(64, 16, [16] * 4), (70, 16, [16] * 4 + [6]), (65, 16, [16, 16, 16, 17]), (1, 16, [1])]
)
def test_epoch_batches_drop_nothing_and_fold_a_single_leftover(n, batch, sizes):
    import torch

    batches = epoch_batches(n, batch, torch.Generator().manual_seed(0))

    assert [len(b) for b in batches] == sizes
    assert sorted(torch.cat(batches).tolist()) == list(range(n))


def _spec(make_task_ref, make_assignment, initial_weights, store, **shard) -> TrainerSpec:
    import torch

    task = make_task_ref(1, "shufflenet_v2_x1_0")
    assignment = make_assignment(task, initial_weights(task), assignment_id=5, **shard)
    return TrainerSpec(
        **assignment.model_dump(), artifact_root=str(store.root), threads=torch.get_num_threads(), warmup_iterations=1
    )


def test_train_waits_for_go_and_reports_the_shard(make_task_ref, make_assignment, initial_weights, store):
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=33, batch_size=16)
    out = io.StringIO()

    before = time.time()
    result = train(spec, out, io.StringIO("GO\n"))

    assert out.getvalue() == "READY\n"
    assert result.status == "succeeded"
    assert (result.samples_trained, result.iterations, result.timed_iterations) == (33, 2, 1)
    assert before < result.started_at < result.finished_at
    assert result.weights_sha256 == store.sha256(spec.output_weights)


def test_train_on_empty_shard_keeps_global_weights(make_task_ref, make_assignment, initial_weights, store):
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=0)

    result = train(spec, io.StringIO(), io.StringIO("GO\n"))

    assert result.status == "succeeded"
    assert result.samples_trained == 0 and result.throughput_sps is None
    assert store.sha256(spec.output_weights) == store.sha256(spec.global_weights)


def test_train_aborts_without_go(make_task_ref, make_assignment, initial_weights, store):
    from workers.training.trainer import BarrierAborted

    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=16)

    with pytest.raises(BarrierAborted):
        train(spec, io.StringIO(), io.StringIO(""))


def test_bad_spec_exits_2_with_a_failed_result(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"assignment_id": 1}))
    result = tmp_path / "result.json"

    proc = subprocess.run(
        [sys.executable, "-m", "workers.training.trainer", "train", str(spec), str(result)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert proc.returncode == EXIT_BAD_SPEC
    assert proc.stdout == ""
    payload = json.loads(result.read_text())
    assert payload["status"] == "failed" and "bad spec" in payload["error"]


_LOCK_SCRIPT = """
import sys, time
from workers.training.trainer import IterationLock
lock, start = IterationLock(sys.argv[1]), float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
for _ in range(6):
    with lock:
        print(time.time(), flush=True)
        busy = time.perf_counter()
        while time.perf_counter() - busy < 0.01:
            pass
"""


def test_iteration_lock_makes_trainers_take_turns(tmp_path):
    start = time.time() + 8.0  # both must be waiting on the lock by then, even on a loaded machine
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOCK_SCRIPT, str(tmp_path / "device.lock"), str(start)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    stamps = [[float(line) for line in proc.communicate(timeout=60)[0].split()] for proc in procs]

    turns = sorted((t, who) for who, times in enumerate(stamps) for t in times)
    owners = [who for _, who in turns]
    switches = sum(1 for a, b in itertools.pairwise(owners) if a != b)
    assert switches >= 8  # alternating gives 11; a bare flock typically gives 1
