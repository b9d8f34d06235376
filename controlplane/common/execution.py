"""Which devices can run which execution options (:class:`workers.protocol.messages.ExecutionOptions`),
checked where a request names both: a task's options against the devices that hold its data
(experiments, runs), a profiling sweep's options against its device.

An explicit GPU option — ``mode="graphs"`` (a CUDA graph per batch size) or ``precision="bf16"``
(autocast in bfloat16) — needs a backend whose trainers run on a CUDA GPU (its record declares
``gpu``: ``cuda-mps``, ``cuda-timeslice``) or the ``simulated`` backend, which models every mode.
``auto`` never fails: it resolves to graphs on a GPU backend and eager on ``cpu``.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.common.errors import ApplicationError
from workers.protocol.messages import ExecutionOptions
from workers.registry.backends import BACKEND_REGISTRY

GPU_OPTIONS: Mapping[str, str] = {"mode": "graphs", "precision": "bf16"}
"""Each :class:`ExecutionOptions` field's value that only a GPU backend can run."""

TASK_FIELDS: Mapping[str, str] = {"mode": "execution_mode", "precision": "precision"}
"""The request field each :class:`ExecutionOptions` field is given as on a task."""


def gpu_backends() -> list[str]:
    """The registered backends whose trainers run on a CUDA GPU (``gpu`` records), by name."""
    return [b.name for b in BACKEND_REGISTRY if b.gpu]


def runs_gpu_options(backend: str) -> bool:
    """Whether a device of ``backend`` runs (or, ``simulated``, models) the GPU execution options;
    an unregistered backend does not."""
    if backend not in BACKEND_REGISTRY:
        return False
    record = BACKEND_REGISTRY.get(backend)
    return record.gpu or record.simulated


def execution_check(
    options: ExecutionOptions,
    *,
    device: str,
    backend: str,
    fields: Mapping[str, str] = TASK_FIELDS,
    what: str = "",
    where: str = "",
    field: str | None = None,
) -> None:
    """Refuse ``options`` on a device of ``backend`` that cannot run them.

    Args:
        options: the execution options asked for.
        device: the device's name, for the message.
        backend: its backend name (``Device.backend``).
        fields: how the request names each option field (a task's ``execution_mode``, a sweep's
            ``execution.mode``): the message names the request's field.
        what: a prefix of the message, e.g. ``"task 'digits-resnet18': "``.
        where: said after the device's name, e.g. ``" (experiment 'light mix')"``.
        field: the field the API reports the error under; default the option's own
            (``fields[...]``).

    Raises:
        ApplicationError: (400) ``"execution_mode 'graphs' needs a GPU backend (cuda-mps,
            cuda-timeslice); device 'x' is cpu"`` for the first option (mode, then precision)
            the backend cannot run.
    """
    if runs_gpu_options(backend):
        return
    for name, gpu_value in GPU_OPTIONS.items():
        if getattr(options, name) == gpu_value:
            option_field = fields.get(name, name)
            raise ApplicationError(
                f"{what}{option_field} {gpu_value!r} needs a GPU backend ({', '.join(gpu_backends())}); "
                f"device {device!r}{where} is {backend}",
                field=field or option_field,
            )
