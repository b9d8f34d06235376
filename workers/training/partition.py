"""How a task's training split is divided among devices (NumPy only, no torch).

A device's shard of a task is a contiguous window ``[offset, offset + count)`` of one seeded
permutation of the training split, so shards of one task are disjoint and together cover the
split exactly. :func:`shard_counts` decides the window sizes with a registered partition rule
(:mod:`workers.registry.partitioners`: even, or quantity-skewed by a Dirichlet draw as in the
paper's "highly skewed data volumes per task"), :func:`shard_offsets` turns them into window
starts and :func:`shard_indices` returns a window's sample indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workers.registry.partitioners import PARTITIONER_REGISTRY


def shard_counts(
    train_size: int,
    num_devices: int,
    rule: str,
    alpha: float | None = None,
    seed: int = 0,
) -> list[int]:
    """Return how many of a task's training samples each device holds.

    The rule is a :data:`~workers.registry.partitioners.PARTITIONER_REGISTRY` record (built-ins
    ``iid``: as even as possible; ``dirichlet``: quantity skew by a seeded ``Dir(alpha · 1_J)``
    draw, :func:`workers.registry.partitioners.dirichlet_counts`). The same arguments always
    give the same counts. Whatever the rule, any shard of exactly one sample is then moved to
    the largest shard (:data:`MIN_SHARD_SAMPLES`).

    Args:
        train_size: samples in the task's training split, ``>= 0``.
        num_devices: devices ``J`` holding the task, ``>= 1``.
        rule: a registered partition rule (``"iid"``, ``"dirichlet"``, or a plug-in's).
        alpha: concentration for rules that use one (``dirichlet``: finite and ``> 0``).
        seed: seed of the rule's random draw, ``>= 0``.

    Returns:
        ``J`` non-negative integers summing to ``train_size``, none equal to 1 (unless
        ``train_size == 1`` and ``J == 1``).

    Raises:
        ValueError: naming the field, for ``train_size < 0``, ``num_devices < 1``, an unknown
            ``rule`` (listing the allowed ones), a bad ``alpha`` for the rule, ``seed < 0``, or
            a rule that gave counts of the wrong length or sum.
    """
    _require_int("train_size", train_size, minimum=0)
    _require_int("num_devices", num_devices, minimum=1)
    _require_int("seed", seed, minimum=0)
    record = PARTITIONER_REGISTRY.get(rule, field="rule")
    counts = [int(c) for c in record.counts(train_size, num_devices, alpha, seed)]
    if len(counts) != num_devices or sum(counts) != train_size or min(counts) < 0:
        raise ValueError(
            f"rule {rule!r} gave {len(counts)} counts summing to {sum(counts)} for {num_devices} devices and {train_size} samples: "
            "it must give one non-negative count per device, summing to train_size"
        )
    return _no_single_samples(counts)


MIN_SHARD_SAMPLES = 2
"""A shard holds 0 or at least 2 samples: training mode BatchNorm cannot normalise a batch of
one sample whose activations are 1×1 (the case of every zoo model at 32×32 input)."""


def _no_single_samples(counts: list[int]) -> list[int]:
    """Move every shard of exactly one sample to the largest shard (ties: lowest index), so
    no device is asked to train on a single sample; the total is unchanged."""
    counts = list(counts)
    for j, c in enumerate(counts):
        if c == 1 and len(counts) > 1:
            largest = max(range(len(counts)), key=lambda k: (counts[k] if k != j else -1, -k))
            counts[j], counts[largest] = 0, counts[largest] + 1
    return counts


def shard_offsets(counts: Sequence[int]) -> list[int]:
    """Return each shard's start in the task's permutation: ``[0, c_0, c_0 + c_1, ...]``.

    Args:
        counts: per-device sample counts (length ``J``), each ``>= 0``.

    Returns:
        ``J`` offsets; device ``j``'s shard is ``[offsets[j], offsets[j] + counts[j])``.

    Raises:
        ValueError: if a count is negative or not an integer (naming ``counts[j]``).
    """
    offsets: list[int] = []
    position = 0
    for j, count in enumerate(counts):
        _require_int(f"counts[{j}]", count, minimum=0)
        offsets.append(position)
        position += int(count)
    return offsets


def shard_indices(train_size: int, permutation_seed: int, offset: int, count: int) -> np.ndarray:
    """Return a shard's sample indices into the task's training split.

    ``np.random.default_rng(permutation_seed).permutation(train_size)[offset : offset + count]``
    — every device of a task uses the same ``permutation_seed``, so windows that do not overlap
    give disjoint shards.

    Args:
        train_size: samples in the training split, ``>= 0``.
        permutation_seed: seed of the task's permutation, ``>= 0``.
        offset: window start, ``>= 0``.
        count: window length, ``>= 0``.

    Returns:
        int64 array of shape ``(count,)`` with values in ``[0, train_size)``.

    Raises:
        ValueError: if an argument is negative or ``offset + count > train_size``.
    """
    _require_int("train_size", train_size, minimum=0)
    _require_int("permutation_seed", permutation_seed, minimum=0)
    _require_int("offset", offset, minimum=0)
    _require_int("count", count, minimum=0)
    if offset + count > train_size:
        raise ValueError(
            f"shard offset + count = {offset} + {count} = {offset + count} exceeds the "
            f"training split's {train_size} samples"
        )
    permutation = np.random.default_rng(permutation_seed).permutation(train_size)
    return permutation[offset : offset + count].astype(np.int64, copy=False)


def _require_int(field: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value}")
