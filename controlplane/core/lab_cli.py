"""Shared pieces of the lab's commands (``mtfl queue``, ``mtfl device-pause``, ``mtfl
device-resume``, ``mtfl pool``): reading the database with a one-line error, and devices by name.

Kept outside ``management/commands/``, where Django would take every public module for a command."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.core.management.base import CommandError
from django.db import DatabaseError

from controlplane.common.errors import ApplicationError
from controlplane.fleet.models import Device

T = TypeVar("T")


def read_lab(what: str, read: Callable[[], T]) -> T:
    """``read()``, with a database that cannot be read (a new ``MTFL_HOME``) or an
    :class:`ApplicationError` turned into one line (a field it names spelled as the option,
    ``devices: ...`` as ``--devices: ...``).

    Raises:
        CommandError: saying what could not be read and what to do.
    """
    try:
        return read()
    except ApplicationError as exc:
        message = exc.message
        if exc.field and message.startswith(f"{exc.field}:"):
            message = f"--{exc.field}{message[len(exc.field) :]}"
        raise CommandError(message) from exc
    except DatabaseError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CommandError(
            f"cannot read {what} from the database ({first}): if it is new, start `mtfl up` or run `mtfl migrate`"
        ) from exc


def device_named(name: str) -> Device:
    """The registered device called ``name``.

    Raises:
        CommandError: no such device (the known ones are listed, up to 20).
    """
    device = Device.objects.filter(name=name).first()
    if device is None:
        known = ", ".join(Device.objects.order_by("name").values_list("name", flat=True)[:20]) or "none"
        raise CommandError(f"no device named {name!r}; devices: {known}")
    return device
