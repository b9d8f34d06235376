"""A task's execution options (:class:`workers.protocol.messages.ExecutionOptions`): read from its
row, and checked against the devices that train it.

The options are the task's, not a strategy's: every strategy of a comparison runs the task so,
and speedups compare like with like. A task is trained only where a device holds some of its
data, so only those devices are checked (:func:`controlplane.common.execution.execution_check`:
an explicit ``graphs`` or ``bf16`` on a ``cpu`` device is refused with a 400) — when an
experiment is created, when a task of experiments is changed, and when a run is created (a
device's backend may have changed since its experiment was).
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.common.execution import execution_check
from controlplane.experiments.models import Experiment, Task
from controlplane.fleet.models import Device
from workers.protocol.messages import ExecutionOptions

EXECUTION_FIELDS = ("execution_mode", "precision", "channels_last")
"""The :class:`Task` fields its :class:`ExecutionOptions` are read from."""


def task_execution(task: Task) -> ExecutionOptions:
    """The execution options ``task``'s trainers run with (its ``execution_mode``,
    ``precision`` and ``channels_last``)."""
    return ExecutionOptions(mode=task.execution_mode, precision=task.precision, channels_last=task.channels_last)


def execution_holders_check(pairs: Iterable[tuple[Device, Task]], *, where: str = "") -> None:
    """Refuse a task whose execution options a device holding its data cannot run.

    Args:
        pairs: ``(device, task)`` of every device holding samples of the task (``name``,
            ``backend`` of the device and the task's :data:`EXECUTION_FIELDS` and ``name`` are read).
        where: appended to the device's name in the message, e.g. ``" (experiment 'x')"``.

    Raises:
        ApplicationError: (400, field ``devices``) ``"task 'x': execution_mode 'graphs' needs a GPU
            backend (cuda-mps, cuda-timeslice); device 'y' is cpu"`` for the first such pair.
    """
    for device, task in pairs:
        execution_check(
            task_execution(task),
            device=device.name,
            backend=device.backend,
            what=f"task {task.name!r}: ",
            where=where,
            field="devices",
        )


def experiment_execution_check(experiment: Experiment) -> None:
    """Refuse a run of ``experiment`` when a device holding a task's data can no longer run that
    task's execution options (its backend changed since the experiment was created); called by the
    run and comparison services before they save anything.

    Raises:
        ApplicationError: as :func:`execution_holders_check`.
    """
    tasks = {t.id: t for t in experiment.tasks.only("id", "name", *EXECUTION_FIELDS)}
    if all(task_execution(t) == ExecutionOptions() for t in tasks.values()):
        return  # auto, fp32: every backend runs it
    devices = {d.id: d for d in experiment.devices.only("id", "name", "backend")}
    holding = experiment.shards.filter(num_samples__gt=0).order_by("device__name", "task_id")
    execution_holders_check(
        (devices[device_id], tasks[task_id]) for device_id, task_id in holding.values_list("device_id", "task_id")
    )
