"""Reliability of the round protocol: the round watchdog (lost agents, stragglers, the
deadline), retries, and resuming after the control plane or the broker restarts.

Built on the round protocol's modules (:mod:`.rounds`, :mod:`.stop`), which never import this
one. A round is normally closed by its chord's callback, once every device's task has returned.
The pieces here handle what a chord cannot:

- **Deadline** (:func:`.rounds.deadlines.round_deadline_s`): ``factor × predicted round time``
  (the experiment's ``deadline_factor`` or ``MTFL_DEADLINE_FACTOR``), or
  ``MTFL_ROUND_DEADLINE_S`` when the plan predicts nothing; never below
  ``MTFL_ROUND_DEADLINE_FLOOR_S``. Stored on the round (``deadline_s``, ``deadline_at``) when it
  starts.
- **The round watchdog** (:func:`round_watchdog`) looks at a running round every
  ``MTFL_ROUND_CHECK_S`` until it ends (each check queues the next, never a countdown longer
  than that, so nothing long waits unacknowledged in a worker). It reads the device tasks'
  results by their stored Celery ids — a chord whose agent died never calls back, but the
  other devices' results are in the result backend — and decides per device:

  * *lost agent*: the task was started by an agent process that is no longer the device's
    agent (it restarted: another pid), or the device sent no heartbeat for
    ``MTFL_HEARTBEAT_OFFLINE_S`` while the round's other devices did;
  * *failed*: the device reported a failure;
  * a lost or failed device is **retried** (its part rebuilt by
    :func:`.rounds.requests.round_device_request_load` and sent again as the next ``attempt``,
    the deadline moved to at least a full deadline later) while the experiment's
    ``device_retries`` allow, else it is failed with the cause and the round goes on without it;
  * at the deadline, a device still training is a **straggler**: excluded from the aggregate,
    its assignments failed with ``straggler: …``, the round flagged, and its task cancelled so
    its agent moves on.

  When every device is settled the round is recorded (:func:`.rounds.record.round_record`:
  ``partial`` when some devices failed, aggregated over the others) and the run continues.
- **Idempotency**: each dispatch of a device's part has a key ``(round, device, attempt)``
  (:func:`workers.protocol.messages.round_idempotency_key`); only results of the device's current
  attempt are recorded, once per round (the round's status is claimed with one conditional
  update), so a redelivered or retried task never counts twice in the aggregate.
- **Resume** (:func:`runs_resume`): every time a control worker connects to the broker (start,
  restart, broker restart) it checks every running round now (re-arming its watchdog, whose
  countdown a restart may have lost), takes back aggregations whose worker died, and moves on
  runs whose next step was lost.
- **Liveness** (:func:`runs_liveness_sweep`): between connections, a message can still be lost
  (one a control worker had prefetched when the broker went away waits for the broker's
  visibility timeout). At most every ``MTFL_ROUND_CHECK_S``, driven by the agents' heartbeats,
  the control worker runs a scheduling pass if a round has been queued that long, and sends the
  next step again of a running run that has had no round in flight for longer than
  :func:`liveness_grace_s`.

Cancelling a run's work in flight is :func:`.stop.run_work_stop`.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Checkpoint, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.evaluation import checkpoints_evaluate_resend
from controlplane.experiments.services.rounds.advance import round_advance
from controlplane.experiments.services.rounds.settle import round_settle
from controlplane.experiments.signals import schedule_now

log = logging.getLogger(__name__)

IN_FLIGHT = frozenset({Round.Status.PENDING, Round.Status.QUEUED, Round.Status.RUNNING, Round.Status.AGGREGATING})
"""Round states of a run that is not between rounds: its next step is on its way."""


# ------------------------------------------------------------------------------ the watchdog


def round_watchdog(*, round_id: int, now: dt.datetime | None = None, claimant: str = "") -> Round | None:
    """The round watchdog's periodic check (:func:`.rounds.settle.round_settle`, re-arming the next check)."""
    return round_settle(round_id=round_id, now=now, claimant=claimant, rearm=True)


# ---------------------------------------------------------------------------------- resume


def _stale_after_s() -> float:
    """A claim older than this was made by a worker that is gone: the hard time limit would
    have killed the task holding it."""
    return float(getattr(settings, "CELERY_TASK_TIME_LIMIT", None) or 900)


class _Abandoned:
    """Whether a claim (of an aggregation, or of a run's initial models) was left by a worker
    that is gone: older than the hard time limit (before ``stale``), or made by this same worker
    (``nodename``) before it booted (``booted``; ``None`` on a reconnection)."""

    def __init__(self, *, stale: dt.datetime, booted: dt.datetime | None, nodename: str) -> None:
        self.stale, self.booted, self.nodename = stale, booted, nodename

    def __call__(self, claimed_by: str, claimed_at: dt.datetime | None) -> bool:
        if claimed_at is None or claimed_at < self.stale:
            return True
        return bool(self.booted and self.nodename and claimed_by == self.nodename and claimed_at < self.booted)


def _reclaim_aggregations(abandoned: _Abandoned) -> int:
    """Put every abandoned aggregation back to ``running``; how many were."""
    reclaimed = 0
    for rnd in Round.objects.filter(status=Round.Status.AGGREGATING).only("id", "claimed_by", "aggregating_at"):
        if abandoned(rnd.claimed_by, rnd.aggregating_at) and Round.objects.filter(
            id=rnd.id, status=Round.Status.AGGREGATING, aggregating_at=rnd.aggregating_at
        ).update(status=Round.Status.RUNNING, claimed_by=""):
            log.warning(
                "round %s: its aggregation was abandoned by %s; it will be redone", rnd.id, rnd.claimed_by or "a worker"
            )
            reclaimed += 1
    return reclaimed


def _recheck_running_rounds(*, now: dt.datetime, deadline_s: float, counts: dict[str, int]) -> None:
    """Send every running round its watchdog check now (``rechecked``), or, for one still
    measuring ``P_alone``, its standalone watchdog (``standalone``); counted in ``counts``."""
    for round_id, run_id, index, deadline_at, started_at in Round.objects.filter(
        status=Round.Status.RUNNING
    ).values_list("id", "run_id", "index", "deadline_at", "started_at"):
        if deadline_at is None:
            # Leased, measuring P_alone before it trains: its standalone watchdog, at what is
            # left of the measurements' deadline.
            left = (started_at + dt.timedelta(seconds=deadline_s) - now).total_seconds() if started_at else 0.0
            transaction.on_commit(
                lambda run_id=run_id, index=index, left=left: dispatch.send_standalone_watchdog(
                    run_id, countdown_s=max(0.0, left), before_round=index
                )
            )
            counts["standalone"] += 1
            continue
        transaction.on_commit(lambda round_id=round_id: dispatch.send_round_watchdog(round_id, countdown_s=0))
        counts["rechecked"] += 1


def _resume_run(run: Run, *, now: dt.datetime, deadline_s: float, abandoned: _Abandoned) -> str | None:
    """Send a running run with no round in flight its next step again; the count it adds to
    (``advanced``, ``standalone`` or ``restarted``), or ``None`` when nothing was sent."""
    rounds = list(run.rounds.order_by("index").only("id", "index", "status", "run_id", "error"))
    if any(r.status in IN_FLIGHT for r in rounds):
        return None
    if rounds:
        round_advance(rounds[-1])
        return "advanced"
    if run.standalone_task_ids:
        left = (run.started_at + dt.timedelta(seconds=deadline_s) - now).total_seconds() if run.started_at else 0
        transaction.on_commit(
            lambda run_id=run.id, left=left: dispatch.send_standalone_watchdog(run_id, countdown_s=max(0.0, left))
        )
        return "standalone"
    if abandoned(run.claimed_by, run.claimed_at or run.started_at) and Run.objects.filter(
        id=run.id, status=Run.Status.RUNNING, standalone_task_ids={}, claimed_at=run.claimed_at
    ).update(
        # started_at stays: the run's wall time counts from its first begin, restart included.
        status=Run.Status.PENDING,
        claimed_at=None,
        claimed_by="",
        restarts=F("restarts") + 1,
        last_restart_at=now,
    ):
        Checkpoint.objects.filter(run=run, round__isnull=True).delete()
        log.warning(
            "run %s: its initial models were being written by a worker that is gone; beginning again "
            "(restart %s, first begun %s)",
            run.id,
            run.restarts + 1,
            run.started_at,
        )
        transaction.on_commit(lambda run_id=run.id: dispatch.send_run_begin(run_id))
        return "restarted"
    return None


def runs_resume(
    *, nodename: str = "", booted_at: float | None = None, now: dt.datetime | None = None
) -> dict[str, int]:
    """Pick up every run in flight after a control worker (re)connected to the broker.

    - An aggregation claimed by a worker that is gone — this same worker before it started
      (``nodename``, claimed before ``booted_at``), or any worker longer ago than the task
      hard time limit — goes back to ``running``: its result is in the result backend.
    - Every running round gets a watchdog check now (its countdown may have been lost with the
      worker or the broker connection); the check records it if all devices answered, and
      re-arms the chain otherwise.
    - A running run with no round in flight has its next step sent again: the next round
      (idempotent), or its end; before round 0, the ``P_alone`` watchdog at the remaining
      deadline, or — if its initial models were being written by a worker that is gone — a
      fresh begin, which keeps the run's first ``started_at`` (its reported wall time includes
      the delay) and counts the restart (``Run.restarts``, ``Run.last_restart_at``).

    - Every checkpoint whose evaluation is pending has it sent again
      (:func:`.evaluation.checkpoints_evaluate_resend`: the message may have died with the worker).

    Args:
        nodename: the Celery node name of the worker that connected (``control@host``).
        booted_at: Unix time that worker started, on its first connection only (``None`` on a
            reconnection: its own tasks may still be running).

    Returns:
        Counts of what was done, by kind.
    """
    now = now or timezone.now()
    booted = dt.datetime.fromtimestamp(booted_at, tz=dt.UTC) if booted_at else None
    stale = now - dt.timedelta(seconds=_stale_after_s())
    counts = {"reclaimed": 0, "rechecked": 0, "advanced": 0, "standalone": 0, "restarted": 0}
    abandoned = _Abandoned(stale=stale, booted=booted, nodename=nodename)
    counts["reclaimed"] = _reclaim_aggregations(abandoned)
    deadline_s = float(mtfl_setting("ROUND_DEADLINE_S"))
    _recheck_running_rounds(now=now, deadline_s=deadline_s, counts=counts)
    # Rounds waiting for devices, and leases a worker that died never released: one pass.
    transaction.on_commit(dispatch.send_lab_schedule)
    for run in Run.objects.filter(status=Run.Status.RUNNING).select_related("experiment"):
        kind = _resume_run(run, now=now, deadline_s=deadline_s, abandoned=abandoned)
        if kind is not None:
            counts[kind] += 1
    counts["evaluations"] = checkpoints_evaluate_resend()
    if any(counts.values()):
        log.warning("resumed after a (re)connection of %s: %s", nodename or "a control worker", counts)
    return counts


def liveness_grace_s() -> float:
    """Seconds a running run may have no round in flight (between one round's aggregation and
    the next round's enqueue) before :func:`runs_liveness_sweep` sends its next step again:
    twice ``MTFL_ROUND_CHECK_S``, at least 10 s (the step is one message; the grace only keeps
    the sweep from racing it)."""
    return max(10.0, 2.0 * float(mtfl_setting("ROUND_CHECK_S")))


def runs_liveness_sweep(*, now: dt.datetime | None = None) -> dict[str, int]:
    """The safety net under the round protocol's chain of messages: nothing a lost message
    leaves waiting waits for ever.

    - Rounds ``queued`` for longer than ``MTFL_ROUND_CHECK_S``: one scheduling pass now
      (:func:`controlplane.lab.services.scheduler.lab_schedule`, idempotent): the ``LAB_SCHEDULE`` that should have
      granted their freed devices may have been lost.
    - A running run with rounds, none of them in flight, whose last round ended more than
      :func:`liveness_grace_s` ago: its next step again (:func:`.rounds.advance.round_advance`:
      ``ROUND_ENQUEUE`` is idempotent, one round row per index; or the run's end).

    Called by the control worker on agents' heartbeats, at most every ``MTFL_ROUND_CHECK_S``
    (:mod:`controlplane.experiments.receivers`).

    Returns:
        Counts of what was done: ``passes`` (0 or 1) and ``advanced`` (runs).
    """
    now = now or timezone.now()
    counts = {"passes": 0, "advanced": 0}
    waited = now - dt.timedelta(seconds=float(mtfl_setting("ROUND_CHECK_S")))
    if Round.objects.filter(status=Round.Status.QUEUED, queued_at__lt=waited).exists():
        schedule_now(now=now)
        counts["passes"] = 1
    ended_before = now - dt.timedelta(seconds=liveness_grace_s())
    idle = list(
        Run.objects.filter(status=Run.Status.RUNNING, rounds__isnull=False)
        .exclude(rounds__status__in=IN_FLIGHT)
        .distinct()
        .values_list("id", flat=True)
    )
    last_rounds: dict[int, Round] = {}
    for rnd in Round.objects.filter(run_id__in=idle).order_by("run_id", "-index"):
        last_rounds.setdefault(rnd.run_id, rnd)
    for run_id, last in last_rounds.items():
        if last.finished_at is None or last.finished_at >= ended_before:
            continue
        # Not inside a transaction: after a run's last round, round_advance evaluates what is
        # still pending before finishing the run, which must not hold SQLite's write lock.
        log.warning("run %s: no round in flight since round %s ended; sending its next step again", run_id, last.index)
        round_advance(last)
        counts["advanced"] += 1
    return counts
