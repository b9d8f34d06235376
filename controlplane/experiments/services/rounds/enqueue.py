"""Enqueue: a run's round is created ``queued``, holding no device, and a scheduling pass runs
(:func:`controlplane.lab.services.scheduler.lab_schedule`, answering the
:data:`controlplane.experiments.signals.schedule_wanted` signal), which leases its devices and dispatches it
(:func:`.dispatch.round_dispatch`) at once when they are free, or later when they are released.
"""

from __future__ import annotations

from django.utils import timezone

from controlplane.common.artifact_root import storage_space_problem
from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Round, Run
from controlplane.experiments.services.participation import round_participants
from controlplane.experiments.services.runs import run_fail
from controlplane.experiments.signals import schedule_now


def round_enqueue(*, run_id: int, index: int) -> Round | None:
    """Enqueue round ``index`` of a running run, then run a scheduling pass (which dispatches
    it at once when its devices are free).

    Its participants are drawn now (:func:`..participation.round_participants`, seeded: the
    same devices whenever it is asked) unless the run names a pool, whose rounds are placed on
    the pool's free devices when granted.

    Returns:
        The round (``queued``, or ``running`` when the pass granted it), or ``None`` when the
        run is not running, the round already exists (a duplicate delivery), or the round could
        not be enqueued (the run is then failed with the reason: participants that cannot be
        drawn, or less free space in ``ARTIFACT_ROOT`` than ``MTFL_MIN_FREE_BYTES``).
    """
    run = Run.objects.select_related("experiment").get(id=run_id)
    if run.status != Run.Status.RUNNING:
        return None
    if Round.objects.filter(run=run, index=index).exists():
        return None
    problem = storage_space_problem()
    if problem:
        run_fail(run_id=run.id, error=f"round {index} refused to start: {problem}")
        return None
    participants: list[int] | None = None
    if run.pool_id is None:
        try:
            participants = round_participants(run.experiment, index)
        except ApplicationError as exc:
            run_fail(run_id=run.id, error=f"drawing the participants of round {index} failed: {exc}")
            return None
    rnd, created = Round.objects.get_or_create(
        run=run,
        index=index,
        defaults={"status": Round.Status.QUEUED, "queued_at": timezone.now(), "participants": participants},
    )
    if not created:
        return None
    schedule_now()
    rnd.refresh_from_db()
    return rnd
