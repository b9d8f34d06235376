"""Warm trainer processes (workers/warm.py): real ``trainer serve`` processes training on the
digits through the ``cpu`` backend, reused between rounds, bounded, replaced when they die, and
never outliving their parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from workers import config, launch, warm
from workers.backends import CpuBackend
from workers.protocol.messages import ShardRef, StandaloneItem, StandaloneRequest
from workers.protocol.queues import TaskName

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone: it no longer computes)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    limit = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > limit:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def warm_backend(monkeypatch):
    """A cpu backend whose pool keeps up to ``count`` warm trainers; stopped at the end."""
    made: list[CpuBackend] = []

    def make(count: int = 2, memory_mb: int | None = None) -> CpuBackend:
        monkeypatch.setenv(config.ENV_WARM_TRAINERS, str(count))
        if memory_mb is None:
            monkeypatch.delenv(config.ENV_WARM_TRAINERS_MEMORY_MB, raising=False)
        else:
            monkeypatch.setenv(config.ENV_WARM_TRAINERS_MEMORY_MB, str(memory_mb))
        backend = CpuBackend()
        backend.warm_pool()  # read the settings now, while they are set
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.stop()


@pytest.fixture
def one_task_round(make_task_ref, make_assignment, make_round, initial_weights, store):
    """A round of one task (``architecture``) with ``global_key`` (default: initial weights),
    writing to ``output``."""

    def build(
        architecture: str = "mobilenet_v3_small", *, task_id: int = 1, global_key=None, output=None, count=64, epochs=1
    ):
        task = make_task_ref(task_id, architecture)
        key = global_key or initial_weights(task)
        assignment = make_assignment(task, key, assignment_id=task_id, offset=0, count=count, share=100)
        assignment = assignment.model_copy(update={"local_epochs": epochs})
        if output is not None:
            assignment = assignment.model_copy(update={"output_weights": output})
        return make_round([assignment], "mps")

    return build


def _ok(result):
    assert result.status == "succeeded", result.error
    return result


def test_a_later_round_reuses_the_process_and_matches_a_cold_trainer_bit_for_bit(
    warm_backend, one_task_round, agent_context, store, monkeypatch
):
    backend = warm_backend(count=2)
    pool = backend.warm_pool()
    assert pool is not None

    first = _ok(backend.run_round(one_task_round(output="out/r1.safetensors"), agent_context))
    (pid,) = pool.idle_pids()
    # Round 2 starts from round 1's weights, as FL does: handed over without a process start.
    second_request = one_task_round(global_key="out/r1.safetensors", output="out/warm-r2.safetensors")
    second = _ok(backend.run_round(second_request, agent_context))

    assert pool.started == 1 and pool.idle_pids() == [pid] and _alive(pid)
    assert second.assignments[0].weights_sha256 != first.assignments[0].weights_sha256
    assert launch.live_children() == []

    # The same round on a cold trainer (pool disabled) gives bit-identical weights.
    monkeypatch.setenv(config.ENV_WARM_TRAINERS, "0")
    cold = CpuBackend()
    assert cold.warm_pool() is None
    cold_request = one_task_round(global_key="out/r1.safetensors", output="out/cold-r2.safetensors")
    cold_result = _ok(cold.run_round(cold_request, agent_context))
    assert store.path("out/cold-r2.safetensors").read_bytes() == store.path("out/warm-r2.safetensors").read_bytes()
    assert cold_result.assignments[0].weights_sha256 == second.assignments[0].weights_sha256
    assert cold_result.assignments[0].train_loss == second.assignments[0].train_loss

    # The agent's stop kills the warm trainers.
    backend.stop()
    assert _gone_within([pid], 5)


def test_least_recently_used_process_is_evicted_at_the_count_bound(warm_backend, one_task_round, agent_context):
    backend = warm_backend(count=2)
    pool = backend.warm_pool()
    assert pool is not None
    a = one_task_round("mobilenet_v3_small", task_id=1)
    b = one_task_round("shufflenet_v2_x1_0", task_id=2)
    c = one_task_round("resnet18", task_id=3)

    _ok(backend.run_round(a, agent_context))
    (pid_a,) = pool.idle_pids()
    _ok(backend.run_round(b, agent_context))
    (pid_b,) = set(pool.idle_pids()) - {pid_a}
    _ok(backend.run_round(a, agent_context))  # a is now the most recently used
    assert pool.idle_pids() == [pid_b, pid_a] and pool.started == 2

    _ok(backend.run_round(c, agent_context))  # a third key: b, the least recently used, goes

    assert len(pool.idle_pids()) == 2 and pool.idle_pids()[0] == pid_a and pid_b not in pool.idle_pids()
    assert _gone_within([pid_b], 5) and _alive(pid_a)
    assert pool.started == 3 and pool.evicted == 1


def test_idle_processes_past_the_memory_bound_are_evicted(warm_backend, one_task_round, agent_context):
    backend = warm_backend(count=4, memory_mb=1)  # less than any trainer's private memory
    pool = backend.warm_pool()
    assert pool is not None

    result = _ok(backend.run_round(one_task_round(), agent_context))

    assert pool.idle_pids() == [] and pool.evicted == 1
    assert result.assignments[0].peak_memory_bytes > 2**20


def _a_round_then_its_trainer_killed(warm_backend, one_task_round, agent_context):
    """A pool of 2 after one round, whose idle trainer has been SIGKILLed: ``(backend, pool, pid)``."""
    backend = warm_backend(count=2)
    pool = backend.warm_pool()
    assert pool is not None
    _ok(backend.run_round(one_task_round(), agent_context))
    (old,) = pool.idle_pids()
    os.kill(old, signal.SIGKILL)
    assert _gone_within([old], 5)
    return backend, pool, old


def test_a_process_killed_while_idle_is_replaced_before_the_round(warm_backend, one_task_round, agent_context):
    backend, pool, old = _a_round_then_its_trainer_killed(warm_backend, one_task_round, agent_context)

    _ok(backend.run_round(one_task_round(), agent_context))

    (new,) = pool.idle_pids()
    assert new != old and pool.started == 2 and pool.evicted == 1


def test_a_process_that_dies_after_the_liveness_check_is_replaced_too(
    warm_backend, one_task_round, agent_context, monkeypatch
):
    backend, pool, old = _a_round_then_its_trainer_killed(warm_backend, one_task_round, agent_context)
    # It still looks alive when it is taken: the job line is what finds it dead.
    monkeypatch.setattr(warm.WarmProcess, "alive", lambda self: True)

    _ok(backend.run_round(one_task_round(), agent_context))

    monkeypatch.undo()
    (new,) = pool.idle_pids()
    assert new != old and pool.started == 2 and pool.evicted == 1


def _kill_when_training(pids, started: threading.Event) -> None:
    """SIGKILL the first trainer once it has been given GO (its stdin line read)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = launch.live_children()
        if children:
            time.sleep(1.5)  # past READY/GO: training (1,000 samples take much longer)
            pids.append(children[0].pid)
            started.set()
            os.kill(children[0].pid, signal.SIGKILL)
            return
        time.sleep(0.05)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_process_dying_mid_round_fails_the_round_as_a_cold_one_does(
    warm, warm_backend, one_task_round, agent_context
):
    backend = warm_backend(count=2 if warm else 0)
    pool = backend.warm_pool()
    if warm:
        assert pool is not None
        _ok(backend.run_round(one_task_round(), agent_context))  # a warm process, used again below
        (warm_pid,) = pool.idle_pids()
    killed: list[int] = []
    started = threading.Event()
    killer = threading.Thread(target=_kill_when_training, args=(killed, started))
    killer.start()

    result = backend.run_round(one_task_round(count=1000), agent_context)

    killer.join()
    assert started.is_set()
    assert result.status == "failed"
    assert "task 1 (mobilenet_v3_small-digits): trainer exited with code -9 without a result" in result.error
    assert result.assignments[0].status == "failed"
    assert launch.live_children() == []
    if warm:
        assert pool is not None
        assert killed == [warm_pid] and pool.idle_pids() == []
        # The next round gets a fresh process.
        _ok(backend.run_round(one_task_round(), agent_context))
        (fresh,) = pool.idle_pids()
        assert fresh != warm_pid and pool.started == 2


def test_a_failed_job_fails_the_round_with_its_error_and_stderr_and_the_process_is_replaced(
    warm_backend, one_task_round, agent_context
):
    backend = warm_backend(count=2)
    pool = backend.warm_pool()
    assert pool is not None
    _ok(backend.run_round(one_task_round(), agent_context))
    (pid,) = pool.idle_pids()

    result = backend.run_round(one_task_round(global_key="runs/1/missing.safetensors"), agent_context)

    assert result.status == "failed"
    error = result.assignments[0].error
    assert error.startswith("FileNotFoundError") and "missing.safetensors" in error
    # The job's own stderr tail (the traceback), not the earlier job's log.
    assert "--- trainer stderr (tail) ---" in error and "Traceback" in error
    assert pool.idle_pids() == [] and _gone_within([pid], 5)


def test_standalone_measurements_reuse_a_warm_process(warm_backend, make_task_ref, agent_context):
    backend = warm_backend(count=2)
    pool = backend.warm_pool()
    assert pool is not None
    item = StandaloneItem(
        task=make_task_ref(1, "mobilenet_v3_small"),
        batch_size=16,
        shard=ShardRef(permutation_seed=7, offset=0, count=40),
    )
    request = StandaloneRequest(
        run_id=1, device=agent_context.device, warmup_iterations=1, timed_iterations=2, items=[item]
    )

    first = backend.measure_standalone(request, agent_context)
    second = backend.measure_standalone(request.model_copy(update={"run_id": 2}), agent_context)

    assert first.status == second.status == "succeeded", (first.error, second.error)
    assert second.run_id == 2 and second.measurements[0].throughput_sps > 0
    assert pool.started == 1 and len(pool.idle_pids()) == 1


_PARENT = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    from workers.backends import AgentContext, CpuBackend
    from workers.protocol.messages import TrainRoundRequest

    setup = json.loads(Path(sys.argv[1]).read_text())
    ctx = AgentContext(**{**setup["ctx"], "state_dir": Path(setup["ctx"]["state_dir"]),
                          "artifact_root": Path(setup["ctx"]["artifact_root"])})
    backend = CpuBackend()
    pool = backend.warm_pool()
    for short in setup["shorts"]:
        assert backend.run_round(TrainRoundRequest.model_validate_json(short), ctx).status == "succeeded"
    print("IDLE", *pool.idle_pids(), flush=True)

    def report():
        time.sleep(3)
        print("BUSY", *pool.pids(), flush=True)

    threading.Thread(target=report, daemon=True).start()
    result = backend.run_round(TrainRoundRequest.model_validate_json(setup["long"]), ctx)  # killed in here
    print("FINISHED", result.status, result.error, flush=True)
    """
)


def test_warm_trainers_die_with_their_parent(tmp_path, one_task_round, agent_context, monkeypatch):
    """A parent holding a pool is SIGKILLed while its warm trainer trains (not reading stdin,
    so only PR_SET_PDEATHSIG can stop it) and while another one idles: both are gone at once."""
    # Two keys, both warmed by the parent's main thread: a idles at the kill, b trains.
    short_a = one_task_round("mobilenet_v3_small", task_id=1)
    short_b = one_task_round("shufflenet_v2_x1_0", task_id=2)
    long_b = one_task_round("shufflenet_v2_x1_0", task_id=2, count=1000, epochs=20)
    setup = {
        "ctx": {
            "device": agent_context.device,
            "cores": agent_context.cores,
            "state_dir": str(agent_context.state_dir),
            "artifact_root": str(agent_context.artifact_root),
            "trainer_timeout_s": 300,
            "ready_timeout_s": 300,
        },
        "shorts": [short_a.model_dump_json(), short_b.model_dump_json()],
        "long": long_b.model_dump_json(),
    }
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    (tmp_path / "setup.json").write_text(json.dumps(setup))
    monkeypatch.setenv(config.ENV_WARM_TRAINERS, "2")
    monkeypatch.delenv(config.ENV_WARM_TRAINERS_MEMORY_MB, raising=False)
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "setup.json")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert parent.stdout is not None
        idle_line = parent.stdout.readline().split()
        assert idle_line[:1] == ["IDLE"], parent.stderr.read() if parent.stderr else ""
        idle = [int(pid) for pid in idle_line[1:]]
        busy_line = parent.stdout.readline().split()
        assert busy_line[:1] == ["BUSY"], busy_line
        pids = [int(pid) for pid in busy_line[1:]]
        assert len(idle) == 2 and sorted(pids) == sorted(idle) and all(_alive(pid) for pid in pids)

        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)

        assert _gone_within(pids, 5), [pid for pid in pids if _alive(pid)]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_bad_settings_are_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(config.ENV_WARM_TRAINERS, "many")
    with pytest.raises(ValueError, match="MTFL_WARM_TRAINERS='many'"):
        config.warm_trainers()
    monkeypatch.setenv(config.ENV_WARM_TRAINERS, "3")
    assert config.warm_trainers() == 3
    monkeypatch.setenv(config.ENV_WARM_TRAINERS_MEMORY_MB, "-5")
    with pytest.raises(ValueError, match="MTFL_WARM_TRAINERS_MEMORY_MB='-5'"):
        config.warm_trainers_memory_bytes()
    monkeypatch.setenv(config.ENV_WARM_TRAINERS_MEMORY_MB, "512")
    assert config.warm_trainers_memory_bytes() == 512 * 2**20


def test_the_trainer_cache_builds_the_model_once_and_reloads_the_shard_only_when_it_changes(make_task_ref):
    import torch

    from workers.training.trainer import TrainerCache

    cache = TrainerCache()
    task = make_task_ref(1, "mobilenet_v3_small")
    shard = ShardRef(permutation_seed=7, offset=0, count=32)
    cpu = torch.device("cpu")

    model = cache.model(task, 3, cpu)
    x, y = cache.shard(task, shard, cpu)
    assert cache.model(task.model_copy(update={"task_id": 9, "name": "other"}), 4, cpu) is model
    assert cache.shard(task, shard, cpu)[0] is x
    assert (cache.models_built, cache.shards_loaded) == (1, 1)

    moved = cache.shard(task, shard.model_copy(update={"offset": 32}), cpu)  # the partition changed

    assert cache.shards_loaded == 2 and len(moved[1]) == 32 and not torch.equal(moved[0], x)
    assert cache.model(task.model_copy(update={"architecture": "shufflenet_v2_x1_0"}), 3, cpu) is not model
    assert cache.models_built == 2


def _warm_children(parent: int) -> list[int]:
    """Pids of the ``trainer serve`` processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"workers.training.trainer" in command and b"serve" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_an_agents_warm_trainers_end_with_it(start_agent, make_task_ref, signum):
    agent_process = start_agent("--device", "warm", "--heartbeat-s", "600", MTFL_WARM_TRAINERS="2")
    request = {
        "run_id": 2,
        "device": "warm",
        "warmup_iterations": 1,
        "timed_iterations": 1,
        "items": [
            {
                "task": make_task_ref(1, "mobilenet_v3_small").model_dump(mode="json"),
                "batch_size": 8,
                "shard": {"permutation_seed": 0, "offset": 0, "count": 16},
            }
        ],
    }
    try:
        for run_id in (2, 3):
            result = agent_process.client.send_task(
                TaskName.MEASURE_STANDALONE,
                args=[{**request, "run_id": run_id}],
                queue="device.warm",
            ).get(timeout=180)
            assert result["status"] == "succeeded", result
        warm_pids = _warm_children(agent_process.proc.pid)
        assert len(warm_pids) == 1  # the second measurement reused the first one's process

        if signum == signal.SIGTERM:
            agent_process.stop()
            assert agent_process.proc.returncode == 0, agent_process.output
        else:
            agent_process.proc.kill()
            agent_process.proc.wait(timeout=30)

        assert _gone_within(warm_pids, 10), [pid for pid in warm_pids if _alive(pid)]
    finally:
        agent_process.stop()
