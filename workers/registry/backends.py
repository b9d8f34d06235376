"""The execution backend registry: how a device runs the trainers of a round, by the name stored
on the device (docs/DESIGN.md §2).

A :class:`Backend` record creates the :class:`~workers.backends.base.ExecutionBackend` an agent
uses and says which partitionings it can realise; the control plane refuses a run whose plan
needs one a device's backend lacks, before anything is dispatched. Plug-ins register in the
``mtfl.backends`` entry-point group.

Strategy → partitioning → backend: a strategy's record gives its partitioning (``temporal`` →
``timeslice``; every other built-in → ``mps``), and the device's backend realises it:

============== ============================================ =====================================
backend        ``timeslice`` (``temporal``)                 ``mps`` (every other strategy)
============== ============================================ =====================================
cuda-mps       plain CUDA contexts, no MPS (driver time     one MPS client per trainer,
               slicing)                                     ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
cuda-timeslice plain CUDA contexts, no MPS                  refused: no way to grant a share
cpu            per-iteration device lock, all cores each    a core window per share
simulated      the model's time-slicing mode                the model's contention mode
============== ============================================ =====================================

Importing this module imports no backend: each built-in record's ``create`` loads its class by
reference when called (see :func:`_builtin`), as an entry point loads a plug-in's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import Any

from workers.registry.base import Registry

PARTITIONINGS: tuple[str, ...] = ("timeslice", "mps")
"""How co-located trainers can share a device (:data:`workers.protocol.messages.Partitioning`)."""


@dataclass(frozen=True)
class Backend:
    """A registered execution backend.

    Attributes:
        name: stored on a device and carried in messages (``"cpu"``).
        label: one line for forms and docs.
        create: ``() -> ExecutionBackend`` (:class:`workers.backends.base.ExecutionBackend`),
            a new instance; raises ``ValueError`` naming the environment variable when its
            configuration is invalid.
        partitionings: the :data:`PARTITIONINGS` it can realise (the table above).
        simulated: it trains nothing and answers from a model; what it reports carries
            ``simulated=True``.
        gpu: its trainers run on a CUDA GPU, so a task may ask for the GPU execution options
            (``execution_mode="graphs"``, ``precision="bf16"``:
            :class:`workers.protocol.messages.ExecutionOptions`); the control plane refuses an
            explicit request of them on a backend that is neither ``gpu`` nor ``simulated``.

    Raises:
        ValueError: (on construction) an empty ``partitionings`` or one not in
            :data:`PARTITIONINGS`.
    """

    name: str
    label: str
    create: Callable[[], Any]
    partitionings: tuple[str, ...] = PARTITIONINGS
    simulated: bool = False
    gpu: bool = False

    def __post_init__(self) -> None:
        unknown = [p for p in self.partitionings if p not in PARTITIONINGS]
        if not self.partitionings or unknown:
            raise ValueError(
                f"backend {self.name!r}: partitionings must be a non-empty subset of {', '.join(PARTITIONINGS)}, "
                f"got {self.partitionings!r}"
            )


BACKEND_REGISTRY: Registry[Backend] = Registry("backend", "mtfl.backends", Backend)
"""Every execution backend a device may use; plug-ins register in the ``mtfl.backends`` group."""


def _builtin(reference: str) -> Callable[[], Any]:
    """A ``create`` that loads ``"module:Class"`` the way an entry point loads a plug-in, when
    first called.

    The built-in backends are named by reference rather than imported: their modules use
    :mod:`workers.protocol.messages`, whose name checks read this registry, so an import here (even
    inside a function) would close the loop messages → registry → backend → messages.
    """

    def create() -> Any:
        return EntryPoint(name=reference, value=reference, group=BACKEND_REGISTRY.group).load()()

    return create


for _backend in (
    Backend("cpu", "cpu — trains on the host's cores", _builtin("workers.backends.cpu:CpuBackend")),
    Backend(
        "simulated",
        "simulated — an analytic GPU model; trains nothing",
        _builtin("workers.backends.simulated:SimulatedBackend"),
        simulated=True,
    ),
    Backend(
        "cuda-mps",
        "cuda-mps — one NVIDIA GPU shared with MPS",
        _builtin("workers.backends.cuda:CudaMpsBackend"),
        gpu=True,
    ),
    Backend(
        "cuda-timeslice",
        "cuda-timeslice — one NVIDIA GPU without MPS (temporal only)",
        _builtin("workers.backends.cuda:CudaTimesliceBackend"),
        partitionings=("timeslice",),
        gpu=True,
    ),
):
    BACKEND_REGISTRY.register(_backend)


def get_backend(name: str) -> Any:
    """A new :class:`~workers.backends.base.ExecutionBackend` of the registered backend ``name``.

    Raises:
        workers.registry.UnknownEntryError: (a ``ValueError``) an unknown name, naming the
            ``backend`` field and listing the allowed ones.
        ValueError: the backend's configuration is invalid (``simulated``: ``MTFL_SIM_DEVICE``
            or ``MTFL_SIM_TIME_SCALE``; GPU backends: ``MTFL_AGENT_GPU``; naming the variable).
    """
    return BACKEND_REGISTRY.get(name, field="backend").create()
