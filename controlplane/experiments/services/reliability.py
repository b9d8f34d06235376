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

  When every device is settled the round is recorded (:func:`.rounds.record.round_finish`:
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.evaluation import checkpoints_evaluate_resend
from controlplane.experiments.services.rounds.advance import round_advance
from controlplane.experiments.services.rounds.deadlines import round_check_after_s
from controlplane.experiments.services.rounds.record import round_finish
from controlplane.experiments.services.rounds.requests import round_device_request_load
from controlplane.experiments.services.stop import device_tasks_cancel_on_commit
from controlplane.fleet.models import Device
from workers.protocol.messages import DeviceRoundResult, round_idempotency_key

log = logging.getLogger(__name__)

IN_FLIGHT = frozenset({Round.Status.PENDING, Round.Status.QUEUED, Round.Status.RUNNING, Round.Status.AGGREGATING})
"""Round states of a run that is not between rounds: its next step is on its way."""


# ------------------------------------------------------------------------------- deadlines


def _deadline_basis(rnd: Round, experiment) -> str:
    if rnd.deadline_s is None:
        return "MTFL_ROUND_DEADLINE_S"
    if rnd.predicted_round_time_s:
        factor = experiment.deadline_factor or mtfl_setting("DEADLINE_FACTOR")
        return f"{rnd.deadline_s:.0f} s = max({factor:g} × predicted {rnd.predicted_round_time_s:.1f} s, floor)"
    return f"{rnd.deadline_s:.0f} s, MTFL_ROUND_DEADLINE_S"


# ------------------------------------------------------------------------------ the watchdog


@dataclass
class _Slot:
    """One device's part of a round, as the watchdog sees it."""

    name: str
    device_id: int
    attempt: int
    task_id: str
    started: bool
    last_heartbeat_at: dt.datetime | None
    agent_pid: int | None


def _device_slots(rnd: Round) -> dict[str, _Slot]:
    rows = rnd.assignments.values_list("device_id", "attempt", "device_task_id", "status")
    by_device: dict[int, list[tuple]] = {}
    for row in rows:
        by_device.setdefault(row[0], []).append(row)
    # The agent's pid only, not each device's whole inventory (1,000 JSON documents a round).
    devices = Device.objects.filter(id__in=by_device).values_list(
        "id", "name", "last_heartbeat_at", "inventory__agent_pid"
    )
    slots = {}
    for device_id, name, last_heartbeat_at, pid in devices:
        parts = by_device[device_id]
        attempt = max(p[1] for p in parts)
        current = [p for p in parts if p[1] == attempt]
        slots[name] = _Slot(
            name=name,
            device_id=device_id,
            attempt=attempt,
            task_id=current[0][2],
            started=any(p[3] == Assignment.Status.RUNNING for p in current),
            last_heartbeat_at=last_heartbeat_at,
            agent_pid=pid if isinstance(pid, int) else None,
        )
    return slots


def _current_result(raw: Any, rnd: Round, slots: Mapping[str, _Slot]) -> tuple[str, DeviceRoundResult] | None:
    """``(device, result)`` if ``raw`` is a valid result of this round from a device's current
    attempt (its idempotency key, when present, matching), else ``None``. The validated result
    is handed on as it is (:func:`.rounds.record.round_finish` takes it without validating it
    again; dumping 1,000 results to JSON to validate them again took as long as the first time)."""
    try:
        result = DeviceRoundResult.model_validate(raw)
    except PydanticValidationError:
        return None
    slot = slots.get(result.device)
    if slot is None or result.round_id != rnd.id or result.attempt != slot.attempt:
        return None
    if result.idempotency_key and result.idempotency_key != round_idempotency_key(rnd.id, slot.name, slot.attempt):
        return None
    return result.device, result


def _lost_cause(
    slot: _Slot, state: dispatch.TaskState | None, slots: Mapping[str, _Slot], now: dt.datetime
) -> str | None:
    """Why a device that has not answered is taken as lost, or ``None`` while it may still.

    Lost: the agent process that started the task is no longer the device's agent (it
    restarted and registered with another pid), or the device has been silent (no heartbeat)
    for ``MTFL_HEARTBEAT_OFFLINE_S``. Silence is measured against the freshest heartbeat of the
    round's other devices when that is older than now, so a control worker that is behind on
    heartbeats does not take every device for lost.
    """
    if state is not None and state.status == "STARTED" and state.pid and slot.agent_pid and state.pid != slot.agent_pid:
        where = f" on {state.hostname}" if state.hostname else ""
        return (
            f"agent lost: the agent process that started this round on device {slot.name} (pid {state.pid}{where}) "
            f"is gone; the device's agent is now pid {slot.agent_pid}"
        )
    if slot.last_heartbeat_at is None:
        return None
    others = [s.last_heartbeat_at for s in slots.values() if s.name != slot.name and s.last_heartbeat_at]
    reference = min(now, max(others)) if others else now
    silent_s = (reference - slot.last_heartbeat_at).total_seconds()
    offline_s = float(mtfl_setting("HEARTBEAT_OFFLINE_S"))
    if silent_s > offline_s:
        return (
            f"agent lost: no heartbeat from device {slot.name} for {silent_s:.0f} s (MTFL_HEARTBEAT_OFFLINE_S="
            f"{offline_s:g}) while its part of the round was running"
        )
    return None


def round_watchdog(*, round_id: int, now: dt.datetime | None = None, claimant: str = "") -> Round | None:
    """The round watchdog's periodic check (:func:`round_check`, re-arming the next check)."""
    return round_check(round_id=round_id, now=now, claimant=claimant, rearm=True)


def round_check(
    *,
    round_id: int,
    results: Iterable[Any] | None = None,
    now: dt.datetime | None = None,
    claimant: str = "",
    rearm: bool = False,
) -> Round | None:
    """Look at a running round and settle what can be settled (see the module docstring).

    Args:
        results: device results already in hand (the chord's callback passes all of them);
            the others are read from the result backend by task id.
        now: the time to judge the deadline and heartbeats against (default now).
        claimant: the control worker's name, recorded with the aggregation claim.
        rearm: queue the next check if the round goes on (the watchdog's chain; the chord's
            callback leaves the chain to the watchdog).

    Returns:
        The round if it was recorded by this call, else ``None`` (not running, or still
        waiting).
    """
    now = now or timezone.now()
    rnd = Round.objects.select_related("run__experiment").filter(id=round_id).first()
    if rnd is None or rnd.status != Round.Status.RUNNING or rnd.deadline_at is None:
        # Not running, or leased but not yet training (measuring P_alone: the standalone
        # watchdog bounds that phase).
        return None
    experiment = rnd.run.experiment
    slots = _device_slots(rnd)
    known: dict[str, DeviceRoundResult] = {}
    for raw in results or []:
        current = _current_result(raw, rnd, slots)
        if current is not None:
            known.setdefault(*current)
    waiting = [s for s in slots.values() if s.name not in known]
    states = dispatch.device_task_states(s.task_id for s in waiting)
    causes: dict[str, str] = {}
    for slot in waiting:
        state = states.get(slot.task_id)
        if state is not None and state.status == "SUCCESS":
            current = _current_result(state.result, rnd, slots)
            if current is not None:
                known[slot.name] = current[1]
                continue
        if state is not None and state.status in ("FAILURE", "REVOKED"):
            causes[slot.name] = f"the device task ended in state {state.status} without a result"
            continue
        cause = _lost_cause(slot, state, slots, now)
        if cause:
            causes[slot.name] = cause

    if rnd.run.status == Run.Status.RUNNING:
        failed = {
            name: result.error or "the device reported a failure"
            for name, result in known.items()
            if result.status == "failed"
        }
        candidates = [
            slots[name] for name in sorted({*causes, *failed}) if slots[name].attempt < experiment.device_retries
        ]
        retried = _retry_devices(rnd, candidates, {**failed, **causes}, now)
        for name in retried:
            known.pop(name, None)
            causes.pop(name, None)
        if retried:
            rnd.refresh_from_db(fields=["deadline_at", "flags"])
    else:
        retried = []

    deadline_at = rnd.deadline_at or (rnd.started_at or now) + dt.timedelta(
        seconds=float(rnd.deadline_s or mtfl_setting("ROUND_DEADLINE_S"))
    )
    pending = [s for s in slots.values() if s.name not in known and s.name not in causes and s.name not in retried]
    if not pending and not retried:
        device_tasks_cancel_on_commit(
            [slots[name].task_id for name in causes],
            f"round {rnd.index} of run {rnd.run_id} went on without this device",
        )
        return round_finish(round_id=round_id, results=list(known.values()), causes=causes, claimant=claimant)
    if not retried and now >= deadline_at:
        basis = _deadline_basis(rnd, experiment)
        notes = []
        for slot in pending:
            if slot.started:
                causes[slot.name] = (
                    f"straggler: device {slot.name} was still training at the round deadline ({basis}); "
                    "excluded from this round's aggregate"
                )
                notes.append(f"straggler: {slot.name} missed the deadline ({basis}) and was left out of the aggregate")
            else:
                causes[slot.name] = (
                    f"no result from device {slot.name} within the round deadline ({basis}): its agent "
                    "never started this round (offline, or busy with other work)"
                )
        device_tasks_cancel_on_commit(
            [slots[name].task_id for name in causes], f"round {rnd.index} of run {rnd.run_id} passed its deadline"
        )
        return round_finish(
            round_id=round_id, results=list(known.values()), causes=causes, notes=notes, claimant=claimant
        )
    if rearm:
        countdown = round_check_after_s(max(0.0, (deadline_at - now).total_seconds()))
        transaction.on_commit(lambda: dispatch.send_round_watchdog(round_id, countdown_s=countdown))
    return None


def _retry_devices(rnd: Round, slots: list[_Slot], why: Mapping[str, str], now: dt.datetime) -> list[str]:
    """Send each slot's part of the round again as its next attempt; return the devices sent.

    Each retry is claimed with one conditional update of the device's assignments (``attempt``
    from ``k`` to ``k + 1``), so two checks racing retry a device once. The previous attempt's
    task is cancelled (its agent, if alive, stops it), and the round's deadline moves to at
    least ``deadline_s`` after now.
    """
    retried = []
    for slot in slots:
        new_id = dispatch.new_task_id()
        with transaction.atomic():
            claimed = Assignment.objects.filter(round=rnd, device_id=slot.device_id, attempt=slot.attempt).update(
                attempt=slot.attempt + 1,
                device_task_id=new_id,
                status=Assignment.Status.PENDING,
                started_at=None,
                error="",
            )
            if not claimed:
                continue
            current = Round.objects.select_for_update().get(id=rnd.id)
            deadline_s = current.deadline_s or float(mtfl_setting("ROUND_DEADLINE_S"))
            later = now + dt.timedelta(seconds=deadline_s)
            current.deadline_at = max(current.deadline_at, later) if current.deadline_at else later
            reason = why.get(slot.name, "failed")
            current.flags = [
                *current.flags,
                f"{slot.name}: attempt {slot.attempt} failed ({reason.splitlines()[0]}); "
                f"retried as attempt {slot.attempt + 1}",
            ]
            current.save(update_fields=["deadline_at", "flags"])
            request = round_device_request_load(rnd=rnd, device_id=slot.device_id, attempt=slot.attempt + 1)
            old_id = slot.task_id

            def send(request=request, new_id=new_id, old_id=old_id, attempt=slot.attempt) -> None:
                dispatch.cancel_device_tasks([old_id], reason=f"attempt {attempt} superseded by a retry")
                dispatch.send_device_round(request, task_id=new_id)

            transaction.on_commit(send)
        log.warning(
            "round %s: device %s retried as attempt %d (%s)",
            rnd.id,
            slot.name,
            slot.attempt + 1,
            why.get(slot.name, ""),
        )
        retried.append(slot.name)
    return retried


# ---------------------------------------------------------------------------------- resume


def _stale_after_s() -> float:
    """A claim older than this was made by a worker that is gone: the hard time limit would
    have killed the task holding it."""
    return float(getattr(settings, "CELERY_TASK_TIME_LIMIT", None) or 900)


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

    def abandoned(claimed_by: str, claimed_at: dt.datetime | None) -> bool:
        if claimed_at is None or claimed_at < stale:
            return True
        return bool(booted and nodename and claimed_by == nodename and claimed_at < booted)

    for rnd in Round.objects.filter(status=Round.Status.AGGREGATING).only("id", "claimed_by", "aggregating_at"):
        if abandoned(rnd.claimed_by, rnd.aggregating_at) and Round.objects.filter(
            id=rnd.id, status=Round.Status.AGGREGATING, aggregating_at=rnd.aggregating_at
        ).update(status=Round.Status.RUNNING, claimed_by=""):
            log.warning(
                "round %s: its aggregation was abandoned by %s; it will be redone", rnd.id, rnd.claimed_by or "a worker"
            )
            counts["reclaimed"] += 1

    deadline_s = float(mtfl_setting("ROUND_DEADLINE_S"))
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
    # Rounds waiting for devices, and leases a worker that died never released: one pass.
    transaction.on_commit(dispatch.send_lab_schedule)

    for run in Run.objects.filter(status=Run.Status.RUNNING).select_related("experiment"):
        rounds = list(run.rounds.order_by("index").only("id", "index", "status", "run_id", "error"))
        if any(r.status in IN_FLIGHT for r in rounds):
            continue
        if rounds:
            round_advance(rounds[-1])
            counts["advanced"] += 1
        elif run.standalone_task_ids:
            left = (run.started_at + dt.timedelta(seconds=deadline_s) - now).total_seconds() if run.started_at else 0
            transaction.on_commit(
                lambda run_id=run.id, left=left: dispatch.send_standalone_watchdog(run_id, countdown_s=max(0.0, left))
            )
            counts["standalone"] += 1
        elif abandoned(run.claimed_by, run.claimed_at or run.started_at) and Run.objects.filter(
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
            counts["restarted"] += 1
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
      (:func:`.lab.scheduler.lab_schedule`, idempotent): the ``LAB_SCHEDULE`` that should have
      granted their freed devices may have been lost.
    - A running run with rounds, none of them in flight, whose last round ended more than
      :func:`liveness_grace_s` ago: its next step again (:func:`.rounds.advance.round_advance`:
      ``ROUND_START`` is idempotent, one round row per index; or the run's end).

    Called by the control worker on agents' heartbeats, at most every ``MTFL_ROUND_CHECK_S``
    (:mod:`controlplane.experiments.receivers`).

    Returns:
        Counts of what was done: ``passes`` (0 or 1) and ``advanced`` (runs).
    """
    from controlplane.experiments.services.lab.scheduler import lab_schedule

    now = now or timezone.now()
    counts = {"passes": 0, "advanced": 0}
    waited = now - dt.timedelta(seconds=float(mtfl_setting("ROUND_CHECK_S")))
    if Round.objects.filter(status=Round.Status.QUEUED, queued_at__lt=waited).exists():
        lab_schedule(now=now)
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
