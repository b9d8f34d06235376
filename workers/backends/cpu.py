"""The ``cpu`` backend: the whole pipeline on a machine without a GPU (docs/DESIGN.md §2).

The share ``R`` (``active_thread_percentage``) becomes a core set and a thread count:

- ``mps``: each trainer gets ``n = max(1, round_half_up(R · C / 100))`` of the device's ``C``
  cores and ``n`` threads (:func:`cpu_allocation`); shares over 100 % in total overlap, which
  is the CPU analogue of MPS clients competing for the same SMs.
- ``timeslice``: every trainer gets all ``C`` cores and ``C`` threads, and the trainers take
  turns holding ``state_dir/device.lock`` for each iteration — the faithful analogue of GPU time
  slicing, where kernels of different contexts never run at the same time. (Plain concurrent
  processes would be ``sharing``, not ``temporal``.)
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

from workers.backends.base import (
    AgentContext,
    BackendUnavailableError,
    TrainerProcessBackend,
    TrainerResources,
)
from workers.protocol.messages import Partitioning


def cpu_allocation(shares: Sequence[int], cores: Sequence[int]) -> list[list[int]]:
    """Map each task's share of the device to a window of cores.

    Task ``k`` with share ``R_k`` (percent) gets ``n_k = max(1, floor(R_k · C / 100 + 1/2))``
    cores of the device's ``C``. Windows are packed consecutively in task order, wrapping around
    modulo ``C``: shares summing to at most 100 % get disjoint cores whenever rounding allows
    (``isolation``), a share of 100 % gets every core, and shares over 100 % in total overlap
    (``sharing``: every task on all cores).

    Args:
        shares: ``active_thread_percentage`` per task, integers in ``[1, 100]``.
        cores: the device's CPU ids, non-empty and without duplicates.

    Returns:
        One list of core ids per task (length ``n_k``, no duplicates within a list).

    Raises:
        ValueError: for an empty or duplicated ``cores``, or a share outside ``[1, 100]``
            (naming ``shares[k]``).

    Example:
        >>> cpu_allocation([50, 50], [0, 1, 2, 3])
        [[0, 1], [2, 3]]
        >>> cpu_allocation([100, 100], [0, 1])
        [[0, 1], [0, 1]]
    """
    if len(cores) == 0:
        raise ValueError("cores must list at least one CPU id")
    if len(set(cores)) != len(cores):
        raise ValueError(f"cores must not repeat CPU ids, got {list(cores)}")
    count = len(cores)
    windows = []
    start = 0
    for k, share in enumerate(shares):
        if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= 100:
            raise ValueError(f"shares[{k}] must be an integer in [1, 100] (percent), got {share!r}")
        # Half-up in integer arithmetic: round() sends halves to the even neighbour
        # (round(2.5) == 2, round(3.5) == 4), so rounding would depend on parity.
        size = max(1, (2 * share * count + 100) // 200)
        windows.append([cores[(start + i) % count] for i in range(size)])
        start = (start + size) % count
    return windows


# Idle OpenMP workers of a trainer that shares its cores — waiting for its time slice, or
# co-located on overlapping cores — must sleep, not spin: spinning starves whoever holds the
# cores (measured on 2 cores: timeslice throughput fell from ~60 to ~2.5 samples/s). A trainer
# alone on its cores (standalone, or a disjoint isolation window) keeps OpenMP's default, which
# spins briefly and is much faster for small operators (mobilenet_v3_small, batch 32, 2 threads:
# 428 samples/s by default, 231 with PASSIVE).
_SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}

# glibc serves torch's large activation buffers with mmap and hands them back on free, so every
# training iteration page-faults its activations in again (measured: ~1,500-4,200 minor faults
# per iteration, kernel time that co-located trainers then fight over). Keeping freed memory in
# the heap removes the faults after the first iteration: mobilenet_v3_small, batch 128, 2 threads
# went from 349 to 453 samples/s, resnet18 batch 128 on 1 core from 88 to 95. Every trainer and
# profiler process of the backend gets it, so profiles and rounds measure the same allocator.
_ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def _env(shared_cores: bool) -> dict[str, str]:
    return {**_ALLOCATOR_ENV, **(_SHARED_CORES_ENV if shared_cores else {})}


class CpuBackend(TrainerProcessBackend):
    """Trainer processes on CPU cores; see the module docstring for the share mapping."""

    name = "cpu"
    probes_host_speed = True
    forks_profilers = True

    def check_available(self) -> None:
        """Check for CPU affinity, ``flock`` and an installed torch (without importing torch).

        Raises:
            BackendUnavailableError: naming what is missing.
        """
        if not hasattr(os, "sched_setaffinity"):
            raise BackendUnavailableError("cpu backend needs os.sched_setaffinity (Linux) to pin trainers to cores")
        if importlib.util.find_spec("fcntl") is None:
            raise BackendUnavailableError("cpu backend needs fcntl.flock (POSIX) for time-slicing trainers")
        if importlib.util.find_spec("torch") is None:
            raise BackendUnavailableError("cpu backend needs torch: pip install torch torchvision")

    def resources_for_shares(
        self, shares: Sequence[int], partitioning: Partitioning, ctx: AgentContext
    ) -> list[TrainerResources]:
        """Return each process's cores and threads (and the lock for ``timeslice``).

        ``mps``: :func:`cpu_allocation`'s core window per share, one thread per core.
        ``timeslice``: every process gets all cores and ``state_dir/device.lock``.
        Trainers whose cores another trainer also uses get ``OMP_WAIT_POLICY=PASSIVE``; every
        trainer gets glibc settings that keep freed activation memory for the next iteration.

        Raises:
            ValueError: if the partitioning is unknown, ``ctx.cores`` is empty or a share is
                outside ``[1, 100]`` (naming ``shares[k]``).
        """
        if not ctx.cores:
            raise ValueError(f"device {ctx.device!r} has no cores")
        if partitioning == "timeslice":
            lock = ctx.state_dir / "device.lock"
            env = _env(shared_cores=len(shares) > 1)
            return [
                TrainerResources(threads=len(ctx.cores), cores=list(ctx.cores), lock_path=lock, env=env) for _ in shares
            ]
        if partitioning == "mps":
            windows = cpu_allocation(list(shares), ctx.cores)
            return [
                TrainerResources(threads=len(window), cores=window, env=_env(shared_cores=_overlaps(k, windows)))
                for k, window in enumerate(windows)
            ]
        raise ValueError(f"partitioning {partitioning!r} is unknown; allowed: 'timeslice', 'mps'")

    def standalone_resources(self, ctx: AgentContext) -> TrainerResources:
        """Return the whole device: all its cores, one thread per core (no OpenMP or allocator
        change but the allocator settings every trainer of the backend gets)."""
        return TrainerResources(threads=len(ctx.cores), cores=list(ctx.cores), env=_env(shared_cores=False))


def _overlaps(k: int, windows: Sequence[Sequence[int]]) -> bool:
    """Whether window ``k`` shares a core with any other window."""
    mine = set(windows[k])
    return any(mine & set(w) for j, w in enumerate(windows) if j != k)
