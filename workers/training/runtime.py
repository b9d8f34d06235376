"""What a trainer or profiler process needs of its device, shared by both
(:mod:`workers.training.trainer`, :mod:`workers.training.profiler`): which device it computes on
and how to open it, a synchronisation, peak memory (a GPU's reserved memory plus the CUDA
context; private resident memory on cpu), the optimiser of a task, the time-slicing lock and the
process's cores and threads. Kept apart from the trainer so the profiler does not import the
trainer, which runs profile jobs in its warm processes (no import circle). torch is imported
inside the functions: importing this module stays light.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import resource
from typing import TYPE_CHECKING

from workers.protocol.messages import OptimizerConfig
from workers.warm import rss_anon_bytes

if TYPE_CHECKING:
    import torch

ENV_DEVICE = "MTFL_TRAINER_DEVICE"
"""``cpu`` (default) or ``cuda``: where a trainer or profiler process computes."""
DEVICES = ("cpu", "cuda")


def trainer_device() -> str:
    """The device this process trains on, from ``MTFL_TRAINER_DEVICE``: ``"cpu"`` or ``"cuda"``.

    Raises:
        ValueError: for another value, naming the variable and the allowed ones.
    """
    value = os.environ.get(ENV_DEVICE, "").strip() or "cpu"
    if value not in DEVICES:
        raise ValueError(f"{ENV_DEVICE}={value!r}; allowed: {', '.join(DEVICES)}")
    return value


def open_device(name: str) -> torch.device:
    """Return the torch device to train on, preparing CUDA when ``name == "cuda"``.

    On CUDA: checks torch sees a GPU and turns cuDNN autotuning on (it then runs during the
    warm-up iterations, which throughput excludes). This is the first CUDA call of the
    process, so the MPS variables of its environment apply from here on.

    Raises:
        RuntimeError: ``cuda`` was asked for but torch sees no GPU (the message says which GPU
            was visible).
    """
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if name != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{ENV_DEVICE}=cuda but torch sees no GPU (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}, torch built for CUDA "
            f"{torch.version.cuda})"
        )
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.cuda.reset_peak_memory_stats(device)
    return device


def synchronize(device: torch.device) -> None:
    """Wait for every kernel queued on ``device`` (a no-op on CPU, where work is synchronous)."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_memory_bytes() -> int:
    """This process's private memory on the CPU, bytes: its anonymous resident memory
    (``RssAnon`` of ``/proc/self/status``), where ``/proc`` has it; else the peak resident set
    size (``ru_maxrss``, KiB on Linux).

    Not the resident set size: that also counts the pages of shared libraries the process has
    touched, about 500 MB of torch's once it has been imported, which every process on the host
    shares and which a process forked from one that imported torch
    (:mod:`workers.forkserver`) does not have mapped at all (measured: 900 MB resident in the
    fork server, 394 MB in its child right after ``fork``, the same 382 MB anonymous in
    both). The anonymous memory is the same however the process started. Under the ``cpu``
    backend's allocator settings (``MALLOC_MMAP_MAX_=0`` and a trim threshold of 1 TiB:
    freed memory stays in the heap) it never shrinks, so its value at the end of a run is its
    peak.
    """
    private = rss_anon_bytes("self")
    return private if private is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


CUDA_CONTEXT_FALLBACK_BYTES = 512 * 2**20
"""Device memory assumed for a process's CUDA context (and everything else it holds outside
torch's caching allocator: module images, cuBLAS/cuDNN handles), bytes, when NVML cannot
attribute memory to this process (:func:`cuda_context_bytes`). An estimate, not a measurement:
a context with lazily loaded modules (CUDA 12's default) takes a few hundred MiB."""


def _nvml_process_memory(gpu_uuid: str, pid: int) -> int | None:
    """Device memory NVML attributes to process ``pid`` on GPU ``gpu_uuid``, bytes, looking at
    both plain and MPS compute processes; ``None`` when NVML is missing or does not list it (a
    container's own PID namespace hides the host pids NVML reports)."""
    try:
        lib = importlib.import_module("pynvml")
        lib.nvmlInit()
    except Exception:  # noqa: BLE001 - no bindings or no driver: no answer
        return None
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(gpu_uuid)
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
            getter = getattr(lib, name, None)
            if getter is None:
                continue
            try:
                processes = getter(handle)
            except lib.NVMLError:
                continue
            for process in processes:
                used = getattr(process, "usedGpuMemory", None)
                if process.pid == pid and isinstance(used, int) and 0 < used < 2**62:
                    return used
        return None
    except Exception:  # noqa: BLE001 - best effort; the caller falls back
        return None
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def cuda_context_bytes(device: torch.device) -> int:
    """Device memory this process holds outside torch's caching allocator (the CUDA context
    and what lives beside it), bytes: NVML's per-process used memory for this pid less
    ``torch.cuda.memory_reserved``, or :data:`CUDA_CONTEXT_FALLBACK_BYTES` when NVML cannot
    attribute memory to this process or the GPU is not named by UUID in
    ``CUDA_VISIBLE_DEVICES`` (as the GPU backends name it)."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    used = _nvml_process_memory(visible, os.getpid()) if visible.startswith(("GPU-", "MIG-")) else None
    if used is None:
        return CUDA_CONTEXT_FALLBACK_BYTES
    return max(0, used - int(torch.cuda.memory_reserved(device)))


def peak_memory(device: torch.device) -> int:
    """Peak memory of this process, bytes.

    On a GPU, what a pinned device memory limit (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) must
    allow for it: the caching allocator's peak *reserved* memory
    (``torch.cuda.max_memory_reserved``, the segments it held, of which the peak allocated
    memory is only the part in use) plus the CUDA context (:func:`cuda_context_bytes`). On CPU
    the private (anonymous) resident memory (:func:`cpu_memory_bytes`)."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device)) + cuda_context_bytes(device)
    return cpu_memory_bytes()


def visible_sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors the process's CUDA context reports (``None`` on CPU)."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """Return SGD (momentum, weight decay) or Adam (weight decay; ``momentum`` unused)."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if config.name == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=config.learning_rate,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
        )
    if config.name == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    raise ValueError(f"optimizer.name must be 'sgd' or 'adam', got {config.name!r}")


class IterationLock:
    """An exclusive ``flock`` on the device's lock file, held for each training iteration.

    This is how the ``cpu`` backend time-slices (docs/DESIGN.md §2): co-located trainers take turns,
    each using all the device's cores while it holds the lock. A bare ``flock`` is not fair —
    the process that just released it re-acquires it before a sleeping waiter wakes, so one
    trainer would run all its iterations and the others would wait. A turnstile fixes that: to
    take the device lock a trainer first takes ``<path>.turnstile`` and lets go of it once it
    holds the device lock. A trainer coming back for its next iteration then queues behind the
    waiter already holding the turnstile, so turns alternate like GPU time slices.

    Re-enterable as a context manager any number of times (not nested). With ``path=None`` it
    does nothing. The kernel drops ``flock`` locks of a dead process, so a killed trainer never
    leaves the device locked.

    Args:
        path: the device's lock file (created if missing, as is ``<path>.turnstile``), or
            ``None``.
    """

    def __init__(self, path: str | None) -> None:
        self._fds: tuple[int, int] | None = None
        if path is not None:
            turnstile = os.open(f"{path}.turnstile", os.O_RDWR | os.O_CREAT, 0o644)
            device = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self._fds = (turnstile, device)

    def __enter__(self) -> IterationLock:
        if self._fds is not None:
            turnstile, device = self._fds
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(device, fcntl.LOCK_EX)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fds is not None:
            fcntl.flock(self._fds[1], fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock files."""
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None


def apply_resources(threads: int, cores: list[int] | None) -> None:
    """Pin this process to ``cores`` (if given) and size torch's thread pools.

    Inter-op parallelism is set to 1: the share of the device is expressed by intra-op threads
    only, so a trainer never uses more cores than it was given.

    Raises:
        OSError: if ``os.sched_setaffinity`` rejects the cores.
    """
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if cores is not None:
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        # Raises only if inter-op work already ran in this process; then it is already fixed.
        torch.set_num_interop_threads(1)
