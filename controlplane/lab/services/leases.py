"""Device leases: which round holds which device (:class:`~controlplane.lab.models.DeviceLease`).

A device is held by at most one lease (a partial unique constraint on the rows not yet released),
so :func:`leases_claim` claims all of a round's devices with one conditional ``INSERT`` inside a
savepoint: if any of them is held, the database refuses the statement and nothing is claimed.
Two control workers granting at the same moment cannot both win a device, on SQLite or
PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from controlplane.common.bulk import bulk_insert
from controlplane.experiments.models import Round, Run
from controlplane.lab.models import DeviceLease


def held_leases() -> QuerySet[DeviceLease]:
    """The leases held now (not released)."""
    return DeviceLease.objects.filter(released_at__isnull=True)


def leases_claim(*, rnd: Round, device_ids: Sequence[int], owner_id: int | None, now: dt.datetime) -> bool:
    """Lease every device of ``device_ids`` to round ``rnd``, or none of them.

    Returns:
        ``True`` when all were free and are now held by ``rnd``; ``False`` when any is held
        (then nothing was written).
    """
    if not device_ids:
        return False
    rows = [
        {"device_id": d, "run_id": rnd.run_id, "round_id": rnd.id, "owner_id": owner_id, "granted_at": now}
        for d in sorted(set(device_ids))
    ]
    try:
        with transaction.atomic():
            bulk_insert(DeviceLease, rows)
    except IntegrityError:
        return False
    return True


def leases_release(
    *, round_ids: Iterable[int] | None = None, run_id: int | None = None, reason: str, now: dt.datetime | None = None
) -> int:
    """Release the held leases of some rounds, or of every round of a run.

    Returns:
        How many leases were released.
    """
    held = held_leases()
    if round_ids is not None:
        held = held.filter(round_id__in=list(round_ids))
    elif run_id is not None:
        held = held.filter(run_id=run_id)
    else:
        raise ValueError("leases_release needs round_ids or run_id")
    return held.update(released_at=now or timezone.now(), release_reason=reason[:200])


def leases_sweep(*, now: dt.datetime | None = None) -> int:
    """Release every lease its round no longer needs: the round is not running any more
    (finished, failed, cancelled, deleted), or its run is not running (a crash that failed the
    run, a cancel). What keeps a dead run from blocking a device for ever; every scheduling pass
    starts with it.

    Returns:
        How many leases were released.
    """
    stale = held_leases().exclude(Q(round__status=Round.Status.RUNNING) & Q(run__status=Run.Status.RUNNING))
    return stale.update(released_at=now or timezone.now(), release_reason="its round or run had ended")
