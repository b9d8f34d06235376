"""Six tasks on one device (issue 22, item 5): a ``vres_sync`` run plans a 6-task mix and trains
it on the ``simulated`` backend through the stack's real processes. The predictor is fitted on
the contention law's synthetic samples (mixes of at most 4 tasks) stored as the simulated
device's, so the 6-task mix is planned on the physical baseline's extrapolation, as a larger mix
than any profiled one is; the guard says so before the run starts. The run's second round is
replanned from what the first measured (closed loop), through the same real processes."""

from __future__ import annotations

import uuid

import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Run
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class
from controlplane.profiling.services import predictor_fit
from tests.controlplane.contention_law import ARCHS, store_synthetic_samples

pytestmark = [pytest.mark.integration, pytest.mark.one_database]

TASKS = 6


def test_a_six_task_mix_plans_and_trains_on_a_simulated_device(child_env, monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    with LocalStack(agents=["mix6-a"], backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        device = Device.objects.get(name="mix6-a")
        store_synthetic_samples(device, n=100, backend="simulated", device_class=device_class(device))
        predictor = predictor_fit(backend="simulated", families=("baseline",))
        assert predictor.status == "ready", predictor.error
        assert predictor.feature_spec["max_mix"] == 8 and predictor.feature_spec["max_fitted_mix"] == 4

        tag = uuid.uuid4().hex[:6]
        tasks = [services.task_create(name=f"mix6-{k}-{tag}", architecture=ARCHS[k % len(ARCHS)]) for k in range(TASKS)]
        experiment = services.experiment_create(
            name=f"mix6-{tag}",
            task_ids=[t.id for t in tasks],
            device_ids=[device.id],
            rounds=2,
            partition_rule="explicit",
            sample_counts=[
                {"device": device.id, "task": t.id, "num_samples": 64 + 32 * k} for k, t in enumerate(tasks)
            ],
        )
        run = services.run_create(experiment=experiment, strategy="vres_sync")
        assert any("trains 6 tasks together" in w and "at most 4" in w for w in run.warnings), run.warnings
        run = run_wait(run, timeout_s=600)
        stack.children.check_alive()

    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.simulated
    trained = list(Assignment.objects.filter(round__run=run, round__index=0).order_by("task_id"))
    assert [a.task_id for a in trained] == [t.id for t in tasks]  # all six, together on mix6-a
    assert {a.device_id for a in trained} == {device.id}
    for a in trained:
        assert a.status == Assignment.Status.SUCCEEDED, a.error
        assert a.predicted_throughput_sps > 0 and a.throughput_sps > 0
        assert 1 <= a.active_thread_percentage <= 100 and a.batch_size >= 8

    second = run.rounds.get(index=1)
    [decision] = second.replan["decisions"]
    assert decision["device"] == "mix6-a" and decision["action"] in {"moved", "kept", "slack"} and decision["reason"]
    assert second.replan["measured_rounds"] == [0]
    # Every batch size the replanned round trains was measured alone (before round 0 or before
    # round 1), so its fair throughput keeps the device.
    assert all(a.standalone_throughput_sps for a in second.assignments.all()), second.flags
    assert second.fair_throughput is not None
