"""Checks of the ``mtfl`` commands' options, done before any process starts.

Each raises :class:`django.core.management.base.CommandError` with one line naming the option
and what is allowed.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable

from django.core.management.base import CommandError

from workers.protocol.queues import DEVICE_NAME_RE


def int_option(name: str, value: str, lo: int, hi: int) -> int:
    """``value`` as an integer in ``[lo, hi]``."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise CommandError(f"--{name} must be an integer from {lo} to {hi}, got {value!r}") from None
    if not lo <= v <= hi:
        raise CommandError(f"--{name}={v} is out of range: allowed {lo} to {hi}")
    return v


def float_option(name: str, value: str, lo: float, hi: float) -> float:
    """``value`` as a finite number in ``(lo, hi]``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise CommandError(f"--{name} must be a number in ({lo:g}, {hi:g}], got {value!r}") from None
    if not (math.isfinite(v) and lo < v <= hi):
        raise CommandError(f"--{name}={value} is out of range: allowed ({lo:g}, {hi:g}]")
    return v


def list_option(name: str, value: str, allowed: Iterable[str] | None = None, *, allow_empty: bool = False) -> list[str]:
    """A comma-separated list without duplicates, each item among ``allowed`` (if given)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items and not allow_empty:
        raise CommandError(f"--{name} is empty: give at least one" + (f" of {', '.join(allowed)}" if allowed else ""))
    duplicates = sorted({v for v in items if items.count(v) > 1})
    if duplicates:
        raise CommandError(f"--{name} lists {duplicates[0]!r} more than once")
    if allowed is not None:
        allowed = list(allowed)
        for v in items:
            if v not in allowed:
                raise CommandError(f"--{name}: {v!r} is not allowed; allowed: {', '.join(allowed)}")
    return items


def device_names_option(name: str, value: str) -> list[str]:
    """A comma-separated list of distinct valid device names (may be empty)."""
    names = list_option(name, value, allow_empty=True)
    for n in names:
        if not DEVICE_NAME_RE.match(n):
            raise CommandError(f"--{name}: {n!r} is not a valid device name (lower-case letters, digits, '-', '_')")
    return names


def addr_option(value: str) -> str:
    """``host:port`` that this machine can listen on now (checked by binding it).

    Checked before anything starts, so a typo or a busy port does not surface only after a
    whole demo has run.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise CommandError(f"--addr {value!r} must be host:port, e.g. 127.0.0.1:8000")
    port = int_option("addr port", port_text, 1, 65535)
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise CommandError(f"--addr {value!r}: unknown host {host!r} ({exc.strerror})") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise CommandError(f"--addr {value!r} cannot be served: {exc.strerror}") from None
    return value
