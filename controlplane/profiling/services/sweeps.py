"""Profiling sweeps on devices, the samples they report, and samples from FL rounds."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection, Mapping, Sequence

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
from controlplane.planning.strategies import STRATEGY_REGISTRY
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


@transaction.atomic
def sweep_start(
    *,
    device: Device,
    budget_s: float,
    architectures: Sequence[str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    max_mix: int | None = None,
    seed: int = 0,
    tasks: Sequence[int] | None = None,
    execution: ExecutionOptions | Mapping[str, object] | None = None,
) -> ProfileSweep:
    """Ask a device's agent to profile co-located mixes for ``budget_s`` seconds.

    The agent streams each measured configuration back (``PROFILE_RECORD``) and ends with a
    summary (``PROFILE_DONE``); a watchdog fails the sweep if that end never comes.

    Args:
        architectures: models to profile at the zoo's shape (10 classes, 3×32×32); default
            :data:`DEFAULT_ARCHITECTURES` when ``tasks`` is not given either.
        tasks: task ids whose architectures are profiled at each task's own classes and input
            shape (``ProfileSweepRequest.workloads``), beside ``architectures``.
        execution: how every profiled trainer runs its steps
            (:class:`~workers.protocol.messages.ExecutionOptions` or its fields: ``mode``
            auto/eager/graphs, ``precision`` fp32/bf16, ``channels_last``); default auto, fp32.
            A predictor is fitted on what was measured, so profile with the options the rounds
            will use.

    Raises:
        ApplicationError: budget out of range, execution options that are malformed or that the
            device's backend cannot run (400, field ``execution``: ``graphs`` or ``bf16`` on a
            ``cpu`` device), unknown models or task ids, two tasks of one
            architecture at different shapes (a sweep profiles a model at one shape), a model
            the device's agent does not declare, bad batch sizes or mix size, or a device whose
            agent never connected (409), or a device leased to a run's round (409: the lab
            scheduler gives no round a device while its sweep is pending or running, and a
            sweep must not hold up a round whose deadline runs).
    """
    try:
        budget_s = float(budget_s)
    except (TypeError, ValueError):
        raise ApplicationError("budget_s must be a number of seconds", field="budget_s") from None
    if not BUDGET_RANGE_S[0] <= budget_s <= BUDGET_RANGE_S[1]:
        raise ApplicationError(
            f"budget_s={budget_s:g} is out of range: allowed {BUDGET_RANGE_S[0]:g} to {BUDGET_RANGE_S[1]:g} seconds",
            field="budget_s",
        )
    options = sweep_execution(execution, device)
    workloads = _task_workloads(tasks) if tasks is not None else {}
    architectures = list(architectures or ([] if workloads else DEFAULT_ARCHITECTURES))
    for name in architectures:
        registered(MODEL_REGISTRY, name, field="architectures")
        _refuse_reference_shape_of_a_shaped_model(name, workloads)
    architectures += [a for a in workloads if a not in architectures]
    for name in architectures:
        if not device_declares(device, "models", name):
            raise ApplicationError(
                f"device {device.name!r} lacks model {name!r} (its agent declares: "
                f"{device_declaration_text(device, 'models')}); install the plug-in on that host",
                field="tasks" if name in workloads else "architectures",
            )
    if device.last_heartbeat_at is None:
        raise ApplicationError(
            f"device {device.name} has never connected an agent: start `mtfl agent --device {device.name}` first",
            field="device",
            status_code=409,
        )
    _refuse_a_leased_device(device)
    sweep = ProfileSweep.objects.create(device=device, backend=device.backend, budget_s=budget_s, request={})
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
        request = check_names(ProfileSweepRequest(**fields))
    except PydanticValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "request"
        raise ApplicationError(f"{field}: {error['msg']}", field=field) from None
    sweep.request = request.model_dump(mode="json")
    sweep.save(update_fields=["request"])
    deadline_s = budget_s + request.config_timeout_s + WATCHDOG_MARGIN_S

    def send() -> None:
        app.send_task(TaskName.PROFILE_SWEEP, args=[sweep.request], queue=device_queue(device.name))
        app.send_task(TaskName.PROFILE_SWEEP_WATCHDOG, args=[sweep.id], queue=CONTROL_QUEUE, countdown=deadline_s)

    transaction.on_commit(send)
    return sweep


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
    """Refuse (409, field ``device``) to profile a device that a run's round holds."""
    from controlplane.experiments.models import DeviceLease

    lease = (
        DeviceLease.objects.filter(device=device, released_at__isnull=True)
        .select_related("run", "owner", "round")
        .first()
    )
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


def _refuse_reference_shape_of_a_shaped_model(architecture: str, workloads: Mapping[str, dict]) -> None:
    """Refuse to profile ``architecture`` at :data:`REFERENCE_SHAPE` when the tasks that use it
    take another sample shape: such a model (a plug-in on feature vectors, say) would fail every
    configuration on the agent, after holding the device for the whole budget.

    Raises:
        ApplicationError: (field ``architectures``) naming a task and its shape and the way out
            (``tasks=[ids]``, ``mtfl profile --tasks``).
    """
    from controlplane.experiments.models import Task

    if architecture in workloads:
        return
    reference = REFERENCE_SHAPE["input_shape"]
    for task in Task.objects.filter(architecture=architecture).only("id", "name", "input_shape").order_by("id"):
        if task.input_shape and list(task.input_shape) != reference:
            raise ApplicationError(
                f"architectures: {architecture!r} is profiled at 3×32×32 when named alone, but task {task.name!r} "
                f"feeds it samples of shape {tuple(task.input_shape)}: name the tasks instead (tasks=[{task.id}], "
                f"or mtfl profile --tasks {task.id})",
                field="architectures",
            )


def _task_workloads(task_ids: Sequence[int]) -> dict[str, dict]:
    """``{architecture: {"num_classes", "input_shape"}}`` of the given tasks.

    Raises:
        ApplicationError: (field ``tasks``) not a list of ids, an unknown id, or two tasks
            of one architecture at different shapes.
    """
    from controlplane.experiments.models import Task

    try:
        ids = [int(i) for i in task_ids]
    except (TypeError, ValueError):
        raise ApplicationError("tasks must be a list of task ids", field="tasks") from None
    if not ids:
        raise ApplicationError("tasks must list at least one task id", field="tasks")
    found = {
        t.id: t
        for t in Task.objects.filter(id__in=ids).only("id", "name", "architecture", "num_classes", "input_shape")
    }
    missing = sorted(set(ids) - set(found))
    if missing:
        raise ApplicationError(f"tasks: no task with id {', '.join(map(str, missing))}", field="tasks")
    out: dict[str, dict] = {}
    named: dict[str, str] = {}
    for task_id in dict.fromkeys(ids):
        task = found[task_id]
        shape = {
            "num_classes": int(task.num_classes),
            "input_shape": [int(d) for d in task.input_shape or REFERENCE_SHAPE["input_shape"]],
        }
        if task.architecture in out and out[task.architecture] != shape:
            raise ApplicationError(
                f"tasks {named[task.architecture]!r} and {task.name!r} use {task.architecture} at different shapes "
                f"({out[task.architecture]} and {shape}): a sweep profiles a model at one shape; sweep them separately",
                field="tasks",
            )
        out[task.architecture] = shape
        named.setdefault(task.architecture, task.name)
    return out


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


def samples_from_round(*, round_id: int, timesliced_devices: Collection[int] = ()) -> int:
    """The closed loop: every measured assignment of an FL round becomes a profile sample, its
    device's assignments of that round being the co-located configuration.

    Rounds of strategies with ``timeslice`` partitioning (``temporal``) are left out: their
    tasks do not run at their shares; so are ``timesliced_devices``, the devices a
    predictor-driven round time-sliced (a baseline's plan kept there: the caller knows the
    round's plan, :func:`controlplane.experiments.services.planning.round_timesliced_devices`), and rounds of a strategy no longer registered (what its
    shares meant is unknown). So is an assignment too short to time: fewer than
    ``MTFL_MIN_TIMED_ITERATIONS`` iterations after the warm-up (``E·ceil(|D_ij| / B_ij)`` in
    all; a 6-sample shard trains one batch a round, and the trainer then times iterations that
    still carry one-off costs). Returns the number of samples stored.
    """
    from controlplane.common.bulk import bulk_insert
    from controlplane.conf import mtfl_setting
    from controlplane.experiments.models import Assignment, Round, Task

    rnd = Round.objects.select_related("run__experiment").get(id=round_id)
    epochs = rnd.run.experiment.local_epochs
    untimed = int(mtfl_setting("WARMUP_ITERATIONS"))
    needed = int(mtfl_setting("MIN_TIMED_ITERATIONS"))
    if rnd.run.strategy not in STRATEGY_REGISTRY or STRATEGY_REGISTRY.get(rnd.run.strategy).partitioning != "mps":
        return 0
    # A round of 1,000 devices has 3,000 assignments: plain values, and each device and task
    # once, rather than a model instance per assignment with its device and task joined on.
    columns = (
        "id",
        "device_id",
        "task_id",
        "status",
        "throughput_sps",
        "batch_size",
        "active_thread_percentage",
        "standalone_throughput_sps",
        "started_at",
        "finished_at",
        "simulated",
        "samples",
        "execution_mode",
    )
    if epochs > 0:
        # A round whose shards are too short to time any assignment stores nothing: one EXISTS
        # instead of reading its 3,000 assignments, devices and tasks. The test below keeps an
        # assignment exactly when ceil(samples / batch) >= least, i.e. samples > (least - 1) * batch.
        least = -(-(needed + untimed) // epochs)
        if not rnd.assignments.filter(
            status=Assignment.Status.SUCCEEDED, samples__gt=(least - 1) * F("batch_size")
        ).exists():
            return 0
    by_device: dict[int, list[dict]] = {}
    for values in rnd.assignments.order_by("device_id", "task_id").values_list(*columns):
        a = dict(zip(columns, values, strict=True))
        by_device.setdefault(a["device_id"], []).append(a)
    used = rnd.assignments.values("device_id")
    devices = {d.id: d for d in Device.objects.filter(id__in=used).only("id", "backend", "inventory")}
    architecture = dict(Task.objects.filter(id__in=rnd.assignments.values("task_id")).values_list("id", "architecture"))
    # A device a predictor-driven plan kept on a timeslice baseline's plan did not run at its shares.
    sliced = set(timesliced_devices)
    rows = []
    for device_id, assignments in by_device.items():
        if device_id in sliced:
            continue
        if not all(a["status"] == Assignment.Status.SUCCEEDED and a["throughput_sps"] for a in assignments):
            continue
        device = devices[device_id]
        klass = device_class(device)
        configuration = [
            {
                "architecture": architecture[a["task_id"]],
                "batch_size": a["batch_size"],
                "active_thread_percentage": a["active_thread_percentage"],
            }
            for a in assignments
        ]
        for index, a in enumerate(assignments):
            if epochs * -(-a["samples"] // a["batch_size"]) - untimed < needed:
                continue
            rows.append(
                dict(
                    source=ProfileSample.Source.RUN,
                    assignment_id=a["id"],
                    device_id=device_id,
                    backend=device.backend,
                    device_class=klass,
                    config_key=f"round-{rnd.id}-{device_id}",
                    configuration=configuration,
                    mix_size=len(assignments),
                    task_index=index,
                    architecture=architecture[a["task_id"]],
                    batch_size=a["batch_size"],
                    active_thread_percentage=a["active_thread_percentage"],
                    throughput_sps=a["throughput_sps"],
                    standalone_sps=a["standalone_throughput_sps"],
                    started_at=a["started_at"],
                    finished_at=a["finished_at"],
                    simulated=a["simulated"],
                    execution_mode=a["execution_mode"],
                )
            )
    bulk_insert(ProfileSample, rows, ignore_conflicts=True)
    return len(rows)
