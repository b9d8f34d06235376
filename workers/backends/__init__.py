"""Execution backends: how a device runs the trainers of a round (docs/DESIGN.md §2).

:class:`~workers.backends.base.ExecutionBackend` is the interface; the backends are records of
:data:`workers.registry.backends.BACKEND_REGISTRY`, and :func:`workers.registry.backends.get_backend`
creates one by name (the registry imports this package, never the reverse). Built-ins: ``cpu``
(:mod:`workers.backends.cpu`, trainer processes on CPU cores),
``simulated`` (:mod:`workers.backends.simulated`, an analytic contention model), and
``cuda-mps`` / ``cuda-timeslice`` (:mod:`workers.backends.cuda`, trainer processes on one NVIDIA
GPU, with or without MPS; the strategy → partitioning → backend mapping is in
:mod:`workers.registry.backends`). Importing this package imports neither torch nor pynvml.
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
    "request_cancel",
    "request_shutdown",
    "shutdown_requested",
    "terminate_children",
]
