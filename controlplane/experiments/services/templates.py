"""Built-in experiment templates: the three task mixes of Yu et al. 2022, §5 ("Experimental
evaluation"), created in one call with skewed data volumes per task and device.

The paper evaluates three mixes of three DNNs each, every device holding a highly skewed volume
of data per task, on CIFAR-10:

- ``heavy``: DenseNet121 + VGG16 + ResNet101 (D121+V16+R101), compute-heavy;
- ``light``: ResNet18 + MobileNetV3 + ShuffleNetV2 (R18+M3+S2), models made for mobile devices;
- ``mixed``: ResNet50 + VGG16 + MobileNetV3 (R50+V16+M3), each task with different demands.

The templates train on CIFAR-10 when the control plane finds it locally
(``MTFL_CIFAR10_ROOT``, :func:`cifar10_root`) and on scikit-learn's digits otherwise; nothing is
ever downloaded.

An experiment made from a template (:func:`experiment_create_from_template`) has:

- Tasks: one per architecture of the template on the data set, with :data:`TASK_RECIPE`; an
  existing task with exactly that definition is reused (so experiments of one mix share
  tasks and their workload features), otherwise one is created.
- Data volumes: the ``quantity`` partition rule (quantity skew, as the paper's "highly skewed
  data volumes per task"; ``partition_params = {"alpha": dirichlet_alpha}``): each task's whole
  training split is divided among the devices in proportions ``p ~ Dir(alpha · 1_J)``
  (:func:`workers.training.partition.partition_indices`). Every task
  has its own draw (seed ``seed · 10007 + k`` for the ``k``-th task, by task id), so a task's
  ``|D_ij|`` differ across devices *and* the three tasks on one device hold different
  volumes; every task still covers its whole split. Smaller ``alpha`` skews more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import transaction

from controlplane.common.errors import ApplicationError
from controlplane.common.limits import DIRICHLET_ALPHA
from controlplane.common.registered import registered
from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Experiment, Task
from controlplane.experiments.services.catalog import (
    check_limit,
    experiment_create,
    task_create,
)
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING
from workers.protocol.messages import ExecutionOptions
from workers.registry.datasets import DATASET_REGISTRY


@dataclass(frozen=True)
class ExperimentTemplate:
    """A built-in experiment setup.

    Attributes:
        name: what the API, the CLI and the dashboard call it (``heavy``, ``light``, ``mixed``).
        title: one line for people, e.g. ``"Light mix"``.
        description: what the mix is and where it comes from.
        architectures: the zoo models of its three tasks (:data:`workers.registry.models.MODEL_REGISTRY` names).
    """

    name: str
    title: str
    description: str
    architectures: tuple[str, ...]


TEMPLATES: dict[str, ExperimentTemplate] = {
    t.name: t
    for t in (
        ExperimentTemplate(
            name="heavy",
            title="Heavy mix",
            description="DenseNet121 + VGG16 + ResNet101: the compute-heavy multi-task mix of "
            "Yu et al. 2022, §5 (D121+V16+R101).",
            architectures=("densenet121", "vgg16", "resnet101"),
        ),
        ExperimentTemplate(
            name="light",
            title="Light mix",
            description="ResNet18 + MobileNetV3-Large + ShuffleNetV2: the light mix of Yu et al. "
            "2022, §5 (R18+M3+S2; MobileNetV3 and ShuffleNetV2 are made for mobile devices).",
            architectures=("resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"),
        ),
        ExperimentTemplate(
            name="mixed",
            title="Mixed-demand mix",
            description="ResNet50 + VGG16 + MobileNetV3-Large: the mixed-demand mix of Yu et al. "
            "2022, §5 (R50+V16+M3; each task makes different demands on the device).",
            architectures=("resnet50", "vgg16", "mobilenet_v3_large"),
        ),
    )
}
"""The built-in templates by name."""

DEFAULT_ROUNDS = 3
DEFAULT_LOCAL_EPOCHS = 1
DEFAULT_DIRICHLET_ALPHA = 0.5
MAX_NAME_LENGTH = 200

TASK_RECIPE: dict[str, Any] = {
    "num_classes": 10,
    "optimizer": "adam",
    "learning_rate": 1e-3,
    "momentum": 0.9,
    "weight_decay": 0.0,
}
"""Hyper-parameters of the template tasks: the demo's (Adam, learning rate 1e-3), which learns
within the few local iterations of a short run where SGD barely moves."""

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
CIFAR10_BATCH_MIN_BYTES = 10_000 * 3 * 32 * 32
"""Each CIFAR-10 python batch pickles 10,000 uint8 images of 3×32×32: a file smaller than this
cannot hold one."""


def template_get(name: Any) -> ExperimentTemplate:
    """Return a built-in template by name.

    Raises:
        ApplicationError: (field ``template``) an unknown name, listing the allowed ones.
    """
    if not isinstance(name, str) or name not in TEMPLATES:
        raise ApplicationError(
            f"template {name!r} is not a built-in template; allowed: {', '.join(TEMPLATES)}", field="template"
        )
    return TEMPLATES[name]


def cifar10_problem(root: str | None = None) -> str | None:
    """Say why CIFAR-10 cannot be used from a folder, or return ``None`` if it can.

    The folder is ``root``, or the ``CIFAR10_ROOT`` setting (``MTFL_CIFAR10_ROOT``) when ``root``
    is None. It must hold ``cifar-10-batches-py/`` with the five training batches, the test batch
    and ``batches.meta``, each batch at least :data:`CIFAR10_BATCH_MIN_BYTES` long (the folder may
    also be ``cifar-10-batches-py`` itself). Checksums are left to the trainers, which load the
    data with ``torchvision.datasets.CIFAR10(download=False)``.
    """
    where = "MTFL_CIFAR10_ROOT" if root is None else "the folder"
    root = mtfl_setting("CIFAR10_ROOT") if root is None else root
    if not root:
        return f"{where} is not set (a folder holding cifar-10-batches-py; nothing is downloaded)"
    batches = _cifar10_batches(Path(root).expanduser())
    for filename in (*CIFAR10_BATCHES, "batches.meta"):
        path = batches / filename
        if not path.is_file():
            return f"{where}={root}: {path} is missing (nothing is downloaded)"
        if filename != "batches.meta" and path.stat().st_size < CIFAR10_BATCH_MIN_BYTES:
            return f"{where}={root}: {path} is too small to be a CIFAR-10 batch"
    return None


def cifar10_root() -> str | None:
    """Return the folder holding ``cifar-10-batches-py/`` (what a cifar10 task's
    ``dataset_root`` is) if ``MTFL_CIFAR10_ROOT`` points at complete CIFAR-10 data, else ``None``.

    Agents read the data from the same path, so in a lab deployment mount it there on every
    GPU host.
    """
    if cifar10_problem() is not None:
        return None
    path = Path(mtfl_setting("CIFAR10_ROOT")).expanduser()
    return str(_cifar10_batches(path).parent.resolve())


def template_dataset_default() -> str:
    """The data set templates use when none is asked for: ``cifar10`` if :func:`cifar10_root`
    finds it, ``digits`` otherwise."""
    return "cifar10" if cifar10_root() else "digits"


def _cifar10_batches(path: Path) -> Path:
    return path if path.name == CIFAR10_FOLDER else path / CIFAR10_FOLDER


def _require_int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApplicationError(f"{field} must be an integer, got {value!r}", field=field)
    return value


def _require_number(field: str, value: Any) -> int | float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise ApplicationError(f"{field} must be a finite number, got {value!r}", field=field)
    return value


def _resolve_dataset(dataset: str | None) -> tuple[str, str]:
    """``(dataset, dataset_root)`` for the tasks: the asked data set, or the default."""
    if dataset is None:
        root = cifar10_root()
        return ("cifar10", root) if root else ("digits", "")
    record = registered(DATASET_REGISTRY, dataset, field="dataset")
    if dataset == "cifar10":  # the one data set whose folder a setting gives (MTFL_CIFAR10_ROOT)
        problem = cifar10_problem()
        if problem is not None:
            raise ApplicationError(
                f"dataset 'cifar10' is not available: {problem}; leave dataset out to use digits", field="dataset"
            )
        return "cifar10", cifar10_root() or ""
    if record.needs_root:
        raise ApplicationError(
            f"dataset {dataset!r} is read from a local folder that templates do not know; create its tasks "
            "with dataset_root instead",
            field="dataset",
        )
    return dataset, ""


def _experiment_name(template: ExperimentTemplate, name: str | None) -> str:
    if name is not None and not isinstance(name, str):
        raise ApplicationError(f"name must be a string, got {name!r}", field="name")
    name = (name or "").strip()
    if name:
        if len(name) > MAX_NAME_LENGTH:
            raise ApplicationError(
                f"name is {len(name)} characters long: allowed at most {MAX_NAME_LENGTH}", field="name"
            )
        return name
    base = f"{template.name} mix"
    taken = set(Experiment.objects.filter(name__startswith=base).values_list("name", flat=True))
    candidate, k = base, 1
    while candidate in taken:
        k += 1
        candidate = f"{base} {k}"
    return candidate


def _template_task(
    *, architecture: str, dataset: str, dataset_root: str, execution: Mapping[str, Any], owner=None
) -> Task:
    """The task training ``architecture`` on the data set with :data:`TASK_RECIPE` and the
    ``execution`` options (``execution_mode``, ``precision``, ``channels_last``): an existing
    identical one (the oldest), or a new one named ``<dataset>-<architecture>`` (with ``-2``,
    ``-3``, … if that name holds a different task)."""
    fields = dict(architecture=architecture, dataset=dataset, dataset_root=dataset_root, **TASK_RECIPE, **execution)
    existing = Task.objects.filter(**fields).order_by("id").first()
    if existing is not None:
        return existing
    base = f"{dataset}-{architecture}"
    name, k = base, 1
    while Task.objects.filter(name=name).exists():
        k += 1
        name = f"{base}-{k}"
    return task_create(name=name, owner=owner, **fields)


@transaction.atomic
def experiment_create_from_template(
    *,
    template: str,
    device_ids: Iterable[int],
    name: str | None = None,
    rounds: int = DEFAULT_ROUNDS,
    local_epochs: int = DEFAULT_LOCAL_EPOCHS,
    dirichlet_alpha: float = DEFAULT_DIRICHLET_ALPHA,
    seed: int = 0,
    dataset: str | None = None,
    owner=None,
    lr_scaling: str = DEFAULT_LR_SCALING,
    untrusted_predictor: str = "plan",
    aggregation: str = "fedavg",
    aggregation_params: Mapping[str, Any] | None = None,
    task_aggregation: Mapping[Any, Mapping[str, Any]] | None = None,
    clients_per_round: int | None = None,
    client_fraction: float | None = None,
    client_sampling: str = "uniform",
    keep_device_weights: bool = False,
    keep_last_checkpoints: int | None = None,
    execution_mode: str = ExecutionOptions().mode,
    precision: str = ExecutionOptions().precision,
    channels_last: bool = ExecutionOptions().channels_last,
) -> Experiment:
    """Create an experiment from a built-in template (:data:`TEMPLATES`) on the given devices, with
    the tasks and skewed data volumes (``quantity`` rule) the module describes.

    Args:
        template: ``heavy``, ``light`` or ``mixed``.
        device_ids: the devices (at least one; two or more for any skew across devices).
        name: the experiment's name; default (also when blank) ``"<template> mix"``, `` 2``, `` 3``, … if taken.
        rounds, local_epochs, dirichlet_alpha, seed: FL rounds, local epochs per round, the Dirichlet
            concentration, the seed of the partition and the shards' sample order (ranges: ``ROUNDS``,
            ``LOCAL_EPOCHS``, ``DIRICHLET_ALPHA``, ``SEED`` of :mod:`controlplane.common.limits`).
        dataset: ``digits`` or ``cifar10``; default: ``cifar10`` if :func:`cifar10_root` finds
            it, else ``digits``.
        owner: the experiment's owner (``None``: superusers only); new tasks are theirs too.
        lr_scaling (``none``, ``linear`` or ``sqrt``), untrusted_predictor (``plan``, ``baseline`` or
        ``measure``), aggregation, aggregation_params, clients_per_round, client_fraction, client_sampling,
        keep_device_weights, keep_last_checkpoints: as
            :func:`~controlplane.experiments.services.catalog.experiment_create`.
        task_aggregation: per-task aggregator overrides, each task named by one of the
            template's architectures (``resnet18``), or by its task's name or id.
        execution_mode, precision, channels_last: how every task of the template runs its
            steps (:func:`~controlplane.experiments.services.catalog.task_create`); ``graphs``
            and ``bf16`` need a GPU backend on every device.

    Returns:
        The experiment, with its shards.

    Raises:
        ApplicationError: naming the field: an unknown template or data set, ``cifar10`` asked
            for without the data, a name that is taken or too long, unknown devices, or a number
            of the wrong type or out of range (ranges from
            :func:`~controlplane.experiments.services.catalog.experiment_create`).
    """
    given = dict(locals())  # the arguments by name (the first statement: no other local is bound yet)
    spec = template_get(template)
    rounds = _require_int("rounds", rounds)
    local_epochs = _require_int("local_epochs", local_epochs)
    seed = _require_int("seed", seed)
    dirichlet_alpha = check_limit(_require_number("dirichlet_alpha", dirichlet_alpha), DIRICHLET_ALPHA)
    dataset, dataset_root = _resolve_dataset(dataset)
    name = _experiment_name(spec, name)
    device_ids = list(device_ids or [])
    tasks = _template_tasks(spec, dataset=dataset, dataset_root=dataset_root, given=given)
    return experiment_create(
        name=name,
        description=_template_description(spec, dataset, len(device_ids), dirichlet_alpha, rounds, local_epochs),
        task_ids=[t.id for t in tasks],
        device_ids=device_ids,
        rounds=rounds,
        local_epochs=local_epochs,
        partition_rule="quantity",
        partition_params={"alpha": dirichlet_alpha},
        seed=seed,
        task_aggregation=_by_task_id(task_aggregation, tasks),
        **{k: given[k] for k in _PASSED_ON},
    )


_PASSED_ON = (
    "owner",
    "lr_scaling",
    "untrusted_predictor",
    "aggregation",
    "aggregation_params",
    "clients_per_round",
    "client_fraction",
    "client_sampling",
    "keep_device_weights",
    "keep_last_checkpoints",
)
"""The arguments :func:`experiment_create_from_template` passes on to ``experiment_create`` as given."""


def _template_tasks(
    spec: ExperimentTemplate, *, dataset: str, dataset_root: str, given: Mapping[str, Any]
) -> list[Task]:
    """The template's tasks (:func:`_template_task`), one per architecture, with the execution
    options and owner of :func:`experiment_create_from_template`'s arguments ``given``."""
    execution = {k: given[k] for k in ("execution_mode", "precision", "channels_last")}
    return [
        _template_task(
            architecture=a, dataset=dataset, dataset_root=dataset_root, execution=execution, owner=given["owner"]
        )
        for a in spec.architectures
    ]


def _template_description(
    spec: ExperimentTemplate, dataset: str, num_devices: int, dirichlet_alpha: float, rounds: int, local_epochs: int
) -> str:
    """The description of an experiment made from ``spec``: its mix, data set, devices, data skew and length."""
    return (
        f"{spec.title} (Yu et al. 2022, §5): {' + '.join(spec.architectures)} on {dataset}, "
        f"{num_devices} device(s), Dirichlet α = {dirichlet_alpha:g} data volumes per task and "
        f"device, {rounds} round(s) × {local_epochs} local epoch(s)"
    )


def _by_task_id(task_aggregation: Any, tasks: list[Task]) -> Any:
    """``task_aggregation`` with each key that is one of the template's architectures replaced by
    its task's id (other keys, and anything that is not an object, are left for
    :func:`~controlplane.experiments.services.catalog.task_aggregation_check` to judge).

    Raises:
        ApplicationError: (400, ``task_aggregation``) an architecture and its task's id both given.
    """
    if not isinstance(task_aggregation, Mapping):
        return task_aggregation
    by_architecture = {t.architecture: str(t.id) for t in tasks}
    names = {t.name for t in tasks}
    out: dict[Any, Any] = {}
    for key, entry in task_aggregation.items():
        task_key = by_architecture[key] if key in by_architecture and key not in names else key
        if task_key in out:
            raise ApplicationError(f"task_aggregation: {key!r} names a task given twice", field="task_aggregation")
        out[task_key] = entry
    return out
