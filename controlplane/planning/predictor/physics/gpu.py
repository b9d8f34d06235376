"""A GPU's physics under MPS (``pooled`` placement): a share is a cap on SMs, not a place.

``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=R`` limits how many of the device's SMs a client may use,
not which: every client may run on every SM. A mix whose granted fractions add up to more than
the device oversubscribes it for everyone alike; within the device, tasks do not slow each other
through the SMs. There are no threads waiting at barriers on shared cores and no placement probe,
so those terms are absent.
"""

from __future__ import annotations

import numpy as np

from controlplane.planning.predictor.physics.base import (
    Placement,
    SlotTerms,
    granted_fraction,
)
from controlplane.planning.predictor.samples import BoolArray, FloatArray, StrArray


def oversubscription(share: FloatArray, present: BoolArray, units: int) -> FloatArray:
    """``max(1, Σ_j g_j)`` per configuration, broadcast to ``(rows, slots)``: how far the
    mix's granted fractions ``g`` oversubscribe the device."""
    granted = np.where(present, granted_fraction(share, units), 0.0)
    load: FloatArray = np.broadcast_to(np.maximum(1.0, granted.sum(axis=1, keepdims=True)), share.shape).copy()
    return load


class GpuPhysics:
    """:class:`~controlplane.planning.predictor.physics.base.Physics` of a GPU shared under MPS
    (see the module docstring)."""

    @property
    def placement(self) -> Placement:
        return "pooled"

    @property
    def weighted_sharing(self) -> bool:
        return False

    def sharing_rate(
        self, share: FloatArray, present: BoolArray, units: int, weight: float = 1.0, escape_weight: float | None = None
    ) -> FloatArray:
        """``1 / max(1, Σ_j g_j)`` for every task: the device oversubscribed for everyone
        (``weight`` and ``escape_weight`` do not apply)."""
        present = np.asarray(present, dtype=bool)
        granted = np.where(present, granted_fraction(share, units), 0.0)
        rate = 1.0 / np.maximum(1.0, granted.sum(axis=1, keepdims=True))
        out: FloatArray = np.broadcast_to(rate, present.shape).copy()
        return out

    def alone(self, share: FloatArray, present: BoolArray, units: int) -> BoolArray:
        """The tasks of mixes that fit within the device (nobody slows them)."""
        alone: BoolArray = self.sharing_rate(share, present, units) >= 1.0
        return alone

    def slot_terms(self, share: FloatArray, present: BoolArray, units: int) -> SlotTerms:
        """Contention, mean and most alike, is :func:`oversubscription`; nobody waits passively."""
        load = oversubscription(share, present, units)
        return SlotTerms(load, load, np.zeros(share.shape, dtype=bool))

    def link_reference(self, rtt: FloatArray) -> float | None:
        """``None``: an MPS client has no placement to measure."""
        return None

    def link_log_ratio(
        self, share: FloatArray, present: BoolArray, units: int, rtt: FloatArray | None, reference: float | None
    ) -> FloatArray:
        """Zeros: no placement term."""
        return np.zeros(share.shape)

    def slice_labels(self, share: FloatArray, present: BoolArray, units: int) -> StrArray:
        """``"within the device"`` or ``"oversubscribed"`` (the shares add up to more than the
        device)."""
        kind = np.where(oversubscription(share, present, units) > 1.0, "oversubscribed", "within the device")
        labels: StrArray = np.where(present, kind, "")
        return labels
