"""Profiling sweeps on devices, the samples they report, and samples from FL rounds."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.celery import app
from controlplane.common.errors import ApplicationError
from controlplane.common.execution import execution_check
from controlplane.common.limits import SWEEP_BUDGET, SWEEP_BUDGET_SELF_SERVE, bound_text
from controlplane.common.registered import registered
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class, device_declaration_text, device_declares
from controlplane.profiling.models import ProfileSample, ProfileSweep
from workers.protocol.messages import ExecutionOptions, ProfileConfigResult, ProfileSweepRequest, ProfileSweepSummary
from workers.protocol.queues import CANCELLED_STATE, CONTROL_QUEUE, TaskName, cancel_marker_id, device_queue
from workers.registry.models import MODEL_REGISTRY
from workers.registry.names import check_names

log = logging.getLogger(__name__)

DEFAULT_ARCHITECTURES = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0", "mobilenet_v3_large")
WATCHDOG_MARGIN_S = 600.0


def _ts(value: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, tz=dt.UTC) if value is not None else None


def config_key(sweep_id: int, config_index: int) -> str:
    return f"sweep-{sweep_id}-{config_index}"


def _sweep_architectures(device: Device, architectures: Sequence[str] | None, workloads: dict[str, dict]) -> list[str]:
    """The models a sweep profiles: ``architectures`` (default :data:`DEFAULT_ARCHITECTURES`
    unless workloads are given) then the workloads' others, each registered and declared by the
    device's agent.

    Raises:
        ApplicationError: an unknown model, or one the device's agent does not declare.
    """
    names = list(architectures or ([] if workloads else DEFAULT_ARCHITECTURES))
    for name in names:
        registered(MODEL_REGISTRY, name, field="architectures")
    names += [a for a in workloads if a not in names]
    for name in names:
        if not device_declares(device, "models", name):
            raise ApplicationError(
                f"device {device.name!r} lacks model {name!r} (its agent declares: "
                f"{device_declaration_text(device, 'models')}); install the plug-in on that host",
                field="tasks" if name in workloads else "architectures",
            )
    return names


def _sweep_request(
    sweep: ProfileSweep,
    device: Device,
    *,
    budget_s: float,
    architectures: list[str],
    seed: int,
    options: ExecutionOptions,
    workloads: dict[str, dict],
    batch_sizes: Sequence[int] | None,
    max_mix: int | None,
) -> ProfileSweepRequest:
    """The checked request sent to the device's agent (workloads at the zoo's shape left out:
    ``architectures`` covers them).

    Raises:
        ApplicationError: a field the request refuses (bad batch sizes, mix size...), named.
    """
    fields = {
        "sweep_id": sweep.id,
        "device": device.name,
        "backend": device.backend,
        "budget_s": budget_s,
        "architectures": architectures,
        "seed": seed,
        "execution": options,
        "workloads": {
            arch: shape
            for arch, shape in workloads.items()
            if (shape["num_classes"], shape["input_shape"])
            != (REFERENCE_SHAPE["num_classes"], REFERENCE_SHAPE["input_shape"])
        },
    }
    if batch_sizes is not None:
        fields["batch_sizes"] = list(batch_sizes)
    if max_mix is not None:
        fields["max_mix"] = max_mix
    try:
        return check_names(ProfileSweepRequest(**fields))
    except PydanticValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "request"
        raise ApplicationError(f"{field}: {error['msg']}", field=field) from None


@transaction.atomic
def sweep_start(
    *,
    device: Device,
    budget_s: float,
    architectures: Sequence[str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    max_mix: int | None = None,
    seed: int = 0,
    workloads: Mapping[str, dict] | None = None,
    execution: ExecutionOptions | Mapping[str, object] | None = None,
    actor: Any = None,
) -> ProfileSweep:
    """Ask a device's agent to profile co-located mixes for ``budget_s`` seconds.

    The agent streams each measured configuration back (``PROFILE_RECORD``) and ends with a
    summary (``PROFILE_DONE``); a watchdog fails the sweep if that end never comes.

    Args:
        architectures: models to profile at the zoo's shape (10 classes, 3×32×32); default
            :data:`DEFAULT_ARCHITECTURES` when ``tasks`` is not given either.
        workloads: ``{architecture: {"num_classes", "input_shape"}}`` to profile at those
            classes and input shapes (``ProfileSweepRequest.workloads``), beside
            ``architectures``: what :func:`controlplane.experiments.services.sweeps.sweep_start`
            reads of the tasks it is given (this app does not read tasks).
        execution: how every profiled trainer runs its steps
            (:class:`~workers.protocol.messages.ExecutionOptions` or its fields: ``mode``
            auto/eager/graphs, ``precision`` fp32/bf16, ``channels_last``); default auto, fp32.
            A predictor is fitted on what was measured, so profile with the options the rounds
            will use.
        actor: the user starting it (recorded as ``started_by``); ``None`` is the lab's operator
            (``mtfl profile``, scripts), who, like lab staff, may give the whole
            :data:`~controlplane.common.limits.SWEEP_BUDGET`; anyone else at most
            :data:`~controlplane.common.limits.SWEEP_BUDGET_SELF_SERVE` (:func:`sweep_budget`).

    Raises:
        ApplicationError: budget out of range (400), or above what ``actor`` may give (403),
            execution options that are malformed or that the
            device's backend cannot run (400, field ``execution``: ``graphs`` or ``bf16`` on a
            ``cpu`` device), unknown models, a model
            the device's agent does not declare, bad batch sizes or mix size, or a device whose
            agent never connected (409), or a device leased to a run's round (409: the lab
            scheduler gives no round a device while its sweep is pending or running, and a
            sweep must not hold up a round whose deadline runs).
    """
    budget_s = sweep_budget(budget_s, actor=actor)
    options = sweep_execution(execution, device)
    workloads = dict(workloads or {})
    architectures = _sweep_architectures(device, architectures, workloads)
    if device.last_heartbeat_at is None:
        raise ApplicationError(
            f"device {device.name} has never connected an agent: start `mtfl agent --device {device.name}` first",
            field="device",
            status_code=409,
        )
    _refuse_a_leased_device(device)
    sweep = ProfileSweep.objects.create(
        device=device,
        backend=device.backend,
        budget_s=budget_s,
        request={},
        started_by=actor if actor is not None and actor.is_authenticated else None,
        task_id=f"profile-sweep-{uuid.uuid4()}",
    )
    request = _sweep_request(
        sweep,
        device,
        budget_s=budget_s,
        architectures=architectures,
        seed=seed,
        options=options,
        workloads=workloads,
        batch_sizes=batch_sizes,
        max_mix=max_mix,
    )
    sweep.request = request.model_dump(mode="json")
    sweep.save(update_fields=["request"])
    deadline_s = budget_s + request.config_timeout_s + WATCHDOG_MARGIN_S
    transaction.on_commit(lambda: _send_sweep(sweep, deadline_s))
    return sweep


def _send_sweep(sweep: ProfileSweep, deadline_s: float) -> None:
    """Queue the sweep on its device's agent, under its ``task_id`` (where :func:`sweep_cancel`
    marks a cancellation), and its watchdog on the control queue in ``deadline_s`` seconds."""
    app.send_task(
        TaskName.PROFILE_SWEEP, args=[sweep.request], queue=device_queue(sweep.device.name), task_id=sweep.task_id
    )
    app.send_task(TaskName.PROFILE_SWEEP_WATCHDOG, args=[sweep.id], queue=CONTROL_QUEUE, countdown=deadline_s)


def is_lab_staff(actor: Any) -> bool:
    """Whether ``actor`` may do what the lab's admins do (give a sweep the whole budget range,
    cancel anyone's sweep, pause a device): the operator (``None``: the CLI, scripts), staff and
    superusers, as :mod:`controlplane.lab.services.admin` decides for a pause."""
    return actor is None or bool(getattr(actor, "is_staff", False) or getattr(actor, "is_superuser", False))


def sweep_budget_limit(actor: Any = None) -> tuple[float, float]:
    """The ``(low, high)`` seconds ``actor`` may give a sweep: :data:`SWEEP_BUDGET` for lab staff
    and the operator (:func:`is_lab_staff`), :data:`SWEEP_BUDGET_SELF_SERVE` for anyone else."""
    limit = SWEEP_BUDGET if is_lab_staff(actor) else SWEEP_BUDGET_SELF_SERVE
    return float(limit.low), float(limit.high)


def sweep_budget(budget_s: float, *, actor: Any = None) -> float:
    """A sweep's time budget in seconds, checked against what ``actor`` may give.

    A sweep keeps its device from every round until it ends (the lab scheduler), so a long one
    is a lab admin's decision, like a pause: a researcher without staff rights gets
    :data:`~controlplane.common.limits.SWEEP_BUDGET_SELF_SERVE`.

    Raises:
        ApplicationError: (field ``budget_s``) not a number, or outside
            :data:`~controlplane.common.limits.SWEEP_BUDGET` (400); above
            :data:`~controlplane.common.limits.SWEEP_BUDGET_SELF_SERVE` for a user who is not
            staff (403), naming the range they may give.
    """
    try:
        budget = float(budget_s)
    except (TypeError, ValueError):
        raise ApplicationError("budget_s must be a number of seconds", field="budget_s") from None
    if not SWEEP_BUDGET.contains(budget):
        raise ApplicationError(
            f"budget_s={budget:g} is out of range: allowed {SWEEP_BUDGET.span} seconds", field="budget_s"
        )
    if not is_lab_staff(actor) and not SWEEP_BUDGET_SELF_SERVE.contains(budget):
        raise ApplicationError(
            f"budget_s={budget:g} is more than a researcher may give a sweep: allowed {SWEEP_BUDGET_SELF_SERVE.span} "
            f"seconds (no round gets the device meanwhile); a lab admin (staff) may give up to "
            f"{bound_text(SWEEP_BUDGET.high)}",
            field="budget_s",
            status_code=403,
        )
    return budget


EXECUTION_FIELDS = {"mode": "execution.mode", "precision": "execution.precision"}
"""How the sweep API names each :class:`ExecutionOptions` field in its messages."""


def sweep_execution(
    execution: ExecutionOptions | Mapping[str, object] | None,
    device: Device,
    *,
    fields: Mapping[str, str] = EXECUTION_FIELDS,
) -> ExecutionOptions:
    """``execution`` as :class:`ExecutionOptions` that ``device``'s backend can run; ``fields``
    names each option in the message (the API's ``execution.mode``, the CLI's ``--execution-mode``).

    Raises:
        ApplicationError: (400, field ``execution``) a malformed value (naming the bad field and
            its allowed values), or ``graphs`` / ``bf16`` on a backend that is neither a GPU
            backend nor ``simulated`` (:func:`controlplane.common.execution.execution_check`).
    """
    if execution is None:
        options = ExecutionOptions()
    elif isinstance(execution, ExecutionOptions):
        options = execution
    else:
        try:
            options = ExecutionOptions.model_validate(dict(execution))
        except (PydanticValidationError, TypeError, ValueError) as exc:
            errors = exc.errors() if isinstance(exc, PydanticValidationError) else []
            where = ".".join(str(p) for p in errors[0]["loc"]) if errors and errors[0]["loc"] else ""
            detail = errors[0]["msg"] if errors else str(exc)
            raise ApplicationError(
                f"execution{'.' + where if where else ''}: {detail} (allowed: mode auto/eager/graphs, "
                "precision fp32/bf16, channels_last true/false)",
                field="execution",
            ) from None
    execution_check(options, device=device.name, backend=device.backend, fields=fields, field="execution")
    return options


REFERENCE_SHAPE = {"num_classes": 10, "input_shape": [3, 32, 32]}
"""What a sweep profiles an architecture at when its request names no shape for it (the
request's own ``num_classes`` default and ``DEFAULT_INPUT_SHAPE``)."""


def _refuse_a_leased_device(device: Device) -> None:
    """Refuse (409, field ``device``) to profile a device that a run's round holds.

    The lease is read through the device's ``leases`` (the lab app's
    :class:`~controlplane.lab.models.DeviceLease` rows): the lab sits above profiling (its
    scheduler reads the sweeps in progress), so profiling reads its rows by the fleet's relation
    instead of importing it.
    """
    lease = device.leases.filter(released_at__isnull=True).select_related("run", "owner", "round").first()
    if lease is not None:
        owner = lease.owner.get_username() if lease.owner else "nobody"
        held = f"round {lease.round.index} of run {lease.run_id}" if lease.round and lease.run_id else "a run"
        raise ApplicationError(
            f"device {device.name} is leased to {held} (owner {owner}) since "
            f"{lease.granted_at:%Y-%m-%d %H:%M:%S}: profile it once `mtfl queue` shows it free, or pause it first "
            f"(`mtfl device-pause {device.name}`) so no new round takes it",
            field="device",
            status_code=409,
        )


def _send_lab_schedule() -> None:
    # A sweep ended: its device is free for waiting rounds (the lab scheduler counted it busy).
    app.send_task(TaskName.LAB_SCHEDULE, queue=CONTROL_QUEUE)


def sweep_cancel_allowed(sweep: ProfileSweep, actor: Any) -> bool:
    """Whether ``actor`` may cancel ``sweep``: the user who started it, lab staff, or the
    operator (``None``)."""
    return is_lab_staff(actor) or (
        sweep.started_by_id is not None and sweep.started_by_id == getattr(actor, "pk", None)
    )


@transaction.atomic
def sweep_cancel(*, sweep: ProfileSweep, actor: Any = None) -> ProfileSweep:
    """Cancel a pending or running sweep: it ends ``cancelled`` at once, so the lab scheduler
    gives its device to waiting rounds (a scheduling pass is queued), and what the agent reports
    afterwards is dropped (:func:`profile_record`, :func:`profile_done`); samples stored before
    are kept (they were measured). The agent is told through the sweep's cancel marker
    (:func:`workers.protocol.queues.cancel_marker_id` of its ``task_id``), which it reads before
    it starts the sweep and every few seconds while it runs: it kills the configuration in
    progress and starts no other.

    Args:
        sweep: the sweep.
        actor: who cancels: the user who started it, lab staff, or ``None`` (the operator).

    Raises:
        ApplicationError: ``actor`` is someone else (403); the sweep has already ended (409).
    """
    if not sweep_cancel_allowed(sweep, actor):
        starter = sweep.started_by.get_username() if sweep.started_by else "the lab's operator"
        raise ApplicationError(
            f"sweep {sweep.id} was started by {starter}: only they or a lab admin (staff) may cancel it",
            field="sweep",
            status_code=403,
        )
    reason = f"sweep {sweep.id} cancelled by {actor.get_username() if actor is not None else 'the operator'}"
    cancelled = ProfileSweep.objects.filter(
        id=sweep.id, status__in=[ProfileSweep.Status.PENDING, ProfileSweep.Status.RUNNING]
    ).update(status=ProfileSweep.Status.CANCELLED, error=reason, finished_at=timezone.now())
    sweep.refresh_from_db()
    if not cancelled:
        raise ApplicationError(
            f"sweep {sweep.id} has already ended ({sweep.status}): there is nothing to cancel",
            field="sweep",
            status_code=409,
        )
    task_id = sweep.task_id
    transaction.on_commit(lambda: _stop_on_agent(task_id, reason))
    transaction.on_commit(_send_lab_schedule)
    return sweep


def _stop_on_agent(task_id: str, reason: str) -> None:
    """Mark the sweep's device task cancelled in the result backend (the agent polls it, also
    when busy in its solo pool) and revoke it (an agent drops a revoked message it has not
    started). Best effort, as :func:`controlplane.experiments.services.dispatch.cancel_device_tasks`
    (which profiling, below the experiments app, does not import): the sweep is cancelled in the
    database whatever happens here, and its budget and watchdog still bound the agent's work."""
    if not task_id:  # a sweep started before sweeps had task ids: nothing to mark
        return
    try:
        app.backend.store_result(cancel_marker_id(task_id), {"reason": reason}, CANCELLED_STATE)
    except Exception:  # noqa: BLE001 - see docstring
        log.warning("could not mark profiling task %s cancelled", task_id, exc_info=True)
    try:
        app.control.revoke([task_id])
    except Exception:  # noqa: BLE001 - see docstring
        log.warning("could not broadcast the revocation of profiling task %s", task_id, exc_info=True)


def profile_record(*, result: dict) -> int:
    """Store one measured configuration of a sweep (one sample per measured task).

    Duplicate deliveries are stored once, and a configuration that arrives after its sweep was
    cancelled (:func:`sweep_cancel`) is dropped. Returns the number of samples stored.
    """
    try:
        r = check_names(ProfileConfigResult.model_validate(result))
    except PydanticValidationError as exc:
        log.error("malformed profile result ignored: %s", exc)
        return 0
    sweep = ProfileSweep.objects.select_related("device").filter(id=r.sweep_id).first()
    if sweep is None:
        log.warning("profile result for unknown sweep %s ignored", r.sweep_id)
        return 0
    key = config_key(sweep.id, r.config_index)
    configuration = [t.model_dump(mode="json") for t in r.tasks]
    rows = [
        ProfileSample(
            source=ProfileSample.Source.SWEEP,
            sweep=sweep,
            device=sweep.device,
            backend=r.backend,
            device_class=device_class(sweep.device),
            config_key=key,
            configuration=configuration,
            mix_size=len(r.tasks),
            task_index=m.task_index,
            architecture=m.architecture,
            batch_size=m.batch_size,
            active_thread_percentage=m.active_thread_percentage,
            throughput_sps=m.throughput_sps,
            standalone_sps=m.standalone_sps,
            peak_memory_bytes=m.peak_memory_bytes,
            speed_index=m.speed_index,
            cross_core_rtt_ns=m.cross_core_rtt_ns,
            execution_mode=m.execution_mode or "",
            host_step_s=m.host_step_s,
            gpu_busy_fraction=m.gpu_busy_fraction,
            simulated=m.simulated or r.simulated,
            repeat_of=config_key(sweep.id, r.repeat_of) if r.repeat_of is not None else "",
            started_at=_ts(r.started_at),
            finished_at=_ts(r.finished_at),
        )
        for m in r.measurements
        if m.throughput_sps is not None and m.throughput_sps > 0 and not m.error
    ]
    with transaction.atomic():
        if ProfileSample.objects.filter(config_key=key).exists():
            return 0
        # Counted first, and only while the sweep is not cancelled: the update locks the row,
        # so a cancellation committed meanwhile drops this record instead of racing it.
        counted = (
            ProfileSweep.objects.filter(id=sweep.id)
            .exclude(status=ProfileSweep.Status.CANCELLED)
            .update(configs=F("configs") + 1, samples=F("samples") + len(rows), last_record_at=timezone.now())
        )
        if not counted:
            log.info("profile result of cancelled sweep %s dropped", sweep.id)
            return 0
        ProfileSample.objects.bulk_create(rows)
        # Only a pending sweep becomes running: the control worker runs records and the end of
        # the sweep concurrently, so a record handled after profile_done must not reopen it.
        ProfileSweep.objects.filter(id=sweep.id, status=ProfileSweep.Status.PENDING).update(
            status=ProfileSweep.Status.RUNNING,
            started_at=sweep.started_at or _ts(r.started_at),
        )
    return len(rows)


def profile_done(*, summary: dict) -> ProfileSweep | None:
    """Close a sweep with the agent's summary (status, repeat spread); a sweep that already
    ended (cancelled, or failed by its watchdog) keeps its end and the summary is dropped."""
    try:
        s = ProfileSweepSummary.model_validate(summary)
    except PydanticValidationError as exc:
        log.error("malformed profile summary ignored: %s", exc)
        return None
    updated = ProfileSweep.objects.filter(
        id=s.sweep_id, status__in=[ProfileSweep.Status.PENDING, ProfileSweep.Status.RUNNING]
    ).update(
        status=ProfileSweep.Status.SUCCEEDED if s.status == "succeeded" else ProfileSweep.Status.FAILED,
        error=s.error[:10_000],
        repeat_spread=s.repeat_spread,
        finished_at=timezone.now(),
    )
    if updated:
        transaction.on_commit(_send_lab_schedule)
    return ProfileSweep.objects.filter(id=s.sweep_id).first() if updated else None


def sweep_watchdog(*, sweep_id: int) -> None:
    """Fail a sweep whose agent never reported its end (what it did report is kept)."""
    failed = ProfileSweep.objects.filter(
        id=sweep_id, status__in=[ProfileSweep.Status.PENDING, ProfileSweep.Status.RUNNING]
    ).update(
        status=ProfileSweep.Status.FAILED,
        finished_at=timezone.now(),
        error="the agent did not report the end of the sweep within its budget and timeouts; samples received are kept",
    )
    if failed:
        transaction.on_commit(_send_lab_schedule)
