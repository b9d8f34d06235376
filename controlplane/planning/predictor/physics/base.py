"""The one interface between the predictor's generic part and a backend family's physics.

The generic part (:mod:`~controlplane.planning.predictor.solo`,
:mod:`~controlplane.planning.predictor.encoding`, :mod:`~controlplane.planning.predictor.physical`,
:mod:`~controlplane.planning.predictor.fit`) models a task's throughput in a mix as

    ``P_i = P_solo(model_i, B_i, g_i, passive_i) · ρ_i · exp(−γ·x_i)``

and asks a :class:`Physics` for everything that depends on how the backend lays shares onto
the device's allocation units: the rate ``ρ_i`` co-located tasks leave a task
(:meth:`Physics.sharing_rate`), which tasks have their units to themselves
(:meth:`Physics.alone`), how many tasks compete for each task's units and which tasks wait
passively at their barriers (:meth:`Physics.slot_terms`), the placement term ``x_i``
(:meth:`Physics.link_log_ratio`, with its reference :meth:`Physics.link_reference`) and the
names of the kinds of slice error is broken down by (:meth:`Physics.slice_labels`). Every array
argument and result is ``(rows, slots)``: one row per configuration, one slot per task
(any number of slots: empty ones hold no task and change nothing).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from controlplane.planning.predictor.samples import BoolArray, FloatArray, StrArray

Placement = Literal["pooled", "packed"]
"""The name of a physics: ``packed`` (the ``cpu`` backend: each task pinned to a window of
cores) or ``pooled`` (a GPU under MPS: a share caps how many SMs a client uses, not which)."""


def granted_fraction(share: npt.ArrayLike, units: int) -> FloatArray:
    """The fraction of a device a share is actually granted: whole allocation units (``units``
    of them: CPU cores on the cpu backend, SMs on a GPU under MPS, where the rounding is
    negligible), at least one, rounded half up: ``max(1, floor(R·C/100 + 1/2)) / C`` — the
    cpu backend's own mapping (workers.backends.cpu.cpu_allocation). Same shape as ``share``."""
    granted: FloatArray = np.maximum(1.0, np.floor(np.asarray(share, dtype=float) * units / 100.0 + 0.5)) / units
    return granted


class SlotTerms(NamedTuple):
    """What a :class:`Physics` computes once per batch of configurations for the features."""

    contention: FloatArray
    """How many tasks compete for each task's units, the mean over its units, at least 1."""
    worst: FloatArray
    """The most tasks on any one of its units (its slowest thread paces it), at least 1."""
    passive: BoolArray
    """The tasks whose threads sleep at every barrier and so pay ``κ·t_0`` more per iteration
    (:func:`controlplane.planning.predictor.solo.slice_throughput`'s ``δ``)."""


class Physics(Protocol):
    """How one backend family lays shares onto a device's allocation units.

    Arguments common to every method: ``share`` ``(rows, slots)`` percent (0 in empty
    slots), ``present`` ``(rows, slots)`` bool (which slots hold a task), ``units`` the
    device's allocation units (cores, SMs). Implementations are stateless; the fitted
    parameters (sharing weights, link exponent, passive-wait ratio) live on the
    :class:`~controlplane.planning.predictor.encoding.FeatureSpace` and are passed in.
    """

    @property
    def placement(self) -> Placement:
        """The name this physics is stored and chosen by (``FeatureSpace.placement``)."""
        ...

    @property
    def weighted_sharing(self) -> bool:
        """Whether :meth:`sharing_rate` depends on ``weight`` and ``escape_weight`` (if not,
        the physical fit leaves them where they start)."""
        ...

    def sharing_rate(
        self, share: FloatArray, present: BoolArray, units: int, weight: float = 1.0, escape_weight: float | None = None
    ) -> FloatArray:
        """``ρ``: the fraction of its own slice each task gets beside the others, in ``(0, 1]``
        (empty slots hold any value; callers mask them with ``present``). ``weight``: how much of the time a multi-threaded task's thread is
        runnable on a shared unit; ``escape_weight``: the same for a multi-threaded task with a
        unit of its own (``None``: ``weight``)."""
        ...

    def alone(self, share: FloatArray, present: BoolArray, units: int) -> BoolArray:
        """Whether each task's units carry no other task (an empty slot counts as alone)."""
        ...

    def slot_terms(self, share: FloatArray, present: BoolArray, units: int) -> SlotTerms:
        """Contention and passive waiting of every task (see :class:`SlotTerms`)."""
        ...

    def link_reference(self, rtt: FloatArray) -> float | None:
        """The placement predictions are for, from the measured ``rtt`` values (1-D, finite);
        ``None``: no placement term."""
        ...

    def link_log_ratio(
        self, share: FloatArray, present: BoolArray, units: int, rtt: FloatArray | None, reference: float | None
    ) -> FloatArray:
        """``x``: the log ratio of how far apart each task's units were when measured (``rtt``,
        ``nan`` where unknown, ``None`` everywhere unknown) to ``reference``; 0 where the term
        does not apply. The model multiplies a task's speed by ``exp(−γ·x)``."""
        ...

    def slice_labels(self, share: FloatArray, present: BoolArray, units: int) -> StrArray:
        """The kind of slice each task runs on (``""`` in empty slots), for breaking held-out
        error down."""
        ...
