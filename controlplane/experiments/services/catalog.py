"""Writes to the catalogue: tasks and experiments (with their shards)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from controlplane.common.errors import ApplicationError
from controlplane.common.registered import registered
from controlplane.experiments.models import Experiment, Shard, Task
from controlplane.experiments.selectors import can_manage_experiment
from controlplane.fleet.models import Device
from controlplane.profiling.services import workload_request
from workers.protocol.messages import OPTIMIZERS
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.registry.partitioners import PARTITIONER_REGISTRY, Partitioner
from workers.training.datasets import dataset_info
from workers.training.partition import shard_counts, shard_offsets


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


def _check_reliability(**values: Any) -> None:
    """Check ``device_retries`` (an integer 0 to 10) and ``deadline_factor`` (``None`` or 1 to
    100) when given.

    Raises:
        ApplicationError: naming the field and the allowed values.
    """
    from controlplane.experiments.models import MAX_DEVICE_RETRIES

    if "device_retries" in values:
        retries = values["device_retries"]
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise ApplicationError(
                f"device_retries must be an integer: allowed 0 to {MAX_DEVICE_RETRIES}", field="device_retries"
            )
        check_finite_range("device_retries", retries, 0, MAX_DEVICE_RETRIES)
    if values.get("deadline_factor") is not None:
        check_finite_range("deadline_factor", values["deadline_factor"], 1.0, 100.0)


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _check_task_fields(fields: Mapping[str, Any]) -> None:
    if "architecture" in fields:
        registered(MODEL_REGISTRY, fields["architecture"], field="architecture")
    if "dataset" in fields:
        registered(DATASET_REGISTRY, fields["dataset"], field="dataset")
    if "optimizer" in fields:
        _check_choice("optimizer", fields["optimizer"], OPTIMIZERS)
    if "learning_rate" in fields:
        check_finite_range("learning_rate", fields["learning_rate"], 0.0, 10.0, lo_open=True)
    if "momentum" in fields:
        check_finite_range("momentum", fields["momentum"], 0.0, 1.0, hi_open=True)
    if "weight_decay" in fields:
        check_finite_range("weight_decay", fields["weight_decay"], 0.0, 1.0)


def _check_dataset_consistency(task: Task) -> None:
    info = dataset_info(task.dataset)
    if not info.num_classes <= task.num_classes <= 100_000:
        raise ApplicationError(
            f"num_classes={task.num_classes} is out of range for {task.dataset}: allowed "
            f"{info.num_classes} to 100000 (the data set has {info.num_classes} classes)",
            field="num_classes",
        )
    if DATASET_REGISTRY.get(task.dataset).needs_root and not task.dataset_root:
        raise ApplicationError(
            f"dataset_root is required for {task.dataset}: the local folder it is read from (nothing is downloaded)",
            field="dataset_root",
        )


@transaction.atomic
def task_create(
    *,
    name: str,
    architecture: str,
    dataset: str = "digits",
    dataset_root: str = "",
    num_classes: int = 10,
    optimizer: str = "sgd",
    learning_rate: float = 0.05,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    owner=None,
) -> Task:
    """Define a learning task, owned by ``owner`` (a user, or ``None`` from the command line).

    Raises:
        ApplicationError: unknown architecture, data set or optimizer; a hyper-parameter out of
            range; ``num_classes`` below the data set's class count; a duplicate name.
    """
    fields = dict(
        name=name,
        architecture=architecture,
        dataset=dataset,
        dataset_root=dataset_root or "",
        num_classes=num_classes,
        optimizer=optimizer,
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
    )
    _check_task_fields(fields)
    if not name:
        raise ApplicationError("name is required", field="name")
    if Task.objects.filter(name=name).exists():
        raise ApplicationError(f"a task named {name!r} already exists", field="name")
    task = Task(owner=owner, **fields)
    _check_dataset_consistency(task)
    task.save()
    workload_request(architecture=task.architecture, num_classes=task.num_classes)
    return task


@transaction.atomic
def task_update(*, task: Task, actor=None, **fields: Any) -> Task:
    """Change a task's definition; only its name once a run has trained it.

    Args:
        actor: the user asking; ``None`` (the command line) may change any task.

    Raises:
        ApplicationError: (403) ``actor`` is neither the task's owner nor a superuser; as
            :func:`task_create`; or (409) changing anything but the name of a task that runs
            have trained.
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
    }
    unknown = set(fields) - allowed
    if unknown:
        raise ApplicationError(f"cannot update {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
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
    for key, value in fields.items():
        setattr(task, key, value)
    _check_dataset_consistency(task)
    task.save()
    return task


def _shard_table(
    *,
    tasks: list[Task],
    devices: list[Device],
    partition_rule: str,
    dirichlet_alpha: float | None,
    seed: int,
    sample_counts: Iterable[Mapping[str, Any]] | None,
) -> list[tuple[Device, Task, int, int]]:
    """Derive ``(device, task, num_samples, offset)`` for every pair (see :class:`Shard`).

    ``explicit`` takes the given counts; any other rule is a registered partitioner
    (:func:`workers.training.partition.shard_counts`), called with seed ``seed * 10007 + k`` for the
    ``k``-th task (so tasks get different draws: ``dirichlet`` gives each task its own skew).
    """
    rows: list[tuple[Device, Task, int, int]] = []
    if partition_rule == Experiment.EXPLICIT:
        given: dict[tuple[int, int], int] = {}
        device_by_id = {d.id: d for d in devices}
        task_by_id = {t.id: t for t in tasks}
        for k, entry in enumerate(sample_counts or []):
            try:
                device_id, task_id, n = int(entry["device"]), int(entry["task"]), int(entry["num_samples"])
            except (KeyError, TypeError, ValueError):
                raise ApplicationError(
                    f"sample_counts[{k}] needs integer device, task and num_samples", field="sample_counts"
                ) from None
            if device_id not in device_by_id:
                raise ApplicationError(
                    f"sample_counts[{k}].device={device_id} is not a device of this experiment", field="sample_counts"
                )
            if task_id not in task_by_id:
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
        for task in tasks:
            train_size = dataset_info(task.dataset).train_size
            counts = [given.get((d.id, task.id), 0) for d in devices]
            if sum(counts) > train_size:
                raise ApplicationError(
                    f"sample_counts for task {task.name!r} add up to {sum(counts)}, more than its "
                    f"training split holds ({train_size})",
                    field="num_samples",
                )
            rows += [(d, task, n, off) for d, n, off in zip(devices, counts, shard_offsets(counts), strict=True)]
        return rows
    if sample_counts:
        raise ApplicationError("sample_counts are only allowed with partition_rule 'explicit'", field="sample_counts")
    for k, task in enumerate(tasks):
        train_size = dataset_info(task.dataset).train_size
        try:
            counts = shard_counts(
                train_size, len(devices), partition_rule, alpha=dirichlet_alpha, seed=seed * 10007 + k
            )
        except ValueError as exc:
            raise ApplicationError(str(exc), field="dirichlet_alpha") from exc
        rows += [(d, task, n, off) for d, n, off in zip(devices, counts, shard_offsets(counts), strict=True)]
    return rows


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
    dirichlet_alpha: float | None = None,
    seed: int = 0,
    sample_counts: Iterable[Mapping[str, Any]] | None = None,
    description: str = "",
    owner=None,
    device_retries: int = 0,
    deadline_factor: float | None = None,
) -> Experiment:
    """Create an experiment and derive its shards (``|D_ij|`` for every device and task).

    Args:
        owner: the user who owns it (sees it, changes it, chooses collaborators); ``None``
            leaves it to superusers only.
        device_retries: how many times a round re-sends a device's part when its agent is lost
            or its trainers fail, 0 to 10 (0: the round goes on without the device).
        deadline_factor: a round's deadline as a multiple of its predicted round time, 1 to 100
            (``None``: ``MTFL_DEADLINE_FACTOR``).
        sample_counts: for ``partition_rule="explicit"``: ``[{"device": id, "task": id,
            "num_samples": n}, ...]``; pairs left out hold 0 samples.

    Raises:
        ApplicationError: unknown tasks or devices, ``rounds``/``local_epochs`` out of range,
            a partition rule or ``dirichlet_alpha`` that is not allowed, explicit counts that are
            negative or exceed a training split, a duplicate name.
    """
    if not name:
        raise ApplicationError("name is required", field="name")
    if Experiment.objects.filter(name=name).exists():
        raise ApplicationError(f"an experiment named {name!r} already exists", field="name")
    tasks = _resolve(Task, task_ids, "tasks")
    devices = _resolve(Device, device_ids, "devices")
    check_finite_range("rounds", rounds, 1, 10_000)
    check_finite_range("local_epochs", local_epochs, 1, 1000)
    check_finite_range("seed", seed, 0, 2**31 - 1)
    _check_reliability(device_retries=device_retries, deadline_factor=deadline_factor)
    uses_alpha = partition_rule != Experiment.EXPLICIT and partition_rule_get(partition_rule).uses_alpha
    if uses_alpha:
        if dirichlet_alpha is None:
            raise ApplicationError(
                f"dirichlet_alpha is required with partition_rule {partition_rule!r}: allowed (0, 1000]",
                field="dirichlet_alpha",
            )
        check_finite_range("dirichlet_alpha", dirichlet_alpha, 0.0, 1000.0, lo_open=True)
    elif dirichlet_alpha is not None:
        with_alpha = " or ".join(repr(p.name) for p in PARTITIONER_REGISTRY if p.uses_alpha)
        raise ApplicationError(
            f"dirichlet_alpha is only allowed with partition_rule {with_alpha}", field="dirichlet_alpha"
        )
    rows = _shard_table(
        tasks=tasks,
        devices=devices,
        partition_rule=partition_rule,
        dirichlet_alpha=dirichlet_alpha,
        seed=int(seed),
        sample_counts=sample_counts,
    )
    if not any(n > 0 for _, _, n, _ in rows):
        raise ApplicationError("no device holds any sample: nothing would be trained", field="sample_counts")
    experiment = Experiment.objects.create(
        name=name,
        description=description or "",
        rounds=int(rounds),
        local_epochs=int(local_epochs),
        partition_rule=partition_rule,
        dirichlet_alpha=dirichlet_alpha,
        seed=int(seed),
        owner=owner,
        device_retries=int(device_retries),
        deadline_factor=None if deadline_factor is None else float(deadline_factor),
    )
    experiment.tasks.set(tasks)
    experiment.devices.set(devices)
    Shard.objects.bulk_create(
        Shard(experiment=experiment, device=d, task=t, num_samples=n, offset=off) for d, t, n, off in rows
    )
    return experiment


@transaction.atomic
def experiment_update(
    *, experiment: Experiment, actor=None, collaborators: Iterable[str] | None = None, **fields: Any
) -> Experiment:
    """Change an experiment's name or description, its rounds or local epochs until it has
    runs, and (its owner only) its collaborators.

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
    # The reliability policy may change at any time: it decides how rounds wait, not what they train.
    allowed = {"name", "description", "rounds", "local_epochs", "device_retries", "deadline_factor"}
    unknown = set(fields) - allowed
    if unknown:
        field = sorted(unknown)[0]
        raise ApplicationError(
            f"{field} cannot change after creation (runs would no longer be comparable); create a new experiment",
            field=field,
        )
    changed = sorted(k for k in ("rounds", "local_epochs") if k in fields and fields[k] != getattr(experiment, k))
    if changed and experiment.runs.exists():
        raise ApplicationError(
            f"{changed[0]} cannot change: the experiment has runs, which follow it round by round "
            "(and would no longer be comparable); create a new experiment",
            field=changed[0],
            status_code=409,
        )
    if "rounds" in fields:
        check_finite_range("rounds", fields["rounds"], 1, 10_000)
    if "local_epochs" in fields:
        check_finite_range("local_epochs", fields["local_epochs"], 1, 1000)
    _check_reliability(**{k: fields[k] for k in ("device_retries", "deadline_factor") if k in fields})
    if "name" in fields and Experiment.objects.exclude(pk=experiment.pk).filter(name=fields["name"]).exists():
        raise ApplicationError(f"an experiment named {fields['name']!r} already exists", field="name")
    for key, value in fields.items():
        setattr(experiment, key, value)
    experiment.save()
    if new_collaborators is not None:
        experiment.collaborators.set(new_collaborators)
    return experiment


def _resolve_users(usernames: Iterable[str], experiment: Experiment) -> list:
    names = list(dict.fromkeys(usernames))
    users = {u.username: u for u in get_user_model().objects.filter(username__in=names, is_active=True)}
    missing = [n for n in names if n not in users]
    if missing:
        raise ApplicationError(f"no active user named {missing[0]!r}", field="collaborators")
    if experiment.owner_id and any(u.pk == experiment.owner_id for u in users.values()):
        raise ApplicationError("the owner is not also a collaborator", field="collaborators")
    return [users[n] for n in names]
