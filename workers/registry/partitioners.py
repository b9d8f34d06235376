"""The partitioner registry: how a task's training split is divided among devices, by the name
stored on an experiment (``partition_rule``).

A :class:`Partitioner` record's ``counts`` decides how many of a task's training samples each
device holds; :func:`workers.training.partition.shard_counts` checks its arguments, calls it, checks the
result and applies the one rule every partitioner shares (no shard of exactly one sample).
Built-ins: ``iid`` (even) and ``dirichlet`` (quantity skew by a Dirichlet draw, as in the
paper's "highly skewed data volumes per task", Yu et al. 2022 §5). Plug-ins register in the
``mtfl.partitioners`` entry-point group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from workers.registry.base import Registry

CountRule = Callable[[int, int, float | None, int], list[int]]
"""``(train_size, num_devices, alpha, seed) -> counts``: ``num_devices`` non-negative integers
summing to ``train_size``; the same arguments always give the same counts. ``train_size >= 0``,
``num_devices >= 1`` and ``seed >= 0`` are checked before the call; ``alpha`` is passed as given
(rules that do not use it ignore it). Raises ``ValueError`` naming ``alpha`` for an alpha it cannot
use."""


@dataclass(frozen=True)
class Partitioner:
    """A registered partition rule.

    Attributes:
        name: stored on an experiment as ``partition_rule`` (``"iid"``).
        label: one line for forms and docs.
        counts: the :data:`CountRule`.
        uses_alpha: takes a concentration ``alpha`` (an experiment's ``dirichlet_alpha``),
            which is then required; other rules refuse one.
    """

    name: str
    label: str
    counts: CountRule
    uses_alpha: bool = False


PARTITIONER_REGISTRY: Registry[Partitioner] = Registry("partition rule", "mtfl.partitioners", Partitioner)
"""Every partition rule an experiment may use; plug-ins register in ``mtfl.partitioners``."""


def iid_counts(train_size: int, num_devices: int, alpha: float | None = None, seed: int = 0) -> list[int]:
    """``iid``: as even as possible; the first ``train_size % num_devices`` devices hold one
    sample more than the others. ``alpha`` and ``seed`` are not used."""
    base, extra = divmod(train_size, num_devices)
    return [base + (1 if j < extra else 0) for j in range(num_devices)]


def dirichlet_counts(train_size: int, num_devices: int, alpha: float | None = None, seed: int = 0) -> list[int]:
    """``dirichlet``: quantity skew.

    Device proportions ``p ~ Dir(alpha · 1_J)`` are drawn with ``np.random.default_rng(seed)``
    and turned into integers by the largest-remainder method (floor of ``p_j · train_size``,
    then one extra sample to the devices with the largest fractional parts, ties to the lower
    device index), so the counts sum to ``train_size`` exactly. Small ``alpha`` (e.g. 0.1) gives
    highly skewed volumes, large ``alpha`` (e.g. 100) nearly even ones.

    Raises:
        ValueError: ``alpha`` missing, not a number, not finite or ``<= 0`` (naming ``alpha``).
    """
    if alpha is None or isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"alpha must be a finite number > 0 for rule='dirichlet', got {alpha!r}")
    if not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0 for rule='dirichlet', got {alpha!r}")
    proportions = np.random.default_rng(seed).dirichlet(np.full(num_devices, float(alpha)))
    return _largest_remainder(proportions, train_size)


def _largest_remainder(proportions: np.ndarray, total: int) -> list[int]:
    """Apportion ``total`` by ``proportions`` (shape ``(J,)``, summing to 1) into integers."""
    exact = proportions * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    # Stable sort keeps ties in device order, so the result is reproducible across platforms.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:short]] += 1
    return [int(c) for c in counts]


PARTITIONER_REGISTRY.register(Partitioner("iid", "iid — even shares of every task", iid_counts))
PARTITIONER_REGISTRY.register(
    Partitioner(
        "dirichlet",
        "dirichlet — skewed volumes per task and device, Dir(α)",
        dirichlet_counts,
        uses_alpha=True,
    )
)
