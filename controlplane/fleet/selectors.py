"""Reads of fleet state."""

from __future__ import annotations

import datetime as dt

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.conf import mtfl_setting
from controlplane.fleet.models import Device, DeviceToken


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


def devices_with_status(queryset: QuerySet[Device], status: str, *, now: dt.datetime | None = None) -> QuerySet[Device]:
    """Filter devices by the status :func:`device_effective_status` would give them."""
    threshold = (now or timezone.now()) - dt.timedelta(seconds=mtfl_setting("HEARTBEAT_OFFLINE_S"))
    if status == Device.Status.UNKNOWN:
        return queryset.filter(last_heartbeat_at__isnull=True)
    if status == Device.Status.ONLINE:
        return queryset.filter(last_heartbeat_at__gte=threshold)
    if status == Device.Status.OFFLINE:
        return queryset.filter(last_heartbeat_at__lt=threshold)
    raise ValueError(f"status must be one of {', '.join(Device.Status.values)}, got {status!r}")


def device_class(device: Device) -> str:
    """The class of devices a predictor fitted on this one applies to: same backend and the
    same resources — ``cpu-2cores`` (the cpu backend on 2 cores), or the backend and the
    accelerator's model when the agent reports one (``simulated-titan-v``)."""
    accelerator = device.inventory.get("accelerator")
    if accelerator:
        return f"{device.backend}-{accelerator}"
    cores = device.inventory.get("cores") or []
    return f"{device.backend}-{len(cores)}cores"


def device_cores(device: Device) -> int:
    """The units a share is granted in (the predictor's device descriptor): the accelerator's
    allocation units when the agent reports them (SMs), else its cores."""
    return int(device.inventory.get("allocation_units") or 0) or len(device.inventory.get("cores") or []) or 1


def device_token_for_key(key: str) -> DeviceToken | None:
    """The agent token whose key is ``key`` (looked up by its SHA-256), with its device; else
    ``None``."""
    from controlplane.fleet.services import agent_token_hash

    if not key:
        return None
    return DeviceToken.objects.select_related("device").filter(key_hash=agent_token_hash(key)).first()
