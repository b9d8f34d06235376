"""Reads of fleet state."""

from __future__ import annotations

import datetime as dt

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.conf import mtfl_setting
from controlplane.fleet.models import Device


def device_list() -> QuerySet[Device]:
    """All devices, by name."""
    return Device.objects.order_by("name")


def device_effective_status(device: Device, *, now: dt.datetime | None = None) -> str:
    """``online`` if the agent's last heartbeat is recent (``MTFL_HEARTBEAT_OFFLINE_S``), else
    ``offline``; ``unknown`` if no agent ever reported."""
    if device.last_heartbeat_at is None:
        return Device.Status.UNKNOWN
    age_s = ((now or timezone.now()) - device.last_heartbeat_at).total_seconds()
    return Device.Status.ONLINE if age_s <= mtfl_setting("HEARTBEAT_OFFLINE_S") else Device.Status.OFFLINE
