"""A task's speed on its own slice of the device: the per-iteration time law and
:class:`SoloTable` (``P_solo(model, B, g)``), before what co-located tasks take from it.

Generic: the slice is a granted fraction ``g`` of the device; how shares become fractions and
what co-located tasks leave a task come from the physics
(:mod:`controlplane.planning.predictor.physics`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from controlplane.planning.predictor.physics import granted_fraction, physics_for
from controlplane.planning.predictor.samples import (
    MAX_MIX,
    BoolArray,
    FloatArray,
    ModelWorkload,
    PredictorError,
    ProfiledTask,
)


def slice_throughput(
    batch: FloatArray | float,
    granted: FloatArray | float,
    t0: FloatArray | float,
    t1: FloatArray | float,
    alpha: FloatArray | float,
    beta: FloatArray | float,
    delta: FloatArray | float = 0.0,
) -> FloatArray:
    """Throughput (samples/s) of a task on a granted fraction ``g`` of the device, before what
    co-located tasks take from it: ``B / (t_0·g^(−β) + t_1·B·g^(−α) + δ)``, per-iteration
    overhead ``t_0`` and per-sample time ``t_1`` (seconds at ``g = 1``), each scaled by its own
    exponent (:meth:`SoloTable.lookup`), and ``δ`` seconds per iteration of sleeping at the
    intra-op barriers (0 unless the task's threads wait passively,
    :attr:`controlplane.planning.predictor.physics.SlotTerms.passive`). Broadcasts over NumPy
    arrays."""
    return np.asarray(batch / (t0 * granted**-beta + t1 * batch * granted**-alpha + delta), dtype=float)


def _sample_arrays(samples: Sequence[ProfiledTask]) -> tuple[FloatArray, BoolArray]:
    """Each sample's mix as ``(n, w)`` shares and presence, ``w`` the largest mix (mixes
    truncated to :data:`MAX_MIX`)."""
    width = min(MAX_MIX, max((len(s.mix) for s in samples), default=1))
    share = np.zeros((len(samples), width))
    present = np.zeros((len(samples), width), dtype=bool)
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
    law's value. On a 2-core sweep: mobilenet_v3_small measured 142 samples/s alone at
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


def law_from_curve(pts: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(t_0, t_1)`` seconds of ``1/P = t_0/B + t_1`` through standalone points ``(B, P)``
    (samples/s; least squares on ``1/P`` against ``1/B``, both kept at least 5 % of the
    fastest point's ``1/P``, ``t_0`` times the smallest batch)."""
    b = np.array([p[0] for p in pts], dtype=float)
    inv = 1.0 / np.array([p[1] for p in pts], dtype=float)
    if len(pts) >= 2 and np.ptp(b) > 0:
        slope, intercept = np.polyfit(1.0 / b, inv, 1)
    else:
        slope, intercept = 0.5 * inv[0] * b[0], 0.5 * inv[0]
    floor = 0.05 * float(np.min(inv))
    return max(float(slope), floor * float(np.min(b))), max(float(intercept), floor)


@dataclass
class SoloTable:
    """``P_solo(model, B, g)``: a task's throughput alone on the device with a granted fraction
    ``g`` of it — ``P_alone(model, B) · g^α_model`` as built here from the samples, and
    ``B / (t_0·g^(−β) + t_1·B·g^(−α) + δ)`` once the physical fit
    (:func:`controlplane.planning.predictor.physical.fit_physical`) has set the model's law and
    both exponents (:meth:`lookup`; ``δ = κ·t_0`` for a task waiting passively, else 0).

    ``P_alone`` (``g = 1``) comes from the measured standalone speeds (and 1-task mixes at a
    share granted the whole device); along the batch size it interpolates linearly in
    ``(log B, log P)`` (throughput grows sub-linearly with the batch) and extends the end slopes,
    clipped to ``[0, 1]``. Standalone points that break the per-iteration time law (throughput
    growing faster than the batch) are repaired first (:func:`_repair_standalone`).

    ``α_model`` (how well the model scales with its slice: 1 for perfectly, below 1 when a
    smaller slice is used more efficiently, below 0 when one core is faster than several, as
    for small CNNs whose intra-op threads spend more on synchronisation than they gain) is the
    least-squares slope through the origin of ``log(P / P_alone)`` against ``log g`` over every
    sample of the model granted less than the device *and alone on its units*
    (:meth:`Physics.alone <controlplane.planning.predictor.physics.Physics.alone>`: 1-task mixes,
    and on the cpu backend tasks of larger mixes whose cores no other task uses), clipped to
    ``[-1, 1.5]``; without such samples the median of the other models' ``α`` (1 if none).

    A model never measured alone is estimated from its samples in mixes, each divided by what
    the mix leaves it (the physics' sharing rate with ``sharing_weight``) and by ``g^α``
    (geometric mean per batch size, then the same interpolation); with no samples at all, from
    its training FLOPs and the device's median FLOP rate over measured models
    (``P_alone ≈ rate / F``).
    """

    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    exponents: dict[str, float] = field(default_factory=dict)
    flop_rate: float | None = None
    default_exponent: float = 1.0
    laws: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``(t_0, t_1)`` seconds per model: ``P_alone(B) = 1 / (t_0/B + t_1)``, set by the
    physical fit; where present it replaces the model's interpolated curve."""
    overhead_exponents: dict[str, float] = field(default_factory=dict)
    """``β`` per model, set by the physical fit with ``laws``: how the per-iteration
    overhead ``t_0`` scales with the slice, while the per-sample time ``t_1`` scales with
    ``α`` (:meth:`lookup`)."""

    @classmethod
    def from_samples(
        cls,
        samples: Iterable[ProfiledTask],
        workloads: Mapping[str, ModelWorkload],
        units: int,
        placement: str = "pooled",
        sharing_weight: float = 1.0,
    ) -> SoloTable:
        """Build the table from profile samples of a device of ``units`` allocation units whose
        shares land as the physics ``placement`` lays them (see the class docstring).

        Raises:
            PredictorError: an unknown ``placement``.
        """
        physics = physics_for(placement)
        samples = [s for s in samples if s.throughput_sps and s.throughput_sps > 0 and len(s.mix) <= MAX_MIX]
        share, present = _sample_arrays(samples)
        idx = np.array([s.task_index for s in samples], dtype=np.int64)[:, None]
        if samples:
            rate = np.take_along_axis(physics.sharing_rate(share, present, units, sharing_weight), idx, axis=1)[:, 0]
            alone = np.take_along_axis(physics.alone(share, present, units), idx, axis=1)[:, 0]
        else:
            rate, alone = np.zeros(0), np.zeros(0, dtype=bool)
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
        for arch, log_pts in by_arch.items():
            x = np.array([a for a, _ in log_pts])
            y = np.array([b for _, b in log_pts])
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

    def alone(self, architecture: str, batch: FloatArray, workloads: Mapping[str, ModelWorkload]) -> FloatArray:
        """``P_alone`` (samples/s): the model alone on the whole device at each batch size.

        Raises:
            PredictorError: the model was never measured alone and has no workload features.
        """
        batch = np.asarray(batch, dtype=float)
        laws: dict[str, tuple[float, float]] = getattr(self, "laws", {})  # tables pickled before laws existed
        law = laws.get(architecture)
        if law is not None:
            by_law: FloatArray = 1.0 / (law[0] / batch + law[1])
            return by_law
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
        out: FloatArray = np.exp(y)
        return out

    def lookup(
        self,
        architecture: str,
        batch: FloatArray,
        granted: FloatArray,
        workloads: Mapping[str, ModelWorkload],
        passive: BoolArray | None = None,
        passive_ratio: float = 0.0,
    ) -> FloatArray:
        """``P_solo`` (samples/s) at arrays of batch sizes and granted fractions ``g``.

        ``passive`` (bool, ``batch``'s shape; ``None``: none) marks the tasks whose threads
        wait passively (:attr:`SlotTerms.passive <controlplane.planning.predictor.physics.SlotTerms>`);
        each pays ``δ = passive_ratio · t_0`` seconds more per iteration (``passive_ratio`` is
        ``κ``, ``FeatureSpace.passive_ratio``). Both are ignored for a model without a fitted law.

        With a fitted law the two parts of an iteration's time scale with the slice
        separately, ``P_solo = B / (t_0·g^(−β) + t_1·B·g^(−α) + δ)``: the per-sample work
        (convolutions over the batch) splits well over a slice's threads, the per-iteration
        overhead (Python, the optimizer's small per-tensor kernels) hardly, so a slice's
        speed-up grows with the batch size — Amdahl's law with a batch-dependent parallel
        fraction. Measured on a 2-core host, 2 threads against 1: resnet18 1.59× at batch 16,
        1.92× at 256; mobilenet_v3_small 1.33× and 1.48×. Without a law:
        ``P_alone(B) · g^α``.

        Raises:
            PredictorError: as :meth:`alone`.
        """
        granted = np.asarray(granted, dtype=float)
        laws: dict[str, tuple[float, float]] = getattr(self, "laws", {})  # tables pickled before laws existed
        betas: dict[str, float] = getattr(self, "overhead_exponents", {})
        law = laws.get(architecture)
        beta = betas.get(architecture)
        if law is None or beta is None:
            scaled: FloatArray = self.alone(architecture, batch, workloads) * granted ** self.exponent(architecture)
            return scaled
        delta: FloatArray | float = 0.0 if passive is None else np.where(passive, passive_ratio * law[0], 0.0)
        return slice_throughput(
            np.asarray(batch, dtype=float), granted, law[0], law[1], self.exponent(architecture), beta, delta
        )
