"""Reads of fleet state."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.conf import mtfl_setting
from controlplane.fleet.models import Device, DeviceToken
from controlplane.fleet.services import agent_token_hash
from workers.registry.base import PROJECT_DISTRIBUTION
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.registry.partitioners import PARTITIONER_REGISTRY


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

    if not key:
        return None
    return DeviceToken.objects.select_related("device").filter(key_hash=agent_token_hash(key)).first()


PLUGIN_KINDS: tuple[str, ...] = ("models", "datasets", "partitioners")
"""The kinds of plug-in an agent declares (:attr:`workers.protocol.messages.DeviceInventory.plugins`)."""


def is_builtin_source(source: str) -> bool:
    """Whether a plug-in source (``"<distribution> <version>"``) is mtfl-lab itself: a built-in."""

    return source.split(" ", 1)[0] == PROJECT_DISTRIBUTION


def device_declares(device: Device, kind: str, name: str) -> bool:
    """Whether ``device``'s agent can run the ``kind`` (``"models"``, ``"datasets"``,
    ``"partitioners"``) plug-in ``name``.

    An agent that declared nothing (``Device.plugins`` empty: an agent older than plug-in
    declarations, or a device no agent has served, e.g. a ``simulated`` device set up by hand)
    is taken to have mtfl-lab's built-ins and nothing else: what this control plane registers in
    code or from the ``mtfl-lab`` distribution. A plug-in from another package must be declared.
    """
    declared = device.plugins or {}
    if declared:
        return name in (declared.get(kind) or {})

    registry = {"models": MODEL_REGISTRY, "datasets": DATASET_REGISTRY, "partitioners": PARTITIONER_REGISTRY}[kind]
    return name in registry and is_builtin_source(registry.source(name))


def device_declaration_text(device: Device, kind: str) -> str:
    """What ``device``'s agent declares of ``kind``, for a message: ``"a, b"``, ``"none"``, or
    ``"nothing (an agent older than plug-in declarations: mtfl-lab's built-ins are assumed)"``."""
    declared = device.plugins or {}
    if not declared:
        return "nothing (an agent older than plug-in declarations: only mtfl-lab's built-ins are assumed)"
    names = sorted(declared.get(kind) or {})
    return ", ".join(names) if names else "none"


def _plugin_registries() -> dict[str, Any]:
    return {"models": MODEL_REGISTRY, "datasets": DATASET_REGISTRY, "partitioners": PARTITIONER_REGISTRY}


def _shape_or_none(value: Any) -> list[int] | None:
    return [int(d) for d in value] if value else None


def installed_plugin_rows() -> list[dict[str, Any]]:
    """Every model, dataset and partitioner registered in this process (the control plane),
    built-ins included: ``[{"kind", "name", "label", "source", "builtin", "details"}]`` by kind
    then name. ``details`` holds what a form needs: a dataset's ``input_shape`` and
    ``num_classes`` when known without loading it (``None`` when they follow from the files) and
    whether it ``needs_root``; a partitioner's ``parameters`` (``name``, ``label``, ``kind``,
    ``minimum``, ``maximum``, ``minimum_open``, ``default``)."""
    rows = []
    for kind, registry in _plugin_registries().items():
        for record in sorted(registry.records(), key=lambda r: r.name):
            source = registry.source(record.name)
            details: dict[str, Any] = {}
            if kind == "datasets":
                details = {
                    "input_shape": _shape_or_none(getattr(record, "input_shape", None)),
                    "num_classes": getattr(record, "num_classes", None),
                    "needs_root": bool(getattr(record, "needs_root", False)),
                }
            elif kind == "partitioners":
                details = {
                    "parameters": [
                        {
                            "name": p.name,
                            "label": p.label,
                            "kind": p.kind,
                            "minimum": p.minimum,
                            "maximum": p.maximum,
                            "minimum_open": bool(getattr(p, "minimum_open", False)),
                            "default": p.default,
                        }
                        for p in getattr(record, "parameters", ())
                    ]
                }
            rows.append(
                {
                    "kind": kind,
                    "name": record.name,
                    "label": record.label,
                    "source": source,
                    "builtin": is_builtin_source(source),
                    "details": details,
                }
            )
    return rows


def plugin_failure_rows() -> list[dict[str, str]]:
    """Entry points of the three kinds that failed to load in this process:
    ``[{"kind", "group", "name", "value", "error"}]``."""
    return [
        {"kind": kind, "group": f.group, "name": f.name, "value": f.value, "error": f.error}
        for kind, registry in _plugin_registries().items()
        for f in registry.failures
    ]


def device_plugin_declarations(*, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """What every online device's agent declared (:attr:`Device.plugins`), by device name:
    ``[{"id", "name", "backend", "status", "declares_nothing", "plugins"}]``; ``plugins`` is
    ``{kind: {name: "dist version"}}``, ``declares_nothing`` true for an agent older than plug-in
    declarations (mtfl-lab's built-ins are then assumed, :func:`device_declares`)."""
    online = devices_with_status(Device.objects.order_by("name"), Device.Status.ONLINE, now=now)
    return [
        {
            "id": d.id,
            "name": d.name,
            "backend": d.backend,
            "status": Device.Status.ONLINE.value,
            "declares_nothing": not d.plugins,
            "plugins": {kind: dict(sorted((d.plugins or {}).get(kind, {}).items())) for kind in PLUGIN_KINDS},
        }
        for d in online.only("id", "name", "backend", "plugins", "last_heartbeat_at")
    ]


def device_count() -> int:
    """How many devices the federation has."""
    return Device.objects.count()


def device_status_counts() -> dict[str, int]:
    """How many devices are in each effective status (:func:`devices_with_status`), by status."""
    return {status: devices_with_status(Device.objects.all(), status).count() for status in Device.Status.values}


def device_names(ids: Iterable[int]) -> dict[int, str]:
    """The names of the devices ``ids``, by id (no query when there are none)."""
    wanted = list(ids)
    return dict(Device.objects.filter(id__in=wanted).values_list("id", "name")) if wanted else {}
