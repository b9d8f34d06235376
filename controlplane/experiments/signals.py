"""Signals the experiments app sends, for the apps above it (the lab leases devices to rounds and
runs the scheduling passes, :mod:`controlplane.lab`): experiments imports none of them.

The round protocol and the runs' ends say what happened here; what the lab does about it is the
lab's (its receivers are connected in :meth:`controlplane.lab.apps.LabConfig.ready`). Signals are
synchronous, so a receiver runs in the sender's transaction, as a direct call would.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.dispatch import Signal

devices_released = Signal()
"""Sent when rounds no longer need their devices (their results are in) or a run ended, with
``round_ids`` (or ``None``), ``run_id`` (or ``None``), ``reason`` and ``now`` (or ``None``: the
time of the release). Each receiver returns how many device leases it released."""

schedule_wanted = Signal()
"""Sent when a scheduling pass should run at once, in this process: a round was enqueued, a
control worker restarted. With ``now`` (or ``None``)."""


def release_devices(
    *, round_ids: Iterable[int] | None = None, run_id: int | None = None, reason: str, now: dt.datetime | None = None
) -> int:
    """Send :data:`devices_released` for some rounds, or for every round of a run.

    Returns:
        How many device leases the receivers released (0: none was held).
    """
    responses = devices_released.send(
        sender=None, round_ids=None if round_ids is None else list(round_ids), run_id=run_id, reason=reason, now=now
    )
    return sum(int(released or 0) for _, released in responses)


def schedule_now(*, now: dt.datetime | None = None) -> None:
    """Send :data:`schedule_wanted`: the lab runs one scheduling pass before this returns."""
    schedule_wanted.send(sender=None, now=now)
