"""Settle: decide, for each device of a running round, whether it answered, is lost, failed,
is retried or missed the deadline, and record the round once every device is settled.

:func:`round_settle` is called by the round's chord callback (``ROUND_SETTLE``, every device's
first attempt answered) and by the round watchdog's periodic check
(:func:`controlplane.experiments.services.reliability.round_watchdog`). A lost or failed device
is retried (its part rebuilt by :func:`.requests.round_device_request_load` and sent again as
the next ``attempt``) while the experiment's ``device_retries`` allow; at the deadline a device
still training is a straggler, left out of the aggregate. Once every device is settled the round
is recorded (:func:`.record.round_record`). The rules are told in
:mod:`controlplane.experiments.services.reliability`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Assignment, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.rounds.deadlines import round_check_after_s
from controlplane.experiments.services.rounds.record import round_record
from controlplane.experiments.services.rounds.requests import round_device_request_load
from controlplane.experiments.services.stop import device_tasks_cancel_on_commit
from controlplane.fleet.models import Device
from workers.protocol.messages import DeviceRoundResult, round_idempotency_key

log = logging.getLogger(__name__)


def _deadline_basis(rnd: Round, experiment) -> str:
    if rnd.deadline_s is None:
        return "MTFL_ROUND_DEADLINE_S"
    if rnd.predicted_round_time_s:
        factor = experiment.deadline_factor or mtfl_setting("DEADLINE_FACTOR")
        return f"{rnd.deadline_s:.0f} s = max({factor:g} × predicted {rnd.predicted_round_time_s:.1f} s, floor)"
    return f"{rnd.deadline_s:.0f} s, MTFL_ROUND_DEADLINE_S"


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
    is handed on as it is (:func:`.record.round_record` takes it without validating it
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


def round_settle(
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
    known, causes = _device_outcomes(rnd, slots, results, now)
    retried = _retry_within_budget(rnd, slots, known, causes, now) if rnd.run.status == Run.Status.RUNNING else []

    deadline_at = rnd.deadline_at or (rnd.started_at or now) + dt.timedelta(
        seconds=float(rnd.deadline_s or mtfl_setting("ROUND_DEADLINE_S"))
    )
    pending = [s for s in slots.values() if s.name not in known and s.name not in causes and s.name not in retried]
    if not pending and not retried:
        device_tasks_cancel_on_commit(
            [slots[name].task_id for name in causes],
            f"round {rnd.index} of run {rnd.run_id} went on without this device",
        )
        return round_record(round_id=round_id, results=list(known.values()), causes=causes, claimant=claimant)
    if not retried and now >= deadline_at:
        notes = _past_deadline(pending, causes, basis=_deadline_basis(rnd, experiment))
        device_tasks_cancel_on_commit(
            [slots[name].task_id for name in causes], f"round {rnd.index} of run {rnd.run_id} passed its deadline"
        )
        return round_record(
            round_id=round_id, results=list(known.values()), causes=causes, notes=notes, claimant=claimant
        )
    if rearm:
        countdown = round_check_after_s(max(0.0, (deadline_at - now).total_seconds()))
        transaction.on_commit(lambda: dispatch.send_round_watchdog(round_id, countdown_s=countdown))
    return None


def _device_outcomes(
    rnd: Round, slots: Mapping[str, _Slot], results: Iterable[Any] | None, now: dt.datetime
) -> tuple[dict[str, DeviceRoundResult], dict[str, str]]:
    """``(known, causes)``: each device's current result, from ``results`` in hand or else the
    result backend, and why each device that has none is taken as failed or lost."""
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
    return known, causes


def _retry_within_budget(
    rnd: Round,
    slots: Mapping[str, _Slot],
    known: dict[str, DeviceRoundResult],
    causes: dict[str, str],
    now: dt.datetime,
) -> list[str]:
    """Retry each failed or lost device the experiment's ``device_retries`` still allow
    (:func:`_retry_devices`), dropping its result and cause from ``known`` and ``causes``, and
    reload the round's deadline and flags if any was; the devices retried."""
    failed = {
        name: result.error or "the device reported a failure"
        for name, result in known.items()
        if result.status == "failed"
    }
    candidates = [
        slots[name] for name in sorted({*causes, *failed}) if slots[name].attempt < rnd.run.experiment.device_retries
    ]
    retried = _retry_devices(rnd, candidates, {**failed, **causes}, now)
    for name in retried:
        known.pop(name, None)
        causes.pop(name, None)
    if retried:
        rnd.refresh_from_db(fields=["deadline_at", "flags"])
    return retried


def _past_deadline(pending: Iterable[_Slot], causes: dict[str, str], *, basis: str) -> list[str]:
    """At the deadline, the cause of each device still pending goes into ``causes``: a
    straggler (it started) or a device whose agent never started the round; the round's flag
    lines about the stragglers."""
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
    return notes


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
