"""Writes to the catalogue: tasks and experiments (with their shards)."""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from django.contrib.auth import get_user_model
from django.db import transaction

from controlplane.common.errors import ApplicationError
from controlplane.common.limits import (
    CLIENT_FRACTION,
    DEADLINE_FACTOR,
    DEVICE_RETRIES,
    KEEP_LAST_CHECKPOINTS,
    LEARNING_RATE,
    LOCAL_EPOCHS,
    MOMENTUM,
    NUM_CLASSES,
    ROUNDS,
    SEED,
    WEIGHT_DECAY,
    Limit,
)
from controlplane.common.registered import registered
from controlplane.experiments.models import (
    CLIENT_SAMPLING_RULES,
    EXECUTION_MODES,
    PRECISIONS,
    Experiment,
    Shard,
    Task,
)
from controlplane.experiments.selectors import can_manage_experiment
from controlplane.experiments.services.execution import EXECUTION_FIELDS, execution_holders_check
from controlplane.fleet.models import Device
from controlplane.planning.guard import untrusted_choice
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING, lr_scaling_check
from controlplane.profiling.services import workload_ensure, workload_request
from workers.protocol.indices import encode_indices
from workers.protocol.messages import OPTIMIZERS, ExecutionOptions
from workers.registry.aggregators import AGGREGATOR_REGISTRY
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.registry.partitioners import PARTITIONER_REGISTRY, Partitioner
from workers.training.partition import label_histogram, partition_indices, shard_indices


def _check_choice(field: str, value: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ApplicationError(f"{field} {value!r} is not supported; allowed: {', '.join(allowed)}", field=field)


def partition_rules() -> tuple[str, ...]:
    """Every ``partition_rule`` an experiment may have: the registered partitioners
    (:data:`~workers.registry.partitioners.PARTITIONER_REGISTRY`), then ``explicit``."""
    return (*PARTITIONER_REGISTRY.names(), Experiment.EXPLICIT)


def partition_rule_get(name: object) -> Partitioner:
    """The registered partitioner ``name``.

    Raises:
        ApplicationError: not a registered partitioner nor ``explicit``, naming
            ``partition_rule`` and listing :func:`partition_rules`.
    """
    if not isinstance(name, str) or name not in PARTITIONER_REGISTRY:
        allowed = ", ".join(partition_rules())
        raise ApplicationError(f"partition_rule: {name!r} is not allowed; allowed: {allowed}", field="partition_rule")
    return PARTITIONER_REGISTRY.get(name)


def check_finite_range(
    field: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """``value`` as a float when it is a finite number in the interval from ``lo`` to ``hi``
    (each end open or closed).

    Raises:
        ApplicationError: not a number, not finite or out of the interval, naming ``field`` and
            the interval.
    """
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float: out of any range
        v = math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        raise ApplicationError(f"{field} must be a number", field=field) from None
    lo_ok = v > lo if lo_open else v >= lo
    hi_ok = v < hi if hi_open else v <= hi
    if not (math.isfinite(v) and lo_ok and hi_ok):
        interval = f"{'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}{')' if hi_open else ']'}"
        raise ApplicationError(f"{field}={value!r} is out of range: allowed {interval}", field=field)
    return v


def check_limit(value: Any, limit: Limit) -> float:
    """``value`` as a float when it is a finite number in ``limit``'s declared range
    (:mod:`controlplane.common.limits`).

    Raises:
        ApplicationError: as :func:`check_finite_range`, naming ``limit.name``.
    """
    return check_finite_range(limit.name, value, limit.low, limit.high, lo_open=limit.low_open, hi_open=limit.high_open)


def _check_reliability(**values: Any) -> None:
    """Check ``device_retries`` (an integer in :data:`~controlplane.common.limits.DEVICE_RETRIES`)
    and ``deadline_factor`` (``None`` or in :data:`~controlplane.common.limits.DEADLINE_FACTOR`)
    when given.

    Raises:
        ApplicationError: naming the field and the allowed values.
    """

    if "device_retries" in values:
        retries = values["device_retries"]
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise ApplicationError(
                f"device_retries must be an integer: allowed {DEVICE_RETRIES.span}", field="device_retries"
            )
        check_limit(retries, DEVICE_RETRIES)
    if values.get("deadline_factor") is not None:
        check_limit(values["deadline_factor"], DEADLINE_FACTOR)


def _check_retention(**values: Any) -> None:
    """Check ``keep_device_weights`` (a boolean) and ``keep_last_checkpoints`` (``None``: the
    lab default ``MTFL_KEEP_LAST_CHECKPOINTS``, or an integer in
    :data:`~controlplane.common.limits.KEEP_LAST_CHECKPOINTS`) when given.

    Raises:
        ApplicationError: naming the field and the allowed values.
    """
    if "keep_device_weights" in values and not isinstance(values["keep_device_weights"], bool):
        raise ApplicationError("keep_device_weights must be true or false", field="keep_device_weights")
    keep = values.get("keep_last_checkpoints")
    if keep is not None:
        if isinstance(keep, bool) or not isinstance(keep, int):
            raise ApplicationError(
                f"keep_last_checkpoints must be an integer: allowed {KEEP_LAST_CHECKPOINTS.span}, or null for the lab "
                "default "
                "(MTFL_KEEP_LAST_CHECKPOINTS)",
                field="keep_last_checkpoints",
            )
        check_limit(keep, KEEP_LAST_CHECKPOINTS)


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _check_task_fields(fields: Mapping[str, Any]) -> None:
    if fields.get("num_classes") is not None:
        n = fields["num_classes"]
        if isinstance(n, bool) or not isinstance(n, int):
            raise ApplicationError(
                f"num_classes must be an integer: allowed {NUM_CLASSES.span}, or null for the data's count",
                field="num_classes",
            )
        check_limit(n, NUM_CLASSES)
    if "architecture" in fields:
        registered(MODEL_REGISTRY, fields["architecture"], field="architecture")
    if "dataset" in fields:
        registered(DATASET_REGISTRY, fields["dataset"], field="dataset")
    if "optimizer" in fields:
        _check_choice("optimizer", fields["optimizer"], OPTIMIZERS)
    if "learning_rate" in fields:
        check_limit(fields["learning_rate"], LEARNING_RATE)
    if "momentum" in fields:
        check_limit(fields["momentum"], MOMENTUM)
    if "weight_decay" in fields:
        check_limit(fields["weight_decay"], WEIGHT_DECAY)
    if "execution_mode" in fields:
        _check_choice("execution_mode", fields["execution_mode"], EXECUTION_MODES)
    if "precision" in fields:
        _check_choice("precision", fields["precision"], PRECISIONS)
    if "channels_last" in fields and not isinstance(fields["channels_last"], bool):
        raise ApplicationError("channels_last must be true or false", field="channels_last")


DATA_FIELDS = ("architecture", "dataset", "dataset_root", "num_classes")
"""The task fields the plug-in check reads: changing one checks the task again."""

MAX_NUM_CLASSES = int(NUM_CLASSES.high)

TASK_FEATURES_WHEN = ("queue", "now")
"""When :func:`task_create` computes a new task's workload features: by the control worker
right after the task is saved, or in the caller before it returns."""


def _check_root_given(dataset: str, dataset_root: str) -> None:
    if DATASET_REGISTRY.get(dataset).needs_root and not dataset_root:
        raise ApplicationError(
            f"dataset_root is required for {dataset}: the local folder (or file) it is read from (nothing is "
            "downloaded)",
            field="dataset_root",
        )


def _task_check(*, architecture: str, dataset: str, dataset_root: str, num_classes: int | None, what: str = ""):
    """Build the model and load the data set in a child process
    (:func:`workers.training.plugin_check.check_task_in_child`: a time limit, cached per process by its
    arguments and the root's modification time) and return its
    :class:`~workers.training.plugin_check.TaskCheck`.

    Args:
        num_classes: the stated class count, or ``None`` to take it from the data.
        what: prefix of the message (``"task 'x': "``) when the check runs for another request
            than the task's own (an experiment that needs its labels).

    Raises:
        ApplicationError: (400) the plug-in failed — its import or call raised, it is not a
            model, its output does not fit ``num_classes``, the arrays disagree, the labels
            fall outside ``[0, num_classes)``, the root does not exist, the check timed out —
            under the :class:`~workers.training.plugin_check.PluginCheckError`'s ``field`` with its
            reason.
    """
    # deferred: the plug-in check builds models and loads data (torch), never in the web process at import
    from workers.training.plugin_check import PluginCheckError, check_task_in_child

    try:
        return check_task_in_child(architecture, dataset, dataset_root or None, num_classes)
    except PluginCheckError as exc:
        raise ApplicationError(f"{what}{exc.field}: {exc.reason}", field=exc.field) from exc


def _labels_to_bytes(labels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, labels=np.asarray(labels, dtype=np.int64))
    return buffer.getvalue()


def _labels_from_bytes(data: bytes | memoryview) -> np.ndarray:
    with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as archive:
        return archive["labels"].astype(np.int64, copy=False)


def _apply_check(task: Task, check: Any) -> None:
    """Copy what the check read from the data onto ``task`` (not saved)."""
    labels = np.asarray(check.train_labels, dtype=np.int64)
    task.num_classes = int(check.num_classes)
    task.input_shape = [int(d) for d in check.input_shape]
    task.train_size = int(check.train_size)
    task.test_size = int(check.test_size)
    task.train_labels = _labels_to_bytes(labels)
    task.label_counts = [int(c) for c in np.bincount(labels, minlength=task.num_classes)[: task.num_classes]]


def task_metadata_ensure(task: Task) -> Task:
    """Make sure ``task`` carries what its data says (input shape, sizes, training labels, class
    histogram), checking it now if it was saved before tasks were checked (``train_labels``
    null). A checked task is returned as it is, without a child process.

    Raises:
        ApplicationError: (400, field ``tasks``) the check fails now (the data moved, the
            plug-in was uninstalled), naming the task and the reason.
    """
    if task.train_labels is not None and task.train_size is not None:
        return task
    try:
        check = _task_check(
            architecture=task.architecture,
            dataset=task.dataset,
            dataset_root=task.dataset_root,
            num_classes=task.num_classes,
            what=f"task {task.name!r}: ",
        )
    except ApplicationError as exc:
        raise ApplicationError(exc.message, field="tasks") from exc
    _apply_check(task, check)
    Task.objects.filter(id=task.id).update(
        num_classes=task.num_classes,
        input_shape=task.input_shape,
        train_size=task.train_size,
        test_size=task.test_size,
        train_labels=task.train_labels,
        label_counts=task.label_counts,
    )
    return task


def task_train_labels(task: Task) -> np.ndarray:
    """The task's training labels: int64 array of shape ``(train_size,)``, in ``[0, num_classes)``
    (checked first when the task predates the check, :func:`task_metadata_ensure`).

    Raises:
        ApplicationError: as :func:`task_metadata_ensure`.
    """
    task_metadata_ensure(task)
    assert task.train_labels is not None  # set by task_metadata_ensure
    return _labels_from_bytes(task.train_labels)


@transaction.atomic
def task_create(
    *,
    name: str,
    architecture: str,
    dataset: str = "digits",
    dataset_root: str = "",
    num_classes: int | None = None,
    optimizer: str = "sgd",
    learning_rate: float = 0.05,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    execution_mode: str = ExecutionOptions().mode,
    precision: str = ExecutionOptions().precision,
    channels_last: bool = ExecutionOptions().channels_last,
    owner=None,
    features: str = "queue",
) -> Task:
    """Define a learning task, owned by ``owner`` (a user, or ``None`` from the command line).

    The model and the data set are checked in a child process before anything is saved
    (:func:`_task_check`): the task then carries its ``input_shape``, ``train_size``,
    ``test_size``, training labels and ``label_counts`` as the data gives them.

    Its workload features (:mod:`controlplane.profiling.services.workloads`) are computed now,
    as part of creating it, never on a run's start: nothing a run's start does reads them, and a
    run created right after the task no longer shares the control worker with their computation.

    Args:
        features: ``"queue"`` (default; a web request): the control worker computes them as
            soon as the task is saved (no-op when a task of the same model and shape has them);
            ``"now"`` (the command line, the demo, benchmarks): computed here before returning
            (imports torch: seconds the first time in a process).
        num_classes: ``None`` (default): the data's class count (``max(label) + 1`` over both
            splits, or the data set's declared count); a stated count may exceed the data's
            (:data:`~controlplane.common.limits.NUM_CLASSES`), never fall below it.
        execution_mode, precision, channels_last: how its trainers run a step
            (:class:`workers.protocol.messages.ExecutionOptions`): ``auto``/``eager``/``graphs``,
            ``fp32``/``bf16``, channels-last memory format. They are the task's, so every strategy
            of a comparison trains it the same way; ``graphs`` and ``bf16`` need a GPU backend
            on every device holding its data (checked when an experiment uses it).

    Raises:
        ApplicationError: unknown architecture, data set, optimizer, execution mode or
            precision; a hyper-parameter out of range; a duplicate name; a missing ``dataset_root`` for a data set read from files;
            (400, under the field at fault) any failure of the plug-in check, including
            ``num_classes`` below the data's and a root that does not exist.
    """
    fields = dict(
        name=name,
        architecture=architecture,
        dataset=dataset,
        dataset_root=dataset_root or "",
        optimizer=optimizer,
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        execution_mode=execution_mode,
        precision=precision,
        channels_last=channels_last,
    )
    _check_task_fields({**fields, "num_classes": num_classes})
    if not name:
        raise ApplicationError("name is required", field="name")
    if Task.objects.filter(name=name).exists():
        raise ApplicationError(f"a task named {name!r} already exists", field="name")
    _check_root_given(dataset, fields["dataset_root"])
    check = _task_check(
        architecture=architecture, dataset=dataset, dataset_root=fields["dataset_root"], num_classes=num_classes
    )
    _check_features_when(features)
    task = Task(owner=owner, **fields)
    _apply_check(task, check)
    task.save()
    _task_workload(task, features)
    return task


def _check_features_when(features: str) -> None:
    """Raises :class:`ApplicationError` (field ``features``) unless ``features`` is one of
    :data:`TASK_FEATURES_WHEN`."""
    if features not in TASK_FEATURES_WHEN:
        raise ApplicationError(
            f"features must be one of {', '.join(TASK_FEATURES_WHEN)}, not {features!r}", field="features"
        )


def _task_workload(task: Task, features: str) -> None:
    """Compute the task's workload features here (``features="now"``) or ask the control worker
    to (``"queue"``)."""
    if features == "now":
        workload_ensure(architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape)
    else:
        workload_request(architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape)


@transaction.atomic
def task_update(*, task: Task, actor=None, **fields: Any) -> Task:
    """Change a task's definition; only its name once a run has trained it.

    A change of its model or data (:data:`DATA_FIELDS`) checks the task again, as
    :func:`task_create` does, and refreshes what it carries from the data. ``num_classes``
    left out keeps the task's count; ``num_classes=None`` takes the data's.

    Args:
        actor: the user asking; ``None`` (the command line) may change any task.

    Raises:
        ApplicationError: (403) ``actor`` is neither the task's owner nor a superuser; as
            :func:`task_create`; (409) changing anything but the name of a task that runs
            have trained; or (400, field ``devices``) execution options a device holding the
            task's data in one of its experiments cannot run (``graphs`` or ``bf16`` on ``cpu``).
    """
    if actor is not None and not (actor.is_superuser or (task.owner_id and task.owner_id == actor.pk)):
        raise ApplicationError(
            "only the task's owner or a superuser can change it; define a new task instead",
            status_code=403,
        )
    allowed = {
        "name",
        "architecture",
        "dataset",
        "dataset_root",
        "num_classes",
        "optimizer",
        "learning_rate",
        "momentum",
        "weight_decay",
        *EXECUTION_FIELDS,
    }
    unknown = set(fields) - allowed
    if unknown:
        raise ApplicationError(f"cannot update {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    if "dataset_root" in fields:
        fields["dataset_root"] = fields["dataset_root"] or ""
    _check_task_fields(fields)
    changed = {k for k, v in fields.items() if getattr(task, k) != v}
    frozen = sorted(changed - {"name"})
    if frozen and task.experiments.filter(runs__isnull=False).exists():
        raise ApplicationError(
            f"{frozen[0]} cannot change: runs have already trained this task with it (they would no "
            "longer say how they were trained); define a new task",
            field=frozen[0],
            status_code=409,
        )
    if "name" in fields and Task.objects.exclude(pk=task.pk).filter(name=fields["name"]).exists():
        raise ApplicationError(f"a task named {fields['name']!r} already exists", field="name")
    if changed & set(EXECUTION_FIELDS):
        _task_holders_check(task, {k: fields.get(k, getattr(task, k)) for k in EXECUTION_FIELDS})
    recheck = bool(changed & set(DATA_FIELDS))
    if recheck:
        dataset = fields.get("dataset", task.dataset)
        dataset_root = fields.get("dataset_root", task.dataset_root)
        _check_root_given(dataset, dataset_root)
        check = _task_check(
            architecture=fields.get("architecture", task.architecture),
            dataset=dataset,
            dataset_root=dataset_root,
            num_classes=fields["num_classes"] if "num_classes" in fields else task.num_classes,
        )
    for key, value in fields.items():
        if key != "num_classes":
            setattr(task, key, value)
    if recheck:
        _apply_check(task, check)
    task.save()
    if recheck:
        workload_request(architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape)
    return task


def _task_holders_check(task: Task, execution: Mapping[str, Any]) -> None:
    """Refuse new execution options of ``task`` that a device holding its data in one of its
    experiments cannot run (:func:`.execution.execution_holders_check`).

    Raises:
        ApplicationError: (400, field ``devices``) naming the task, the option, the device and
            its experiment.
    """
    proposed = Task(name=task.name, **execution)
    shards = (
        Shard.objects.filter(task=task, num_samples__gt=0)
        .select_related("device", "experiment")
        .only("device__name", "device__backend", "experiment__name")
        .order_by("experiment_id", "device__name")
    )
    for shard in shards:
        execution_holders_check([(shard.device, proposed)], where=f" (experiment {shard.experiment.name!r})")


class _ShardRow:
    """One device's shard of one task, as :func:`_shard_table` derives it (see :class:`Shard`)."""

    __slots__ = ("device", "task", "num_samples", "offset", "indices", "label_counts")

    def __init__(
        self, device: Device, task: Task, num_samples: int, offset: int, indices: str | None, label_counts: list[int]
    ):
        self.device, self.task, self.num_samples, self.offset = device, task, num_samples, offset
        self.indices, self.label_counts = indices, label_counts


def _histogram(labels: np.ndarray, positions: np.ndarray, num_classes: int) -> list[int]:
    return [int(c) for c in label_histogram(labels, positions, num_classes)]


def _shard_table(
    *,
    tasks: list[Task],
    devices: list[Device],
    partition_rule: str,
    partition_params: Mapping[str, float | int],
    seed: int,
    sample_counts: Iterable[Mapping[str, Any]] | None,
    train_samples: int | None = None,
) -> list[_ShardRow]:
    """Derive every device's shard of every task.

    ``explicit`` takes the given counts as windows of the task's seeded permutation
    (:func:`workers.training.partition.shard_indices`, seed ``seed``), in device order. Any
    other rule is a registered partitioner called over the task's training labels
    (:func:`workers.training.partition.partition_indices`) with seed ``seed * 10007 + k`` for the
    ``k``-th task (so tasks get different draws: ``quantity`` gives each task its own skew); the
    positions it chose are stored encoded (:func:`workers.protocol.indices.encode_indices`);
    with ``train_samples`` the partitioner divides only the first ``train_samples`` positions of
    each split (quick runs that keep the rule's skew). Either way each shard gets its class
    histogram.

    Raises:
        ApplicationError: bad explicit counts (naming ``sample_counts`` or ``num_samples``), a
            partitioner that refuses its parameters (``partition_params``), or a task whose
            check fails now (``tasks``).
    """
    rows: list[_ShardRow] = []
    if partition_rule == Experiment.EXPLICIT:
        given = _explicit_counts(tasks, devices, sample_counts)
        for task in tasks:
            labels = task_train_labels(task)
            train_size = int(task.train_size or 0)
            counts = [given.get((d.id, task.id), 0) for d in devices]
            if sum(counts) > train_size:
                raise ApplicationError(
                    f"sample_counts for task {task.name!r} add up to {sum(counts)}, more than its "
                    f"training split holds ({train_size})",
                    field="num_samples",
                )
            offsets = [0, *itertools.accumulate(counts)][:-1]
            for device, n, offset in zip(devices, counts, offsets, strict=True):
                positions = shard_indices(train_size, seed, offset, n)
                rows.append(_ShardRow(device, task, n, offset, None, _histogram(labels, positions, task.num_classes)))
        return rows
    if sample_counts:
        raise ApplicationError("sample_counts are only allowed with partition_rule 'explicit'", field="sample_counts")

    for k, task in enumerate(tasks):
        labels = task_train_labels(task)
        divided = labels if train_samples is None else labels[:train_samples]
        try:
            parts = partition_indices(divided, len(devices), partition_rule, dict(partition_params), seed * 10007 + k)
        except ValueError as exc:
            raise ApplicationError(f"task {task.name!r}: {exc}", field="partition_params") from exc
        for device, positions in zip(devices, parts, strict=True):
            positions = np.asarray(positions, dtype=np.int64)
            rows.append(
                _ShardRow(
                    device,
                    task,
                    int(positions.size),
                    0,
                    encode_indices(positions),
                    _histogram(labels, positions, task.num_classes),
                )
            )
    return rows


def _explicit_counts(
    tasks: list[Task], devices: list[Device], sample_counts: Iterable[Mapping[str, Any]] | None
) -> dict[tuple[int, int], int]:
    """``{(device_id, task_id): num_samples}`` of an explicit experiment.

    Raises:
        ApplicationError: an entry without integer ``device``, ``task`` and ``num_samples``,
            naming a device or task outside the experiment, repeated, or a count of 1 or below 0.
    """
    given: dict[tuple[int, int], int] = {}
    device_ids = {d.id for d in devices}
    task_ids = {t.id for t in tasks}
    for k, entry in enumerate(sample_counts or []):
        try:
            device_id, task_id, n = int(entry["device"]), int(entry["task"]), int(entry["num_samples"])
        except (KeyError, TypeError, ValueError):
            raise ApplicationError(
                f"sample_counts[{k}] needs integer device, task and num_samples", field="sample_counts"
            ) from None
        if device_id not in device_ids:
            raise ApplicationError(
                f"sample_counts[{k}].device={device_id} is not a device of this experiment", field="sample_counts"
            )
        if task_id not in task_ids:
            raise ApplicationError(
                f"sample_counts[{k}].task={task_id} is not a task of this experiment", field="sample_counts"
            )
        if n < 0 or n == 1:
            raise ApplicationError(
                f"sample_counts[{k}].num_samples={n} is not allowed: allowed 0 or 2 and more "
                "(BatchNorm cannot train on a single sample)",
                field="num_samples",
            )
        if (device_id, task_id) in given:
            raise ApplicationError(
                f"sample_counts[{k}] repeats device {device_id} and task {task_id}", field="sample_counts"
            )
        given[(device_id, task_id)] = n
    return given


def _parameter_interval(p: Any) -> str:
    lo = "(" if getattr(p, "minimum_open", False) else "["
    hi = "inf)" if p.maximum is None else f"{_bound(p.maximum)}]"
    return f"{lo}{_bound(p.minimum)}, {hi}"


def partition_params_check(
    partition_rule: str, partition_params: Mapping[str, Any] | None, dirichlet_alpha: float | None = None
) -> dict[str, float | int]:
    """The parameters an experiment's partition rule is called with: those given, checked
    against the rule's record (``Partitioner.parameters``), with each left out at its default.

    ``dirichlet_alpha`` (the field of clients older than ``partition_params``) is the ``alpha``
    of a rule that takes one.

    Args:
        partition_rule: a registered partitioner's name, or ``explicit`` (which takes none).
        partition_params: ``{name: value}``; ``None`` for none.
        dirichlet_alpha: ``alpha`` under its old name, or ``None``.

    Returns:
        ``{name: value}`` for every parameter of the rule: ints for ``int`` parameters, floats
        for ``float`` ones.

    Raises:
        ApplicationError: (400) an unknown parameter (field ``partition_params``, listing the
            allowed ones), a value that is not a number of the parameter's kind or out of its
            range (field ``partition_params.<name>``, or ``dirichlet_alpha`` when it came from
            there, naming the range), a required one left out, or ``dirichlet_alpha`` with a
            rule that takes no ``alpha`` or different from ``partition_params.alpha``.
    """
    given = dict(partition_params or {})
    if partition_rule == Experiment.EXPLICIT:
        _explicit_params_check(given, dirichlet_alpha)
        return {}
    record = partition_rule_get(partition_rule)
    parameters = {p.name: p for p in record.parameters}
    allowed = ", ".join(parameters) or "none"
    for name in sorted(given):
        if name not in parameters:
            raise ApplicationError(
                f"partition_params.{name} is unknown for partition_rule {partition_rule!r}; allowed: {allowed}",
                field="partition_params",
            )
    source = {name: f"partition_params.{name}" for name in parameters}
    if dirichlet_alpha is not None:
        if "alpha" not in parameters:
            with_alpha = " or ".join(repr(p.name) for p in PARTITIONER_REGISTRY if "alpha" in _names(p))
            raise ApplicationError(
                f"dirichlet_alpha is only allowed with partition_rule {with_alpha} (rules that take an alpha); "
                f"{partition_rule!r} takes: {allowed}",
                field="dirichlet_alpha",
            )
        if "alpha" in given and given["alpha"] != dirichlet_alpha:
            raise ApplicationError(
                f"dirichlet_alpha={dirichlet_alpha!r} and partition_params.alpha={given['alpha']!r} differ: give one",
                field="dirichlet_alpha",
            )
        given["alpha"] = dirichlet_alpha
        if "alpha" not in (partition_params or {}):
            source["alpha"] = "dirichlet_alpha"
    out: dict[str, float | int] = {}
    for name, p in parameters.items():
        field = source[name]
        if name not in given:
            if p.default is None:
                raise ApplicationError(
                    f"{field} is required with partition_rule {partition_rule!r}: allowed {_parameter_interval(p)}",
                    field=field,
                )
            out[name] = p.default
            continue
        out[name] = _partition_param_value(p, field, given[name])
    return out


def _explicit_params_check(given: Mapping[str, Any], dirichlet_alpha: float | None) -> None:
    """Raises :class:`ApplicationError` when parameters or ``dirichlet_alpha`` come with the
    ``explicit`` rule (which takes none: ``sample_counts`` give the shards)."""
    if given:
        raise ApplicationError(
            "partition_params are not allowed with partition_rule 'explicit': sample_counts give the shards",
            field="partition_params",
        )
    if dirichlet_alpha is not None:
        raise ApplicationError("dirichlet_alpha is not allowed with partition_rule 'explicit'", field="dirichlet_alpha")


def _partition_param_value(p: Any, field: str, value: Any) -> float | int:
    """``value`` of the partitioner's parameter ``p``, checked: an int for an ``int`` parameter,
    a float otherwise.

    Raises:
        ApplicationError: (naming ``field`` and the range) not a number of its kind, not finite,
            or out of its range.
    """
    if p.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        if not (isinstance(value, float) and value.is_integer()):
            raise ApplicationError(f"{field} must be an integer: allowed {_parameter_interval(p)}", field=field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApplicationError(f"{field} must be a number: allowed {_parameter_interval(p)}", field=field)
    hi = math.inf if p.maximum is None else p.maximum
    if not math.isfinite(float(value)):
        raise ApplicationError(f"{field} must be a finite number: allowed {_parameter_interval(p)}", field=field)
    # The API reads every number as a float: echo 0, not 0.0, when the researcher wrote 0.
    shown = int(value) if p.kind == "int" and isinstance(value, float) and value.is_integer() else value
    checked = check_finite_range(
        field, shown, p.minimum, hi, lo_open=getattr(p, "minimum_open", False), hi_open=p.maximum is None
    )
    return int(checked) if p.kind == "int" else float(checked)


def _names(partitioner: Partitioner) -> set[str]:
    return {p.name for p in partitioner.parameters}


# --- aggregation and participation ----------------------------------------------------------

_PARAM_FIELD = re.compile(r"aggregation_params(?:\.\w+)?")


def aggregation_check(aggregation: object, params: object, *, prefix: str = "") -> tuple[str, dict[str, Any]]:
    """An aggregator's name and its parameters, checked against its record
    (:meth:`workers.registry.aggregators.Aggregator.check_params`), defaults filled in.

    Args:
        aggregation: a name of :data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY`.
        params: ``{name: number}`` or ``None`` (every parameter at its default).
        prefix: put before every field named (``"task_aggregation.<task>."`` for an override).

    Returns:
        ``(name, {parameter: value})`` with every declared parameter present.

    Raises:
        ApplicationError: (400) an unknown aggregator (``<prefix>aggregation``, listing the
            registered ones), ``params`` that is not an object (``<prefix>aggregation_params``),
            an unknown parameter, a missing required one or a value out of its range
            (``<prefix>aggregation_params.<name>``, naming the allowed range).
    """
    record = registered(AGGREGATOR_REGISTRY, aggregation, field=f"{prefix}aggregation")
    if params is not None and not isinstance(params, Mapping):
        raise ApplicationError(
            f"{prefix}aggregation_params must be an object of parameter names, got {params!r}",
            field=f"{prefix}aggregation_params",
        )
    try:
        checked = record.check_params(params)
    except ValueError as exc:
        message = str(exc)
        match = _PARAM_FIELD.match(message)
        field = match.group(0) if match else "aggregation_params"
        raise ApplicationError(f"{prefix}{message}", field=f"{prefix}{field}") from None
    return record.name, dict(checked)


def task_aggregation_check(
    task_aggregation: object, tasks: Iterable[Task], *, default_aggregation: str
) -> dict[str, dict[str, Any]]:
    """Per-task aggregator overrides, checked, keyed by task id (a string, as JSON keys are).

    Args:
        task_aggregation: ``{task: {"aggregation": name, "aggregation_params": {...}}}`` or
            ``None``; ``task`` is a task's id (a number or its digits) or its name, of one of
            ``tasks``; ``aggregation`` left out is ``default_aggregation``.
        tasks: the experiment's tasks.
        default_aggregation: the experiment's aggregator.

    Returns:
        ``{str(task id): {"aggregation": name, "aggregation_params": checked}}``.

    Raises:
        ApplicationError: (400) not an object, a key that is not one of ``tasks`` or names a
            task twice (``task_aggregation``), an entry that is not an object or has other keys
            (``task_aggregation.<task>``), and as :func:`aggregation_check` under
            ``task_aggregation.<task>.`` (``<task>`` as the request wrote it).
    """
    if task_aggregation is None:
        return {}
    if not isinstance(task_aggregation, Mapping):
        raise ApplicationError(
            "task_aggregation must be an object of task ids or names, each with its aggregation and "
            f"aggregation_params, got {task_aggregation!r}",
            field="task_aggregation",
        )
    tasks = list(tasks)
    by_id = {str(t.id): t for t in tasks}
    by_name = {t.name: t for t in tasks}
    out: dict[str, dict[str, Any]] = {}
    for key, entry in task_aggregation.items():
        written = str(key)
        task = by_id.get(written) or by_name.get(written)
        if task is None:
            known = ", ".join(f"{t.name} (id {t.id})" for t in tasks)
            raise ApplicationError(
                f"task_aggregation: {written!r} is not a task of this experiment; its tasks: {known}",
                field="task_aggregation",
            )
        if str(task.id) in out:
            raise ApplicationError(
                f"task_aggregation: task {task.name!r} (id {task.id}) is given twice", field="task_aggregation"
            )
        prefix = f"task_aggregation.{written}."
        if not isinstance(entry, Mapping):
            raise ApplicationError(
                f"task_aggregation.{written} must be an object with aggregation and aggregation_params, got {entry!r}",
                field=f"task_aggregation.{written}",
            )
        unknown = sorted(set(entry) - {"aggregation", "aggregation_params"})
        if unknown:
            raise ApplicationError(
                f"{prefix}{unknown[0]}: unknown field; allowed: aggregation, aggregation_params",
                field=f"{prefix}{unknown[0]}",
            )
        name, params = aggregation_check(
            entry.get("aggregation") or default_aggregation, entry.get("aggregation_params"), prefix=prefix
        )
        out[str(task.id)] = {"aggregation": name, "aggregation_params": params}
    return out


def participation_check(
    *, clients_per_round: object, client_fraction: object, client_sampling: object, num_devices: int
) -> tuple[int | None, float | None, str]:
    """How many devices train each round, and how they are drawn.

    Args:
        clients_per_round: an integer in ``[1, num_devices]``, or ``None``.
        client_fraction: a number in :data:`~controlplane.common.limits.CLIENT_FRACTION`, or ``None``
            (exclusive with ``clients_per_round``;
            both ``None``: every device, every round).
        client_sampling: ``uniform`` or ``weighted`` (by each device's data volume).
        num_devices: the experiment's devices.

    Returns:
        ``(clients_per_round, client_fraction, client_sampling)`` as stored.

    Raises:
        ApplicationError: (400) both counts given (naming both), a count that is not an integer
            or out of range, a fraction out of its range, an unknown sampling rule; each naming
            its field and the allowed values.
    """
    if clients_per_round is not None and client_fraction is not None:
        raise ApplicationError(
            "clients_per_round and client_fraction are exclusive: give one of them (the other null), or neither "
            "for every device every round",
            field="clients_per_round",
        )
    count: int | None = None
    if clients_per_round is not None:
        if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, int):
            if not (isinstance(clients_per_round, float) and clients_per_round.is_integer()):
                raise ApplicationError(
                    f"clients_per_round must be an integer: allowed 1 to {num_devices} (the experiment's devices)",
                    field="clients_per_round",
                )
        if not 1 <= clients_per_round <= num_devices:
            raise ApplicationError(
                f"clients_per_round={clients_per_round!r} is out of range: allowed 1 to {num_devices} "
                "(the experiment's devices)",
                field="clients_per_round",
            )
        count = int(clients_per_round)
    fraction = None
    if client_fraction is not None:
        if isinstance(client_fraction, bool):
            raise ApplicationError(
                f"client_fraction must be a number: allowed {CLIENT_FRACTION.interval}", field="client_fraction"
            )
        fraction = check_limit(client_fraction, CLIENT_FRACTION)
    _check_choice("client_sampling", client_sampling, CLIENT_SAMPLING_RULES)
    return count, fraction, str(client_sampling)


def _resolve(model, ids: Iterable[Any], field: str) -> list:
    ids = list(ids or [])
    if not ids:
        raise ApplicationError(f"{field} must list at least one", field=field)
    try:
        ids = [int(i) for i in ids]
    except (TypeError, ValueError):
        raise ApplicationError(f"{field} must be a list of ids", field=field) from None
    if len(set(ids)) != len(ids):
        raise ApplicationError(f"{field} lists an id twice", field=field)
    objects = list(model.objects.filter(id__in=ids).order_by("id"))
    missing = sorted(set(ids) - {o.id for o in objects})
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise ApplicationError(f"{field}: no {model.__name__.lower()} with id {shown}", field=field)
    return objects


@transaction.atomic
def experiment_create(
    *,
    name: str,
    task_ids: Iterable[int],
    device_ids: Iterable[int],
    rounds: int,
    local_epochs: int = 1,
    partition_rule: str = "iid",
    partition_params: Mapping[str, Any] | None = None,
    dirichlet_alpha: float | None = None,
    seed: int = 0,
    sample_counts: Iterable[Mapping[str, Any]] | None = None,
    description: str = "",
    owner=None,
    device_retries: int = 0,
    deadline_factor: float | None = None,
    lr_scaling: str = DEFAULT_LR_SCALING,
    untrusted_predictor: str = "plan",
    aggregation: str = "fedavg",
    aggregation_params: Mapping[str, Any] | None = None,
    task_aggregation: Mapping[Any, Mapping[str, Any]] | None = None,
    clients_per_round: int | None = None,
    client_fraction: float | None = None,
    client_sampling: str = "uniform",
    train_samples: int | None = None,
    keep_device_weights: bool = False,
    keep_last_checkpoints: int | None = None,
) -> Experiment:
    """Create an experiment and derive its shards (which samples of every task each device
    holds, with their class histograms: :func:`_shard_table`).

    Args:
        partition_rule: a registered partitioner (built-ins ``iid``, ``quantity``,
            ``dirichlet_labels``, ``shards``) or ``explicit``; ``partition_params`` its parameters
            (``{"alpha": 0.5}``), checked against its record (:func:`partition_params_check`),
            left-out ones at their defaults; ``dirichlet_alpha``: ``partition_params["alpha"]``
            under the name older clients use.
        sample_counts: for ``explicit``: ``[{"device": id, "task": id, "num_samples": n}, ...]``; 0 if left out.
        owner: the user who owns it (sees and changes it, chooses collaborators); ``None``: superusers only.
        device_retries: how many times a round re-sends a device's part when its agent is lost or
            its trainers fail, :data:`~controlplane.common.limits.DEVICE_RETRIES` (0: the round goes
            on without the device); ``deadline_factor``: a round's deadline as a multiple of its
            predicted round time, :data:`~controlplane.common.limits.DEADLINE_FACTOR` (``None``:
            ``MTFL_DEADLINE_FACTOR``).
        lr_scaling: how an assignment's learning rate follows its batch size, relative to batch 128:
            ``none``, ``linear`` or ``sqrt`` (:mod:`controlplane.planning.lr_scaling`); ``untrusted_predictor``:
            what a ``vres_*`` run does when the planner's guard distrusts a device's predictor: ``plan``,
            ``baseline`` or ``measure`` (:mod:`controlplane.planning.guard`).
        aggregation: a name of :data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY` (``fedavg``,
            ``fedadam``, …): how each task's device models become its next global model;
            ``aggregation_params`` its hyper-parameters (``{"server_learning_rate": 0.01}``), stored
            checked with every left-out one at its default (:func:`aggregation_check`);
            ``task_aggregation``: per-task overrides, ``{task id or name: {"aggregation": name,
            "aggregation_params": {...}}}`` (:func:`task_aggregation_check`), stored by task id.
        clients_per_round: devices trained per round (partial participation), 1 to the number of
            devices, or ``client_fraction`` of them (:data:`~controlplane.common.limits.CLIENT_FRACTION`;
            exclusive); ``client_sampling``: ``uniform`` or ``weighted`` (by data volume)
            (:func:`participation_check`).
        train_samples: for a quick run, the partition rule divides only the first ``train_samples`` samples
            of each task's training split, 2 to its size (``None``: all); not with ``explicit``, whose
            counts already say how many.
        keep_device_weights: keep every device's weights after its round is aggregated (for debugging; by
            default the retention policy deletes them: :mod:`controlplane.storage.services.retention`);
            ``keep_last_checkpoints``: global checkpoints kept per run and task beside the initial, best and latest,
            :data:`~controlplane.common.limits.KEEP_LAST_CHECKPOINTS` (``None``: ``MTFL_KEEP_LAST_CHECKPOINTS``).

    Raises:
        ApplicationError: unknown tasks or devices, ``rounds``/``local_epochs`` out of range, an
            ``lr_scaling`` that is not a rule, an ``untrusted_predictor`` not allowed, a partition rule or
            parameter that is not allowed, explicit counts that are negative or exceed a training split, a
            task whose check fails now, a duplicate name, an aggregator, aggregator parameter, per-task
            override or participation setting that is not allowed (naming the field and the allowed values);
            (field ``devices``) a task asking for ``execution_mode`` ``graphs`` or ``precision`` ``bf16``
            while a device holding its data is not a GPU backend (:mod:`.execution`).
    """
    given = dict(locals())  # the arguments by name, for the steps (first: no other local is bound yet)
    tasks, devices = _experiment_members(name, task_ids, device_ids)
    stored = _experiment_stored(given, tasks=tasks, devices=devices)
    rows = _experiment_shards(given, tasks=tasks, devices=devices, params=stored["partition_params"])
    return _experiment_save(stored, tasks=tasks, devices=devices, rows=rows)


def _experiment_members(
    name: str, task_ids: Iterable[int], device_ids: Iterable[int]
) -> tuple[list[Task], list[Device]]:
    """A new experiment's tasks and devices, by id.

    Raises:
        ApplicationError: no name, a name taken, or unknown or repeated tasks or devices.
    """
    if not name:
        raise ApplicationError("name is required", field="name")
    if Experiment.objects.filter(name=name).exists():
        raise ApplicationError(f"an experiment named {name!r} already exists", field="name")
    return _resolve(Task, task_ids, "tasks"), _resolve(Device, device_ids, "devices")


def _experiment_stored(given: Mapping[str, Any], *, tasks: list[Task], devices: list[Device]) -> dict[str, Any]:
    """The :class:`Experiment` fields of :func:`experiment_create`'s arguments ``given``, each
    checked (in the order the first error is reported) and as stored.

    Raises:
        ApplicationError: as :func:`experiment_create` (not the shards' errors).
    """
    check_limit(given["rounds"], ROUNDS)
    check_limit(given["local_epochs"], LOCAL_EPOCHS)
    check_limit(given["seed"], SEED)
    deadline_factor = given["deadline_factor"]
    _check_reliability(device_retries=given["device_retries"], deadline_factor=deadline_factor)
    _check_retention(
        keep_device_weights=given["keep_device_weights"], keep_last_checkpoints=given["keep_last_checkpoints"]
    )
    try:
        lr_scaling_check(given["lr_scaling"])
    except ValueError as exc:
        raise ApplicationError(str(exc), field="lr_scaling") from None
    try:
        untrusted_choice(given["untrusted_predictor"])
    except ValueError as exc:
        raise ApplicationError(str(exc), field="untrusted_predictor") from None
    partition_rule, partition_params = given["partition_rule"], given["partition_params"]
    if partition_rule != Experiment.EXPLICIT:
        partition_rule_get(partition_rule)
    if partition_params is not None and not isinstance(partition_params, Mapping):
        raise ApplicationError("partition_params must be an object of parameter names", field="partition_params")
    params = partition_params_check(partition_rule, partition_params, given["dirichlet_alpha"])
    aggregation, aggregation_params = aggregation_check(given["aggregation"], given["aggregation_params"])
    task_aggregation = task_aggregation_check(given["task_aggregation"], tasks, default_aggregation=aggregation)
    clients_per_round, client_fraction, client_sampling = participation_check(
        clients_per_round=given["clients_per_round"],
        client_fraction=given["client_fraction"],
        client_sampling=given["client_sampling"],
        num_devices=len(devices),
    )
    return dict(
        name=given["name"],
        description=given["description"] or "",
        rounds=int(given["rounds"]),
        local_epochs=int(given["local_epochs"]),
        partition_rule=partition_rule,
        partition_params=params,
        dirichlet_alpha=params.get("alpha"),
        seed=int(given["seed"]),
        owner=given["owner"],
        device_retries=int(given["device_retries"]),
        deadline_factor=None if deadline_factor is None else float(deadline_factor),
        lr_scaling=given["lr_scaling"],
        untrusted_predictor=given["untrusted_predictor"],
        aggregation=aggregation,
        aggregation_params=aggregation_params,
        task_aggregation=task_aggregation,
        clients_per_round=clients_per_round,
        client_fraction=client_fraction,
        client_sampling=client_sampling,
        keep_device_weights=given["keep_device_weights"],
        keep_last_checkpoints=given["keep_last_checkpoints"],
    )


def _experiment_shards(
    given: Mapping[str, Any], *, tasks: list[Task], devices: list[Device], params: dict[str, float | int]
) -> list[_ShardRow]:
    """The shards of :func:`experiment_create`'s arguments ``given`` (checked ``params`` of its
    partition rule).

    Raises:
        ApplicationError: ``train_samples`` with ``explicit`` or out of range, explicit counts
            that are not allowed, no device holding any sample, or a task's execution options a
            device holding its data cannot run.
    """
    partition_rule, train_samples = given["partition_rule"], given["train_samples"]
    if train_samples is not None:
        if partition_rule == Experiment.EXPLICIT:
            raise ApplicationError(
                "train_samples is not allowed with partition_rule 'explicit': sample_counts give the shards",
                field="train_samples",
            )
        check_finite_range("train_samples", train_samples, 2, min((int(t.train_size or 0) for t in tasks), default=2))
    rows = _shard_table(
        tasks=tasks,
        devices=devices,
        partition_rule=partition_rule,
        partition_params=params,
        seed=int(given["seed"]),
        sample_counts=given["sample_counts"],
        train_samples=None if train_samples is None else int(train_samples),
    )
    if not any(r.num_samples > 0 for r in rows):
        raise ApplicationError("no device holds any sample: nothing would be trained", field="sample_counts")
    execution_holders_check((r.device, r.task) for r in rows if r.num_samples > 0)
    return rows


def _experiment_save(
    stored: Mapping[str, Any], *, tasks: list[Task], devices: list[Device], rows: list[_ShardRow]
) -> Experiment:
    """Save the experiment (its fields ``stored``), its tasks, devices and shards."""
    experiment = Experiment.objects.create(**stored)
    experiment.tasks.set(tasks)
    experiment.devices.set(devices)
    Shard.objects.bulk_create(
        Shard(
            experiment=experiment,
            device=r.device,
            task=r.task,
            num_samples=r.num_samples,
            offset=r.offset,
            indices=r.indices,
            label_counts=r.label_counts,
        )
        for r in rows
    )
    return experiment


@transaction.atomic
def experiment_update(
    *, experiment: Experiment, actor=None, collaborators: Iterable[str] | None = None, **fields: Any
) -> Experiment:
    """Change an experiment's name or description, its rounds, local epochs, aggregation
    (:data:`FL_SETTINGS`) until it has runs, its reliability policy, ``untrusted_predictor`` and
    retention policy (``keep_device_weights``, ``keep_last_checkpoints``: the next round and
    ``mtfl gc`` apply it) at any time, and (its owner only) its collaborators.

    A new ``aggregation`` without ``aggregation_params`` takes the new aggregator's defaults;
    ``task_aggregation`` replaces every override; ``clients_per_round`` and ``client_fraction``
    stay exclusive (set the other to ``None`` in the same request).

    Tasks, devices and the partition are fixed at creation (runs would no longer be comparable):
    create a new experiment to change them.

    Args:
        actor: the user asking (``None``: the command line, allowed everything).
        collaborators: user names that replace the collaborator list; the owner cannot be one.

    Raises:
        ApplicationError: a field that cannot change, a value out of range, an unknown user
            name (naming it), or (403) a collaborator changing the collaborators.
    """
    new_collaborators = None
    if collaborators is not None:
        if actor is not None and not can_manage_experiment(actor, experiment):
            raise ApplicationError(
                "only the experiment's owner can change its collaborators", field="collaborators", status_code=403
            )
        new_collaborators = _resolve_users(collaborators, experiment)
    _check_changeable(fields)
    if any(k in fields for k in FL_SETTINGS):
        fields.update(_fl_settings_updated(experiment, {k: fields.pop(k) for k in FL_SETTINGS if k in fields}))
    changed = sorted(
        k for k in ("rounds", "local_epochs", *FL_SETTINGS) if k in fields and fields[k] != getattr(experiment, k)
    )
    if changed and experiment.runs.exists():
        raise ApplicationError(
            f"{changed[0]} cannot change: the experiment has runs, which follow it round by round "
            "(and would no longer be comparable); create a new experiment",
            field=changed[0],
            status_code=409,
        )
    if "rounds" in fields:
        check_limit(fields["rounds"], ROUNDS)
    if "local_epochs" in fields:
        check_limit(fields["local_epochs"], LOCAL_EPOCHS)
    _check_reliability(**{k: fields[k] for k in ("device_retries", "deadline_factor") if k in fields})
    _check_retention(**{k: fields[k] for k in ("keep_device_weights", "keep_last_checkpoints") if k in fields})
    if "untrusted_predictor" in fields:
        try:
            untrusted_choice(fields["untrusted_predictor"])
        except ValueError as exc:
            raise ApplicationError(str(exc), field="untrusted_predictor") from None
    if "name" in fields and Experiment.objects.exclude(pk=experiment.pk).filter(name=fields["name"]).exists():
        raise ApplicationError(f"an experiment named {fields['name']!r} already exists", field="name")
    for key, value in fields.items():
        setattr(experiment, key, value)
    experiment.save()
    if new_collaborators is not None:
        experiment.collaborators.set(new_collaborators)
    return experiment


FL_SETTINGS = (
    "aggregation",
    "aggregation_params",
    "task_aggregation",
    "clients_per_round",
    "client_fraction",
    "client_sampling",
)
"""The experiment's FL algorithm settings: fixed once it has runs (they decide what is trained)."""


def _check_changeable(fields: Mapping[str, Any]) -> None:
    """Raises :class:`ApplicationError` (naming the first, by name) when ``fields`` name one that
    is fixed at creation (tasks, devices, the partition...)."""
    # The reliability policy may change at any time: it decides how rounds wait, not what they train.
    # untrusted_predictor too: each run applies it when it is planned and records what it did
    # (Run.warnings, Run.planned), so runs already made stay readable. The retention policy
    # too: it decides what is kept on disk, never what is trained.
    allowed = {
        "name",
        "description",
        "rounds",
        "local_epochs",
        "device_retries",
        "deadline_factor",
        "untrusted_predictor",
        "keep_device_weights",
        "keep_last_checkpoints",
        *FL_SETTINGS,
    }
    unknown = set(fields) - allowed
    if unknown:
        field = sorted(unknown)[0]
        raise ApplicationError(
            f"{field} cannot change after creation (runs would no longer be comparable); create a new experiment",
            field=field,
        )


def _fl_settings_updated(experiment: Experiment, given: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`FL_SETTINGS` values ``given`` (and the parameters of a new aggregator), checked
    as :func:`experiment_create` checks them against what ``experiment`` keeps of the others.

    Raises:
        ApplicationError: as :func:`aggregation_check`, :func:`task_aggregation_check` and
            :func:`participation_check`.
    """
    aggregation = given.get("aggregation", experiment.aggregation)
    if "aggregation_params" in given:
        params = given["aggregation_params"]
    elif aggregation != experiment.aggregation:
        params = None  # another aggregator's parameters: its defaults
    else:
        params = experiment.aggregation_params
    aggregation, params = aggregation_check(aggregation, params)
    tasks = list(experiment.tasks.order_by("id"))
    overrides = (
        task_aggregation_check(given["task_aggregation"], tasks, default_aggregation=aggregation)
        if "task_aggregation" in given
        else experiment.task_aggregation
    )
    count, fraction, sampling = participation_check(
        clients_per_round=given.get("clients_per_round", experiment.clients_per_round),
        client_fraction=given.get("client_fraction", experiment.client_fraction),
        client_sampling=given.get("client_sampling", experiment.client_sampling),
        num_devices=experiment.devices.count(),
    )
    updated = {
        "aggregation": aggregation,
        "aggregation_params": params,
        "task_aggregation": overrides,
        "clients_per_round": count,
        "client_fraction": fraction,
        "client_sampling": sampling,
    }
    # Only what was asked for (a new aggregator brings its parameters): a setting stored before a
    # plug-in gained a parameter is not rewritten by a request about another one.
    return {k: v for k, v in updated.items() if k in given or (k == "aggregation_params" and "aggregation" in given)}


def _resolve_users(usernames: Iterable[str], experiment: Experiment) -> list:
    names = list(dict.fromkeys(usernames))
    users = {u.username: u for u in get_user_model().objects.filter(username__in=names, is_active=True)}
    missing = [n for n in names if n not in users]
    if missing:
        raise ApplicationError(f"no active user named {missing[0]!r}", field="collaborators")
    if experiment.owner_id and any(u.pk == experiment.owner_id for u in users.values()):
        raise ApplicationError("the owner is not also a collaborator", field="collaborators")
    return [users[n] for n in names]
