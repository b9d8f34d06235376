"""Reliability of the round protocol: deadlines, lost agents, stragglers, retries, cancellation,
and resuming after the control plane or the broker restarts.

A round is normally closed by its chord's callback, once every device's task has returned. The
pieces here handle what a chord cannot:

- **Deadline** (:func:`round_deadline_s`): ``factor × predicted round time`` (the experiment's
  ``deadline_factor`` or ``MTFL_DEADLINE_FACTOR``), or ``MTFL_ROUND_DEADLINE_S`` when the plan
  predicts nothing; never below ``MTFL_ROUND_DEADLINE_FLOOR_S``. Stored on the round
  (``deadline_s``, ``deadline_at``).
- **The round watchdog** (:func:`round_watchdog`) looks at a running round every
  ``MTFL_ROUND_CHECK_S`` until it ends (each check queues the next, never a countdown longer
  than that, so nothing long waits unacknowledged in a worker). It reads the device tasks'
  results by their stored Celery ids — a chord whose agent died never calls back, but the
  other devices' results are in the result backend — and decides per device:

  * *lost agent*: the task was started by an agent process that is no longer the device's
    agent (it restarted: another pid), or the device sent no heartbeat for
    ``MTFL_HEARTBEAT_OFFLINE_S`` while the round's other devices did;
  * *failed*: the device reported a failure;
  * a lost or failed device is **retried** (its part sent again as the next ``attempt``, the
    deadline moved to at least a full deadline later) while the experiment's
    ``device_retries`` allow, else it is failed with the cause and the round goes on without it;
  * at the deadline, a device still training is a **straggler**: excluded from the aggregate,
    its assignments failed with ``straggler: …``, the round flagged, and its task cancelled so
    its agent moves on.

  When every device is settled the round is recorded (:func:`.runs.round_finish`: ``partial``
  when some devices failed, FedAvg over the others) and the run continues.
- **Idempotency**: each dispatch of a device's part has a key ``(round, device, attempt)``
  (:func:`workers.messages.round_idempotency_key`); only results of the device's current
  attempt are recorded, once per round (the round's status is claimed with one conditional
  update), so a redelivered or retried task never counts twice in FedAvg.
- **Cancel** (:func:`run_work_stop`): a cancelled run's in-flight round is cancelled and its
  device tasks cancelled (:func:`.dispatch.cancel_device_tasks`: queued ones never run, running
  ones have their trainers killed).
- **Resume** (:func:`runs_resume`): every time a control worker connects to the broker (start,
  restart, broker restart) it checks every running round now (re-arming its watchdog, whose
  countdown a restart may have lost), takes back aggregations whose worker died, and moves on
  runs whose next step was lost.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.fleet.models import Device
from workers.artifacts import device_weights_key
from workers.messages import AssignmentSpec, DeviceRoundResult, TrainRoundRequest, round_idempotency_key

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- deadlines


def round_deadline_s(*, predicted_round_time_s: float | None, factor: float | None = None) -> float:
    """How long a round waits for its devices, in seconds.

    ``factor × predicted_round_time_s`` when the plan predicts the round time (``vres_*``
    runs), else ``MTFL_ROUND_DEADLINE_S``; never below ``MTFL_ROUND_DEADLINE_FLOOR_S`` (trainer
    start-up and data loading are not in the prediction).

    Args:
        predicted_round_time_s: the plan's predicted round time, or ``None``.
        factor: the experiment's ``deadline_factor``; ``None`` for ``MTFL_DEADLINE_FACTOR``.
    """
    floor = float(mtfl_setting("ROUND_DEADLINE_FLOOR_S"))
    if predicted_round_time_s is not None and predicted_round_time_s > 0:
        factor = float(factor if factor is not None else mtfl_setting("DEADLINE_FACTOR"))
        return max(floor, factor * float(predicted_round_time_s))
    return max(floor, float(mtfl_setting("ROUND_DEADLINE_S")))


def check_after_s(deadline_s: float) -> float:
    """Seconds until a round's next watchdog check: ``MTFL_ROUND_CHECK_S``, or the deadline if
    it comes first."""
    return max(0.0, min(float(mtfl_setting("ROUND_CHECK_S")), deadline_s))


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
    devices = Device.objects.filter(id__in=by_device).only("id", "name", "last_heartbeat_at", "inventory")
    slots = {}
    for device in devices:
        parts = by_device[device.id]
        attempt = max(p[1] for p in parts)
        current = [p for p in parts if p[1] == attempt]
        pid = (device.inventory or {}).get("agent_pid")
        slots[device.name] = _Slot(
            name=device.name, device_id=device.id, attempt=attempt, task_id=current[0][2],
            started=any(p[3] == Assignment.Status.RUNNING for p in current),
            last_heartbeat_at=device.last_heartbeat_at, agent_pid=pid if isinstance(pid, int) else None,
        )
    return slots


def _current_result(raw: Any, rnd: Round, slots: Mapping[str, _Slot]) -> tuple[str, dict] | None:
    """``(device, result JSON)`` if ``raw`` is a valid result of this round from a device's
    current attempt (its idempotency key, when present, matching), else ``None``."""
    try:
        result = DeviceRoundResult.model_validate(raw)
    except PydanticValidationError:
        return None
    slot = slots.get(result.device)
    if slot is None or result.round_id != rnd.id or result.attempt != slot.attempt:
        return None
    if result.idempotency_key and result.idempotency_key != round_idempotency_key(rnd.id, slot.name, slot.attempt):
        return None
    return result.device, result.model_dump(mode="json")


def _lost_cause(slot: _Slot, state: dispatch.TaskState | None, slots: Mapping[str, _Slot],
                now: dt.datetime) -> str | None:
    """Why a device that has not answered is taken as lost, or ``None`` while it may still.

    Lost: the agent process that started the task is no longer the device's agent (it
    restarted and registered with another pid), or the device has been silent (no heartbeat)
    for ``MTFL_HEARTBEAT_OFFLINE_S``. Silence is measured against the freshest heartbeat of the
    round's other devices when that is older than now, so a control worker that is behind on
    heartbeats does not take every device for lost.
    """
    if state is not None and state.status == "STARTED" and state.pid and slot.agent_pid and state.pid != slot.agent_pid:
        where = f" on {state.hostname}" if state.hostname else ""
        return (f"agent lost: the agent process that started this round on device {slot.name} (pid {state.pid}{where}) "
                f"is gone; the device's agent is now pid {slot.agent_pid}")
    if slot.last_heartbeat_at is None:
        return None
    others = [s.last_heartbeat_at for s in slots.values() if s.name != slot.name and s.last_heartbeat_at]
    reference = min(now, max(others)) if others else now
    silent_s = (reference - slot.last_heartbeat_at).total_seconds()
    offline_s = float(mtfl_setting("HEARTBEAT_OFFLINE_S"))
    if silent_s > offline_s:
        return (f"agent lost: no heartbeat from device {slot.name} for {silent_s:.0f} s (MTFL_HEARTBEAT_OFFLINE_S="
                f"{offline_s:g}) while its part of the round was running")
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
    from controlplane.experiments.services.runs import round_finish

    now = now or timezone.now()
    rnd = Round.objects.select_related("run__experiment").filter(id=round_id).first()
    if rnd is None or rnd.status != Round.Status.RUNNING:
        return None
    experiment = rnd.run.experiment
    slots = _device_slots(rnd)
    known: dict[str, dict] = {}
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
        failed = {name: result.get("error") or "the device reported a failure"
                  for name, result in known.items() if result.get("status") == "failed"}
        candidates = [slots[name] for name in sorted({*causes, *failed})
                      if slots[name].attempt < experiment.device_retries]
        retried = _retry_devices(rnd, candidates, {**failed, **causes}, now)
        for name in retried:
            known.pop(name, None)
            causes.pop(name, None)
        if retried:
            rnd.refresh_from_db(fields=["deadline_at", "flags"])
    else:
        retried = []

    deadline_at = rnd.deadline_at or (rnd.started_at or now) + dt.timedelta(seconds=float(
        rnd.deadline_s or mtfl_setting("ROUND_DEADLINE_S")))
    pending = [s for s in slots.values() if s.name not in known and s.name not in causes and s.name not in retried]
    if not pending and not retried:
        _cancel_tasks([slots[name].task_id for name in causes], f"round {rnd.index} of run {rnd.run_id} "
                                                                   "went on without this device")
        return round_finish(round_id=round_id, results=list(known.values()), causes=causes, claimant=claimant)
    if not retried and now >= deadline_at:
        basis = _deadline_basis(rnd, experiment)
        notes = []
        for slot in pending:
            if slot.started:
                causes[slot.name] = (f"straggler: device {slot.name} was still training at the round deadline ({basis}); "
                                     "excluded from this round's aggregate")
                notes.append(f"straggler: {slot.name} missed the deadline ({basis}) and was left out of the aggregate")
            else:
                causes[slot.name] = (f"no result from device {slot.name} within the round deadline ({basis}): its agent "
                                     "never started this round (offline, or busy with other work)")
        _cancel_tasks([slots[name].task_id for name in causes],
                      f"round {rnd.index} of run {rnd.run_id} passed its deadline")
        return round_finish(round_id=round_id, results=list(known.values()), causes=causes, notes=notes,
                            claimant=claimant)
    if rearm:
        countdown = check_after_s(max(0.0, (deadline_at - now).total_seconds()))
        transaction.on_commit(lambda: dispatch.send_round_watchdog(round_id, countdown_s=countdown))
    return None


def _cancel_tasks(task_ids: list[str], reason: str) -> None:
    ids = [t for t in task_ids if t]
    if ids:
        transaction.on_commit(lambda: dispatch.cancel_device_tasks(ids, reason=reason))


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
                attempt=slot.attempt + 1, device_task_id=new_id, status=Assignment.Status.PENDING, started_at=None,
                error="",
            )
            if not claimed:
                continue
            current = Round.objects.select_for_update().get(id=rnd.id)
            deadline_s = current.deadline_s or float(mtfl_setting("ROUND_DEADLINE_S"))
            later = now + dt.timedelta(seconds=deadline_s)
            current.deadline_at = max(current.deadline_at, later) if current.deadline_at else later
            reason = why.get(slot.name, "failed")
            current.flags = [*current.flags, f"{slot.name}: attempt {slot.attempt} failed ({reason.splitlines()[0]}); "
                                             f"retried as attempt {slot.attempt + 1}"]
            current.save(update_fields=["deadline_at", "flags"])
            request = _device_request(rnd, slot.device_id, slot.attempt + 1)
            old_id = slot.task_id

            def send(request=request, new_id=new_id, old_id=old_id, attempt=slot.attempt) -> None:
                dispatch.cancel_device_tasks([old_id], reason=f"attempt {attempt} superseded by a retry")
                dispatch.send_device_round(request, task_id=new_id)

            transaction.on_commit(send)
        log.warning("round %s: device %s retried as attempt %d (%s)", rnd.id, slot.name, slot.attempt + 1,
                    why.get(slot.name, ""))
        retried.append(slot.name)
    return retried


def _device_request(rnd: Round, device_id: int, attempt: int) -> TrainRoundRequest:
    """Rebuild a device's part of a round from the database, for ``attempt`` (as
    :func:`.runs.round_start` built it: same assignments, shards, global models and seeds)."""
    from controlplane.experiments.services.runs import _plan, _shard_ref

    run = rnd.run
    experiment = run.experiment
    device = Device.objects.get(id=device_id)
    rows = list(rnd.assignments.filter(device_id=device_id).select_related("task").order_by("task_id"))
    shards = selectors.experiment_shards(experiment)
    latest = selectors.latest_checkpoints(run)
    specs = [
        AssignmentSpec(
            assignment_id=a.id,
            task=selectors.task_ref(a.task),
            batch_size=a.batch_size,
            active_thread_percentage=a.active_thread_percentage,
            shard=_shard_ref(experiment, shards[(device_id, a.task_id)]),
            local_epochs=experiment.local_epochs,
            global_weights=latest[a.task_id].artifact_path,
            output_weights=device_weights_key(run.id, rnd.index, device.name, a.task_id),
            seed=experiment.seed * 1000 + rnd.index,
        )
        for a in rows
    ]
    return TrainRoundRequest(
        run_id=run.id, round_id=rnd.id, round_index=rnd.index, device=device.name, backend=device.backend,
        partitioning=_plan(run).partitioning, warmup_iterations=mtfl_setting("WARMUP_ITERATIONS"),
        assignments=specs, attempt=attempt, idempotency_key=round_idempotency_key(rnd.id, device.name, attempt),
    )


# ---------------------------------------------------------------------------------- cancel


def run_work_stop(*, run_ids: Iterable[int], reason: str) -> int:
    """Stop the work in flight of runs that were just cancelled: their running rounds become
    ``cancelled`` (unfinished assignments failed with ``reason``; a late result is then
    ignored) and, once the transaction commits, their device tasks — the round's, or the
    ``P_alone`` measurements' before round 0 — are cancelled on the agents.

    Returns:
        The number of device tasks cancelled.
    """
    run_ids = list(run_ids)
    now = timezone.now()
    round_ids = list(Round.objects.filter(run_id__in=run_ids, status=Round.Status.RUNNING).values_list("id", flat=True))
    task_ids = set(
        Assignment.objects.filter(round_id__in=round_ids).exclude(device_task_id="")
        .values_list("device_task_id", flat=True)
    )
    Round.objects.filter(id__in=round_ids, status=Round.Status.RUNNING).update(
        status=Round.Status.CANCELLED, finished_at=now, error=reason
    )
    Assignment.objects.filter(
        round_id__in=round_ids, status__in=[Assignment.Status.PENDING, Assignment.Status.RUNNING]
    ).update(status=Assignment.Status.FAILED, error=reason)
    for ids in Run.objects.filter(id__in=run_ids, rounds__isnull=True).values_list("standalone_task_ids", flat=True):
        task_ids.update((ids or {}).values())
    _cancel_tasks(sorted(task_ids), reason)
    return len(task_ids)


# ---------------------------------------------------------------------------------- resume


def _stale_after_s() -> float:
    """A claim older than this was made by a worker that is gone: the hard time limit would
    have killed the task holding it."""
    return float(getattr(settings, "CELERY_TASK_TIME_LIMIT", None) or 900)


def runs_resume(*, nodename: str = "", booted_at: float | None = None, now: dt.datetime | None = None) -> dict[str, int]:
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
      fresh begin.

    Args:
        nodename: the Celery node name of the worker that connected (``control@host``).
        booted_at: Unix time that worker started, on its first connection only (``None`` on a
            reconnection: its own tasks may still be running).

    Returns:
        Counts of what was done, by kind.
    """
    from controlplane.experiments.services.runs import _advance

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
            log.warning("round %s: its aggregation was abandoned by %s; it will be redone", rnd.id,
                        rnd.claimed_by or "a worker")
            counts["reclaimed"] += 1

    for round_id in Round.objects.filter(status=Round.Status.RUNNING).values_list("id", flat=True):
        transaction.on_commit(lambda round_id=round_id: dispatch.send_round_watchdog(round_id, countdown_s=0))
        counts["rechecked"] += 1

    in_flight = {Round.Status.PENDING, Round.Status.RUNNING, Round.Status.AGGREGATING}
    deadline_s = float(mtfl_setting("ROUND_DEADLINE_S"))
    for run in Run.objects.filter(status=Run.Status.RUNNING).select_related("experiment"):
        rounds = list(run.rounds.order_by("index").only("id", "index", "status", "run_id", "error"))
        if any(r.status in in_flight for r in rounds):
            continue
        if rounds:
            _advance(rounds[-1])
            counts["advanced"] += 1
        elif run.standalone_task_ids:
            left = (run.started_at + dt.timedelta(seconds=deadline_s) - now).total_seconds() if run.started_at else 0
            transaction.on_commit(lambda run_id=run.id, left=left: dispatch.send_standalone_watchdog(
                run_id, countdown_s=max(0.0, left)))
            counts["standalone"] += 1
        elif abandoned(run.claimed_by, run.started_at) and Run.objects.filter(
            id=run.id, status=Run.Status.RUNNING, standalone_task_ids={}, started_at=run.started_at
        ).update(status=Run.Status.PENDING, started_at=None, claimed_by=""):
            Checkpoint.objects.filter(run=run, round__isnull=True).delete()
            log.warning("run %s: its initial models were being written by a worker that is gone; beginning again",
                        run.id)
            transaction.on_commit(lambda run_id=run.id: dispatch.send_run_begin(run_id))
            counts["restarted"] += 1
    if any(counts.values()):
        log.warning("resumed after a (re)connection of %s: %s", nodename or "a control worker", counts)
    return counts
