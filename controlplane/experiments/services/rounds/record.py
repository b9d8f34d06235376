"""Recording a round: the devices' progress while it runs, then their results once it is
settled — measurements, the aggregate (:mod:`.aggregate`), the round's metrics
(:mod:`controlplane.planning.metrics`) — and moving the run on (:mod:`.advance`).

Only a result of a device's current attempt counts (its ``attempt`` and, when set, its
``idempotency_key``), once: the round is claimed with one conditional update (running →
aggregating), so a duplicate delivery or a late callback after the watchdog records nothing
twice.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import connections, models, router, transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.common.bulk import bulk_set, db_value
from controlplane.experiments import selectors
from controlplane.experiments.models import ASSIGNMENT_RESULT_COLUMNS, Assignment, Checkpoint, DeviceTelemetry, Round
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.planning import round_timesliced_devices
from controlplane.experiments.services.rounds.advance import round_advance
from controlplane.experiments.services.rounds.aggregate import round_aggregate
from controlplane.experiments.services.runs import run_fail
from controlplane.experiments.services.samples import samples_from_round
from controlplane.experiments.services.weights import weights_problems
from controlplane.experiments.signals import release_devices
from controlplane.fleet.models import Device
from controlplane.planning import metrics
from workers.fl.artifacts import device_weights_key, get_store
from workers.protocol.messages import AssignmentResult, DeviceRoundResult, round_idempotency_key

log = logging.getLogger(__name__)


def _ts(value: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, tz=dt.UTC) if value is not None else None


_TEXT_LIMIT = 10_000
"""Characters kept of a free-text column a trainer fills (a log excerpt, a fallback's reason)."""


def _column_converter(column: str) -> Callable[[Any], Any]:
    """How a result's value becomes the value of ``column``, by the column's type: a timestamp
    (Unix seconds) an aware datetime, a missing text ``""``, a free text (``TextField``) cut to
    :data:`_TEXT_LIMIT` characters; anything else is copied as it is."""
    field = Assignment._meta.get_field(column)
    if isinstance(field, models.DateTimeField):
        return _ts
    if isinstance(field, models.TextField):
        return lambda value: (value or "")[:_TEXT_LIMIT]
    if isinstance(field, models.CharField):
        return lambda value: value or ""
    return lambda value: value


_RESULT_COPY = tuple(
    (attribute, column, _column_converter(column)) for attribute, column in ASSIGNMENT_RESULT_COLUMNS.items()
)
"""``(result attribute, column, converter)`` of every column a result fills, resolved once."""


def result_columns(result: AssignmentResult) -> dict[str, Any]:
    """The :class:`Assignment` column values of a trainer's result, by column name: every column
    of :data:`~controlplane.experiments.models.ASSIGNMENT_RESULT_COLUMNS`, converted by its type
    (:func:`_column_converter`)."""
    return {column: convert(getattr(result, attribute)) for attribute, column, convert in _RESULT_COPY}


def round_progress(*, round_id: int, device: str, phase: str, at: float | None = None) -> int:
    """Record that a device's trainers started (``phase="started"``) a round.

    Returns:
        The number of assignments updated.
    """
    if phase != "started":
        return 0
    # Every device of every round sends one: one prepared statement, no ORM query to build
    # (that took ten times the update itself). The same rows as
    # Assignment.objects.filter(round_id=…, device__name=…, status=PENDING).update(…).
    connection = connections[router.db_for_write(Assignment)]
    started_at = db_value(Assignment, "started_at", _ts(at) or timezone.now(), connection)
    with connection.cursor() as cursor:
        sql = _PROGRESS_SQL.get(connection.vendor) or _PROGRESS_SQL.setdefault(
            connection.vendor, _progress_sql(connection)
        )
        cursor.execute(sql, [Assignment.Status.RUNNING, started_at, round_id, Assignment.Status.PENDING, device])
        return cursor.rowcount


_PROGRESS_SQL: dict[str, str] = {}
""":func:`_progress_sql` per database vendor (it depends on nothing else)."""


def _progress_sql(connection) -> str:
    """``UPDATE`` of a device's pending assignments of a round to running (see
    :func:`round_progress`); parameters: new status, started_at, round id, pending, device name."""
    q = connection.ops.quote_name
    a, d = Assignment._meta, Device._meta
    status, started_at = q(a.get_field("status").column), q(a.get_field("started_at").column)
    return (
        f"UPDATE {q(a.db_table)} SET {status} = %s, {started_at} = %s "
        f"WHERE {q(a.get_field('round').column)} = %s AND {status} = %s "
        f"AND {q(a.get_field('device').column)} = "
        f"(SELECT {q(d.pk.column)} FROM {q(d.db_table)} WHERE {q(d.get_field('name').column)} = %s)"
    )


def _parse_device_results(
    raw_results: Iterable[Any] | None, *, round_id: int | None = None, attempts: Mapping[str, int] | None = None
) -> tuple[dict[str, DeviceRoundResult], list[str]]:
    """Validate device results; keep one per device, of its current attempt.

    A result for another round, or of an attempt other than ``attempts[device]`` (a retry
    superseded it), or whose idempotency key is not its ``(round, device, attempt)`` key, is
    ignored (logged); of duplicates (a redelivery) the first is kept.
    """
    parsed: dict[str, DeviceRoundResult] = {}
    problems = []
    for raw in raw_results or []:
        try:
            result = DeviceRoundResult.model_validate(raw)
        except PydanticValidationError as exc:
            problems.append(f"malformed device result ignored: {exc.errors()[0]['msg']}")
            continue
        if result.device in parsed:
            continue
        if attempts is not None:
            expected = attempts.get(result.device)
            key = round_idempotency_key(round_id, result.device, result.attempt) if round_id is not None else ""
            if (
                expected is None
                or result.attempt != expected
                or (round_id is not None and result.round_id != round_id)
                or (result.idempotency_key and key and result.idempotency_key != key)
            ):
                log.warning(
                    "round %s: result of device %s attempt %s ignored (current attempt %s)",
                    round_id,
                    result.device,
                    result.attempt,
                    expected,
                )
                continue
        parsed[result.device] = result
    return parsed, problems


def round_record(
    *,
    round_id: int,
    results: Iterable[Any] | None,
    cause: str = "",
    causes: Mapping[str, str] | None = None,
    notes: Iterable[str] = (),
    claimant: str = "",
) -> Round | None:
    """Record a round's device results, aggregate each task's models, evaluate, and move the run on.

    Only a result of a device's current attempt counts (its ``attempt`` and, when set, its
    ``idempotency_key``), once: duplicates and results of superseded attempts are ignored.

    Args:
        results: :class:`workers.protocol.messages.DeviceRoundResult` JSON of the devices that reported,
            or the results already validated (the round check's; pydantic hands an instance on
            without validating it again).
            Devices that did not report have their assignments failed with ``causes[device]``
            or else ``cause``.
        cause: why results are missing (default for every device).
        causes: why each missing device is missing (lost agent, straggler, deadline), and for a
            device that reported, overrides nothing.
        notes: lines added to the round's flags (stragglers left out of the aggregate).
        claimant: the control worker's name, kept with the claim (see
            :func:`controlplane.experiments.services.reliability.runs_resume`).

    Returns:
        The finished round, or ``None`` if it was not running (already finished: a duplicate
        delivery or a late callback after the watchdog).
    """
    claimed = Round.objects.filter(id=round_id, status=Round.Status.RUNNING).update(
        status=Round.Status.AGGREGATING, aggregating_at=timezone.now(), claimed_by=claimant[:200]
    )
    if not claimed:
        log.info("round %s is not running; its results were already recorded", round_id)
        return None
    # Its devices are done: a waiting round (another run's, or this run's next) may have them
    # while this one is aggregated on the control plane, unless this run outranks every waiting
    # round: then its next round's enqueue runs the pass, so its priority is not lost between
    # two of its rounds (a run that fails or ends asks for a pass itself).
    rnd = Round.objects.select_related("run__experiment").get(id=round_id)
    if release_devices(round_ids=[round_id], reason="its round's results are in") and not _outranks_the_queue(rnd):
        transaction.on_commit(dispatch.send_lab_schedule)
    try:
        _record_and_aggregate(rnd, results, cause, causes or {}, list(notes))
    except Exception as exc:  # noqa: BLE001 - the round must end, with its cause, whatever broke
        log.exception("round %s: aggregation failed", round_id)
        Round.objects.filter(id=round_id).update(
            status=Round.Status.FAILED,
            error=f"aggregation failed: {type(exc).__name__}: {exc}",
            finished_at=timezone.now(),
        )
        run_fail(run_id=rnd.run_id, error=f"round {rnd.index} could not be aggregated: {type(exc).__name__}: {exc}")
        return Round.objects.get(id=round_id)
    rnd.refresh_from_db()
    try:
        samples_from_round(round_id=rnd.id, timesliced_devices=round_timesliced_devices(rnd))
    except Exception:  # noqa: BLE001 - the closed loop must never hold up the run
        log.exception("round %s: could not turn its assignments into profile samples", rnd.id)
    round_advance(rnd)
    return rnd


def _record_and_aggregate(
    rnd: Round,
    raw_results: Iterable[Any] | None,
    cause: str,
    causes: Mapping[str, str] | None = None,
    notes: Iterable[str] = (),
) -> None:
    run = rnd.run
    # Devices once (not joined onto each of 3,000 assignments, with their inventories).
    devices = {d.id: d for d in Device.objects.filter(id__in=rnd.assignments.values("device_id")).only("id", "name")}
    assignments = list(rnd.assignments.all())
    by_device: dict[str, list[Assignment]] = defaultdict(list)
    for a in assignments:
        by_device[devices[a.device_id].name].append(a)
    parsed, problems = _parse_device_results(
        raw_results, round_id=rnd.id, attempts={name: rows[0].attempt for name, rows in by_device.items()}
    )

    failed_devices: dict[str, str] = {}
    telemetry: list[DeviceTelemetry] = []
    for device_name, rows in by_device.items():
        result = parsed.get(device_name)
        if result is not None and (result.telemetry or result.mps_restarted):
            telemetry.append(_telemetry_row(rnd, devices[rows[0].device_id], result))
        missing = (causes or {}).get(device_name) or cause or "the device returned no result"
        failure = _device_result_apply(rnd, device_name, rows, result, missing=missing)
        if failure is not None:
            failed_devices[device_name] = failure

    # Aggregate only over devices whose whole round succeeded: a failed device's weights never
    # enter the global model, even the tasks that finished before the failure.
    usable = [
        a
        for a in assignments
        if a.status == Assignment.Status.SUCCEEDED and devices[a.device_id].name not in failed_devices
    ]
    store = get_store()
    latest = selectors.latest_checkpoints(run)
    # A weights file the aggregation cannot use (truncated, not safetensors, another model's)
    # fails its device with the reason, like a trainer crash: the round goes on without it.
    unusable = weights_problems(store=store, assignments=usable, previous=latest)
    if unusable:
        usable = _unusable_refuse(usable, unusable, failed_devices)
    new_checkpoints, aggregate_flags = round_aggregate(rnd=rnd, usable=usable, latest=latest, store=store)
    flags: list[str] = [*rnd.flags, *problems, *notes, *aggregate_flags]

    measured = _round_measured(by_device, failed_devices)
    if not failed_devices:
        status = Round.Status.SUCCEEDED
    elif len(failed_devices) < len(by_device):
        status = Round.Status.PARTIAL
    else:
        status = Round.Status.FAILED
    error = "; ".join(f"{name}: {why}" for name, why in sorted(failed_devices.items()))
    now = timezone.now()
    with transaction.atomic():
        bulk_set(Assignment, assignments, ["status", "error", *ASSIGNMENT_RESULT_COLUMNS.values()])
        # a redelivered result replaces the series instead of failing on the unique constraint
        DeviceTelemetry.objects.filter(round=rnd, device__in=[t.device for t in telemetry]).delete()
        DeviceTelemetry.objects.bulk_create(telemetry)
        Checkpoint.objects.bulk_create(new_checkpoints)
        Round.objects.filter(id=rnd.id).update(
            status=status,
            error=error[:10_000],
            flags=flags,
            finished_at=now,
            wall_time_s=(now - rnd.started_at).total_seconds() if rnd.started_at else None,
            round_time_s=measured.round_time_s,
            samples_trained=measured.samples_trained,
            fl_throughput_sps=measured.fl_throughput_sps,
            raw_throughput_sps=measured.raw_throughput_sps,
            fair_throughput=measured.fair_throughput,
            device_metrics=measured.devices_json(),
        )


def _device_result_apply(
    rnd: Round, device_name: str, rows: list[Assignment], result: DeviceRoundResult | None, *, missing: str
) -> str | None:
    """Copy one device's result onto its assignments ``rows`` (unsaved): their status, error and
    measured columns; every one failed with ``missing`` when the device returned no result.

    Returns:
        Why the device failed (``missing``, its reported failure, or weights reported away from
        its key), or ``None`` when it did not.
    """
    if result is None:
        for a in rows:
            a.status, a.error = Assignment.Status.FAILED, missing
        return missing
    failure = None
    if result.status == "failed":
        failure = result.error or "the device reported a failure"
    measured = {r.assignment_id: r for r in result.assignments}
    for a in rows:
        r = measured.get(a.id)
        if r is None:
            a.status = Assignment.Status.FAILED
            a.error = result.error or "no result for this assignment"
            continue
        a.status = Assignment.Status.SUCCEEDED if r.status == "succeeded" else Assignment.Status.FAILED
        a.error = r.error
        for column, value in result_columns(r).items():
            setattr(a, column, value)
        a.simulated = r.simulated or result.simulated
        expected = device_weights_key(rnd.run_id, rnd.index, device_name, a.task_id)
        if a.status == Assignment.Status.SUCCEEDED and a.weights_path != expected:
            # The agent was told where to write (output_weights); weights anywhere else were
            # not written under this device's agent token, so they never enter the aggregate.
            a.status = Assignment.Status.FAILED
            a.error = f"weights reported at {a.weights_path!r}, not at this device's key {expected!r}"
            failure = f"task {a.task.name}: {a.error}"
    return failure


def _unusable_refuse(
    usable: list[Assignment], unusable: Mapping[int, str], failed_devices: dict[str, str]
) -> list[Assignment]:
    """Fail each assignment whose weights the aggregation cannot use (``unusable``: assignment
    id → why) and its device (kept in ``failed_devices`` unless it already failed); the usable
    assignments left, none of a refused device."""
    refused_devices = set()
    for a in usable:
        if a.id in unusable:
            a.status, a.error = Assignment.Status.FAILED, unusable[a.id]
            failed_devices.setdefault(a.device.name, f"task {a.task.name}: {unusable[a.id]}")
            refused_devices.add(a.device_id)
    return [a for a in usable if a.device_id not in refused_devices]


def _round_measured(
    by_device: Mapping[str, list[Assignment]], failed_devices: Mapping[str, str]
) -> metrics.RoundMetrics:
    """The round's metrics from its assignments' measurements, per device."""
    # One rule for every metric (controlplane.planning.metrics): a device counts only when its
    # whole round succeeded, the same devices whose weights entered the aggregate.
    return metrics.round_metrics(
        {
            device_name: metrics.DeviceTotals.from_tasks(
                [
                    metrics.TaskMeasurement(
                        succeeded=a.status == Assignment.Status.SUCCEEDED,
                        samples_trained=a.samples_trained,
                        throughput_sps=a.throughput_sps,
                        standalone_sps=a.standalone_throughput_sps,
                        started_at=a.started_at.timestamp() if a.started_at else None,
                        finished_at=a.finished_at.timestamp() if a.finished_at else None,
                    )
                    for a in rows
                ],
                device_failed=device_name in failed_devices,
            )
            for device_name, rows in by_device.items()
        }
    )


def _telemetry_row(rnd: Round, device, result: DeviceRoundResult) -> DeviceTelemetry:
    """One device's NVML series of a round as parallel lists, in time order."""
    samples = sorted(result.telemetry, key=lambda g: g.t)
    totals = [g.memory_total_bytes for g in samples if g.memory_total_bytes]
    return DeviceTelemetry(
        round=rnd,
        device=device,
        t=[g.t for g in samples],
        gpu_util_percent=[g.gpu_util_percent for g in samples],
        memory_used_bytes=[g.memory_used_bytes for g in samples],
        memory_total_bytes=max(totals) if totals else None,
        mps_restarted=result.mps_restarted,
    )


def _outranks_the_queue(rnd: Round) -> bool:
    """Whether the run of ``rnd`` (its run and experiment loaded) has rounds left and a higher
    priority than every round waiting now (none waiting: nothing to hand its devices to either)."""
    if rnd.index + 1 >= rnd.run.experiment.rounds:
        return False
    top = (
        Round.objects.filter(status=Round.Status.QUEUED)
        .order_by("-run__priority")
        .values_list("run__priority", flat=True)
        .first()
    )
    return top is None or rnd.run.priority > top
