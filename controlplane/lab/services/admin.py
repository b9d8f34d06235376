"""An admin's hand on the lab's fleet: pausing and resuming a device, and device pools.

A paused device is leased to no new round (the round holding it finishes); resuming it runs a
scheduling pass. A pool groups devices of one device class
(:func:`controlplane.fleet.selectors.device_class`) so that runs may name the pool instead of
devices (:func:`controlplane.experiments.services.runs.run_create`'s ``pool``).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Run
from controlplane.experiments.services import dispatch
from controlplane.fleet.models import Device, DevicePool
from controlplane.fleet.selectors import device_class


def _staff(user, action: str) -> None:
    if user is not None and not (user.is_staff or user.is_superuser):
        raise ApplicationError(f"only a lab admin (staff) may {action}", field="user", status_code=403)


def device_pause(*, device: Device, user=None, reason: str = "") -> Device:
    """Pause a device: the lab scheduler leases it to no new round until it is resumed; the
    round holding it now finishes. Pausing a paused device keeps when it was paused, and its
    reason unless a new one is given.

    Raises:
        ApplicationError: ``user`` is not staff (403); ``reason`` longer than 200 characters.
    """
    _staff(user, "pause a device")
    if len(reason) > 200:
        raise ApplicationError(f"reason must be at most 200 characters, got {len(reason)}", field="reason")
    if Device.objects.filter(id=device.id, paused=True).exists():
        if reason:
            Device.objects.filter(id=device.id).update(paused_reason=reason)
    else:
        Device.objects.filter(id=device.id).update(paused=True, paused_reason=reason, paused_at=timezone.now())
    device.refresh_from_db()
    return device


def device_resume(*, device: Device, user=None) -> Device:
    """Resume a paused device; a scheduling pass then hands it to a waiting round.

    Raises:
        ApplicationError: ``user`` is not staff (403).
    """
    _staff(user, "resume a device")
    Device.objects.filter(id=device.id).update(paused=False, paused_reason="", paused_at=None)
    transaction.on_commit(dispatch.send_lab_schedule)
    device.refresh_from_db()
    return device


def _pool_devices(devices: Iterable[Device | int | str]) -> list[Device]:
    """The devices named (instances, ids or names), checked to be of one device class."""
    wanted = list(devices)
    ids = {
        d.id if isinstance(d, Device) else d for d in wanted if isinstance(d, Device | int) and not isinstance(d, bool)
    }
    names = {d for d in wanted if isinstance(d, str)}
    found = list(Device.objects.filter(id__in=ids)) + list(Device.objects.filter(name__in=names).exclude(id__in=ids))
    missing = sorted(str(x) for x in (ids - {d.id for d in found}) | (names - {d.name for d in found}))
    if missing:
        raise ApplicationError(f"devices: no device {', '.join(missing[:5])}", field="devices")
    classes = {device_class(d) for d in found}
    if len(classes) > 1:
        raise ApplicationError(
            f"devices of a pool must be of one device class, got {', '.join(sorted(classes))}", field="devices"
        )
    return found


@transaction.atomic
def pool_create(
    *, name: str, description: str = "", devices: Iterable[Device | int | str] = (), user=None
) -> DevicePool:
    """Create a device pool of devices of one class.

    Raises:
        ApplicationError: ``user`` is not staff (403); ``name`` not a slug (1-63 letters,
            digits, '-' or '_') or taken (409); devices unknown or of different classes.
    """
    _staff(user, "create a pool")
    if not name or slugify(name) != name or len(name) > 63:
        raise ApplicationError(f"name must be 1-63 lower-case letters, digits, '-' or '_', got {name!r}", field="name")
    if DevicePool.objects.filter(name=name).exists():
        raise ApplicationError(f"pool {name} already exists", field="name", status_code=409)
    members = _pool_devices(devices)
    warnings = _pool_leaving_warnings(Device.objects.filter(id__in=[d.id for d in members], pool__isnull=False))
    pool = DevicePool.objects.create(name=name, description=description)
    Device.objects.filter(id__in=[d.id for d in members]).update(pool=pool)
    pool.warnings = warnings  # type: ignore[attr-defined]
    return pool


@transaction.atomic
def pool_set_devices(*, pool: DevicePool, devices: Iterable[Device | int | str], user=None) -> DevicePool:
    """Make ``devices`` the pool's devices (others leave it). The pool's ``warnings`` (set on
    the returned object, as by :func:`pool_create`) name the running runs of pools that lose a
    device.

    Raises:
        ApplicationError: ``user`` is not staff (403); devices unknown or of different classes.
    """
    _staff(user, "change a pool")
    members = _pool_devices(devices)
    ids = [d.id for d in members]
    leaving = Device.objects.filter(pool=pool).exclude(id__in=ids) | Device.objects.filter(
        id__in=ids, pool__isnull=False
    ).exclude(pool=pool)
    warnings = _pool_leaving_warnings(leaving)
    Device.objects.filter(pool=pool).exclude(id__in=ids).update(pool=None)
    Device.objects.filter(id__in=ids).update(pool=pool)
    transaction.on_commit(dispatch.send_lab_schedule)
    pool.warnings = warnings  # type: ignore[attr-defined]
    return pool


@transaction.atomic
def pool_delete(*, pool: DevicePool, user=None) -> None:
    """Delete a pool; its devices serve in no pool afterwards.

    Raises:
        ApplicationError: ``user`` is not staff (403); runs name the pool (409: a run keeps the
            pool it ran on, so the pool goes once they are deleted).
    """
    _staff(user, "delete a pool")
    runs = list(Run.objects.filter(pool=pool).order_by("id").values_list("id", flat=True)[:6])
    if runs:
        shown = ", ".join(map(str, runs[:5])) + (", ..." if len(runs) > 5 else "")
        raise ApplicationError(
            f"pool {pool.name} is named by runs {shown}: a run keeps the pool it ran on; delete those runs "
            "(DELETE /api/runs/{id}/) or keep the pool",
            field="pool",
            status_code=409,
        )
    pool.delete()


def _pool_leaving_warnings(leaving) -> list[str]:
    """One line per running run on a pool that loses devices (a queryset of the devices that
    leave their pool): its next rounds train on fewer devices, so fewer of its shards."""
    lost: dict[int, list[str]] = {}
    for name, pool_id in leaving.values_list("name", "pool_id"):
        lost.setdefault(pool_id, []).append(name)
    lines = []
    runs = Run.objects.filter(pool_id__in=list(lost), status=Run.Status.RUNNING).select_related(
        "pool", "experiment__owner"
    )
    for run in runs.order_by("id"):
        names = ", ".join(sorted(lost[run.pool_id]))
        owner = run.experiment.owner.get_username() if run.experiment.owner else "nobody"
        lines.append(
            f"run {run.id} ({owner}) on pool {run.pool.name} loses {names}: its next rounds train on the pool's "
            "other devices, and the data on these sits out"
        )
    return lines
