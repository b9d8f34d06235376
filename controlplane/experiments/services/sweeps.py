"""Profiling sweeps as the task catalogue asks for them: a sweep may name tasks, whose models are
then profiled at each task's own classes and input shape.

The profiling app stores sweeps and samples and never reads a task (it sits below this app);
this module reads the tasks and hands their shapes to
:func:`controlplane.profiling.services.sweeps.sweep_start`, checking in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.common.errors import ApplicationError
from controlplane.common.registered import registered
from controlplane.experiments.models import Task
from controlplane.fleet.models import Device
from controlplane.profiling.models import ProfileSweep
from controlplane.profiling.services import sweeps as profiling_sweeps
from controlplane.profiling.services.sweeps import DEFAULT_ARCHITECTURES, REFERENCE_SHAPE
from workers.protocol.messages import ExecutionOptions
from workers.registry.models import MODEL_REGISTRY


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
    actor: Any = None,
) -> ProfileSweep:
    """Ask a device's agent to profile co-located mixes for ``budget_s`` seconds
    (:func:`controlplane.profiling.services.sweeps.sweep_start`), naming tasks as well as models.

    Args:
        tasks: task ids whose architectures are profiled at each task's own classes and input
            shape (``ProfileSweepRequest.workloads``), beside ``architectures``.
        others: as :func:`controlplane.profiling.services.sweeps.sweep_start` (``actor``: who
            starts it; ``None``, the operator, may give the whole budget range).

    Raises:
        ApplicationError: as :func:`controlplane.profiling.services.sweeps.sweep_start`; also
            unknown task ids, two tasks of one architecture at different shapes (a sweep
            profiles a model at one shape), or a model named alone whose tasks take another
            sample shape than the reference 3×32×32.
    """
    # The budget and the execution options are checked first, as before tasks were read here.
    profiling_sweeps.sweep_budget(budget_s, actor=actor)
    profiling_sweeps.sweep_execution(execution, device)
    workloads = _task_workloads(tasks) if tasks is not None else {}
    for name in list(architectures or ([] if workloads else DEFAULT_ARCHITECTURES)):
        registered(MODEL_REGISTRY, name, field="architectures")
        _refuse_reference_shape_of_a_shaped_model(name, workloads)
    return profiling_sweeps.sweep_start(
        device=device,
        budget_s=budget_s,
        architectures=architectures,
        batch_sizes=batch_sizes,
        max_mix=max_mix,
        seed=seed,
        workloads=workloads,
        execution=execution,
        actor=actor,
    )


def _refuse_reference_shape_of_a_shaped_model(architecture: str, workloads: Mapping[str, dict]) -> None:
    """Refuse to profile ``architecture`` at :data:`REFERENCE_SHAPE` when the tasks that use it
    take another sample shape: such a model (a plug-in on feature vectors, say) would fail every
    configuration on the agent, after holding the device for the whole budget.

    Raises:
        ApplicationError: (field ``architectures``) naming a task and its shape and the way out
            (``tasks=[ids]``, ``mtfl profile --tasks``).
    """
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
