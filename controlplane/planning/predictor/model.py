"""A fitted throughput predictor: the feature space, the kept family's model and the memory model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from controlplane.planning.predictor.encoding import (
    EncodedMixes,
    FeatureSpace,
    encode_mixes,
)
from controlplane.planning.predictor.families import unresidual
from controlplane.planning.predictor.memory import MemoryModel
from controlplane.planning.predictor.samples import MAX_MIX, FloatArray, MixTask

PARALLEL_PREDICT_ROWS = 20_000
"""From this many configurations a forest predicts its trees on its joblib thread pool; below,
on the caller's thread (see :meth:`ThroughputPredictor.predict_arrays`)."""


@dataclass
class ThroughputPredictor:
    """A fitted predictor for one backend / device class: every co-located task's throughput
    from the whole mix at once (see :mod:`controlplane.planning.predictor`).

    ``model`` is the kept family's fitted regressor, ``None`` for the physical baseline.
    """

    family: str
    space: FeatureSpace
    model: Any
    memory: MemoryModel

    def predict_arrays(self, enc: EncodedMixes) -> FloatArray:
        """Throughput (samples/s) of every task of every configuration, ``(n, MAX_MIX)`` in the
        caller's slot order; ``nan`` in empty slots."""
        X, order, baseline = self.space.features(enc)
        if self.model is None:
            out = baseline
        else:
            baseline_c = np.take_along_axis(baseline, order, axis=1)
            canonical = unresidual(np.asarray(self._predict_model(X)).reshape(len(X), MAX_MIX), baseline_c)
            out = np.empty_like(canonical)
            np.put_along_axis(out, order, canonical, axis=1)
        out = np.clip(out, 1e-9, None)
        predicted: FloatArray = np.where(enc.present, out, np.nan)
        return predicted

    def largest_profiled_batch(self, architecture: str) -> int | None:
        """The largest batch size the model was profiled at alone (``None`` if never): beyond
        it every prediction is an extrapolation."""
        pts = self.space.solo.curves.get(architecture)
        return max(b for b, _ in pts) if pts else None

    def _predict_model(self, X: FloatArray) -> Any:
        # Forests predict their trees on a joblib thread pool; for a few thousand rows
        # starting and joining it costs more (~50 ms a call) than the trees themselves,
        # and planners call this many times with small batches.
        n_jobs = getattr(self.model, "n_jobs", None)
        if n_jobs is None or len(X) >= PARALLEL_PREDICT_ROWS:
            return self.model.predict(X)
        try:
            self.model.n_jobs = 1
            return self.model.predict(X)
        finally:
            self.model.n_jobs = n_jobs

    def predict(self, mixes: Sequence[Sequence[MixTask]]) -> list[list[float]]:
        """Throughput (samples/s) of every task of every configuration, in the order given.

        Raises:
            PredictorError: an unknown model or a configuration of the wrong size.
        """
        enc = encode_mixes(mixes, self.space.architectures)
        predicted = self.predict_arrays(enc)
        return [[float(predicted[r, s]) for s in range(len(mix))] for r, mix in enumerate(mixes)]
