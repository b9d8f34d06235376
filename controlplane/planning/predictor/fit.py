"""Fitting: profile samples grouped into configurations, the model families compared under
repeated grouped cross-validation (whole mixes held out), the best kept and refitted on all.

The physical tables are refitted inside every fold from its training mixes only
(:meth:`TrainingSet.fold`), so no held-out measurement (a held-out standalone speed included)
reaches its baseline. Fitting holds BLAS and OpenMP to one thread (:data:`one_native_thread`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from controlplane.planning.predictor.encoding import (
    EncodedMixes,
    FeatureSpace,
    encode_mixes,
)
from controlplane.planning.predictor.families import (
    FAMILIES,
    make_model,
    mape,
    residual,
    rmsle,
    unresidual,
)
from controlplane.planning.predictor.memory import MemoryModel
from controlplane.planning.predictor.model import ThroughputPredictor
from controlplane.planning.predictor.physical import fit_space
from controlplane.planning.predictor.physics import physics_for
from controlplane.planning.predictor.samples import (
    LEGACY_MAX_MIX,
    MAX_MIX,
    BoolArray,
    FloatArray,
    IntArray,
    MixTask,
    ModelWorkload,
    PredictorError,
    ProfiledTask,
    StrArray,
    host_seconds_per_op,
    normalise_speed,
)

one_native_thread: Callable[[Callable[..., Any]], Callable[..., Any]] = threadpool_limits.wrap(limits=1)
"""Decorator: the call runs with BLAS and OpenMP held to one thread each. A predictor is fitted
on a few hundred configurations, where native thread pools only add hand-offs, and their
threads spin while they wait, so beside any other busy process (another test worker, a
profiling sweep, a training run) they fight it for the cores: on a 2-core machine,
cross-validating gradient boosting on a kept sweep took 8.0 s alone and did not finish in 280 s
beside a 2-thread torch loop; with one thread, 5.4 s alone and 6.6 s beside the loop. The
forests parallelise over trees on joblib's own threads, which this leaves alone; prediction
keeps the caller's settings."""


def slice_labels(space: FeatureSpace, enc: EncodedMixes) -> StrArray:
    """What kind of slice each task runs on, ``(n, w)`` strings in the caller's order
    (``""`` in empty slots), named by the space's physics
    (:meth:`~controlplane.planning.predictor.physics.Physics.slice_labels`): on the cpu
    backend ``"<k> unit(s), alone|shared"``, on a GPU under MPS ``"within the device"`` or
    ``"oversubscribed"``. Used to break held-out error down."""
    return space.physics.slice_labels(enc.share, enc.present, space.cores)


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
    heldout: list[dict[str, Any]]
    fit_seconds: float
    partitions: int = 1
    """How many random partitions into ``folds`` folds the held-out figures are taken over."""


def _training_matrix(
    samples: Sequence[ProfiledTask],
) -> tuple[list[tuple[MixTask, ...]], FloatArray, list[str], FloatArray]:
    """Group samples into configurations: ``(mixes, Y (n, w) with nan where not measured,
    config keys, RTT (n, w) placement measurements with nan where unknown)``, ``w`` the largest
    mix, at least :data:`LEGACY_MAX_MIX` (the design matrix's slots,
    :attr:`FeatureSpace.slots`: a sweep of mixes of at most 4 fits the model it always did).
    Repeated measurements of a task average in log space, throughputs and round trips alike.
    Samples of more than :data:`MAX_MIX` tasks are left out."""
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
    width = max([LEGACY_MAX_MIX, *(len(m) for m in mixes.values())])
    Y = np.full((len(keys), width), np.nan)
    RTT = np.full((len(keys), width), np.nan)
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
class TrainingSet:
    """Samples grouped into configurations with the physical tables fitted on all of them: the
    rows every family is cross-validated and refitted on (arrays ``(n, slots)`` in canonical
    slot order, ``order`` mapping it to ``enc``'s)."""

    samples: list[ProfiledTask]
    keys: list[str]
    """Config key of each row."""
    mixes: list[tuple[MixTask, ...]]
    space: FeatureSpace
    enc: EncodedMixes
    X: FloatArray
    order: IntArray
    measured: FloatArray
    """Throughput (samples/s), ``nan`` where not measured."""
    baseline: FloatArray
    """The physical baseline's throughput (samples/s)."""
    groups: StrArray
    memory: MemoryModel

    @property
    def mask(self) -> BoolArray:
        """Where a throughput was measured."""
        mask: BoolArray = ~np.isnan(self.measured)
        return mask

    @property
    def target(self) -> FloatArray:
        """The learned families' target (:func:`~controlplane.planning.predictor.families.residual`)."""
        return residual(np.nan_to_num(self.measured), self.baseline, self.mask)

    def fold(self, train: IntArray) -> tuple[FloatArray, FloatArray]:
        """``(X, baseline)`` of every row with the physical tables fitted on the rows ``train``
        only, so a held-out mix's measurements never reach its own baseline.

        The :class:`~controlplane.planning.predictor.solo.SoloTable` sees the samples of the
        training configurations; of those, a ``standalone_sps`` is kept only when the model's
        own 1-task group (``mix_group`` of the model alone) is a training group too: a sweep
        fills ``standalone_sps`` from the 1-task full-share configuration of that model and
        batch size, so for a held-out 1-task group it would be the held-out target itself.
        """
        train_keys = {self.keys[r] for r in train}
        train_groups = set(self.groups[train].tolist())
        fold_samples = [
            s
            if s.standalone_sps is None or s.mix[s.task_index].architecture in train_groups
            else ProfiledTask(s.config_key, s.mix, s.task_index, s.throughput_sps, None, s.peak_memory_bytes)
            for s in self.samples
            if s.config_key in train_keys
        ]
        sp = self.space
        rows = np.asarray(train)
        train_enc = self.enc.rows(rows)
        Y = np.empty_like(self.measured)
        np.put_along_axis(Y, self.order, self.measured, axis=1)
        space = fit_space(
            fold_samples,
            sp.architectures,
            sp.workloads,
            sp.cores,
            sp.placement,
            train_enc,
            Y[rows],
            sp.reference_cross_core_rtt_ns,
            sp.host_s_per_op,
        )
        X, order, baseline = space.features(self.enc)
        if not (order == self.order).all():  # the canonical order does not depend on the tables
            raise AssertionError("the canonical slot order changed with the physical tables")
        fold_baseline: FloatArray = np.take_along_axis(baseline, order, axis=1)
        return X, fold_baseline


def training_set(
    samples: Sequence[ProfiledTask], workloads: Mapping[str, ModelWorkload], cores: int, placement: str
) -> TrainingSet:
    """Samples speed-normalised (:func:`normalise_speed`), grouped into configurations and
    encoded, with the physical tables fitted on all of them.

    Raises:
        PredictorError: workloads missing, fewer than 10 configurations or 2 mixes, or an
            unknown ``placement``.
    """
    physics = physics_for(placement)
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
    known = {a: workloads[a] for a in architectures}
    enc = replace(encode_mixes(mixes, architectures, width=RTT.shape[1]), rtt=RTT)
    reference_rtt = physics.link_reference(RTT[np.isfinite(RTT)])
    space = fit_space(
        samples, architectures, known, cores, placement, enc, Y, reference_rtt, host_seconds_per_op(samples, known)
    )
    space.reference_speed_index = reference_speed
    X, order, baseline = space.features(enc)
    return TrainingSet(
        samples=samples,
        keys=keys,
        mixes=mixes,
        space=space,
        enc=enc,
        X=X,
        order=order,
        measured=np.take_along_axis(Y, order, axis=1),
        baseline=np.take_along_axis(baseline, order, axis=1),
        groups=groups,
        memory=MemoryModel.fit(samples, known),
    )


@one_native_thread
def fit_family(
    samples: Sequence[ProfiledTask],
    workloads: Mapping[str, ModelWorkload],
    *,
    cores: int,
    family: str,
    placement: str = "pooled",
    seed: int = 0,
) -> ThroughputPredictor:
    """Fit one model family on every sample, without cross-validation.

    Raises:
        PredictorError: as :func:`fit_predictor`, or an unknown family.
    """
    if family not in FAMILIES:
        raise PredictorError(f"unknown model family {family!r}; allowed: {', '.join(FAMILIES)}")
    ts = training_set(samples, workloads, cores, placement)
    model = None
    if family != "baseline":
        model = make_model(family, seed).fit(ts.X, ts.target)
    return ThroughputPredictor(family, ts.space, model, ts.memory)


@one_native_thread
def fit_predictor(
    samples: Sequence[ProfiledTask],
    workloads: Mapping[str, ModelWorkload],
    *,
    cores: int,
    placement: str = "pooled",
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
        placement: the physics shares land by
            (:func:`~controlplane.planning.predictor.physics.placement_for_backend`):
            ``packed`` for the cpu backend, ``pooled`` for MPS.
        families: which of :data:`FAMILIES` to compare.
        folds: grouped CV folds (fewer if there are fewer mixes).
        partitions: how many random partitions into folds the error is taken over, ``>= 1``.
        seed: seeds the partitions and the learned families.
        progress: called with a line of text at each step.

    Returns:
        The fitted predictor and the report.

    Raises:
        PredictorError: fewer than 2 mixes or 10 configurations, workloads missing, an
            unknown family or placement, or ``partitions < 1``.
    """
    if partitions < 1:
        raise PredictorError(f"partitions must be at least 1, got {partitions}")
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise PredictorError(
            f"unknown model family {unknown[0] if unknown else None!r}; allowed: {', '.join(FAMILIES)}"
        )
    ts = training_set(samples, workloads, cores, placement)
    mask, target = ts.mask, ts.target
    mix_size = ts.enc.present.sum(axis=1)
    slices = np.take_along_axis(slice_labels(ts.space, ts.enc), ts.order, axis=1)[None]
    n_groups = len(set(ts.groups.tolist()))
    n_folds = min(folds, n_groups)
    splits = _partitions(ts, n_folds, partitions, seed)
    reports, heldout_by_family = _compare_families(ts, families, splits, mix_size, slices, seed, say)
    kept = min(reports, key=lambda r: r.rmsle).family
    say(f"refitting {kept} on all {len(ts.mixes)} configurations")
    model = None
    if kept != "baseline":
        model = make_model(kept, seed).fit(ts.X, target)
    predictor = ThroughputPredictor(kept, ts.space, model, ts.memory)
    report = FitReport(
        samples=int(mask.sum()),
        configurations=len(ts.mixes),
        groups=n_groups,
        folds=n_folds,
        partitions=partitions,
        families=reports,
        kept=kept,
        heldout=_heldout_rows(ts, heldout_by_family[kept], mix_size, slices),
        fit_seconds=time.perf_counter() - started,
    )
    return predictor, report


_Split = tuple[IntArray, IntArray, FloatArray, FloatArray]
"""One fold: training rows, held-out rows, and the features and baseline (``(n, slots)``) of
every row with the physical tables refitted on the training rows (:meth:`TrainingSet.fold`)."""


def _partitions(ts: TrainingSet, n_folds: int, partitions: int, seed: int) -> list[list[_Split]]:
    """``partitions`` random partitions of ``ts``'s mixes into ``n_folds`` folds, whole mixes held
    out together (``GroupKFold(shuffle=True)`` seeded ``seed + p``), each fold with its features."""
    # deferred: sklearn.model_selection is heavy to import and only a fit needs it.
    from sklearn.model_selection import GroupKFold

    # The physical tables (SoloTable) are refitted inside every fold from its training rows.
    return [
        [
            (train, test, *ts.fold(train))
            for train, test in GroupKFold(n_splits=n_folds, shuffle=True, random_state=seed + p).split(
                ts.X, groups=ts.groups
            )
        ]
        for p in range(partitions)
    ]


def _compare_families(
    ts: TrainingSet,
    families: Sequence[str],
    splits: list[list[_Split]],
    mix_size: IntArray,
    slices: StrArray,
    seed: int,
    say: Callable[[str], None],
) -> tuple[list[FamilyReport], dict[str, FloatArray]]:
    """Cross-validate every family on the same partitions ``splits``: its report, and its
    held-out predictions of the first partition (``(n, slots)``, for the scatter)."""
    n_folds, partitions = len(splits[0]), len(splits)
    reports = []
    heldout_by_family: dict[str, FloatArray] = {}
    measured = np.broadcast_to(ts.measured, (partitions, *ts.measured.shape))
    for family in families:
        say(f"cross-validating {family} ({n_folds} folds × {partitions} partitions, whole mixes held out)")
        t0 = time.perf_counter()
        pred = _heldout_predictions(family, ts, splits, measured.shape, seed)
        reports.append(_family_report(family, pred, measured, ts.mask, mix_size, slices, t0))
        heldout_by_family[family] = pred[0]  # the scatter shows one held-out prediction per sample
        say(f"{family}: held-out RMSLE {reports[-1].rmsle:.4f}, MAPE {100 * reports[-1].mape:.1f} %")
    return reports, heldout_by_family


def _heldout_predictions(
    family: str, ts: TrainingSet, splits: list[list[_Split]], shape: tuple[int, ...], seed: int
) -> FloatArray:
    """``family``'s held-out prediction of every task of every partition, ``shape`` =
    ``(partitions, n, slots)`` samples/s (floored at 1e-9; ``nan`` where no task): a learned family
    fits the residual over the fold's baseline on the fold's training rows."""
    mask = ts.mask
    pred = np.full(shape, np.nan)
    for p, partition in enumerate(splits):
        for train, test, X, baseline in partition:
            if family == "baseline":
                pred[p, test] = baseline[test]
                continue
            learned = residual(np.nan_to_num(ts.measured[train]), baseline[train], mask[train])
            model = make_model(family, seed).fit(X[train], learned)
            pred[p, test] = unresidual(
                np.asarray(model.predict(X[test])).reshape(len(test), ts.space.slots), baseline[test]
            )
    clipped: FloatArray = np.clip(pred, 1e-9, None)
    return clipped


def _family_report(
    family: str,
    pred: FloatArray,
    measured: FloatArray,
    mask: BoolArray,
    mix_size: IntArray,
    slices: StrArray,
    started: float,
) -> FamilyReport:
    """A family's held-out errors over every partition: overall, by mix size and by slice kind;
    ``started`` is when its cross-validation began (``time.perf_counter``)."""
    every = np.broadcast_to(mask, measured.shape)
    by_size = {}
    for k in sorted(set(mix_size.tolist())):
        sel = every & (mix_size[None, :, None] == k)
        if sel.any():
            by_size[int(k)] = rmsle(pred[sel], measured[sel])
    by_slice = {
        kind: rmsle(pred[every & (slices == kind)], measured[every & (slices == kind)])
        for kind in sorted(set(slices[0][mask].tolist()))
    }
    return FamilyReport(
        family,
        rmsle(pred[every], measured[every]),
        mape(pred[every], measured[every]),
        time.perf_counter() - started,
        by_size,
        by_slice,
    )


def _heldout_rows(ts: TrainingSet, pred: FloatArray, mix_size: IntArray, slices: StrArray) -> list[dict[str, Any]]:
    """The report's scatter: one row per measured task, its held-out prediction ``pred``
    (``(n, slots)``, the first partition's) beside what was measured."""
    canonical_arch = np.take_along_axis(ts.enc.arch, ts.order, axis=1)
    return [
        {
            "architecture": ts.space.architectures[canonical_arch[r, s]],
            "mix_size": int(mix_size[r]),
            "measured_sps": float(ts.measured[r, s]),
            "predicted_sps": float(pred[r, s]),
            "slice": str(slices[0, r, s]),
        }
        for r, s in zip(*np.nonzero(ts.mask), strict=True)
    ]
