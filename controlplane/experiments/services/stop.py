"""Stopping work in flight: a cancelled run's round and device tasks, device tasks the round
protocol no longer waits for (stragglers, devices left behind, superseded attempts), and what the
start of a run that ended before training wrote."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from controlplane.common.artifact_root import run_folders_remove
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from controlplane.experiments.services import dispatch


def device_tasks_cancel_on_commit(task_ids: Iterable[str], reason: str) -> None:
    """Once the current transaction commits, cancel these device tasks on their agents
    (:func:`.dispatch.cancel_device_tasks`: queued ones never run, running ones have their
    trainers killed). Empty ids are skipped; nothing is sent when none is left."""
    ids = [t for t in task_ids if t]
    if ids:
        transaction.on_commit(lambda: dispatch.cancel_device_tasks(ids, reason=reason))


def run_work_stop(*, run_ids: Iterable[int], reason: str) -> int:
    """Stop the work in flight of runs that were just cancelled: their running rounds become
    ``cancelled`` (unfinished assignments failed with ``reason``; a late result is then
    ignored) and, once the transaction commits, their device tasks — the round's, or the
    ``P_alone`` measurements' — are cancelled on the agents.

    Returns:
        The number of device tasks cancelled.
    """
    run_ids = list(run_ids)
    now = timezone.now()
    round_ids = list(Round.objects.filter(run_id__in=run_ids, status=Round.Status.RUNNING).values_list("id", flat=True))
    task_ids = set(
        Assignment.objects.filter(round_id__in=round_ids)
        .exclude(device_task_id="")
        .values_list("device_task_id", flat=True)
    )
    Round.objects.filter(id__in=round_ids, status=Round.Status.RUNNING).update(
        status=Round.Status.CANCELLED, finished_at=now, error=reason
    )
    Assignment.objects.filter(
        round_id__in=round_ids, status__in=[Assignment.Status.PENDING, Assignment.Status.RUNNING]
    ).update(status=Assignment.Status.FAILED, error=reason)
    # P_alone measurements in flight (a round that leased its devices and measures them first);
    # cancelling ids that already finished is harmless.
    for ids in Run.objects.filter(id__in=run_ids).values_list("standalone_task_ids", flat=True):
        task_ids.update((ids or {}).values())
    device_tasks_cancel_on_commit(sorted(task_ids), reason)
    return len(task_ids)


def run_start_undo(*, run_id: int) -> bool:
    """Remove what the start of a run that ended before training wrote: its initial models
    (:class:`Checkpoint` rows without a round, and the run's artifact folder once that commits).

    Called when a run is cancelled (or fails) while starting — while
    :func:`.standalone.run_begin` writes its initial models, or while round 0 waits for its
    devices or measures ``P_alone`` — by the cancel and by ``run_begin`` itself when it sees the
    run has ended (whichever comes last finds what the other left). A run still running, or one
    with a round dispatched to its devices (``Round.deadline_at`` set), is left alone: its files
    are its history, which retention and
    :func:`controlplane.storage.services.retention.run_delete` manage.

    Returns:
        Whether the run's start was undone.
    """
    if Run.objects.filter(id=run_id, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).exists():
        return False
    if Round.objects.filter(run_id=run_id, deadline_at__isnull=False).exists():
        return False
    with transaction.atomic():
        Checkpoint.objects.filter(run_id=run_id, round__isnull=True).delete()
        transaction.on_commit(lambda: run_folders_remove([run_id]))
    return True
