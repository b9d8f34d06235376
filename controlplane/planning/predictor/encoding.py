"""Mix encoding: configurations as arrays, and the design matrix the learned families read.

Yu et al. 2022 (Eq. 2; docs/DESIGN.md §1) learn ``(P_1, …, P_I) = Pre((F_1·B_1, R_1), …,
(F_I·B_I, R_I))``. A configuration (a mix of 1 to :data:`MAX_MIX` tasks) becomes one row: the
tasks are put in a canonical order (descending ``F·B``, then share, then model name), so the
model cannot depend on the order tasks are listed in, and padded with empty slots to the
space's :attr:`FeatureSpace.slots` (4, or the largest mix it was fitted on; every column of an
empty slot is 0, so how many empty slots follow changes nothing the physics computes). Each
slot holds the paper's ``(log F·B, R)`` plus the bytes the task moves per iteration, its
parameter count, its granted fraction, how many tasks compete for its slice, its standalone
speed on its slice, the physical baseline's prediction and its host launch time (issue 31:
``log(ops_per_step × host seconds per operation)``, what a host-bound GPU step costs whatever
its batch size); a few mix-level totals and the device descriptor (its allocation units) follow. The physics of the device's backend family
(:mod:`controlplane.planning.predictor.physics`) supplies everything that depends on where
shares land.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.planning.predictor.physics import (
    Physics,
    granted_fraction,
    physics_for,
)
from controlplane.planning.predictor.samples import (
    LEGACY_MAX_MIX,
    MAX_MIX,
    BoolArray,
    FloatArray,
    IntArray,
    MixTask,
    ModelWorkload,
    PredictorError,
)
from controlplane.planning.predictor.solo import SoloTable

SLOT_FEATURES = (
    "present",
    "log_flops_per_iter",
    "log_bytes_per_iter",
    "log_params",
    "share",
    "granted",
    "contention",
    "worst_contention",
    "log_solo",
    "log_baseline",
    "log_host_launch_s",
)
"""The columns of each slot in the design matrix (:meth:`FeatureSpace.features`) of a space
with a host time per operation (:attr:`FeatureSpace.host_s_per_op`)."""
LEGACY_SLOT_FEATURES = SLOT_FEATURES[:-1]
"""The slot columns of a space fitted before issue 31 (no host launch term): such a predictor
keeps predicting from exactly these."""
MIX_FEATURES = ("mix_size", "share_sum", "granted_sum", "log_flops_sum", "log_bytes_sum", "cores")
"""The mix-level columns after the slots."""


@dataclass
class EncodedMixes:
    """Configurations as ``(n, w)`` arrays in the caller's task order, ``w`` slots (:attr:`width`,
    at least the largest configuration's task count, at most :data:`MAX_MIX` for the predictor
    to answer).

    ``arch`` holds indices into ``architectures`` (-1 for an empty slot); ``batch`` and
    ``share`` are 0 in empty slots. ``rtt`` holds each task's placement measurement (the cpu
    backend's cross-core round trip, ns), ``nan`` where unknown — always for a configuration to
    predict, which is then predicted at the reference placement
    (:attr:`FeatureSpace.reference_cross_core_rtt_ns`); ``None``: unknown everywhere.
    """

    architectures: tuple[str, ...]
    arch: IntArray
    batch: FloatArray
    share: FloatArray
    rtt: FloatArray | None = None

    def rows(self, rows: IntArray | BoolArray) -> EncodedMixes:
        """The configurations ``rows`` (an index or boolean array) only."""
        return EncodedMixes(
            self.architectures,
            self.arch[rows],
            self.batch[rows],
            self.share[rows],
            None if self.rtt is None else self.rtt[rows],
        )

    @property
    def present(self) -> BoolArray:
        """``(n, w)``: which slots hold a task."""
        present: BoolArray = self.arch >= 0
        return present

    @property
    def width(self) -> int:
        """``w``: the slots of every row."""
        return int(self.arch.shape[1])

    @property
    def mix_sizes(self) -> IntArray:
        """``(n,)``: how many tasks each configuration holds."""
        sizes: IntArray = self.present.sum(axis=1)
        return sizes


def encode_mixes(
    mixes: Sequence[Sequence[MixTask]], architectures: Sequence[str], width: int | None = None
) -> EncodedMixes:
    """Turn configurations into arrays (see :class:`EncodedMixes`) of ``width`` slots (``None``:
    the largest configuration's task count, at least 1).

    Raises:
        PredictorError: a configuration is empty, has more than :data:`MAX_MIX` tasks or more
            than ``width``, or a model is not in ``architectures``.
    """
    index = {a: i for i, a in enumerate(architectures)}
    n = len(mixes)
    for mix in mixes:
        if not 1 <= len(mix) <= MAX_MIX:
            raise PredictorError(
                f"a configuration holds 1 to {MAX_MIX} tasks (the most the predictor plans on one device), "
                f"got {len(mix)}"
            )
    w = max((len(m) for m in mixes), default=1) if width is None else width
    if any(len(m) > w for m in mixes):
        raise PredictorError(f"a configuration of {max(len(m) for m in mixes)} tasks does not fit {w} slots")
    arch = np.full((n, w), -1, dtype=np.int64)
    batch = np.zeros((n, w))
    share = np.zeros((n, w))
    for r, mix in enumerate(mixes):
        for s, task in enumerate(mix):
            if task.architecture not in index:
                raise PredictorError(
                    f"model {task.architecture!r} is unknown to the predictor; known: {', '.join(architectures)}"
                )
            arch[r, s], batch[r, s], share[r, s] = index[task.architecture], task.batch_size, task.share
    return EncodedMixes(tuple(architectures), arch, batch, share)


@dataclass
class FeatureSpace:
    """What the encoder knows about models and the device class: workloads, standalone speeds,
    the device descriptor, the physics shares land by, and that physics' fitted parameters."""

    architectures: tuple[str, ...]
    workloads: dict[str, ModelWorkload]
    solo: SoloTable
    cores: int
    """The device's allocation units (CPU cores on the cpu backend, SMs on a GPU)."""
    placement: str = "pooled"
    """The name of the physics (:data:`controlplane.planning.predictor.physics.PHYSICS`)."""
    sharing_weight: float = 1.0
    """``weight`` of the physics' sharing rate: how much of the time a multi-threaded task's
    thread is runnable on a shared unit (fitted by
    :func:`~controlplane.planning.predictor.physical.fit_sharing_weight`; ignored by physics
    without weighted sharing)."""
    escape_weight: float | None = None
    """The same for a multi-threaded task that has a unit of its own, fitted by
    :func:`~controlplane.planning.predictor.physical.fit_physical`; ``None``: the same as
    ``sharing_weight``."""
    reference_speed_index: float | None = None
    """The host speed predictions are for
    (:func:`~controlplane.planning.predictor.samples.normalise_speed`), ``None`` if the
    training samples had no speed index."""
    reference_cross_core_rtt_ns: float | None = None
    """The placement predictions are for (:meth:`Physics.link_reference`); ``None``: no link
    term."""
    link_exponent: float = 0.0
    """``γ`` of the link term ``exp(−γ·x)`` (:meth:`link_log_ratio`), fitted by the physical fit."""
    passive_ratio: float = 0.0
    """``κ``: a task whose threads wait passively (:attr:`SlotTerms.passive`) spends
    ``δ = κ·t_0`` more per iteration (:func:`~controlplane.planning.predictor.solo.slice_throughput`),
    fitted by the physical fit."""
    # The three below default to what a space pickled before issue 22 was: a dataclass field's
    # default is a class attribute, so an old pickle without them reads these.
    slots: int = LEGACY_MAX_MIX
    """The slots of the design matrix (:meth:`features`): at least :data:`LEGACY_MAX_MIX`, else
    the largest mix fitted on (set by
    :func:`~controlplane.planning.predictor.physical.fit_space`). A learned family corrects
    configurations of up to this many tasks; larger ones get the physical baseline alone."""
    max_mix: int = LEGACY_MAX_MIX
    """The most tasks a configuration may hold for this space to answer: :data:`MAX_MIX` for a
    space fitted since issue 22, :data:`LEGACY_MAX_MIX` for one fitted before (refit it to plan
    larger mixes)."""
    max_fitted_mix: int | None = None
    """The largest configuration the space was fitted on (tasks); ``None``: fitted before this
    was recorded (then at most :data:`LEGACY_MAX_MIX`). Larger configurations are extrapolations."""
    host_s_per_op: float | None = None
    """Host seconds per dispatched operation on the device class
    (:func:`~controlplane.planning.predictor.samples.host_seconds_per_op`, set by
    :func:`~controlplane.planning.predictor.physical.fit_space`): each slot's
    ``log_host_launch_s`` is ``log(ops_per_step × host_s_per_op)``. ``None``: a space fitted
    before issue 31 (or built by hand), whose design matrix has :data:`LEGACY_SLOT_FEATURES`."""

    @property
    def slot_features(self) -> tuple[str, ...]:
        """The slot columns of :meth:`features`: :data:`SLOT_FEATURES`, or
        :data:`LEGACY_SLOT_FEATURES` without a host time per operation."""
        return SLOT_FEATURES if getattr(self, "host_s_per_op", None) is not None else LEGACY_SLOT_FEATURES

    @property
    def physics(self) -> Physics:
        """The physics named by :attr:`placement`.

        Raises:
            PredictorError: an unknown placement.
        """
        return physics_for(self.placement)

    def spec(self) -> dict[str, object]:
        """A JSON description of the features (stored on the Predictor row)."""
        return {
            "max_mix": self.max_mix,
            "slots": self.slots,
            "max_fitted_mix": self.max_fitted_mix,
            "slot_features": list(self.slot_features),
            "mix_features": list(MIX_FEATURES),
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
            "host_s_per_op": getattr(self, "host_s_per_op", None),
        }

    def _per_arch(self, values: Callable[[str], float]) -> FloatArray:
        return np.array([values(a) for a in self.architectures] + [0.0])  # index -1 → 0

    def slot_arrays(self, enc: EncodedMixes) -> dict[str, npt.NDArray[Any]]:
        """Per-slot physical quantities, ``(n, w)`` each (``enc``'s width), in the caller's order:
        ``present``, ``flops`` and ``bytes`` per iteration, ``params``, ``granted`` fraction,
        ``solo`` (samples/s on its slice), ``contention`` and ``worst`` (tasks competing for
        its units), ``rate`` (what the others leave it), ``baseline`` (the physical
        prediction, samples/s; 0 in empty slots) and ``host_launch_s`` (``ops_per_step ×``
        :attr:`host_s_per_op`, seconds; 0 in empty slots, for a model whose operations were not
        counted, and without a host time per operation)."""
        present = enc.present
        flops = self._per_arch(lambda a: self.workloads[a].train_flops_per_sample)[enc.arch] * enc.batch
        bytes_ = self._per_arch(lambda a: self.workloads[a].activation_bytes_per_sample)[enc.arch] * enc.batch
        params = self._per_arch(lambda a: float(self.workloads[a].params))[enc.arch]
        host_s_per_op: float = getattr(self, "host_s_per_op", None) or 0.0  # getattr: pickled before it existed
        # getattr: workloads pickled before ops were counted
        ops = self._per_arch(lambda a: float(getattr(self.workloads[a], "ops_per_step", None) or 0))[enc.arch]
        granted = np.where(present, granted_fraction(enc.share, self.cores), 0.0)
        solo = np.ones(enc.arch.shape)
        physics = self.physics
        # One call: the prediction path of planners, 100,000 configurations a call.
        terms = physics.slot_terms(enc.share, present, self.cores)
        passive_ratio: float = getattr(self, "passive_ratio", 0.0)  # getattr: spaces pickled before it existed
        for i, name in enumerate(self.architectures):
            mask = enc.arch == i
            if mask.any():
                solo[mask] = self.solo.lookup(
                    name, enc.batch[mask], granted[mask], self.workloads, terms.passive[mask], passive_ratio
                )
        escape: float | None = getattr(self, "escape_weight", None)  # getattr: spaces pickled before it existed
        rate = physics.sharing_rate(enc.share, present, self.cores, self.sharing_weight, escape)
        gamma: float = getattr(self, "link_exponent", 0.0)  # getattr: spaces pickled before it existed
        baseline = solo * rate * np.exp(-gamma * self.link_log_ratio(enc))
        return {
            "present": present,
            "flops": flops,
            "bytes": bytes_,
            "params": params,
            "solo": solo,
            "granted": granted,
            "contention": terms.contention,
            "worst": terms.worst,
            "rate": rate,
            "baseline": np.where(present, baseline, 0.0),
            "host_launch_s": np.where(present, ops * host_s_per_op, 0.0),
        }

    def link_log_ratio(self, enc: EncodedMixes) -> FloatArray:
        """``x`` per slot, ``(n, w)``: the physics' placement term
        (:meth:`Physics.link_log_ratio`) of ``enc``'s measured ``rtt`` against
        :attr:`reference_cross_core_rtt_ns`; 0 for every configuration to predict."""
        reference: float | None = getattr(
            self, "reference_cross_core_rtt_ns", None
        )  # getattr: pickled before it existed
        return self.physics.link_log_ratio(enc.share, enc.present, self.cores, enc.rtt, reference)

    def contention(self, share: FloatArray, present: BoolArray) -> tuple[FloatArray, FloatArray]:
        """How many tasks compete for each task's slice, the mean over its units and the most
        on any one of them, each ``(rows, slots)`` as ``share``, at least 1 (:class:`SlotTerms`)."""
        terms = self.physics.slot_terms(share, present, self.cores)
        return terms.contention, terms.worst

    def canonical_order(self, enc: EncodedMixes, flops: FloatArray) -> IntArray:
        """``(n, w)`` slot permutation putting each row in canonical order (present
        slots first, by descending ``F·B``, then share, then model name)."""
        key_name = np.where(enc.present, enc.arch, len(self.architectures))
        order: IntArray = np.lexsort((key_name, -enc.share, -flops, ~enc.present), axis=1)
        return order

    def features(self, enc: EncodedMixes) -> tuple[FloatArray, IntArray, FloatArray]:
        """The design matrix, the canonical order and the baseline prediction.

        Returns:
            ``X`` of shape ``(n, slots · len(slot_features) + len(MIX_FEATURES))`` with
            :attr:`slots` slots whatever ``enc``'s width ``w`` (empty slots are zeros; a
            configuration of more than :attr:`slots` tasks loses its smallest tasks' columns, so
            its row must not reach a learned family), the ``(n, w)`` order (``X``'s slot ``s``
            is the caller's slot ``order[:, s]``), and the baseline throughput ``(n, w)``
            (samples/s) in the caller's order.
        """
        q = self.slot_arrays(enc)
        order = self.canonical_order(enc, q["flops"])

        def take(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            taken: npt.NDArray[Any] = np.take_along_axis(a, order, axis=1)
            return taken

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
        if self.slot_features is SLOT_FEATURES:
            launch = take(q["host_launch_s"])
            # log seconds (about -9 to -3); 0, as every column of an empty slot, where unknown
            slots.append(np.log(launch, out=np.zeros_like(launch), where=launch > 0))
        mix = [
            present.sum(axis=1),
            enc.share.sum(axis=1) / 100.0,
            q["granted"].sum(axis=1),
            np.log1p(q["flops"].sum(axis=1)),
            np.log1p(q["bytes"].sum(axis=1)),
            np.full(len(present), float(self.cores)),
        ]
        per_slot = np.stack(slots, axis=2)  # (n, w, len(slot_features))
        n, w, f = per_slot.shape
        k = self.slots
        if w < k:  # every feature of an empty slot is 0 (log1p(0) included)
            per_slot = np.concatenate([per_slot, np.zeros((n, k - w, f))], axis=1)
        elif w > k:
            per_slot = per_slot[:, :k]
        X = np.concatenate([per_slot.reshape(n, -1), np.stack(mix, axis=1)], axis=1)
        return X, order, q["baseline"]
