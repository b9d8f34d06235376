"""Writes to fleet state: creating devices, recording what their agents report, issuing their
agents' tokens."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.common.errors import ApplicationError
from controlplane.common.registered import registered
from controlplane.fleet.models import Device, DeviceToken
from workers.protocol.messages import DeviceInventory
from workers.protocol.queues import DEVICE_NAME_RE
from workers.registry.backends import BACKEND_REGISTRY
from workers.registry.names import check_names


def _check_name(name: str) -> None:
    if not DEVICE_NAME_RE.match(name or ""):
        raise ApplicationError(
            f"device name {name!r} is invalid: use 1-63 lower-case letters, digits, '-' or '_'",
            field="name",
        )


def _check_backend(backend: str) -> None:
    registered(BACKEND_REGISTRY, backend, field="backend")


@transaction.atomic
def device_create(*, name: str, backend: str = "cpu") -> Device:
    """Register a device that an agent will serve (``mtfl agent --device NAME``).

    Raises:
        ApplicationError: invalid or duplicate name, unknown backend.
    """
    _check_name(name)
    _check_backend(backend)
    if Device.objects.filter(name=name).exists():
        raise ApplicationError(f"a device named {name!r} already exists", field="name")
    return Device.objects.create(name=name, backend=backend)


@transaction.atomic
def device_update(*, device: Device, backend: str | None = None) -> Device:
    """Change a device's backend (its name is its queue and cannot change).

    Raises:
        ApplicationError: unknown backend.
    """
    if backend is not None:
        _check_backend(backend)
        device.backend = backend
        device.save(update_fields=["backend"])
    return device


@transaction.atomic
def device_report(*, inventory: dict, at: dt.datetime | None = None) -> Device:
    """Record an agent's start-up registration or heartbeat; creates the device if new.

    The agent's plug-in declaration (``DeviceInventory.plugins``: models, data sets and
    partitioners it can run, each with the distribution providing it) is kept apart from the
    rest of the inventory, as :attr:`Device.plugins`: a run is refused before dispatch when a
    device lacks what its tasks need (:mod:`controlplane.experiments.services.plugins`).

    Args:
        inventory: a :class:`workers.protocol.messages.DeviceInventory` as JSON.
        at: when it was received (default now).

    Raises:
        ApplicationError: the payload is not a valid inventory.
    """
    try:
        inv = check_names(DeviceInventory.model_validate(inventory))
    except PydanticValidationError as exc:
        raise ApplicationError(f"invalid device inventory: {exc}", field="inventory") from exc
    _check_name(inv.name)
    device, _ = Device.objects.select_for_update().get_or_create(name=inv.name, defaults={"backend": inv.backend})
    device.backend = inv.backend
    device.inventory = inv.model_dump(mode="json", exclude={"plugins"})
    device.plugins = {kind: dict(names) for kind, names in inv.plugins.items()}
    device.last_heartbeat_at = at or timezone.now()
    device.status = Device.Status.ONLINE
    device.save(update_fields=["backend", "inventory", "plugins", "last_heartbeat_at", "status"])
    return device


AGENT_TOKEN_BYTES = 32
"""Random bytes in an agent token (``secrets.token_urlsafe``: 43 characters)."""

TOKEN_TOUCH_INTERVAL = dt.timedelta(seconds=60)
"""``last_used_at`` is written at most this often per token (not on every request)."""


def agent_token_hash(key: str) -> str:
    """Return the hex SHA-256 of an agent token's key, as :class:`DeviceToken` stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@transaction.atomic
def device_token_issue(*, device: Device, issued_by=None) -> tuple[DeviceToken, str]:
    """Issue a new agent token for ``device``, replacing (revoking) the one it had.

    Args:
        device: the device whose agent will present the key.
        issued_by: the user issuing it, or ``None`` (the command line).

    Returns:
        ``(token, key)``: the stored token (its key's hash only) and the key itself, which is
        not stored anywhere and cannot be shown again.
    """
    key = secrets.token_urlsafe(AGENT_TOKEN_BYTES)
    token, _ = DeviceToken.objects.update_or_create(
        device=device,
        defaults={
            "key_hash": agent_token_hash(key),
            "created_at": timezone.now(),
            "created_by": issued_by,
            "last_used_at": None,
        },
    )
    return token, key


def device_token_touch(*, token: DeviceToken, at: dt.datetime | None = None) -> None:
    """Record that an agent used its token (at most once per :data:`TOKEN_TOUCH_INTERVAL`)."""
    now = at or timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < TOKEN_TOUCH_INTERVAL:
        return
    DeviceToken.objects.filter(id=token.id).update(last_used_at=now)
    token.last_used_at = now
