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


USAGE_ERROR = 2
"""Exit status of bad input (as argparse's)."""


def number_or_text(text: str) -> int | float | str:
    """What a JSON client would send for a parameter value typed on the command line: an int for
    an integer literal, a float for another number, else the text itself (the service then says
    what the parameter allows)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def params_option(option: str, items: list[str]) -> dict[str, int | float | str]:
    """``NAME=VALUE`` items (``--aggregation-param``, repeated) as ``{name: value}``.

    Raises:
        CommandError: (exit status :data:`USAGE_ERROR`) an item without ``=`` or a name, or a
            name given twice, naming ``--<option>``.
    """
    params: dict[str, int | float | str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise CommandError(
                f"--{option} must be NAME=VALUE (e.g. server_learning_rate=0.01), got {item!r}", returncode=USAGE_ERROR
            )
        if name in params:
            raise CommandError(f"--{option} gives {name!r} more than once", returncode=USAGE_ERROR)
        params[name] = number_or_text(value)
    return params


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
