"""The throughput predictor: every co-located task's throughput from the whole mix at once.

Yu et al. 2022 (Eq. 2; docs/DESIGN.md §1) learn ``(P_1, …, P_I) = Pre((F_1·B_1, R_1), …,
(F_I·B_I, R_I))`` from profiled runs: ``F_i`` the per-sample workload of task ``i``'s model,
``B_i`` its batch size, ``R_i`` its share of the device (``active_thread_percentage``), ``P_i``
its throughput in samples/s. This package is that regression, pure NumPy, SciPy and
scikit-learn, split by concern:

* :mod:`.samples` — the input: configurations, workloads, profile samples, and the host speed
  correction (:func:`normalise_speed`: samples carrying a speed-probe reading are put at the
  median speed before anything is fitted, so a virtual machine's speed changes are not taken
  for contention).
* :mod:`.solo` — a task's speed on its own slice: the per-iteration time law
  ``t_0 + t_1·B`` with the overhead scaled by ``g^(−β)`` and the per-sample time by
  ``g^(−α)`` for the granted fraction ``g`` (:class:`SoloTable`).
* :mod:`.encoding` — a mix as one row in canonical slot order and the design matrix
  (:class:`FeatureSpace`); targets are ``log P − log P_baseline`` per slot, so the learned
  models correct the physical baseline.
* :mod:`.physical` — the physical baseline ``P_i = P_solo · ρ_i · exp(−γ·x_i)`` fitted jointly
  on every measured task (:func:`fit_physical`).
* :mod:`.families` — the learned families (random forest as in Horus, Yeung et al. 2021,
  gradient-boosted trees, extremely randomised trees) and the metrics.
* :mod:`.fit` — grouped cross-validation with whole mixes held out, the physical tables
  refitted inside every fold, the best family kept and refitted (:func:`fit_predictor`).
* :mod:`.memory` — peak memory per task (:class:`MemoryModel`).
* :mod:`.model` — the fitted :class:`ThroughputPredictor`, vectorised over ``(n, slots)``
  arrays, up to :data:`MAX_MIX` tasks a configuration (:meth:`ThroughputPredictor.predict_arrays`).
* :mod:`.physics` — each backend family's physics behind one interface
  (:class:`~.physics.Physics`): how shares land on the device's allocation units, what
  co-located tasks leave each other, passive waiting and the placement term. ``packed`` is
  the cpu backend's (core windows, the core link probe), ``pooled`` a GPU's under MPS (SM
  shares). Nothing outside :mod:`.physics` knows of cores or MPS.

Callers import from this package; the names below are its public surface.
"""

from __future__ import annotations

from controlplane.planning.predictor.encoding import (
    LEGACY_SLOT_FEATURES,
    MIX_FEATURES,
    SLOT_FEATURES,
    EncodedMixes,
    FeatureSpace,
    encode_mixes,
)
from controlplane.planning.predictor.families import FAMILIES, make_model, mape, rmsle
from controlplane.planning.predictor.fit import (
    FamilyReport,
    FitReport,
    fit_family,
    fit_predictor,
    mix_group,
    slice_labels,
)
from controlplane.planning.predictor.memory import MemoryModel
from controlplane.planning.predictor.model import ThroughputPredictor
from controlplane.planning.predictor.physical import fit_physical, fit_sharing_weight
from controlplane.planning.predictor.physics import (
    Physics,
    Placement,
    alone_on_units,
    granted_fraction,
    packed_windows,
    passive_wait,
    physics_for,
    placement_for_backend,
    sharing_rate,
)
from controlplane.planning.predictor.samples import (
    DEFAULT_HOST_S_PER_OP,
    LEGACY_MAX_MIX,
    MAX_MIX,
    MixTask,
    ModelWorkload,
    PredictorError,
    ProfiledTask,
    host_seconds_per_op,
    normalise_speed,
)
from controlplane.planning.predictor.solo import SoloTable, slice_throughput

__all__ = [
    "FAMILIES",
    "LEGACY_MAX_MIX",
    "MAX_MIX",
    "DEFAULT_HOST_S_PER_OP",
    "LEGACY_SLOT_FEATURES",
    "MIX_FEATURES",
    "SLOT_FEATURES",
    "EncodedMixes",
    "FamilyReport",
    "FeatureSpace",
    "FitReport",
    "MemoryModel",
    "MixTask",
    "ModelWorkload",
    "Physics",
    "Placement",
    "PredictorError",
    "ProfiledTask",
    "SoloTable",
    "ThroughputPredictor",
    "alone_on_units",
    "encode_mixes",
    "fit_family",
    "fit_physical",
    "fit_predictor",
    "fit_sharing_weight",
    "granted_fraction",
    "host_seconds_per_op",
    "make_model",
    "mape",
    "mix_group",
    "normalise_speed",
    "packed_windows",
    "passive_wait",
    "physics_for",
    "placement_for_backend",
    "rmsle",
    "sharing_rate",
    "slice_labels",
    "slice_throughput",
]
