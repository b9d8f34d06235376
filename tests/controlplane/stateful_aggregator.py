"""A small stateful aggregator the control-plane tests register for themselves
(``test_momentum``), so the control plane's handling of server state is tested apart from the
built-in server optimisers (tests/workers test those against hand-worked examples).

It is FedAvg with server momentum, ``v ← β v + Δ``, ``W ← W + η v`` with ``Δ = mean − W``
(Hsu et al. 2019, §3), on floating tensors; integer tensors take FedAvg's rounded mean. Its server
state also counts the aggregations it made (``"rounds"``, int64), so a test can see that a state
was handed back, and which one. It declares two parameters and, as FedProx does, a trainer
option (its ``mu``) with FedProx's client term, so one record exercises every part of the settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import numpy as np

from workers.fl.fedavg import FedAvgAccumulator
from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext, Aggregator, proximal_client_term
from workers.registry.base import Parameter

NAME = "test_momentum"


class MomentumAggregation:
    """One task's aggregation: see the module."""

    def __init__(self, ctx: AggregationContext) -> None:
        self._ctx = ctx
        self._mean = FedAvgAccumulator()
        self._state: dict[str, np.ndarray] | None = None

    def add(self, state: Mapping[str, np.ndarray], count: int) -> None:
        self._mean.add(state, count)

    def result(self) -> dict[str, np.ndarray]:
        mean = self._mean.result()
        previous = self._ctx.previous()
        saved = self._ctx.state()
        eta = float(self._ctx.options["server_learning_rate"])
        beta = float(self._ctx.options["server_momentum"])
        out: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {"rounds": np.asarray(int(saved.get("rounds", 0)) + 1, dtype=np.int64)}
        for key, value in mean.items():
            if not np.issubdtype(value.dtype, np.floating):
                out[key] = value  # FedAvg's rounded mean: integers stay integers
                continue
            weights = np.asarray(previous[key], dtype=np.float64)
            velocity = beta * np.asarray(saved.get(f"momentum/{key}", 0.0), dtype=np.float64)
            velocity = velocity + (value.astype(np.float64) - weights)
            out[key] = (weights + eta * velocity).astype(value.dtype)
            state[f"momentum/{key}"] = velocity.astype(np.float32)
        self._state = state
        return out

    def server_state(self) -> dict[str, np.ndarray]:
        assert self._state is not None, "server_state() before result()"
        return dict(self._state)


def record() -> Aggregator:
    """The ``test_momentum`` record."""
    return Aggregator(
        NAME,
        "test momentum — FedAvg with server momentum, for the control plane's tests",
        MomentumAggregation,
        uses_previous=True,
        parameters=(
            Parameter("server_learning_rate", "η", "float", 0.0, 10.0, minimum_open=True, default=1.0),
            Parameter("server_momentum", "β", "float", 0.0, 0.999, default=0.9),
            Parameter("mu", "μ, asked of every trainer", "float", 0.0, 1000.0, default=0.0),
        ),
        stateful=True,
        trainer_options=lambda params: {"mu": float(params["mu"])},
        client_term=proximal_client_term,
    )


@contextlib.contextmanager
def registered() -> Iterator[Aggregator]:
    """``test_momentum`` registered for the duration (removed after, whatever happens)."""
    aggregator = AGGREGATOR_REGISTRY.register(record(), replace=True)
    try:
        yield aggregator
    finally:
        AGGREGATOR_REGISTRY.unregister(NAME)
