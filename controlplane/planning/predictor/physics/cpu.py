"""The ``cpu`` backend's physics (``packed`` placement): each task pinned to a window of cores.

The cpu backend (workers.backends.cpu.cpu_allocation) gives task ``k`` of a mix
``n_k = max(1, floor(R_k·C/100 + 1/2))`` of the ``C`` cores, a window starting where the
previous task's window ended, modulo ``C``, and runs one intra-op thread per core. Linux shares
a core between the threads pinned to it; a multi-threaded trainer whose window overlaps another
trainer's is started with ``OMP_WAIT_POLICY=PASSIVE``, so its threads sleep at every barrier
instead of spinning. Every measurement of a task on 2 or more cores also carries the round trip
of a cache line between its cores (``cross_core_rtt_ns``, :mod:`workers.profiling.core_link_probe`): a
host that moves a virtual machine's cores apart slows its multi-threaded tasks (by 37 % for
``mobilenet_v3_small`` at batch 32 on two cores) and leaves single-threaded ones alone.
"""

from __future__ import annotations

import numpy as np

from controlplane.planning.predictor.physics.base import Placement, SlotTerms
from controlplane.planning.predictor.samples import (
    BoolArray,
    FloatArray,
    IntArray,
    StrArray,
)

Windows = tuple[IntArray, BoolArray]
""":func:`packed_windows`: cores per task ``(rows, slots)`` and coverage ``(rows, slots, C)``."""


def packed_windows(share: FloatArray, present: BoolArray, units: int) -> Windows:
    """Which units each task runs on under ``packed`` placement (workers.backends.cpu.cpu_allocation):
    task ``k`` gets ``n_k = max(1, floor(R_k·C/100 + 1/2))`` units, a window starting where the
    previous task's ended, modulo ``C``. Returns ``n`` ``(rows, slots)`` (0 for empty slots) and
    the coverage ``(rows, slots, C)`` (bool)."""
    share = np.asarray(share, dtype=float)
    n_units: IntArray = np.where(present, np.maximum(1, np.floor(share * units / 100.0 + 0.5)).astype(np.int64), 0)
    starts = (np.cumsum(n_units, axis=1) - n_units) % units
    core = np.arange(units)
    covered: BoolArray = ((core[None, None, :] - starts[:, :, None]) % units) < n_units[:, :, None]
    return n_units, covered & present[:, :, None]


def alone_on_units(covered: BoolArray) -> BoolArray:
    """``(rows, slots)`` bool: whether each task's units carry no other task, from the coverage
    ``(rows, slots, C)`` of :func:`packed_windows` (an empty slot counts as alone)."""
    on_unit = covered.sum(axis=1)  # (rows, C) tasks on each unit
    alone: BoolArray = ~(covered & (on_unit[:, None, :] > 1)).any(axis=2)
    return alone


def sharing_rate(
    share: FloatArray, present: BoolArray, units: int, weight: float = 1.0, escape_weight: float | None = None
) -> FloatArray:
    """The fraction of its own slice a task gets when co-located, ``(rows, slots)``, in ``(0, 1]``.

    Weighted time sharing of each core between the threads pinned to it (Linux CFS shares a
    core equally between its *runnable* threads). A task with one thread is always runnable
    (weight 1); a task with several intra-op threads is not: its threads are
    barrier-synchronised and, with ``OMP_WAIT_POLICY=PASSIVE`` on shared cores, sleep at every
    barrier until the sibling on a busier core catches up, so each is runnable only a fraction
    ``w`` of the time (``weight``, fitted on the profiled mixes). On core ``c`` task ``i`` gets
    ``w_i / Σ_{j on c} w_j``; its rate is the mean over its ``n_i`` cores,
    ``ρ_i = (1/n_i) Σ_{c ∈ i} w_i / Σ_{j on c} w_j``, capped at 1. With ``w = 1`` this is the
    mean over the task's cores of ``1 / (tasks on the core)``. The mean fits the 2-core
    profiles better than the most-contended core (the barrier's ``min``): held-out RMS log
    error of the baseline's multi-task slowdowns 0.25 (mean) against 0.30 (min).

    A multi-threaded task is pinned to its whole window, not each thread to a core, so when
    one of its cores carries no other task (``escape_weight`` given) the scheduler keeps its
    threads mostly there, off the cores it shares: it weighs ``escape_weight`` instead of
    ``w`` on every core. Measured on 2 cores, resnet18 (batch 64, both cores) beside
    shufflenet_v2_x1_0 (batch 16, pinned to one of them): shufflenet kept 84 % of its speed
    alone on its core and resnet18 ran at 53 % of its 2-core speed (its 1-core speed), where
    the weight fitted on the other mixes, ``w ≈ 0.5``, predicts 67 % for both.
    """
    present = np.asarray(present, dtype=bool)
    n_units, covered = packed_windows(share, present, units)
    w = np.where(n_units > 1, weight, 1.0)
    if escape_weight is not None:
        on_core = covered.sum(axis=1)  # (rows, C) tasks on each core
        has_own_core = (covered & (on_core[:, None, :] == 1)).any(axis=2)
        w = np.where((n_units > 1) & has_own_core, escape_weight, w)
    w = w * present
    total = (covered * w[:, :, None]).sum(axis=1)  # (rows, C) runnable weight on each core
    per_core = np.where(covered, w[:, :, None] / np.maximum(total[:, None, :], 1e-12), 0.0)
    rate = per_core.sum(axis=2) / np.maximum(n_units, 1)
    out: FloatArray = np.where(present, np.clip(rate, 1e-6, 1.0), 1.0)
    return out


def passive_wait(share: FloatArray, present: BoolArray, units: int, windows: Windows | None = None) -> BoolArray:
    """``(rows, slots)`` bool: the tasks that run several intra-op threads on cores another task
    also uses — those the cpu backend starts with ``OMP_WAIT_POLICY=PASSIVE``
    (workers.backends.cpu: a trainer whose window overlaps another's), whose threads sleep at
    every barrier instead of spinning (``δ`` of
    :func:`controlplane.planning.predictor.solo.slice_throughput`). ``windows``:
    :func:`packed_windows` of the same arguments, when the caller has it already."""
    n_units, covered = windows if windows is not None else packed_windows(share, present, units)
    passive: BoolArray = present & (n_units > 1) & ~alone_on_units(covered)
    return passive


def contention(
    share: FloatArray, present: BoolArray, units: int, windows: Windows | None = None
) -> tuple[FloatArray, FloatArray]:
    """How many tasks compete for each task's cores: the mean over its cores and the most on
    any one of them (its slowest thread sets the pace of each parallel operator), each
    ``(rows, slots)``, at least 1. On each core count how many tasks' windows cover it — the OS
    shares a core between the threads pinned to it. ``windows``: :func:`packed_windows` of the
    same arguments, when the caller has it already."""
    n_units, covered = windows if windows is not None else packed_windows(share, present, units)
    per_core = covered.sum(axis=1)  # (n, C) tasks on each core
    on_mine = covered * per_core[:, None, :]
    mean = on_mine.sum(axis=2) / np.maximum(n_units, 1)
    worst = on_mine.max(axis=2)
    return np.where(present, np.maximum(1.0, mean), 1.0), np.where(present, np.maximum(1.0, worst), 1.0)


class CpuPhysics:
    """:class:`~controlplane.planning.predictor.physics.base.Physics` of the ``cpu`` backend
    (see the module docstring)."""

    @property
    def placement(self) -> Placement:
        return "packed"

    @property
    def weighted_sharing(self) -> bool:
        return True

    def sharing_rate(
        self, share: FloatArray, present: BoolArray, units: int, weight: float = 1.0, escape_weight: float | None = None
    ) -> FloatArray:
        """:func:`sharing_rate`."""
        return sharing_rate(share, present, units, weight, escape_weight)

    def alone(self, share: FloatArray, present: BoolArray, units: int) -> BoolArray:
        """:func:`alone_on_units` of the tasks' windows."""
        return alone_on_units(packed_windows(share, present, units)[1])

    def slot_terms(self, share: FloatArray, present: BoolArray, units: int) -> SlotTerms:
        """:func:`contention` and :func:`passive_wait`, the windows computed once (the
        planners' prediction path asks this for 100,000 configurations a call)."""
        windows = packed_windows(share, present, units)
        mean, worst = contention(share, present, units, windows)
        return SlotTerms(mean, worst, passive_wait(share, present, units, windows))

    def link_reference(self, rtt: FloatArray) -> float | None:
        """The near placement, the 10th percentile of the measured round trips: a task beside
        others runs as if its cores were near, whatever the probe read (its threads already
        wait for the cores themselves), so predictions are for that placement."""
        return float(np.percentile(rtt, 10)) if rtt.size else None

    def link_log_ratio(
        self, share: FloatArray, present: BoolArray, units: int, rtt: FloatArray | None, reference: float | None
    ) -> FloatArray:
        """``x = log(rtt / rtt_ref)`` per slot: how much further apart than the reference the
        task's cores were when it was measured, for a task on several cores that no other task
        uses; 0 otherwise, and for an unknown ``rtt`` (every configuration to predict) or no
        reference. The model multiplies a task's speed by ``exp(−γ·x) = (rtt / rtt_ref)^(−γ)``:
        a multi-threaded task waits on its cores' cache lines at every parallel operator
        (:mod:`workers.profiling.core_link_probe`). Only alone on its cores: beside other tasks its
        threads already wait for the cores themselves, and the link no longer shows — in a
        2-core sweep the physical baseline's residuals of 2-core tasks alone were
        +0.04…+0.22 (log, per model) at the near placement and −0.08…−0.33 at the far one,
        those of 2-core tasks sharing their cores −0.01…+0.10 at the far one. That is also why
        the reference is the near placement.

        One ``γ`` for all models, not one each: grouped cross-validation holds a model's
        1-task mixes out together, and on a 2-core device only those put a multi-core task
        alone on its cores, so a per-model ``γ`` is never fitted where it is tested. On that
        sweep (65 configurations), the baseline's held-out RMSLE: 0.152 without the term,
        0.159 with one ``γ`` per model, 0.138 with one for all (0.193 → 0.147 on 1-task mixes).
        """
        if rtt is None or reference is None:
            return np.zeros(share.shape)
        n_units, covered = packed_windows(share, present, units)
        known = (n_units > 1) & alone_on_units(covered) & present & np.isfinite(rtt) & (np.nan_to_num(rtt) > 0)
        x: FloatArray = np.where(known, np.log(np.where(known, rtt, reference) / reference), 0.0)
        return x

    def slice_labels(self, share: FloatArray, present: BoolArray, units: int) -> StrArray:
        """``"<k> unit(s), alone|shared"``: the ``k = max(1, round(R·C/100))`` cores the task's
        share is granted (one intra-op thread each), ``shared`` when another task's window
        covers one of them. On the cpu backend a task whose 2 threads share cores with other
        processes repeats far worse than a 1-thread task alone on its core."""
        windows = packed_windows(share, present, units)
        _contention, worst = contention(share, present, units, windows)
        kind = np.where(worst > 1.0, "shared", "alone")
        n_units = windows[0]
        plural = np.where(n_units > 1, "units", "unit")
        kind = np.char.add(np.char.add(np.char.add(n_units.astype(str), " "), plural), np.char.add(", ", kind))
        labels: StrArray = np.where(present, kind, "")
        return labels
