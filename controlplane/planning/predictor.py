"""The throughput predictor: every co-located task's throughput from the whole mix at once.

Yu et al. 2022 (Eq. 2; docs/DESIGN.md §1) learn ``(P_1, …, P_I) = Pre((F_1·B_1, R_1), …,
(F_I·B_I, R_I))`` from profiled runs: ``F_i`` the per-sample workload of task ``i``'s model,
``B_i`` its batch size, ``R_i`` its share of the device (``active_thread_percentage``), ``P_i``
its throughput in samples/s. This module is that regression, pure NumPy and scikit-learn:

* **Encoding.** A configuration (a mix of 1 to :data:`MAX_MIX` tasks) becomes one row: the
  tasks are put in a canonical order (descending ``F·B``, then share, then model name), so the
  model cannot depend on the order tasks are listed in, and padded to ``MAX_MIX`` slots. Each
  slot holds the paper's ``(log F·B, R)`` plus the bytes the task moves per iteration, its
  parameter count and its standalone speed ``P_alone(model, B)`` on this device class; a few
  mix-level totals and the device descriptor (its core count) follow. Targets are
  ``log P − log P_baseline`` per slot (0 for empty slots): the learned models correct the
  physical baseline below, and every task is predicted at once.
* **Families**, compared under the same grouped cross-validation in which whole mixes (the
  multiset of models) are held out: a physically-motivated baseline ``P_i = P_solo(model_i,
  B_i, g_i) · ρ_i`` (:class:`SoloTable`: the per-iteration time law ``t_0 + t_1·B`` with
  the overhead ``t_0`` scaled by ``g^(−β)`` and the per-sample time by ``g^(−α)`` for the
  granted fraction ``g``; :func:`sharing_rate` ``ρ_i``: what co-located tasks leave it — weighted time
  sharing of the cores under ``packed`` placement, proportional oversubscription when
  ``pooled``; a multi-threaded task on cores other tasks share, whose threads sleep at its
  barriers, pays ``κ·t_0`` more per iteration, :func:`passive_wait`), a random forest (as in
  Horus, Yeung et al. 2021), gradient-boosted trees, and extremely randomised trees. The one
  with the lowest held-out RMSLE is refitted on all samples and kept. The physical tables
  (SoloTable, sharing weight) are refitted inside every fold from its training mixes only,
  so no held-out measurement (a held-out standalone speed included) reaches its baseline.
* **Host speed.** On the ``cpu`` backend a sweep reads how fast the device's cores ran while
  each task was timed (``speed_index``, :mod:`workers.speed_probe`); :func:`normalise_speed`
  puts every such sample at the median speed before anything is fitted, so a virtual machine's
  speed changes (tens of percent, in regimes of seconds) are not taken for contention. The
  predictor then predicts throughput at that reference speed.
* **Core placement.** A sweep also reads the round trip of a cache line between each
  multi-core task's cores (``cross_core_rtt_ns``, :mod:`workers.core_link_probe`): a host
  that moves a virtual machine's cores apart slows its multi-threaded tasks (by 37 % for
  ``mobilenet_v3_small`` at batch 32 on two cores) and leaves single-threaded ones alone. The
  physical model slows a task alone on several cores by ``(rtt / rtt_ref)^(−γ)``
  (:meth:`FeatureSpace.link_log_ratio`, ``γ`` fitted by :func:`fit_physical`), ``rtt_ref`` the
  near placement (10th percentile of the training samples' round trips), and predicts there.
* **Memory.** Peak memory per task from ``(model, B)``: a least-squares line per model over the
  profiled peaks, or, for a model never profiled, a physical estimate from its parameter bytes
  and activation bytes per sample.

Prediction is vectorised: :meth:`ThroughputPredictor.predict_arrays` takes ``(n, MAX_MIX)``
arrays and answers for all ``n`` configurations in one call.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from threadpoolctl import threadpool_limits

Placement = Literal["pooled", "packed"]

MAX_MIX = 4
"""Largest number of co-located tasks the predictor encodes (MPS allows up to 48; beyond a few
the paper's mixes, and our sweeps, do not go)."""

FAMILIES = ("baseline", "random_forest", "gradient_boosting", "extra_trees")

_SLOT_FEATURES = ("present", "log_flops_per_iter", "log_bytes_per_iter", "log_params", "share", "granted",
                  "contention", "worst_contention", "log_solo", "log_baseline")
_PARALLEL_PREDICT_ROWS = 20_000
_MIX_FEATURES = ("mix_size", "share_sum", "granted_sum", "log_flops_sum", "log_bytes_sum", "cores")


@dataclass(frozen=True)
class MixTask:
    """One task of a configuration: its model, batch size ``B`` and share ``R`` (percent)."""

    architecture: str
    batch_size: int
    share: int


@dataclass(frozen=True)
class ModelWorkload:
    """Per-sample workload of a model (``F_i``): training FLOPs, activation bytes and
    parameters (see :class:`workers.messages.WorkloadFeatures`)."""

    train_flops_per_sample: float
    activation_bytes_per_sample: float
    params: int
    param_bytes: int


@dataclass(frozen=True)
class ProfiledTask:
    """A measured task of a measured configuration (one profile sample).

    Attributes:
        config_key: identifies the configuration this task ran in (all its tasks share it).
        mix: every task of that configuration, in the order they were listed.
        task_index: which of ``mix`` this sample measures.
        throughput_sps: measured samples/s.
        standalone_sps: ``P_alone`` of the same model and batch size, if measured.
        peak_memory_bytes: the task's peak memory, if measured.
        speed_index: how fast the device's cores ran while it was measured (the profiling
            sweep's speed probe, ``cpu`` backend), if known; see :func:`normalise_speed`.
        cross_core_rtt_ns: the round trip between the task's cores while it was measured
            (nanoseconds; tasks on 2 or more cores of the ``cpu`` backend), if known.
    """

    config_key: str
    mix: tuple[MixTask, ...]
    task_index: int
    throughput_sps: float
    standalone_sps: float | None = None
    peak_memory_bytes: int | None = None
    speed_index: float | None = None
    cross_core_rtt_ns: float | None = None


class PredictorError(ValueError):
    """The predictor cannot be fitted or cannot answer (too few samples, unknown model...)."""


# ------------------------------------------------------------------------------ host speed


def normalise_speed(samples: Sequence[ProfiledTask]) -> tuple[list[ProfiledTask], float | None]:
    """Take the host's speed changes out of measured throughputs.

    A virtual machine's cores change speed by tens of percent within seconds
    (:mod:`workers.speed_probe`); a sample measured in a fast moment and one in a slow moment
    disagree by that much for the same configuration. Each sample with a ``speed_index``
    ``s`` becomes ``P · s_ref / s``: its throughput at the reference speed ``s_ref``, the
    median ``speed_index`` of ``samples``. Its ``standalone_sps`` is dropped: that value was
    measured at another moment (the standalone configuration's own sample carries it, with its
    own index). Samples without an index (closed-loop samples from runs, other backends) are
    kept as they are. The predictor fitted on the result predicts throughput at ``s_ref``.

    Returns:
        ``(samples, s_ref)``; ``s_ref`` is ``None`` (samples unchanged) when none has an index.
    """
    probed = [s.speed_index is not None and s.speed_index > 0 for s in samples]
    if not any(probed):
        return list(samples), None
    reference = float(np.median([s.speed_index for s, p in zip(samples, probed, strict=True) if p]))
    out = [
        replace(s, throughput_sps=s.throughput_sps * reference / s.speed_index, standalone_sps=None) if p else s
        for s, p in zip(samples, probed, strict=True)
    ]
    return out, reference


# ------------------------------------------------------------------------------------ solo table


def granted_fraction(share: np.ndarray, units: int) -> np.ndarray:
    """The fraction of a device a share is actually granted: whole allocation units (``units``
    of them: CPU cores on the cpu backend, SMs on a GPU under MPS, where the rounding is
    negligible), at least one, rounded half up: ``max(1, floor(R·C/100 + 1/2)) / C`` — the
    cpu backend's own mapping (workers.backends.cpu.cpu_allocation)."""
    return np.maximum(1.0, np.floor(np.asarray(share, dtype=float) * units / 100.0 + 0.5)) / units


def packed_windows(share: np.ndarray, present: np.ndarray, units: int) -> tuple[np.ndarray, np.ndarray]:
    """Which units each task runs on under ``packed`` placement (workers.backends.cpu.cpu_allocation):
    task ``k`` gets ``n_k = max(1, floor(R_k·C/100 + 1/2))`` units, a window starting where the
    previous task's ended, modulo ``C``. Returns ``n`` ``(rows, slots)`` (0 for empty slots) and
    the coverage ``(rows, slots, C)`` (bool)."""
    share = np.asarray(share, dtype=float)
    n_units = np.where(present, np.maximum(1, np.floor(share * units / 100.0 + 0.5)).astype(np.int64), 0)
    starts = (np.cumsum(n_units, axis=1) - n_units) % units
    core = np.arange(units)
    covered = ((core[None, None, :] - starts[:, :, None]) % units) < n_units[:, :, None]
    return n_units, covered & present[:, :, None]


def alone_on_units(covered: np.ndarray) -> np.ndarray:
    """``(rows, slots)`` bool: whether each task's units carry no other task, from the coverage
    ``(rows, slots, C)`` of :func:`packed_windows` (an empty slot counts as alone)."""
    on_unit = covered.sum(axis=1)  # (rows, C) tasks on each unit
    return ~(covered & (on_unit[:, None, :] > 1)).any(axis=2)


def sharing_rate(share: np.ndarray, present: np.ndarray, units: int, placement: Placement,
                 weight: float = 1.0, escape_weight: float | None = None) -> np.ndarray:
    """The fraction of its own slice a task gets when co-located, ``(rows, slots)``, in ``(0, 1]``.

    ``pooled`` (MPS): ``1 / max(1, Σ_j g_j)`` — the device oversubscribed for everyone.

    ``packed`` (cpu backend): weighted time sharing of each core between the threads pinned to
    it (Linux CFS shares a core equally between its *runnable* threads). A task with one thread
    is always runnable (weight 1); a task with several intra-op threads is not: its threads are
    barrier-synchronised and, with ``OMP_WAIT_POLICY=PASSIVE`` on shared cores, sleep at every
    barrier until the sibling on a busier core catches up, so each is runnable only a fraction
    ``w`` of the time (``weight``, fitted on the profiled mixes, :func:`fit_sharing_weight`).
    On core ``c`` task ``i`` gets ``w_i / Σ_{j on c} w_j``; its rate is the mean over its
    ``n_i`` cores, ``ρ_i = (1/n_i) Σ_{c ∈ i} w_i / Σ_{j on c} w_j``, capped at 1. With ``w = 1``
    this is the mean over the task's cores of ``1 / (tasks on the core)``. The mean fits the
    2-core profiles better than the most-contended core (the barrier's ``min``): held-out
    RMS log error of the baseline's multi-task slowdowns 0.25 (mean) against 0.30 (min).

    A multi-threaded task is pinned to its whole window, not each thread to a core, so when
    one of its cores carries no other task (``escape_weight`` given) the scheduler keeps its
    threads mostly there, off the cores it shares: it weighs ``escape_weight`` instead of
    ``w`` on every core. Measured on 2 cores, resnet18 (batch 64, both cores) beside
    shufflenet_v2_x1_0 (batch 16, pinned to one of them): shufflenet kept 84 % of its speed
    alone on its core and resnet18 ran at 53 % of its 2-core speed (its 1-core speed), where
    the weight fitted on the other mixes, ``w ≈ 0.5``, predicts 67 % for both.
    """
    present = np.asarray(present, dtype=bool)
    if placement == "pooled":
        granted = np.where(present, granted_fraction(share, units), 0.0)
        rate = 1.0 / np.maximum(1.0, granted.sum(axis=1, keepdims=True))
        return np.broadcast_to(rate, present.shape).copy()
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
    return np.where(present, np.clip(rate, 1e-6, 1.0), 1.0)


def passive_wait(share: np.ndarray, present: np.ndarray, units: int,
                 windows: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``(rows, slots)`` bool: the tasks that run several intra-op threads on cores another task
    also uses, under ``packed`` placement — those the cpu backend starts with
    ``OMP_WAIT_POLICY=PASSIVE`` (workers.backends.cpu: a trainer whose window overlaps another's),
    whose threads sleep at every barrier instead of spinning (:func:`slice_throughput`'s ``δ``).
    ``windows``: :func:`packed_windows` of the same arguments, when the caller has it already."""
    n_units, covered = windows if windows is not None else packed_windows(share, present, units)
    return present & (n_units > 1) & ~alone_on_units(covered)


def slice_throughput(batch, granted, t0, t1, alpha, beta, delta=0.0):
    """Throughput (samples/s) of a task on a granted fraction ``g`` of the device, before what
    co-located tasks take from it: ``B / (t_0·g^(−β) + t_1·B·g^(−α) + δ)``, per-iteration
    overhead ``t_0`` and per-sample time ``t_1`` (seconds at ``g = 1``), each scaled by its own
    exponent (:meth:`SoloTable.lookup`), and ``δ`` seconds per iteration of sleeping at the
    intra-op barriers (0 unless the task's threads wait passively, :func:`passive_wait`).
    Broadcasts over NumPy arrays."""
    return batch / (t0 * granted ** -beta + t1 * batch * granted ** -alpha + delta)


def _sample_arrays(samples: Sequence[ProfiledTask]) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's mix as ``(n, MAX_MIX)`` shares and presence (mixes truncated to MAX_MIX)."""
    share = np.zeros((len(samples), MAX_MIX))
    present = np.zeros((len(samples), MAX_MIX), dtype=bool)
    for r, s in enumerate(samples):
        for k, t in enumerate(s.mix[:MAX_MIX]):
            share[r, k], present[r, k] = t.share, True
    return share, present


def _repair_standalone(pts: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Standalone speeds ``(B, P)`` (ascending ``B``) with physically impossible points repaired.

    An iteration costs a fixed time plus a time per sample, ``1/P = t_0/B + t_1`` (optimizer
    step, operator dispatch and thread fork/join, then the samples' compute), so throughput
    grows with the batch at most proportionally: ``P(B_2)/P(B_1) ≤ B_2/B_1`` (a log-log slope
    ≤ 1). A pair of neighbouring points breaking that (with 3 or more points) holds a disturbed
    measurement; of the two, the one further from the law — fitted by Theil–Sen (median of
    pairwise slopes of ``1/P`` against ``1/B``, robust to that very point) — is replaced by the
    law's value. On the 2-core sweep: mobilenet_v3_small measured 142 samples/s alone at
    B = 16 against 498 at B = 32 (a slope of 1.8; on one core in mixes it ran at 213–479).
    """
    if len(pts) < 3:
        return pts
    b = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    x, inv = 1.0 / b, 1.0 / y
    i, j = np.triu_indices(len(x), 1)
    slope = max(0.0, float(np.median((inv[j] - inv[i]) / (x[j] - x[i]))))
    law = 1.0 / np.maximum(slope * x + float(np.median(inv - slope * x)), 1e-12)
    residual = np.abs(np.log(y) - np.log(law))
    for k in range(len(y) - 1):
        if y[k + 1] / y[k] > b[k + 1] / b[k] * (1.0 + 1e-9):
            bad = k if residual[k] >= residual[k + 1] else k + 1
            y[bad] = law[bad]
    return [(int(bb), float(p)) for bb, p in zip(b, y, strict=True)]


@dataclass
class SoloTable:
    """``P_solo(model, B, g)``: a task's throughput alone on the device with a granted fraction
    ``g`` of it — ``P_alone(model, B) · g^α_model`` as built here from the samples, and
    ``B / (t_0·g^(−β) + t_1·B·g^(−α) + δ)`` once :func:`fit_physical` has set the model's law
    and both exponents (:meth:`lookup`; ``δ = κ·t_0`` for a task waiting passively, else 0).

    ``P_alone`` (``g = 1``) comes from the measured standalone speeds (and 1-task mixes at a
    share granted the whole device); along the batch size it interpolates linearly in
    ``(log B, log P)`` (throughput grows sub-linearly with the batch) and extends the end slopes,
    clipped to ``[0, 1]``. Standalone points that break the per-iteration time law (throughput
    growing faster than the batch) are repaired first (:func:`_repair_standalone`).

    ``α_model`` (how well the model scales with its slice: 1 for perfectly, below 1 when a
    smaller slice is used more efficiently, below 0 when one core is faster than several, as
    for small CNNs whose intra-op threads spend more on synchronisation than they gain) is the
    least-squares slope through the origin of ``log(P / P_alone)`` against ``log g`` over every
    sample of the model granted less than the device *and alone on its units* — 1-task mixes
    and tasks of larger mixes whose cores no other task uses (``packed`` placement) —, clipped
    to ``[-1, 1.5]``; without such samples the median of the other models' ``α`` (1 if none).

    A model never measured alone is estimated from its samples in mixes, each divided by what
    the mix leaves it (:func:`sharing_rate` with ``sharing_weight``) and by ``g^α``
    (geometric mean per batch size, then the same interpolation); with no samples at all, from
    its training FLOPs and the device's median FLOP rate over measured models
    (``P_alone ≈ rate / F``).
    """

    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    exponents: dict[str, float] = field(default_factory=dict)
    flop_rate: float | None = None
    default_exponent: float = 1.0
    laws: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``(t_0, t_1)`` seconds per model: ``P_alone(B) = 1 / (t_0/B + t_1)``, set by
    :func:`fit_physical`; where present it replaces the model's interpolated curve."""
    overhead_exponents: dict[str, float] = field(default_factory=dict)
    """``β`` per model, set by :func:`fit_physical` with ``laws``: how the per-iteration
    overhead ``t_0`` scales with the slice, while the per-sample time ``t_1`` scales with
    ``α`` (:meth:`lookup`)."""

    @classmethod
    def from_samples(cls, samples: Iterable[ProfiledTask], workloads: Mapping[str, ModelWorkload], units: int,
                     placement: Placement = "pooled", sharing_weight: float = 1.0) -> SoloTable:
        samples = [s for s in samples if s.throughput_sps and s.throughput_sps > 0 and len(s.mix) <= MAX_MIX]
        share, present = _sample_arrays(samples)
        idx = np.array([s.task_index for s in samples], dtype=np.int64)[:, None]
        if samples:
            rate = np.take_along_axis(sharing_rate(share, present, units, placement, sharing_weight), idx, axis=1)[:, 0]
            if placement == "packed":
                alone = alone_on_units(packed_windows(share, present, units)[1])
            else:
                alone = sharing_rate(share, present, units, placement) >= 1.0
            alone = np.take_along_axis(alone, idx, axis=1)[:, 0]
        else:
            rate = alone = np.zeros(0)
        full: dict[tuple[str, int], list[float]] = defaultdict(list)
        partial: list[tuple[str, int, float, float]] = []
        mixed: list[tuple[str, int, float, float]] = []
        for k, s in enumerate(samples):
            task = s.mix[s.task_index]
            if s.standalone_sps and s.standalone_sps > 0:
                full[(task.architecture, task.batch_size)].append(s.standalone_sps)
            g = float(granted_fraction(task.share, units))
            if len(s.mix) == 1 and g >= 1.0:
                full[(task.architecture, task.batch_size)].append(s.throughput_sps)
            elif alone[k] and g < 1.0:
                partial.append((task.architecture, task.batch_size, g, s.throughput_sps))
            if len(s.mix) > 1 or g < 1.0:
                mixed.append((task.architecture, task.batch_size, g, s.throughput_sps / float(rate[k])))
        curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for (arch, batch), values in sorted(full.items()):
            curves[arch].append((batch, float(np.exp(np.mean(np.log(values))))))
        for arch, pts in curves.items():
            curves[arch] = _repair_standalone(pts)
        rates = [p * workloads[a].train_flops_per_sample for a, pts in curves.items() if a in workloads for _, p in pts]
        table = cls(curves=dict(curves), flop_rate=float(np.median(rates)) if rates else None)
        by_arch: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for arch, batch, g, p in partial:
            if arch in table.curves:
                ratio = p / float(table.alone(arch, np.array([batch]), workloads)[0])
                by_arch[arch].append((math.log(g), math.log(ratio)))
        for arch, pts in by_arch.items():
            x = np.array([a for a, _ in pts])
            y = np.array([b for _, b in pts])
            table.exponents[arch] = float(np.clip((x @ y) / (x @ x), -1.0, 1.5))  # through the origin: g=1 → ratio 1
        if table.exponents:
            table.default_exponent = float(np.median(list(table.exponents.values())))
        inferred: dict[tuple[str, int], list[float]] = defaultdict(list)
        for arch, batch, g, p in mixed:
            if arch not in table.curves:
                inferred[(arch, batch)].append(math.log(p) - table.exponent(arch) * math.log(g))
        extra: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for (arch, batch), logs in sorted(inferred.items()):
            extra[arch].append((batch, float(np.exp(np.mean(logs)))))
        table.curves.update(extra)
        return table

    def exponent(self, architecture: str) -> float:
        """``α`` of a model (the median of the others' for a model without partial-share samples)."""
        return self.exponents.get(architecture, self.default_exponent)

    def alone(self, architecture: str, batch: np.ndarray, workloads: Mapping[str, ModelWorkload]) -> np.ndarray:
        """``P_alone`` (samples/s): the model alone on the whole device at each batch size.

        Raises:
            PredictorError: the model was never measured alone and has no workload features.
        """
        batch = np.asarray(batch, dtype=float)
        law = getattr(self, "laws", {}).get(architecture)  # getattr: tables pickled before laws existed
        if law is not None:
            return 1.0 / (law[0] / batch + law[1])
        pts = self.curves.get(architecture)
        if not pts:
            if self.flop_rate is None or architecture not in workloads:
                raise PredictorError(f"no standalone speed and no workload features for model {architecture!r}")
            return np.full(batch.shape, self.flop_rate / workloads[architecture].train_flops_per_sample)
        xs = np.log([b for b, _ in pts])
        ys = np.log([p for _, p in pts])
        if len(pts) == 1:
            return np.full(batch.shape, math.exp(ys[0]))
        x = np.log(batch)
        y = np.interp(x, xs, ys)
        lo_slope = np.clip((ys[1] - ys[0]) / (xs[1] - xs[0]), 0.0, 1.0)
        hi_slope = np.clip((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0, 1.0)
        y = np.where(x < xs[0], ys[0] + lo_slope * (x - xs[0]), y)
        y = np.where(x > xs[-1], ys[-1] + hi_slope * (x - xs[-1]), y)
        return np.exp(y)

    def lookup(self, architecture: str, batch: np.ndarray, granted: np.ndarray,
               workloads: Mapping[str, ModelWorkload], passive: np.ndarray | None = None,
               passive_ratio: float = 0.0) -> np.ndarray:
        """``P_solo`` (samples/s) at arrays of batch sizes and granted fractions ``g``.

        ``passive`` (bool, ``batch``'s shape; ``None``: none) marks the tasks whose threads
        wait passively (:func:`passive_wait`); each pays ``δ = passive_ratio · t_0`` seconds
        more per iteration (``passive_ratio`` is ``κ``, :attr:`FeatureSpace.passive_ratio`).
        Both are ignored for a model without a fitted law.

        With a fitted law (:func:`fit_physical`) the two parts of an iteration's time scale
        with the slice separately, ``P_solo = B / (t_0·g^(−β) + t_1·B·g^(−α) + δ)``: the
        per-sample work (convolutions over the batch) splits well over a slice's threads, the
        per-iteration overhead (Python, the optimizer's small per-tensor kernels) hardly, so a
        slice's speed-up grows with the batch size — Amdahl's law with a batch-dependent
        parallel fraction. Measured on a 2-core host, 2 threads against 1: resnet18 1.59× at
        batch 16, 1.92× at 256; mobilenet_v3_small 1.33× and 1.48×. Without a law:
        ``P_alone(B) · g^α``.
        """
        granted = np.asarray(granted, dtype=float)
        law = getattr(self, "laws", {}).get(architecture)  # getattr: tables pickled before laws existed
        beta = getattr(self, "overhead_exponents", {}).get(architecture)
        if law is None or beta is None:
            return self.alone(architecture, batch, workloads) * granted ** self.exponent(architecture)
        delta = 0.0 if passive is None else np.where(passive, passive_ratio * law[0], 0.0)
        return slice_throughput(np.asarray(batch, dtype=float), granted, law[0], law[1], self.exponent(architecture), beta,
                                delta)


# ------------------------------------------------------------------------------------- encoding


@dataclass
class EncodedMixes:
    """Configurations as ``(n, MAX_MIX)`` arrays in the caller's task order.

    ``arch`` holds indices into ``architectures`` (-1 for an empty slot); ``batch`` and
    ``share`` are 0 in empty slots. ``rtt`` holds the measured cross-core round trip (ns) of
    each task, ``nan`` where unknown — always for a configuration to predict, which is then
    predicted at the reference placement (:attr:`FeatureSpace.reference_cross_core_rtt_ns`);
    ``None``: unknown everywhere.
    """

    architectures: tuple[str, ...]
    arch: np.ndarray
    batch: np.ndarray
    share: np.ndarray
    rtt: np.ndarray | None = None

    def rows(self, rows: np.ndarray) -> EncodedMixes:
        """The configurations ``rows`` (an index or boolean array) only."""
        return EncodedMixes(self.architectures, self.arch[rows], self.batch[rows], self.share[rows],
                            None if self.rtt is None else self.rtt[rows])

    @property
    def present(self) -> np.ndarray:
        return self.arch >= 0


def encode_mixes(mixes: Sequence[Sequence[MixTask]], architectures: Sequence[str]) -> EncodedMixes:
    """Turn configurations into arrays (see :class:`EncodedMixes`).

    Raises:
        PredictorError: a configuration is empty or has more than :data:`MAX_MIX` tasks, or a
            model is not in ``architectures``.
    """
    index = {a: i for i, a in enumerate(architectures)}
    n = len(mixes)
    arch = np.full((n, MAX_MIX), -1, dtype=np.int64)
    batch = np.zeros((n, MAX_MIX))
    share = np.zeros((n, MAX_MIX))
    for r, mix in enumerate(mixes):
        if not 1 <= len(mix) <= MAX_MIX:
            raise PredictorError(f"a configuration holds 1 to {MAX_MIX} tasks, got {len(mix)}")
        for s, task in enumerate(mix):
            if task.architecture not in index:
                raise PredictorError(f"model {task.architecture!r} is unknown to the predictor; known: {', '.join(architectures)}")
            arch[r, s], batch[r, s], share[r, s] = index[task.architecture], task.batch_size, task.share
    return EncodedMixes(tuple(architectures), arch, batch, share)


@dataclass
class FeatureSpace:
    """What the encoder knows about models and the device class: workloads, standalone speeds
    and the device descriptor."""

    architectures: tuple[str, ...]
    workloads: dict[str, ModelWorkload]
    solo: SoloTable
    cores: int
    placement: Placement = "pooled"
    sharing_weight: float = 1.0
    """``w`` of :func:`sharing_rate`: how much of the time a multi-threaded task's thread is
    runnable on a shared core (fitted by :func:`fit_sharing_weight`; ignored when pooled)."""
    escape_weight: float | None = None
    """``w`` of a multi-threaded task that has a core of its own (:func:`sharing_rate`), fitted
    by :func:`fit_physical`; ``None``: the same as ``sharing_weight`` (ignored when pooled)."""
    reference_speed_index: float | None = None
    """The host speed predictions are for (:func:`normalise_speed`), ``None`` if the training
    samples had no speed index."""
    reference_cross_core_rtt_ns: float | None = None
    """The cross-core round trip predictions are for, the near placement: the 10th percentile
    of the training samples' ``cross_core_rtt_ns``; ``None`` if none had one (no link term)."""
    link_exponent: float = 0.0
    """``γ`` of :meth:`link_log_ratio`, fitted by :func:`fit_physical`."""
    passive_ratio: float = 0.0
    """``κ``: a multi-threaded task whose cores other tasks share (:func:`passive_wait`) spends
    ``δ = κ·t_0`` more per iteration (:func:`slice_throughput`), fitted by :func:`fit_physical`."""

    def spec(self) -> dict:
        """A JSON description of the features (stored on the Predictor row)."""
        return {
            "max_mix": MAX_MIX,
            "slot_features": list(_SLOT_FEATURES),
            "mix_features": list(_MIX_FEATURES),
            "slot_order": "descending log(F·B), then share, then model name",
            "target": "log(throughput_sps) - log(baseline throughput) per slot",
            "architectures": list(self.architectures),
            "cores": self.cores,
            "placement": self.placement,
            "sharing_weight": self.sharing_weight,
            "escape_weight": self.escape_weight,
            "reference_speed_index": self.reference_speed_index,
            "reference_cross_core_rtt_ns": getattr(self, "reference_cross_core_rtt_ns", None),
            "link_exponent": getattr(self, "link_exponent", 0.0),
            "passive_ratio": getattr(self, "passive_ratio", 0.0),
        }

    def _per_arch(self, values: Callable[[str], float]) -> np.ndarray:
        return np.array([values(a) for a in self.architectures] + [0.0])  # index -1 → 0

    def slot_arrays(self, enc: EncodedMixes) -> dict[str, np.ndarray]:
        """Per-slot physical quantities, ``(n, MAX_MIX)`` each, in the caller's order."""
        present = enc.present
        flops = self._per_arch(lambda a: self.workloads[a].train_flops_per_sample)[enc.arch] * enc.batch
        bytes_ = self._per_arch(lambda a: self.workloads[a].activation_bytes_per_sample)[enc.arch] * enc.batch
        params = self._per_arch(lambda a: float(self.workloads[a].params))[enc.arch]
        granted = np.where(present, granted_fraction(enc.share, self.cores), 0.0)
        solo = np.ones(enc.arch.shape)
        # Computed once here: the prediction path of planners, 100,000 configurations a call.
        windows = packed_windows(enc.share, present, self.cores) if self.placement == "packed" else None
        passive = (passive_wait(enc.share, present, self.cores, windows) if windows is not None
                   else np.zeros(enc.arch.shape, dtype=bool))
        for i, name in enumerate(self.architectures):
            mask = enc.arch == i
            if mask.any():
                solo[mask] = self.solo.lookup(name, enc.batch[mask], granted[mask], self.workloads, passive[mask],
                                              getattr(self, "passive_ratio", 0.0))  # getattr: spaces pickled before it existed
        contention, worst = self.contention(enc.share, present, windows)
        rate = sharing_rate(enc.share, present, self.cores, self.placement, self.sharing_weight,
                            getattr(self, "escape_weight", None))  # getattr: spaces pickled before it existed
        gamma = getattr(self, "link_exponent", 0.0)  # getattr: spaces pickled before it existed
        baseline = solo * rate * np.exp(-gamma * self.link_log_ratio(enc))
        return {"present": present, "flops": flops, "bytes": bytes_, "params": params, "solo": solo,
                "granted": granted, "contention": contention, "worst": worst, "rate": rate,
                "baseline": np.where(present, baseline, 0.0)}

    def link_log_ratio(self, enc: EncodedMixes) -> np.ndarray:
        """``x = log(rtt / rtt_ref)`` per slot, ``(n, MAX_MIX)``: how much further apart than
        the reference the task's cores were when it was measured, for a task on several units
        that no other task uses; 0 otherwise, and for an unknown ``rtt`` (every configuration
        to predict) or no reference. The baseline multiplies a task's speed by
        ``exp(−γ·x) = (rtt / rtt_ref)^(−γ)`` (:func:`fit_physical` fits ``γ``): a
        multi-threaded task waits on its cores' cache lines at every parallel operator
        (:mod:`workers.core_link_probe`). Only alone on its cores: beside other tasks its
        threads already wait for the cores themselves, and the link no longer shows — in a
        2-core sweep the physical baseline's residuals of 2-core tasks alone were
        +0.04…+0.22 (log, per model) at the near placement and −0.08…−0.33 at the far one,
        those of 2-core tasks sharing their cores −0.01…+0.10 at the far one. That is also why
        the reference is the near placement: a task beside others runs as if its cores were
        near, whatever the probe read.

        One ``γ`` for all models, not one each: grouped cross-validation holds a model's
        1-task mixes out together, and on a 2-core device only those put a multi-core task
        alone on its cores, so a per-model ``γ`` is never fitted where it is tested. On that
        sweep (65 configurations), the baseline's held-out RMSLE: 0.152 without the term,
        0.159 with one ``γ`` per model, 0.138 with one for all (0.193 → 0.147 on 1-task mixes).
        """
        reference = getattr(self, "reference_cross_core_rtt_ns", None)  # getattr: spaces pickled before it existed
        if enc.rtt is None or reference is None:
            return np.zeros(enc.arch.shape)
        present = enc.present
        n_units, covered = packed_windows(enc.share, present, self.cores)
        known = (n_units > 1) & alone_on_units(covered) & present & np.isfinite(enc.rtt) & (np.nan_to_num(enc.rtt) > 0)
        return np.where(known, np.log(np.where(known, enc.rtt, reference) / reference), 0.0)

    def contention(self, share: np.ndarray, present: np.ndarray,
                   windows: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """How many tasks compete for each task's slice: the mean over its units and the most
        on any one of them (its slowest thread sets the pace of each parallel operator), each
        ``(n, MAX_MIX)``, at least 1.

        ``pooled`` (a GPU under MPS: a client's share caps how many SMs it may use, not which):
        the device is oversubscribed by ``max(1, Σ_j g_j)`` for everyone, mean and most alike.
        ``packed`` (the cpu backend): each task's ``n_i`` units are a window starting where the
        previous task's ended, modulo the device (workers.backends.cpu.cpu_allocation); on each
        unit count how many tasks' windows cover it — the OS shares a core between the threads
        pinned to it. ``windows``: :func:`packed_windows` of ``share``, ``present``, when the
        caller has it already.
        """
        if self.placement == "pooled":
            granted = np.where(present, granted_fraction(share, self.cores), 0.0)
            load = np.broadcast_to(np.maximum(1.0, granted.sum(axis=1, keepdims=True)), share.shape).copy()
            return load, load
        units, covered = windows if windows is not None else packed_windows(share, present, self.cores)
        per_core = covered.sum(axis=1)  # (n, C) tasks on each core
        on_mine = covered * per_core[:, None, :]
        mean = on_mine.sum(axis=2) / np.maximum(units, 1)
        worst = on_mine.max(axis=2)
        return np.where(present, np.maximum(1.0, mean), 1.0), np.where(present, np.maximum(1.0, worst), 1.0)

    def canonical_order(self, enc: EncodedMixes, flops: np.ndarray) -> np.ndarray:
        """``(n, MAX_MIX)`` slot permutation putting each row in canonical order (present
        slots first, by descending ``F·B``, then share, then model name)."""
        key_name = np.where(enc.present, enc.arch, len(self.architectures))
        order = np.lexsort((key_name, -enc.share, -flops, ~enc.present), axis=1)
        return order

    def features(self, enc: EncodedMixes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The design matrix, the canonical order and the baseline prediction.

        Returns:
            ``X`` of shape ``(n, MAX_MIX · len(slot features) + len(mix features))``, the
            ``(n, MAX_MIX)`` order (``X``'s slot ``s`` is the caller's slot ``order[:, s]``),
            and the baseline throughput ``(n, MAX_MIX)`` in the caller's order.
        """
        q = self.slot_arrays(enc)
        order = self.canonical_order(enc, q["flops"])
        take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731 - local shorthand
        present = take(q["present"]).astype(float)
        slots = [
            present,
            np.log1p(take(q["flops"])),
            np.log1p(take(q["bytes"])),
            np.log1p(take(q["params"])),
            take(enc.share) / 100.0,
            take(q["granted"]),
            take(q["contention"]) * present,
            take(q["worst"]) * present,
            np.log1p(take(q["solo"]) * present),
            np.log1p(take(q["baseline"])),
        ]
        mix = [
            present.sum(axis=1),
            enc.share.sum(axis=1) / 100.0,
            q["granted"].sum(axis=1),
            np.log1p(q["flops"].sum(axis=1)),
            np.log1p(q["bytes"].sum(axis=1)),
            np.full(len(present), float(self.cores)),
        ]
        X = np.concatenate([np.stack(slots, axis=2).reshape(len(present), -1), np.stack(mix, axis=1)], axis=1)
        return X, order, q["baseline"]


# ---------------------------------------------------------------------------------------- models


def _make_model(family: str, seed: int):
    from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor, RandomForestRegressor
    from sklearn.multioutput import MultiOutputRegressor

    if family == "random_forest":
        return RandomForestRegressor(n_estimators=150, min_samples_leaf=2, max_features=0.5, n_jobs=-1, random_state=seed)
    if family == "extra_trees":
        # Leaves of 4 (not 2) and 150 trees (not 200): as accurate on the nine kept sweeps (mean
        # held-out RMSLE 0.1390 against 0.1398) with a third of the nodes, so 100,000
        # configurations are predicted in about half the time (0.48 s of trees was 1.0 s in all).
        return ExtraTreesRegressor(n_estimators=150, min_samples_leaf=4, max_features=0.7, n_jobs=-1, random_state=seed)
    if family == "gradient_boosting":
        return MultiOutputRegressor(
            HistGradientBoostingRegressor(max_iter=300, learning_rate=0.06, min_samples_leaf=8, l2_regularization=1e-3,
                                          random_state=seed)
        )
    raise PredictorError(f"unknown model family {family!r}; allowed: {', '.join(FAMILIES)}")


# Fitting runs with BLAS and OpenMP held to one thread each. A predictor is fitted on a few
# hundred configurations, where native thread pools only add hand-offs, and their threads spin
# while they wait, so beside any other busy process (another test worker, a profiling sweep, a
# training run) they fight it for the cores: on a 2-core machine, cross-validating gradient
# boosting on a kept sweep took 8.0 s alone and did not finish in 280 s beside a 2-thread torch
# loop; with one thread, 5.4 s alone and 6.6 s beside the loop. The forests parallelise over
# trees on joblib's own threads, which this leaves alone; prediction keeps the caller's settings.
_one_native_thread = threadpool_limits.wrap(limits=1)


def _residual(throughput: np.ndarray, baseline: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Learned targets: ``log(P) - log(P_baseline)`` per slot (0 where nothing is measured).

    The trees correct the physical baseline rather than learn throughput from scratch: the
    residual's range is small and similar across models and slots, so one multi-output tree
    can serve all slots (a forest on raw log-throughput split mostly on which model sits in
    which slot and generalised poorly to unseen mixes).
    """
    safe = np.where(mask, throughput, 1.0)
    return np.where(mask, np.log(safe) - np.log(np.clip(baseline, 1e-9, None)), 0.0)


def _unresidual(residual: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    return np.clip(baseline, 1e-9, None) * np.exp(residual)


def rmsle(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Root mean squared log error, ``sqrt(mean((log1p(p) - log1p(m))²))`` (Horus' metric)."""
    return float(np.sqrt(np.mean((np.log1p(predicted) - np.log1p(measured)) ** 2)))


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, ``mean(|p - m| / m)`` (a fraction, not percent)."""
    return float(np.mean(np.abs(predicted - measured) / measured))


@dataclass
class ThroughputPredictor:
    """A fitted predictor for one backend / device class (see the module docstring)."""

    family: str
    space: FeatureSpace
    model: object | None
    memory: MemoryModel

    def predict_arrays(self, enc: EncodedMixes) -> np.ndarray:
        """Throughput (samples/s) of every task of every configuration, ``(n, MAX_MIX)`` in the
        caller's slot order; ``nan`` in empty slots."""
        X, order, baseline = self.space.features(enc)
        if self.model is None:
            out = baseline
        else:
            baseline_c = np.take_along_axis(baseline, order, axis=1)
            canonical = _unresidual(np.asarray(self._predict_model(X)).reshape(len(X), MAX_MIX), baseline_c)
            out = np.empty_like(canonical)
            np.put_along_axis(out, order, canonical, axis=1)
        out = np.clip(out, 1e-9, None)
        return np.where(enc.present, out, np.nan)

    def largest_profiled_batch(self, architecture: str) -> int | None:
        """The largest batch size the model was profiled at alone (``None`` if never): beyond
        it every prediction is an extrapolation."""
        pts = self.space.solo.curves.get(architecture)
        return max(b for b, _ in pts) if pts else None

    def _predict_model(self, X: np.ndarray) -> np.ndarray:
        # Forests predict their trees on a joblib thread pool; for a few thousand rows
        # starting and joining it costs more (~50 ms a call) than the trees themselves,
        # and planners call this many times with small batches.
        n_jobs = getattr(self.model, "n_jobs", None)
        if n_jobs is None or len(X) >= _PARALLEL_PREDICT_ROWS:
            return self.model.predict(X)
        try:
            self.model.n_jobs = 1
            return self.model.predict(X)
        finally:
            self.model.n_jobs = n_jobs

    def predict(self, mixes: Sequence[Sequence[MixTask]]) -> list[list[float]]:
        """Throughput of every task of every configuration, in the order given.

        Raises:
            PredictorError: an unknown model or a configuration of the wrong size.
        """
        enc = encode_mixes(mixes, self.space.architectures)
        predicted = self.predict_arrays(enc)
        return [[float(predicted[r, s]) for s in range(len(mix))] for r, mix in enumerate(mixes)]


# ---------------------------------------------------------------------------------------- memory


@dataclass
class MemoryModel:
    """Peak memory (bytes) of a task from its model and batch size.

    ``lines[model] = (a, b)``: least squares ``peak = a + b·B`` over that model's profiled
    peaks (``b`` kept ≥ 0). Without a line (model never profiled, or one batch size only):
    ``base + 4 · param_bytes + activation_bytes_per_sample · B``, ``base`` being the median
    intercept of the fitted lines (the runtime's own footprint) and 4 × the weights covering
    weights, gradients, optimizer state and a copy.
    """

    lines: dict[str, tuple[float, float]]
    base: float
    workloads: dict[str, ModelWorkload]

    @classmethod
    def fit(cls, samples: Iterable[ProfiledTask], workloads: Mapping[str, ModelWorkload]) -> MemoryModel:
        points: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for s in samples:
            if s.peak_memory_bytes:
                task = s.mix[s.task_index]
                points[task.architecture].append((task.batch_size, s.peak_memory_bytes))
        lines = {}
        for arch, pts in points.items():
            b = np.array([p[0] for p in pts], dtype=float)
            m = np.array([p[1] for p in pts], dtype=float)
            if len(np.unique(b)) < 2:
                continue
            slope, intercept = np.polyfit(b, m, 1)
            slope = max(0.0, float(slope))
            lines[arch] = (float(np.mean(m - slope * b)), slope) if slope == 0.0 else (float(intercept), slope)
        base = float(np.median([a for a, _ in lines.values()])) if lines else 300e6
        return cls(lines=lines, base=base, workloads=dict(workloads))

    def predict(self, architecture: str, batch_size: np.ndarray | int) -> np.ndarray:
        """Peak bytes for ``architecture`` at each batch size.

        Raises:
            PredictorError: the model was never profiled and has no workload features.
        """
        batch_size = np.asarray(batch_size, dtype=float)
        if architecture in self.lines:
            a, b = self.lines[architecture]
            return a + b * batch_size
        if architecture not in self.workloads:
            raise PredictorError(f"no memory profile and no workload features for model {architecture!r}")
        w = self.workloads[architecture]
        return self.base + 4.0 * w.param_bytes + w.activation_bytes_per_sample * batch_size


# ------------------------------------------------------------------------------------------- fit


def slice_labels(space: FeatureSpace, enc: EncodedMixes) -> np.ndarray:
    """What kind of slice each task runs on, ``(n, MAX_MIX)`` strings in the caller's order
    (``""`` in empty slots). Under ``packed`` placement ``"<k> unit(s), alone|shared"``: the
    ``k = max(1, round(R·C/100))`` cores the task's share is granted (one intra-op thread each,
    :func:`packed_windows`), ``shared`` when another task's window covers one of them. Under
    ``pooled`` (MPS: every client may use every SM) ``"within the device"`` or
    ``"oversubscribed"`` (the shares add up to more than the device). Used to break held-out
    error down: on the cpu backend a task whose 2 threads share cores with other processes
    repeats far worse than a 1-thread task alone on its core."""
    _contention, worst = space.contention(enc.share, enc.present)
    kind = np.where(worst > 1.0, "oversubscribed", "within the device")
    if space.placement == "packed":
        kind = np.where(worst > 1.0, "shared", "alone")
        units, _covered = packed_windows(enc.share, enc.present, space.cores)
        plural = np.where(units > 1, "units", "unit")
        kind = np.char.add(np.char.add(np.char.add(units.astype(str), " "), plural), np.char.add(", ", kind))
    return np.where(enc.present, kind, "")


@dataclass
class FamilyReport:
    """Held-out accuracy of one model family."""

    family: str
    rmsle: float
    mape: float
    fit_seconds: float
    by_mix_size: dict[int, float]
    by_slice: dict[str, float] = field(default_factory=dict)
    """Held-out RMSLE by the kind of slice a task ran on (:func:`slice_labels`), e.g.
    ``"1 unit, alone"``: where the error comes from beyond the mix size."""


@dataclass
class FitReport:
    """What :func:`fit_predictor` measured: per-family held-out metrics, the kept family, and
    the kept family's held-out predictions (for the predicted-vs-measured scatter): one
    ``{"architecture", "mix_size", "measured_sps", "predicted_sps", "slice"}`` per measured
    task (``slice`` from :func:`slice_labels`), from the first partition."""

    samples: int
    configurations: int
    groups: int
    folds: int
    families: list[FamilyReport]
    kept: str
    heldout: list[dict]
    fit_seconds: float
    partitions: int = 1
    """How many random partitions into ``folds`` folds the held-out figures are taken over."""


def _training_matrix(samples: Sequence[ProfiledTask]) -> tuple[list[tuple[MixTask, ...]], np.ndarray, list[str], np.ndarray]:
    """Group samples into configurations: ``(mixes, Y (n, MAX_MIX) with nan where not
    measured, config keys, RTT (n, MAX_MIX) cross-core round trips with nan where unknown)``.
    Repeated measurements of a task average in log space, throughputs and round trips alike."""
    mixes: dict[str, tuple[MixTask, ...]] = {}
    values: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    rtts: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        if not (s.throughput_sps and s.throughput_sps > 0) or len(s.mix) > MAX_MIX:
            continue
        mixes.setdefault(s.config_key, s.mix)
        values[s.config_key][s.task_index].append(math.log(s.throughput_sps))
        rtt = getattr(s, "cross_core_rtt_ns", None)
        if rtt is not None and rtt > 0:
            rtts[s.config_key][s.task_index].append(math.log(rtt))
    keys = sorted(mixes)
    Y = np.full((len(keys), MAX_MIX), np.nan)
    RTT = np.full((len(keys), MAX_MIX), np.nan)
    for r, key in enumerate(keys):
        for idx, logs in values[key].items():
            Y[r, idx] = math.exp(float(np.mean(logs)))
        for idx, logs in rtts[key].items():
            RTT[r, idx] = math.exp(float(np.mean(logs)))
    return [mixes[k] for k in keys], Y, keys, RTT


def mix_group(mix: Sequence[MixTask]) -> str:
    """The grouped-CV key: the multiset of models of a mix (batch sizes and shares ignored), so
    a held-out fold never contains a combination of models seen in training."""
    return "+".join(sorted(t.architecture for t in mix))


@dataclass
class _TrainingSet:
    samples: list[ProfiledTask]
    keys: list[str]  # config key of each row
    mixes: list[tuple[MixTask, ...]]
    space: FeatureSpace
    enc: EncodedMixes
    X: np.ndarray
    order: np.ndarray
    measured: np.ndarray  # (n, MAX_MIX) throughput in canonical order, nan where not measured
    baseline: np.ndarray  # (n, MAX_MIX) baseline throughput in canonical order
    groups: np.ndarray
    memory: MemoryModel

    @property
    def mask(self) -> np.ndarray:
        return ~np.isnan(self.measured)

    @property
    def target(self) -> np.ndarray:
        return _residual(np.nan_to_num(self.measured), self.baseline, self.mask)

    def fold(self, train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(X, baseline)`` of every row with the physical tables fitted on the rows ``train``
        only, so a held-out mix's measurements never reach its own baseline.

        The :class:`SoloTable` sees the samples of the training configurations; of those, a
        ``standalone_sps`` is kept only when the model's own 1-task group (``mix_group`` of the
        model alone) is a training group too: a sweep fills ``standalone_sps`` from the 1-task
        full-share configuration of that model and batch size, so for a held-out 1-task group
        it would be the held-out target itself.
        """
        train_keys = {self.keys[r] for r in train}
        train_groups = set(self.groups[train].tolist())
        fold_samples = [
            s if s.standalone_sps is None or s.mix[s.task_index].architecture in train_groups
            else ProfiledTask(s.config_key, s.mix, s.task_index, s.throughput_sps, None, s.peak_memory_bytes)
            for s in self.samples if s.config_key in train_keys
        ]
        sp = self.space
        rows = np.asarray(train)
        train_enc = self.enc.rows(rows)
        Y = np.empty_like(self.measured)
        np.put_along_axis(Y, self.order, self.measured, axis=1)
        space = _fit_space(fold_samples, sp.architectures, sp.workloads, sp.cores, sp.placement, train_enc, Y[rows],
                           sp.reference_cross_core_rtt_ns)
        X, order, baseline = space.features(self.enc)
        assert (order == self.order).all()  # the canonical order does not depend on the tables
        return X, np.take_along_axis(baseline, order, axis=1)


def fit_sharing_weight(space: FeatureSpace, enc: EncodedMixes, measured: np.ndarray) -> float:
    """``w`` of :func:`sharing_rate` (``packed`` placement): the value on the grid
    ``0.05, 0.10, …, 1`` minimising the squared log error of the baseline
    ``P_solo · ρ_i(w)`` over the measured tasks of the multi-task configurations ``enc``
    (``measured`` ``(n, MAX_MIX)`` in ``enc``'s order, ``nan`` where not measured); 1 when
    pooled or without such tasks."""
    sel = ~np.isnan(measured) & enc.present & (enc.present.sum(axis=1) > 1)[:, None]
    if space.placement != "packed" or not sel.any():
        return 1.0
    log_measured = np.log(np.where(sel, measured, 1.0))
    best, best_loss = 1.0, math.inf
    for w in np.linspace(0.05, 1.0, 20):
        trial = FeatureSpace(space.architectures, space.workloads, space.solo, space.cores, space.placement, float(w))
        baseline = trial.slot_arrays(enc)["baseline"]
        loss = float(np.mean((log_measured[sel] - np.log(np.clip(baseline[sel], 1e-9, None))) ** 2))
        if loss < best_loss - 1e-12:
            best, best_loss = float(w), loss
    return best


def _law_from_curve(pts: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(t_0, t_1)`` of ``1/P = t_0/B + t_1`` through standalone points ``(B, P)`` (least
    squares on ``1/P`` against ``1/B``, both kept positive)."""
    b = np.array([p[0] for p in pts], dtype=float)
    inv = 1.0 / np.array([p[1] for p in pts], dtype=float)
    if len(pts) >= 2 and np.ptp(b) > 0:
        slope, intercept = np.polyfit(1.0 / b, inv, 1)
    else:
        slope, intercept = 0.5 * inv[0] * b[0], 0.5 * inv[0]
    floor = 0.05 * float(np.min(inv))
    return max(float(slope), floor * float(np.min(b))), max(float(intercept), floor)


_PHYSICAL_ALPHA_PRIOR = (1.0, 0.2)  # (mean, weight): a slice's speed ∝ its size unless data say otherwise
_PHYSICAL_BETA_PRIOR = (0.5, 0.1)  # the per-iteration overhead: half parallel unless data say otherwise (weaker:
# on two sweeps weight 0.1 gave held-out RMSLE 0.161 and 0.165 against 0.166 and 0.166 at 0.2)
_PHYSICAL_ESCAPE_PRIOR = (0.2, 1.0)  # (mean, weight) of escape_weight: see fit_physical
_PHYSICAL_LINK_PRIOR = (0.0, 0.1)  # (mean, weight) of γ: no placement effect unless data say otherwise
_PHYSICAL_PASSIVE_START = math.log(0.3)  # log κ where the fit starts
_PHYSICAL_LOSS_SCALE = 0.15  # log error beyond which a residual counts linearly (soft L1): outliers


def fit_physical(space: FeatureSpace, enc: EncodedMixes, measured: np.ndarray) -> FeatureSpace:
    """Refit the physical model on every measured task at once (nonlinear least squares).

    The model is the baseline's, ``log P_i = log B_i − log(t_0·g_i^(−β) + t_1·B_i·g_i^(−α) +
    κ·t_0·[passive_i]) + log ρ_i(w) − γ·x_i`` (:meth:`SoloTable.lookup`, :func:`sharing_rate`,
    :meth:`FeatureSpace.link_log_ratio`, :func:`passive_wait`), with per model ``t_0``, ``t_1`` (the per-iteration
    time law of :func:`_repair_standalone`), ``α`` (how the per-sample time scales with the
    granted fraction ``g``) and ``β`` (how the per-iteration overhead does), the sharing
    weights ``w`` and ``escape_weight`` (:func:`sharing_rate`), and one ``γ`` for all models
    (how a task alone on several cores slows as they move apart,
    :meth:`FeatureSpace.link_log_ratio`; fitted only when some measured task has ``x ≠ 0``,
    under a weak prior toward 0, bounds ``[-0.5, 3]``), and one ``κ`` for all models (what a
    multi-threaded task loses per iteration when it waits passively, as a fraction of its
    ``t_0``; fitted only when some measured task waits passively, bounds ``[1e-4, 10]``, no
    prior). :func:`_fit_space`'s tables fit a simpler
    form (one exponent) one part after another, each from its own subset (standalone points,
    then tasks alone on their units, then the mixes); here all parts are fitted jointly to all
    measured tasks of ``enc`` (``measured`` ``(n, MAX_MIX)`` in ``enc``'s order, ``nan`` where
    not measured), so every mix informs every model's speed — what a whole model held out of
    the standalone measurements needs — and one noisy standalone point no longer sets a
    model's speed at its batch size. The loss is soft-L1 in log space (scale
    :data:`_PHYSICAL_LOSS_SCALE`: disturbed measurements weigh less) with weak priors pulling
    each ``α`` to 1 and, weaker, each ``β`` to 0.5, and a firmer one pulling ``escape_weight``
    to 0.2: the configurations that inform it (a multi-threaded task beside single-threaded
    ones all on one core) are few, and grouped cross-validation often holds them all out.
    Starts from ``space``'s tables, ``β`` at ``α``, ``escape_weight`` at the prior's mean
    (``scipy.optimize.least_squares``, bounded: ``α, β ∈ [-1, 1.5]``, ``w ∈ [0.05, 1]``,
    ``escape_weight ∈ [0.01, 1]``).

    On 2-core sweeps (speed-normalised), the joint fit with one exponent lowered the
    baseline's held-out RMSLE from 0.232 to 0.202, mostly for models whose 1-task mixes were
    held out; the second exponent ``β`` lowered it further, 0.179 → 0.161 and 0.189 → 0.165
    on two 480 s sweeps of another host, and ``escape_weight`` to 0.151 and 0.152 (a third
    sweep: 0.176 → 0.170 → 0.170; prior weights 0.3 to 3 and means 0.2 to 0.3 all within 0.003).

    ``κ``: the cpu backend starts a trainer whose cores other trainers share with
    ``OMP_WAIT_POLICY=PASSIVE`` (its idle threads sleep instead of spinning, or they starve the
    other trainers), and a sleeping thread takes a wake-up at every barrier, so such a task pays
    per iteration what a task alone on its cores does not — a cost of the iteration, like
    ``t_0``, not of its samples: without the term the joint fit bent each model's ``α``, ``β``
    to explain its shared 2-thread tasks and predicted its 2-thread speed alone from them when
    its 1-task mixes were held out. One ``κ`` for all models (``δ_i = κ·t_0,i``: both scale
    with the operators run per iteration): one per model, each under a prior tying it to
    ``t_0``, scored the same (mean held-out RMSLE of ten 2-core sweeps 0.1313 with a prior
    weight of 3 or 30, 0.1438 at 0.05). Over those ten sweeps the term lowered the mean from
    0.1349 to 0.1313, most on the 4 s-window sweep of 2026-12-01 (0.1015 → 0.0965); on an
    eleventh, measured after on a host whose measurements repeated to 0.075, 0.1119 → 0.1129.

    Returns:
        A new :class:`FeatureSpace` whose :class:`SoloTable` has ``laws``, ``exponents`` and
        ``overhead_exponents`` for every model measured in ``enc`` (the others keep
        ``space``'s), with the fitted ``w``, ``escape_weight``, ``link_exponent`` and
        ``passive_ratio``, and
        ``space``'s references; ``space`` itself when nothing was measured.
    """
    from scipy.optimize import least_squares

    mask = ~np.isnan(measured) & enc.present
    fitted = sorted({int(a) for a in enc.arch[mask]})
    if not fitted:
        return space
    names = [space.architectures[a] for a in fitted]
    slot = np.full(len(space.architectures) + 1, -1)
    slot[fitted] = np.arange(len(fitted))
    k = len(fitted)
    rows = mask.any(axis=1)
    enc = enc.rows(rows)
    mask, log_measured = mask[rows], np.log(np.where(mask[rows], measured[rows], 1.0))
    arch_slot = slot[np.where(mask, enc.arch, -1)]
    batch = np.where(mask, enc.batch, 1.0)
    granted = np.where(mask, granted_fraction(enc.share, space.cores), 1.0)
    link_x = space.link_log_ratio(enc)
    packed = space.placement == "packed"
    link = bool(np.any(link_x[mask] != 0))
    passive = (passive_wait(enc.share, enc.present, space.cores) & mask) if packed else np.zeros(mask.shape, dtype=bool)

    start = []
    for name in names:
        pts = space.solo.curves.get(name)
        if pts:
            start.append(_law_from_curve(pts))
        else:
            p = float(space.solo.alone(name, np.array([32.0]), space.workloads)[0])
            start.append((16.0 / p, 0.5 / p))
    theta0 = np.concatenate([
        np.log([t for t, _ in start]), np.log([t for _, t in start]),
        [np.clip(space.solo.exponent(n), -1.0, 1.5) for n in names],  # α
        [np.clip(space.solo.exponent(n), -1.0, 1.5) for n in names],  # β starts at α
        [np.clip(space.sharing_weight, 0.05, 1.0)],
        [_PHYSICAL_ESCAPE_PRIOR[0] if space.escape_weight is None else np.clip(space.escape_weight, 0.01, 1.0)],
        [space.link_exponent],  # γ
        [math.log(space.passive_ratio) if space.passive_ratio > 0 else _PHYSICAL_PASSIVE_START],  # log κ
    ])

    def unpack(theta):
        return (np.exp(theta[:k]), np.exp(theta[k:2 * k]), theta[2 * k:3 * k], theta[3 * k:4 * k],
                float(theta[4 * k]), float(theta[4 * k + 1]), float(theta[4 * k + 2]), math.exp(theta[4 * k + 3]))

    def log_rate(w, escape):
        return np.log(sharing_rate(enc.share, enc.present, space.cores, space.placement, w, escape))

    def residuals(theta):
        t0, t1, alpha, beta, w, escape, gamma, kappa = unpack(theta)
        j = np.maximum(arch_slot, 0)
        d = np.where(passive, kappa * t0[j], 0.0)
        log_p = np.log(slice_throughput(batch, granted, t0[j], t1[j], alpha[j], beta[j], d)) - gamma * link_x
        log_p = log_p + log_rate(w, escape)
        alpha_mean, alpha_weight = _PHYSICAL_ALPHA_PRIOR
        beta_mean, beta_weight = _PHYSICAL_BETA_PRIOR
        escape_mean, escape_weight = _PHYSICAL_ESCAPE_PRIOR
        link_mean, link_weight = _PHYSICAL_LINK_PRIOR
        return np.concatenate([(log_p - log_measured)[mask], alpha_weight * (alpha - alpha_mean),
                               beta_weight * (beta - beta_mean), [escape_weight * (escape - escape_mean)],
                               [link_weight * (gamma - link_mean)]])

    lower = np.concatenate([np.full(2 * k, -np.inf), np.full(2 * k, -1.0), [0.05, 0.01, -0.5, math.log(1e-4)]])
    upper = np.concatenate([np.full(2 * k, np.inf), np.full(2 * k, 1.5), [1.0, 1.0, 3.0, math.log(10.0)]])
    data_rows, data_slots = np.nonzero(mask)  # the order of ``(…)[mask]`` in residuals (row-major)
    data_arch = arch_slot[data_rows, data_slots]
    data_batch, data_link, log_g = batch[mask], link_x[mask], np.log(granted[mask])
    data_passive = passive[mask]

    def jacobian(theta):
        """``∂ residuals / ∂ θ``, dense ``(residuals, 4k + 4)``: analytic in the per-model
        parameters, ``γ`` and ``κ`` (with ``u = t_0·g^(−β)``, ``v = t_1·B·g^(−α)``,
        ``d = κ·t_0`` for a task waiting passively, else 0, ``S = u + v + d``:
        ``∂ log P/∂ log t_0 = −(u + d)/S``, ``∂/∂ log t_1 = −v/S``, ``∂/∂α = v·ln g / S``,
        ``∂/∂β = u·ln g / S``, ``∂/∂γ = −x``, ``∂/∂ log κ = −d/S``), one-sided differences for the two sharing
        weights (:func:`sharing_rate`, piecewise rational in them). A residual depends on one
        model's four parameters only, so this costs about three residual evaluations where
        scipy's finite differences over all ``4k + 4`` parameters cost ``4k + 4``."""
        t0, t1, alpha, beta, w, escape, _gamma, kappa = unpack(theta)
        u = t0[data_arch] * np.exp(-beta[data_arch] * log_g)
        v = t1[data_arch] * data_batch * np.exp(-alpha[data_arch] * log_g)
        d = np.where(data_passive, kappa * t0[data_arch], 0.0)
        total = u + v + d
        n_data = len(data_rows)
        jac = np.zeros((n_data + 2 * k + 2, 4 * k + 4))
        at = np.arange(n_data)
        jac[at, data_arch] = -(u + d) / total
        jac[at, k + data_arch] = -v / total
        jac[at, 2 * k + data_arch] = v * log_g / total
        jac[at, 3 * k + data_arch] = u * log_g / total
        jac[:n_data, 4 * k + 2] = -data_link
        jac[:n_data, 4 * k + 3] = -d / total
        if packed:
            base = log_rate(w, escape)[mask]
            for column in (4 * k, 4 * k + 1):  # w, escape_weight
                step = 1e-6 * max(1.0, abs(theta[column]))
                step = -step if theta[column] + step > upper[column] else step
                shifted = theta.copy()
                shifted[column] += step
                jac[:n_data, column] = (log_rate(*unpack(shifted)[4:6])[mask] - base) / step
        jac[n_data + np.arange(k), 2 * k + np.arange(k)] = _PHYSICAL_ALPHA_PRIOR[1]
        jac[n_data + k + np.arange(k), 3 * k + np.arange(k)] = _PHYSICAL_BETA_PRIOR[1]
        jac[n_data + 2 * k, 4 * k + 1] = _PHYSICAL_ESCAPE_PRIOR[1]
        jac[n_data + 2 * k + 1, 4 * k + 2] = _PHYSICAL_LINK_PRIOR[1]
        return jac

    theta0 = np.clip(theta0, lower + 1e-9, upper - 1e-9)
    weights = slice(4 * k, 4 * k + 2)
    if not packed:  # the weights only matter under packed placement
        lower[weights], upper[weights] = theta0[weights] - 1e-9, theta0[weights] + 1e-9
    if not passive.any():  # no task waited passively: κ stays where it is
        lower[4 * k + 3], upper[4 * k + 3] = theta0[4 * k + 3] - 1e-9, theta0[4 * k + 3] + 1e-9
    if not link:  # no measured round trip away from the reference: γ stays where it is
        lower[4 * k + 2], upper[4 * k + 2] = theta0[4 * k + 2] - 1e-9, theta0[4 * k + 2] + 1e-9
    solution = least_squares(residuals, theta0, jac=jacobian, bounds=(lower, upper), loss="soft_l1",
                             f_scale=_PHYSICAL_LOSS_SCALE)
    t0, t1, alpha, beta, w, escape, gamma, kappa = unpack(solution.x)
    solo = SoloTable(
        curves=dict(space.solo.curves), exponents={**space.solo.exponents, **dict(zip(names, map(float, alpha), strict=True))},
        flop_rate=space.solo.flop_rate, default_exponent=space.solo.default_exponent,
        laws={**space.solo.laws, **{n: (float(a), float(b)) for n, a, b in zip(names, t0, t1, strict=True)}},
        overhead_exponents={**space.solo.overhead_exponents, **dict(zip(names, map(float, beta), strict=True))},
    )
    return FeatureSpace(space.architectures, space.workloads, solo, space.cores, space.placement,
                        w if packed else space.sharing_weight, escape if packed else space.escape_weight,
                        space.reference_speed_index, space.reference_cross_core_rtt_ns,
                        gamma if link else space.link_exponent, kappa if passive.any() else space.passive_ratio)


def _fit_space(samples: Sequence[ProfiledTask], architectures: tuple[str, ...], workloads: dict[str, ModelWorkload],
               cores: int, placement: Placement, enc: EncodedMixes, measured: np.ndarray,
               reference_rtt: float | None = None) -> FeatureSpace:
    """The feature space with its physical tables fitted on ``samples`` / the configurations
    ``enc`` (measured throughputs ``measured``, ``enc``'s order): the :class:`SoloTable`, then
    the sharing weight on it, then the SoloTable again with that weight (it only changes the
    speeds inferred for models never measured alone), then all of them refined jointly on every
    measured task (:func:`fit_physical`), the link exponent with them when ``reference_rtt``
    (the cross-core round trip predictions are for) is given."""
    solo = SoloTable.from_samples(samples, workloads, cores, placement=placement)
    space = FeatureSpace(architectures, workloads, solo, cores, placement)
    weight = fit_sharing_weight(space, enc, measured)
    if weight != 1.0:
        solo = SoloTable.from_samples(samples, workloads, cores, placement=placement, sharing_weight=weight)
    space = FeatureSpace(architectures, workloads, solo, cores, placement, weight,
                         reference_cross_core_rtt_ns=reference_rtt)
    return fit_physical(space, enc, measured)


def _training_set(samples: Sequence[ProfiledTask], workloads: Mapping[str, ModelWorkload], cores: int,
                  placement: Placement) -> _TrainingSet:
    samples, reference_speed = normalise_speed(samples)
    mixes, Y, keys, RTT = _training_matrix(samples)
    missing = sorted({t.architecture for m in mixes for t in m} - set(workloads))
    if missing:
        raise PredictorError(f"workload features missing for {', '.join(missing)}")
    groups = np.array([mix_group(m) for m in mixes])
    n_groups = len(set(groups.tolist()))
    if len(mixes) < 10 or n_groups < 2:
        raise PredictorError(
            f"need at least 10 measured configurations of at least 2 different mixes, got "
            f"{len(mixes)} configurations of {n_groups} mix(es): profile longer"
        )
    architectures = tuple(sorted(workloads))
    workloads = {a: workloads[a] for a in architectures}
    enc = replace(encode_mixes(mixes, architectures), rtt=RTT)
    known_rtt = RTT[np.isfinite(RTT)]
    # The near placement: tasks beside others (x = 0) run as if their cores were near.
    reference_rtt = float(np.percentile(known_rtt, 10)) if known_rtt.size else None
    space = _fit_space(samples, architectures, workloads, cores, placement, enc, Y, reference_rtt)
    space.reference_speed_index = reference_speed
    X, order, baseline = space.features(enc)
    return _TrainingSet(
        samples=samples, keys=keys, mixes=mixes, space=space, enc=enc, X=X, order=order,
        measured=np.take_along_axis(Y, order, axis=1),
        baseline=np.take_along_axis(baseline, order, axis=1), groups=groups,
        memory=MemoryModel.fit(samples, workloads),
    )


@_one_native_thread
def fit_family(
    samples: Sequence[ProfiledTask], workloads: Mapping[str, ModelWorkload], *, cores: int, family: str,
    placement: Placement = "pooled", seed: int = 0,
) -> ThroughputPredictor:
    """Fit one model family on every sample, without cross-validation.

    Raises:
        PredictorError: as :func:`fit_predictor`, or an unknown family.
    """
    if family not in FAMILIES:
        raise PredictorError(f"unknown model family {family!r}; allowed: {', '.join(FAMILIES)}")
    ts = _training_set(samples, workloads, cores, placement)
    model = None
    if family != "baseline":
        model = _make_model(family, seed).fit(ts.X, ts.target)
    return ThroughputPredictor(family, ts.space, model, ts.memory)


@_one_native_thread
def fit_predictor(
    samples: Sequence[ProfiledTask],
    workloads: Mapping[str, ModelWorkload],
    *,
    cores: int,
    placement: Placement = "pooled",
    families: Sequence[str] = FAMILIES,
    folds: int = 5,
    partitions: int = 3,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[ThroughputPredictor, FitReport]:
    """Compare model families under repeated grouped cross-validation, keep the best, refit on all.

    Every family is cross-validated on the same ``partitions`` random partitions of the mixes
    into ``folds`` folds (``GroupKFold(shuffle=True)``, seeded ``seed``, ``seed + 1``, …), and
    its held-out error is taken over every held-out prediction of every partition. One
    partition is not enough: which mixes are held out together moves the figure by more than
    the families differ — on a 2-core sweep (65 configurations, 25 mixes) the same predictor
    scored 0.138 with scikit-learn's unshuffled partition and 0.141–0.155 (mean 0.148) with
    five shuffled ones.

    Args:
        samples: profile samples of one backend / device class.
        workloads: workload features of every model in ``samples`` (and any other model the
            predictor should know).
        cores: the device descriptor: allocation units of the device class (cores, SMs).
        placement: how shares land on the units (:meth:`FeatureSpace.contention`): ``packed``
            for the cpu backend, ``pooled`` for MPS.
        families: which of :data:`FAMILIES` to compare.
        folds: grouped CV folds (fewer if there are fewer mixes).
        partitions: how many random partitions into folds the error is taken over, ``>= 1``.
        progress: called with a line of text at each step.

    Returns:
        The fitted predictor and the report.

    Raises:
        PredictorError: fewer than 2 mixes or 10 configurations, workloads missing, an
            unknown family, or ``partitions < 1``.
    """
    from sklearn.model_selection import GroupKFold

    if partitions < 1:
        raise PredictorError(f"partitions must be at least 1, got {partitions}")
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise PredictorError(f"unknown model family {unknown[0] if unknown else None!r}; allowed: {', '.join(FAMILIES)}")
    ts = _training_set(samples, workloads, cores, placement)
    mask, target = ts.mask, ts.target
    mix_size = ts.enc.present.sum(axis=1)
    slices = np.take_along_axis(slice_labels(ts.space, ts.enc), ts.order, axis=1)[None]
    n_groups = len(set(ts.groups.tolist()))
    n_folds = min(folds, n_groups)
    reports = []
    heldout_by_family: dict[str, np.ndarray] = {}
    # The physical tables (SoloTable) are refitted inside every fold from its training rows.
    splits = [
        [(train, test, *ts.fold(train))
         for train, test in GroupKFold(n_splits=n_folds, shuffle=True, random_state=seed + p).split(ts.X, groups=ts.groups)]
        for p in range(partitions)
    ]
    measured = np.broadcast_to(ts.measured, (partitions, *ts.measured.shape))
    for family in families:
        say(f"cross-validating {family} ({n_folds} folds × {partitions} partitions, whole mixes held out)")
        t0 = time.perf_counter()
        pred = np.full(measured.shape, np.nan)
        for p, partition in enumerate(splits):
            for train, test, X, baseline in partition:
                if family == "baseline":
                    pred[p, test] = baseline[test]
                    continue
                residual = _residual(np.nan_to_num(ts.measured[train]), baseline[train], mask[train])
                model = _make_model(family, seed).fit(X[train], residual)
                pred[p, test] = _unresidual(np.asarray(model.predict(X[test])).reshape(len(test), MAX_MIX), baseline[test])
        pred = np.clip(pred, 1e-9, None)
        every = np.broadcast_to(mask, measured.shape)
        by_size = {}
        for k in sorted(set(mix_size.tolist())):
            sel = every & (mix_size[None, :, None] == k)
            if sel.any():
                by_size[int(k)] = rmsle(pred[sel], measured[sel])
        by_slice = {kind: rmsle(pred[every & (slices == kind)], measured[every & (slices == kind)])
                    for kind in sorted(set(slices[0][mask].tolist()))}
        reports.append(FamilyReport(family, rmsle(pred[every], measured[every]), mape(pred[every], measured[every]),
                                    time.perf_counter() - t0, by_size, by_slice))
        heldout_by_family[family] = pred[0]  # the scatter shows one held-out prediction per sample
        say(f"{family}: held-out RMSLE {reports[-1].rmsle:.4f}, MAPE {100 * reports[-1].mape:.1f} %")
    kept = min(reports, key=lambda r: r.rmsle).family
    say(f"refitting {kept} on all {len(ts.mixes)} configurations")
    model = None
    if kept != "baseline":
        model = _make_model(kept, seed).fit(ts.X, target)
    predictor = ThroughputPredictor(kept, ts.space, model, ts.memory)
    pred = heldout_by_family[kept]
    canonical_arch = np.take_along_axis(ts.enc.arch, ts.order, axis=1)
    heldout = [
        {"architecture": ts.space.architectures[canonical_arch[r, s]], "mix_size": int(mix_size[r]),
         "measured_sps": float(ts.measured[r, s]), "predicted_sps": float(pred[r, s]), "slice": str(slices[0, r, s])}
        for r, s in zip(*np.nonzero(mask), strict=True)
    ]
    report = FitReport(
        samples=int(mask.sum()), configurations=len(ts.mixes), groups=n_groups, folds=n_folds, partitions=partitions,
        families=reports, kept=kept, heldout=heldout, fit_seconds=time.perf_counter() - started,
    )
    return predictor, report
