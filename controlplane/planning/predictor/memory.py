"""The memory model: a task's peak memory from its model and batch size."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from controlplane.planning.predictor.samples import (
    FloatArray,
    ModelWorkload,
    PredictorError,
    ProfiledTask,
)


@dataclass
class MemoryModel:
    """Peak memory (bytes) of a task from its model and batch size.

    ``lines[model] = (a, b)``: least squares ``peak = a + b·B`` over that model's profiled
    peaks (``b`` kept ≥ 0). Without a line (model never profiled, or one batch size only):
    ``base + 4 · param_bytes + activation_bytes_per_sample · B``, ``base`` being the median
    intercept of the fitted lines (the runtime's own footprint; 300 MB without any) and 4 × the
    weights covering weights, gradients, optimizer state and a copy.
    """

    lines: dict[str, tuple[float, float]]
    base: float
    workloads: dict[str, ModelWorkload]

    @classmethod
    def fit(cls, samples: Iterable[ProfiledTask], workloads: Mapping[str, ModelWorkload]) -> MemoryModel:
        """The lines through the samples' measured peaks (samples without one are skipped)."""
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
            fitted_slope, intercept = np.polyfit(b, m, 1)
            slope = max(0.0, float(fitted_slope))
            lines[arch] = (float(np.mean(m - slope * b)), slope) if slope == 0.0 else (float(intercept), slope)
        base = float(np.median([a for a, _ in lines.values()])) if lines else 300e6
        return cls(lines=lines, base=base, workloads=dict(workloads))

    def predict(self, architecture: str, batch_size: FloatArray | int) -> FloatArray:
        """Peak bytes for ``architecture`` at each batch size (``batch_size``'s shape).

        Raises:
            PredictorError: the model was never profiled and has no workload features.
        """
        batch = np.asarray(batch_size, dtype=float)
        if architecture in self.lines:
            a, b = self.lines[architecture]
            line: FloatArray = a + b * batch
            return line
        if architecture not in self.workloads:
            raise PredictorError(f"no memory profile and no workload features for model {architecture!r}")
        w = self.workloads[architecture]
        estimate: FloatArray = self.base + 4.0 * w.param_bytes + w.activation_bytes_per_sample * batch
        return estimate
