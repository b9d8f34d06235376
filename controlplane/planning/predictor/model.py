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
from controlplane.planning.predictor.samples import MAX_MIX, FloatArray, MixTask, PredictorError

PARALLEL_PREDICT_ROWS = 20_000
"""From this many configurations a forest predicts its trees on its joblib thread pool; below,
on the caller's thread (see :meth:`ThroughputPredictor.predict_arrays`)."""


@dataclass
class ThroughputPredictor:
    """A fitted predictor for one backend / device class: every co-located task's throughput
    from the whole mix at once (see :mod:`controlplane.planning.predictor`).

    ``model`` is the kept family's fitted regressor, ``None`` for the physical baseline. It
    corrects configurations of up to ``space.slots`` tasks (4, or the largest mix fitted on);
    a larger configuration, up to :attr:`max_mix`, gets the physical baseline alone, which
    follows every task's share wherever the mix size goes while the trees have never seen it.
    """

    family: str
    space: FeatureSpace
    model: Any
    memory: MemoryModel

    @property
    def max_mix(self) -> int:
        """The most tasks of one configuration this predictor answers for: :data:`MAX_MIX`, or 4
        for a predictor fitted before issue 22 (refit it to plan more)."""
        return self.space.max_mix

    @property
    def max_fitted_mix(self) -> int | None:
        """The largest configuration (tasks) among those the predictor was fitted on: a larger
        one is an extrapolation. ``None`` for a predictor fitted before this was recorded
        (it answers for at most 4 tasks)."""
        return self.space.max_fitted_mix

    def check_mix_size(self, tasks: int) -> None:
        """Refuse a configuration of ``tasks`` tasks this predictor does not answer for.

        Raises:
            PredictorError: ``tasks`` above :attr:`max_mix`, naming the limit (and, for a
                predictor fitted before issue 22, that a refit lifts it to :data:`MAX_MIX`).
        """
        if tasks <= self.max_mix:
            return
        if self.max_mix < MAX_MIX:
            raise PredictorError(
                f"{tasks} tasks on one device: this predictor was fitted for at most {self.max_mix} tasks per "
                f"device; refit it (mtfl fit-predictor) to plan up to {MAX_MIX}"
            )
        raise PredictorError(f"{tasks} tasks on one device: the predictor plans at most {MAX_MIX} tasks per device")

    def predict_arrays(self, enc: EncodedMixes) -> FloatArray:
        """Throughput (samples/s) of every task of every configuration, ``(n, w)`` in the
        caller's slot order (``enc``'s width); ``nan`` in empty slots.

        Raises:
            PredictorError: a configuration of more than :attr:`max_mix` tasks.
        """
        sizes = enc.mix_sizes
        if len(sizes):
            self.check_mix_size(int(sizes.max()))
        X, order, baseline = self.space.features(enc)
        if self.model is None:
            out = baseline
        else:
            out = self._corrected(X, order, baseline, sizes)
        out = np.clip(out, 1e-9, None)
        predicted: FloatArray = np.where(enc.present, out, np.nan)
        return predicted

    def _corrected(self, X: FloatArray, order: Any, baseline: FloatArray, sizes: Any) -> FloatArray:
        """The learned family's correction of ``baseline`` ``(n, w)`` on every configuration of
        at most ``space.slots`` tasks (``sizes``), the baseline itself on the others."""
        n, w = baseline.shape
        k = self.space.slots
        fits = sizes <= k
        learned = np.zeros((n, w))
        if fits.all():
            learned[:, : min(w, k)] = np.asarray(self._predict_model(X)).reshape(n, k)[:, :w]
        elif fits.any():
            rows = np.flatnonzero(fits)
            learned[rows, : min(w, k)] = np.asarray(self._predict_model(X[rows])).reshape(len(rows), k)[:, :w]
        canonical = unresidual(learned, np.take_along_axis(baseline, order, axis=1))
        out: FloatArray = np.empty_like(canonical)
        np.put_along_axis(out, order, canonical, axis=1)
        return out

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
            PredictorError: an unknown model, an empty configuration or one of more than
                :attr:`max_mix` tasks.
        """
        for mix in mixes:
            self.check_mix_size(len(mix))
        enc = encode_mixes(mixes, self.space.architectures)
        predicted = self.predict_arrays(enc)
        return [[float(predicted[r, s]) for s in range(len(mix))] for r, mix in enumerate(mixes)]
