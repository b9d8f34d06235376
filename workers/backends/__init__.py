"""Execution backends: how a device runs the trainers of a round (docs/DESIGN.md §2).

:class:`~workers.backends.base.ExecutionBackend` is the interface, :func:`get_backend` the
factory. Backends: ``cpu`` (:mod:`workers.backends.cpu`, trainer processes on CPU cores),
``simulated`` (:mod:`workers.backends.simulated`, an analytic contention model), and
``cuda-mps`` / ``cuda-timeslice`` (:mod:`workers.backends.cuda`, trainer processes on one NVIDIA
GPU, with or without MPS; the strategy → partitioning → backend mapping is in
:data:`workers.messages.BackendName`). Importing this package imports neither torch nor pynvml.
"""

from __future__ import annotations

from workers.backends.base import (
    AgentContext,
    AnalyticBackend,
    BackendUnavailableError,
    ExecutionBackend,
    TrainerProcessBackend,
    TrainerResources,
)
from workers.backends.cpu import CpuBackend, cpu_allocation
from workers.backends.cuda import CudaBackend, CudaMpsBackend, CudaTimesliceBackend
from workers.backends.simulated import SimulatedBackend
from workers.launch import (
    cancel_requested,
    clear_cancel,
    request_cancel,
    request_shutdown,
    shutdown_requested,
    terminate_children,
)
from workers.messages import BACKENDS

_BACKENDS: dict[str, type[ExecutionBackend]] = {
    CpuBackend.name: CpuBackend,
    SimulatedBackend.name: SimulatedBackend,
    CudaMpsBackend.name: CudaMpsBackend,
    CudaTimesliceBackend.name: CudaTimesliceBackend,
}

__all__ = [
    "AgentContext",
    "AnalyticBackend",
    "BackendUnavailableError",
    "CpuBackend",
    "CudaBackend",
    "CudaMpsBackend",
    "CudaTimesliceBackend",
    "ExecutionBackend",
    "SimulatedBackend",
    "TrainerProcessBackend",
    "TrainerResources",
    "cancel_requested",
    "clear_cancel",
    "cpu_allocation",
    "get_backend",
    "request_cancel",
    "request_shutdown",
    "shutdown_requested",
    "terminate_children",
]


def get_backend(name: str) -> ExecutionBackend:
    """Return a new backend by name.

    Args:
        name: one of :data:`workers.messages.BACKENDS` (``"cpu"``, ``"simulated"``,
            ``"cuda-mps"``, ``"cuda-timeslice"``).

    Raises:
        ValueError: for an unknown name, listing the allowed ones, or a backend whose
            configuration is invalid (``simulated``: ``MTFL_SIM_DEVICE`` or
            ``MTFL_SIM_TIME_SCALE``; GPU backends: ``MTFL_AGENT_GPU``; naming the variable).
    """
    if name not in _BACKENDS:
        allowed = ", ".join(sorted(set(BACKENDS) & set(_BACKENDS)))
        raise ValueError(f"backend {name!r} is unknown; allowed: {allowed}")
    return _BACKENDS[name]()
