"""Device registration and heartbeats, as the control worker records what agents report."""

from __future__ import annotations

import datetime as dt

import pytest

from controlplane.common.errors import ApplicationError
from controlplane.fleet import services
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_effective_status
from tests.conftest import inventory

pytestmark = pytest.mark.django_db


def test_an_agents_first_report_registers_its_device():
    device = services.device_report(inventory={**inventory("gpu-host-1"), "memory_bytes": 2**34})
    assert device.name == "gpu-host-1" and device.queue == "device.gpu-host-1"
    assert device.inventory["memory_bytes"] == 2**34 and device.inventory["cores"] == [0, 1]
    assert device_effective_status(device) == "online"


def test_heartbeats_refresh_the_inventory_and_time():
    first = services.device_report(inventory=inventory("d1"), at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert device_effective_status(first) == "offline"  # a heartbeat long ago
    later = services.device_report(inventory={**inventory("d1"), "cores": [0, 1, 2, 3]})
    assert Device.objects.count() == 1
    assert later.inventory["cores"] == [0, 1, 2, 3] and device_effective_status(later) == "online"


def test_a_malformed_inventory_is_refused_with_the_field():
    with pytest.raises(ApplicationError) as info:
        services.device_report(inventory={"name": "d1", "backend": "tpu", "host": "h", "cores": []})
    assert info.value.field == "inventory" and "backend" in info.value.message
