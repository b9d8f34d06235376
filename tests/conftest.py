"""Shared fixtures: users and API clients, and factories for devices, tasks and experiments."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("researcher", password="s3cret-pass")


@pytest.fixture
def api(user) -> APIClient:
    """An API client authenticated with the user's token."""
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def browser_client(client, user):
    """Django's test client logged in (session) as the user."""
    client.force_login(user)
    return client


def inventory(name: str, backend: str = "cpu") -> dict:
    """What an agent reports at start (:class:`workers.messages.DeviceInventory`)."""
    return {"name": name, "backend": backend, "host": "test-host", "cores": [0, 1]}


@pytest.fixture
def make_device(db):
    """A device whose agent has connected (``connected=False``: registered only)."""
    from controlplane.fleet.services import device_create, device_report

    def make(name: str = "dev-a", backend: str = "cpu", *, connected: bool = True):
        device = device_create(name=name, backend=backend)
        if connected:
            device = device_report(inventory=inventory(name, backend))
        return device

    return make


@pytest.fixture
def make_task(db):
    from controlplane.experiments.services import task_create

    def make(name: str = "digits-mobilenet", architecture: str = "mobilenet_v3_small", **kw):
        return task_create(name=name, architecture=architecture, **kw)

    return make


@pytest.fixture
def make_experiment(db, make_device, make_task):
    """An experiment over given (or two new) devices and tasks, explicit small shards by default."""
    from controlplane.experiments.services import experiment_create

    def make(*, devices=None, tasks=None, name="exp", rounds=1, counts=None, **kw):
        devices = devices or [make_device("dev-a"), make_device("dev-b")]
        tasks = tasks or [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")]
        if counts is None and "partition_rule" not in kw:
            kw["partition_rule"] = "explicit"
            counts = [{"device": d.id, "task": t.id, "num_samples": 40 + 8 * i} for i, (d, t) in
                      enumerate((d, t) for d in devices for t in tasks)]
        return experiment_create(
            name=name, task_ids=[t.id for t in tasks], device_ids=[d.id for d in devices], rounds=rounds,
            sample_counts=counts, **kw,
        )

    return make
