"""Plug-ins a run needs, checked before anything is dispatched (issue 21, item 5).

The wire carries names, never code: every device trains its tasks with the models and data sets
installed on its own host, and the control worker builds every task's model and reads its test
split to evaluate the global models. So a run is refused, with a 400 naming the device (or the
control plane) and the plug-in, when

- a device's agent, for a task it holds data of, does not declare a task's model or data set (``Device.plugins``, from
  :attr:`workers.protocol.messages.DeviceInventory.plugins`; an agent that declares nothing is
  taken to have mtfl-lab's built-ins only, :func:`controlplane.fleet.selectors.device_declares`);
- this control plane does not have it registered (the web app and the control worker run the
  same installation in every deployment mtfl-lab ships, so what this process can build stands
  for what the control worker can).

Partitioners run on the control plane only (an experiment's shards are chosen when it is
created), so devices are not asked for them.
"""

from __future__ import annotations

from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Experiment, Task
from controlplane.fleet.selectors import device_declaration_text, device_declares
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY

_KINDS = (("models", "model", "architecture", MODEL_REGISTRY), ("datasets", "dataset", "dataset", DATASET_REGISTRY))


def _needs(tasks: list[Task]) -> list[tuple[str, str, str, Task]]:
    """``(kind, noun, name, task)`` for every model and data set the tasks use, in task order."""
    return [(kind, noun, getattr(task, attr), task) for task in tasks for kind, noun, attr, _ in _KINDS]


def control_plane_plugins_check(tasks: list[Task]) -> None:
    """Refuse tasks this control plane cannot build (it evaluates every global model).

    Raises:
        ApplicationError: (400, field ``tasks``) ``"the control plane cannot build task 'x':
            model 'm' is not installed here (installed: …); install the plug-in …"``.
    """
    registries = {kind: registry for kind, _, _, registry in _KINDS}
    for kind, noun, name, task in _needs(tasks):
        registry = registries[kind]
        if name not in registry:
            failure = registry.failure(name)
            why = f" (its entry point failed to load: {failure.error})" if failure else ""
            raise ApplicationError(
                f"the control plane cannot build task {task.name!r}: {noun} {name!r} is not installed here{why} "
                f"(installed: {', '.join(registry.names())}); install the plug-in on the control plane's hosts "
                "(the web app and the control worker evaluate the global models)",
                field="tasks",
            )


def experiment_plugins_check(experiment: Experiment) -> None:
    """Refuse a run of ``experiment`` that needs a plug-in one of its devices, or the control
    plane, lacks; called by the run and comparison services before they save anything.

    Raises:
        ApplicationError: (400, field ``tasks``) the control plane lacks a task's model or data
            set (:func:`control_plane_plugins_check`); (400, field ``devices``) ``"device 'x'
            lacks model 'tabular_mlp' (its agent declares: …); install the plug-in on that
            host"``, for the first device (by name) lacking the first such plug-in.
    """
    tasks = list(experiment.tasks.order_by("id").only("id", "name", "architecture", "dataset"))
    control_plane_plugins_check(tasks)
    needs = _needs(tasks)
    holding = set(experiment.shards.filter(num_samples__gt=0).values_list("device_id", "task_id"))
    for device in experiment.devices.order_by("name").only("id", "name", "plugins"):
        for kind, noun, name, task in needs:
            if (device.id, task.id) in holding and not device_declares(device, kind, name):
                raise ApplicationError(
                    f"device {device.name!r} lacks {noun} {name!r} for task {task.name!r} (its agent declares: "
                    f"{device_declaration_text(device, kind)}); install the plug-in on that host and restart its "
                    "agent",
                    field="devices",
                )
