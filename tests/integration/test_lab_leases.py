"""Issue 24 item 1 with real agents: two researchers launch runs on the same two devices a moment
apart; a round waits ``queued`` while the other run's round holds a device, no two runs ever hold
(and so train on) one device at the same time, every lease is released at the end, and deadlines
count from when a round got its devices, never from when it was enqueued.

Real processes as in tests/integration/test_faults.py: a Celery control worker and two
``simulated`` device agents against a broker of their own, rounds paced in real time (about 2 s).
Runs on both databases.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.contrib.auth import get_user_model

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Round, Run
from controlplane.lab.models import DeviceLease
from tests.integration.test_faults import _experiment, fast_faults  # noqa: F401 - fast_faults is a fixture

pytestmark = pytest.mark.integration


def test_two_researchers_on_the_same_devices_take_turns_and_never_share_a_device(fast_faults):  # noqa: F811
    fast_faults.setenv("MTFL_SIM_TIME_SCALE", "30")  # about 2 s of real time per round
    names = ["lab-a", "lab-b"]
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        users = get_user_model()
        alice = users.objects.create_user(f"alice-{time.monotonic_ns()}", password="s3cret-pass")
        bob = users.objects.create_user(f"bob-{time.monotonic_ns()}", password="s3cret-pass")
        runs = []
        for owner in (alice, bob):
            experiment = _experiment(names, rounds=2, owner=owner)
            runs.append(services.run_create(experiment=experiment, strategy="sharing"))
            time.sleep(0.07)
        finished = [run_wait(run, timeout_s=240) for run in runs]
        stack.children.check_alive()

    assert [r.status for r in finished] == [Run.Status.SUCCEEDED] * 2, [r.error for r in finished]
    rounds = list(Round.objects.filter(run__in=runs).order_by("started_at"))
    assert [r.status for r in rounds] == [Round.Status.SUCCEEDED] * 4
    # someone waited for the other's round, and it was recorded as a wait, apart from training
    assert max(r.queue_s for r in rounds) > 0.5
    for r in rounds:
        assert r.started_at >= r.queued_at
        assert r.deadline_at >= r.started_at + dt.timedelta(seconds=r.deadline_s)
    leases = list(DeviceLease.objects.filter(run__in=runs).order_by("device_id", "granted_at"))
    assert len(leases) == 8 and all(lease.released_at is not None for lease in leases)
    by_device: dict[int, list[DeviceLease]] = {}
    for lease in leases:
        by_device.setdefault(lease.device_id, []).append(lease)
    for held in by_device.values():
        for earlier, later in zip(held, held[1:], strict=False):
            assert earlier.released_at <= later.granted_at, (earlier.run_id, later.run_id)
    assert {lease.owner_id for lease in leases} == {alice.id, bob.id}
