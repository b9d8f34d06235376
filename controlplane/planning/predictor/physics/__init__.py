"""Each backend family's physics behind one interface (:class:`Physics`), chosen by table.

``packed`` is the ``cpu`` backend (:mod:`.cpu`: core windows, passive waiting at barriers, the
core link), ``pooled`` a GPU shared under MPS (:mod:`.gpu`: SM shares). A fitted predictor stores
its physics by name (``FeatureSpace.placement``); :func:`placement_for_backend` says which one a
backend's profile samples are fitted with. A new backend family is one module implementing
:class:`Physics` and one line in :data:`PHYSICS` (and in :data:`BACKEND_PLACEMENT` for the
backends that use it).
"""

from __future__ import annotations

from controlplane.planning.predictor.physics.base import (
    Physics,
    Placement,
    SlotTerms,
    granted_fraction,
)
from controlplane.planning.predictor.physics.cpu import (
    CpuPhysics,
    alone_on_units,
    packed_windows,
    passive_wait,
)
from controlplane.planning.predictor.physics.gpu import GpuPhysics
from controlplane.planning.predictor.samples import (
    BoolArray,
    FloatArray,
    PredictorError,
)

PHYSICS: dict[str, Physics] = {"packed": CpuPhysics(), "pooled": GpuPhysics()}
"""Physics by placement name."""

BACKEND_PLACEMENT: dict[str, Placement] = {"cpu": "packed"}
"""The physics a backend's samples are fitted with; a backend not listed (``cuda-mps``,
``cuda-timeslice``, ``simulated``, plug-ins) pools its shares as MPS does."""

DEFAULT_PLACEMENT: Placement = "pooled"


def physics_for(placement: str) -> Physics:
    """The physics called ``placement``.

    Raises:
        PredictorError: ``placement`` is not one of :data:`PHYSICS`.
    """
    try:
        return PHYSICS[placement]
    except KeyError:
        raise PredictorError(
            f"placement: {placement!r} is not allowed; allowed: {', '.join(sorted(PHYSICS))}"
        ) from None


def placement_for_backend(backend: str) -> Placement:
    """The placement (physics name) of a backend's profile samples (:data:`BACKEND_PLACEMENT`)."""
    return BACKEND_PLACEMENT.get(backend, DEFAULT_PLACEMENT)


def sharing_rate(
    share: FloatArray,
    present: BoolArray,
    units: int,
    placement: str,
    weight: float = 1.0,
    escape_weight: float | None = None,
) -> FloatArray:
    """``ρ``, the fraction of its own slice each task gets beside the others, ``(rows, slots)``
    in ``(0, 1]``, under the physics ``placement`` (:meth:`Physics.sharing_rate`).

    Raises:
        PredictorError: an unknown ``placement``.
    """
    return physics_for(placement).sharing_rate(share, present, units, weight, escape_weight)


__all__ = [
    "BACKEND_PLACEMENT",
    "DEFAULT_PLACEMENT",
    "PHYSICS",
    "CpuPhysics",
    "GpuPhysics",
    "Physics",
    "Placement",
    "SlotTerms",
    "alone_on_units",
    "granted_fraction",
    "packed_windows",
    "passive_wait",
    "physics_for",
    "placement_for_backend",
    "sharing_rate",
]
