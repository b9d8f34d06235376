"""The aggregator registry: how a task's device models become the next global model.

An aggregator is started once per task and round with the previous global model available, gets
every device's state dict with its sample count (one at a time, so only one device model is in
memory), and gives the new global state dict. Built-in: ``fedavg`` (McMahan et al. 2017). A
server-side optimiser (FedAdam and kin, Reddi et al. 2021) uses ``previous`` to form the
pseudo-gradient; FedAvg ignores it. Plug-ins register in the ``mtfl.aggregators`` group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from workers.registry.base import Registry

StateDict = Mapping[str, np.ndarray]


class Aggregation(Protocol):
    """One task's aggregation in one round (the object an :class:`Aggregator` starts)."""

    def add(self, state: StateDict, count: int) -> None:
        """Add one device's state dict, trained on ``count`` samples (``count >= 0``).

        Raises:
            ValueError: a count below 0 or a state that does not match the others.
        """

    def result(self) -> dict[str, np.ndarray]:
        """The new global state dict (same keys, shapes and dtypes as the states added).

        Raises:
            workers.fl.fedavg.NoSamplesError: every count added was 0.
        """


@dataclass(frozen=True)
class AggregationContext:
    """What an aggregator may read when it starts.

    Attributes:
        previous: loads the previous global state dict (called only by aggregators that need it).
        options: the run's aggregator options (plain JSON; empty for ``fedavg``).
    """

    previous: Callable[[], dict[str, np.ndarray]]
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Aggregator:
    """A registered aggregator.

    Attributes:
        name: stored on a run and carried in messages (``"fedavg"``).
        label: one line for forms and docs.
        start: ``AggregationContext -> Aggregation``.
        uses_previous: the aggregation reads the previous global model, so an all-unchanged
            round cannot be short-cut to "keep the previous file".
    """

    name: str
    label: str
    start: Callable[[AggregationContext], Aggregation]
    uses_previous: bool = False


AGGREGATOR_REGISTRY: Registry[Aggregator] = Registry("aggregator", "mtfl.aggregators", Aggregator)


def _fedavg(_ctx: AggregationContext) -> Aggregation:
    from workers.fl.fedavg import FedAvgAccumulator

    return FedAvgAccumulator()


AGGREGATOR_REGISTRY.register(
    Aggregator("fedavg", "FedAvg — the sample-weighted mean of the device models (McMahan et al. 2017)", _fedavg)
)
