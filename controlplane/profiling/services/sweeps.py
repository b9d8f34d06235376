"""Profiling sweeps on devices, the samples they report, and samples from FL rounds."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.celery import app
from controlplane.common.errors import ApplicationError
from controlplane.common.execution import execution_check
from controlplane.common.registered import registered
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class, device_declaration_text, device_declares
from controlplane.profiling.models import ProfileSample, ProfileSweep
from workers.protocol.messages import ExecutionOptions, ProfileConfigResult, ProfileSweepRequest, ProfileSweepSummary
from workers.protocol.queues import CONTROL_QUEUE, TaskName, device_queue
from workers.registry.models import MODEL_REGISTRY
from workers.registry.names import check_names

log = logging.getLogger(__name__)

BUDGET_RANGE_S = (5.0, 7 * 24 * 3600.0)
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

    Raises:
        ApplicationError: budget out of range, execution options that are malformed or that the
            device's backend cannot run (400, field ``execution``: ``graphs`` or ``bf16`` on a
            ``cpu`` device), unknown models, a model
            the device's agent does not declare, bad batch sizes or mix size, or a device whose
            agent never connected (409), or a device leased to a run's round (409: the lab
            scheduler gives no round a device while its sweep is pending or running, and a
            sweep must not hold up a round whose deadline runs).
    """
    budget_s = sweep_budget(budget_s)
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
    sweep = ProfileSweep.objects.create(device=device, backend=device.backend, budget_s=budget_s, request={})
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

    def send() -> None:
        app.send_task(TaskName.PROFILE_SWEEP, args=[sweep.request], queue=device_queue(device.name))
        app.send_task(TaskName.PROFILE_SWEEP_WATCHDOG, args=[sweep.id], queue=CONTROL_QUEUE, countdown=deadline_s)

    transaction.on_commit(send)
    return sweep


def sweep_budget(budget_s: float) -> float:
    """A sweep's time budget in seconds, checked.

    Raises:
        ApplicationError: (field ``budget_s``) not a number, or outside :data:`BUDGET_RANGE_S`.
    """
    try:
        budget = float(budget_s)
    except (TypeError, ValueError):
        raise ApplicationError("budget_s must be a number of seconds", field="budget_s") from None
    if not BUDGET_RANGE_S[0] <= budget <= BUDGET_RANGE_S[1]:
        raise ApplicationError(
            f"budget_s={budget:g} is out of range: allowed {BUDGET_RANGE_S[0]:g} to {BUDGET_RANGE_S[1]:g} seconds",
            field="budget_s",
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


def profile_record(*, result: dict) -> int:
    """Store one measured configuration of a sweep (one sample per measured task).

    Duplicate deliveries are stored once. Returns the number of samples stored.
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
        ProfileSample.objects.bulk_create(rows)
        ProfileSweep.objects.filter(id=sweep.id).update(
            configs=F("configs") + 1,
            samples=F("samples") + len(rows),
            last_record_at=timezone.now(),
        )
        # Only a pending sweep becomes running: the control worker runs records and the end of
        # the sweep concurrently, so a record handled after profile_done must not reopen it.
        ProfileSweep.objects.filter(id=sweep.id, status=ProfileSweep.Status.PENDING).update(
            status=ProfileSweep.Status.RUNNING,
            started_at=sweep.started_at or _ts(r.started_at),
        )
    return len(rows)


def profile_done(*, summary: dict) -> ProfileSweep | None:
    """Close a sweep with the agent's summary (status, repeat spread)."""
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
