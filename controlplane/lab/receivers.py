"""The lab's receivers of the experiments app's signals (connected in
:meth:`.apps.LabConfig.ready`; see :mod:`controlplane.experiments.signals`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from controlplane.lab.services.leases import leases_release
from controlplane.lab.services.scheduler import lab_schedule


def leases_release_on_signal(
    *,
    round_ids: list[int] | None = None,
    run_id: int | None = None,
    reason: str,
    now: dt.datetime | None = None,
    **_kwargs: Any,
) -> int:
    """Release the leases of the rounds (or the run) that no longer need their devices
    (:func:`.services.leases.leases_release`); returns how many were released."""
    return leases_release(round_ids=round_ids, run_id=run_id, reason=reason, now=now)


def lab_schedule_on_signal(*, now: dt.datetime | None = None, **_kwargs: Any) -> None:
    """Run one scheduling pass (:func:`.services.scheduler.lab_schedule`)."""
    lab_schedule(now=now)
