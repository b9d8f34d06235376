"""How a task's training split is divided among devices (NumPy only, no torch).

:func:`partition_indices` divides a split by a registered partition rule
(:mod:`workers.registry.partitioners`: ``iid``, ``quantity``, ``dirichlet_labels``, ``shards`` or
a plug-in) from the split's labels: it checks the arguments and the rule's
``partition_params``, calls the rule, checks its result and merges shards of one sample
(:data:`MIN_SHARD_SAMPLES`). The control plane ships each device's positions on
:class:`workers.protocol.messages.ShardRef` (``indices``); :func:`label_histogram` counts a
shard's labels per class.

Experiments made before label rules stored a shard as a window ``[offset, offset + count)`` of
one seeded permutation: :func:`shard_indices` still gives those positions, and
:func:`shard_offsets` turns counts into window starts (the ``explicit`` rule's counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from workers.registry.base import ParamValue
from workers.registry.partitioners import PARTITIONER_REGISTRY, Partitioner

MIN_SHARD_SAMPLES = 2
"""A non-empty shard holds at least 2 samples: training-mode BatchNorm cannot normalise a batch
of one sample whose activations are 1×1 (the case of every zoo model at 32×32 input).
:func:`partition_indices` moves the position of a 1-sample shard to the largest shard."""


def check_partition_params(rule: str, params: Mapping[str, object] | None) -> dict[str, ParamValue]:
    """Check an experiment's ``partition_params`` against the rule's declared parameters.

    Args:
        rule: a registered partition rule.
        params: parameter name → value (``None`` or ``{}``: none given).

    Returns:
        Every declared parameter, with its checked value (an ``int`` or a ``float`` by its kind)
        or its default.

    Raises:
        workers.registry.base.UnknownEntryError: (a ``ValueError``) an unknown rule, naming
            ``partition_rule`` and listing the allowed ones.
        ValueError: naming ``partition_params.<name>``: a parameter the rule does not take
            (listing those it takes), a required one missing, or a value outside its range
            (saying the range).
    """
    record = PARTITIONER_REGISTRY.get(rule, field="partition_rule")
    return _check_params(record, params)


def _check_params(record: Partitioner, params: Mapping[str, object] | None) -> dict[str, ParamValue]:
    given = dict(params or {})
    declared = {p.name for p in record.parameters}
    for name in given:
        if name not in declared:
            takes = ", ".join(sorted(declared)) or "none"
            raise ValueError(
                f"partition_params.{name} is not a parameter of partition rule {record.name!r}; allowed: {takes}"
            )
    resolved: dict[str, ParamValue] = {}
    for parameter in record.parameters:
        value = given.get(parameter.name)
        if value is None:
            if parameter.default is None:
                raise ValueError(
                    f"partition_params.{parameter.name} is required with partition rule {record.name!r}: "
                    f"{parameter.allowed}"
                )
            value = parameter.default
        resolved[parameter.name] = parameter.check(value)
    return resolved


def partition_indices(
    labels: np.ndarray,
    num_devices: int,
    rule: str,
    params: Mapping[str, object] | None = None,
    seed: int = 0,
) -> list[np.ndarray]:
    """Divide a training split among devices with a registered partition rule.

    The rule's shards are checked (one array per device, integer positions in ``[0, N)``, no
    position in two shards), each is sorted, and then every shard of exactly one sample is
    merged into the largest other shard (ties: the lowest device index), so no device trains
    on a single sample (:data:`MIN_SHARD_SAMPLES`); the total is unchanged. A lone sample
    (every other shard empty) stays: there is nowhere to merge it. The same arguments always
    give the same shards.

    Args:
        labels: the split's class labels, an integer array of shape ``(N,)`` (position ``i``
            is sample ``i``).
        num_devices: devices ``J`` holding the task, ``>= 1``.
        rule: a registered partition rule (``"iid"``, ``"quantity"``, ``"dirichlet_labels"``,
            ``"shards"``, or a plug-in's).
        params: the rule's ``partition_params`` (:func:`check_partition_params`).
        seed: seed of the rule's random draws, ``>= 0``.

    Returns:
        ``J`` sorted int64 arrays of positions in ``[0, N)``, pairwise disjoint, each empty or
        of at least 2 positions (unless ``N == 1``).

    Raises:
        ValueError: naming the field: ``labels`` not a 1-d integer array, ``num_devices < 1``,
            ``seed < 0``, an unknown ``partition_rule`` (listing the allowed ones), a bad
            ``partition_params.<name>`` (with the allowed range), or a rule whose result has
            the wrong number of shards, positions out of range or a position twice.
    """
    array = np.asarray(labels)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"labels must be a 1-d integer array, got shape {array.shape} dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    _require_int("num_devices", num_devices, minimum=1)
    _require_int("seed", seed, minimum=0)
    record = PARTITIONER_REGISTRY.get(rule, field="partition_rule")
    resolved = _check_params(record, params)
    shards = list(record.split(array, int(num_devices), resolved, int(seed)))
    return merge_single_samples(_check_shards(record.name, shards, int(num_devices), len(array)))


def _check_shards(rule: str, shards: list[np.ndarray], num_devices: int, size: int) -> list[np.ndarray]:
    if len(shards) != num_devices:
        raise ValueError(
            f"partition rule {rule!r} gave {len(shards)} shards for {num_devices} devices: it must give one per device"
        )
    checked: list[np.ndarray] = []
    for j, shard in enumerate(shards):
        positions = np.asarray(shard)
        if positions.ndim != 1 or (positions.size and not np.issubdtype(positions.dtype, np.integer)):
            raise ValueError(
                f"partition rule {rule!r} gave device {j} shape {positions.shape} dtype {positions.dtype}: "
                "a shard must be a 1-d integer array of positions"
            )
        positions = np.sort(positions.astype(np.int64, copy=False))
        if positions.size and (positions[0] < 0 or positions[-1] >= size):
            raise ValueError(
                f"partition rule {rule!r} gave device {j} positions from {positions[0]} to {positions[-1]}: "
                f"allowed [0, {size})"
            )
        checked.append(positions)
    taken = np.concatenate(checked) if checked else np.empty(0, dtype=np.int64)
    if len(np.unique(taken)) != len(taken):
        raise ValueError(
            f"partition rule {rule!r} gave a position to two devices (or twice to one): shards must be disjoint"
        )
    return checked


def merge_single_samples(shards: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Move the position of every 1-sample shard to the largest other shard (ties: lowest
    index), keeping each shard sorted; a lone sample (all other shards empty) stays.

    Args:
        shards: sorted int64 position arrays, one per device.

    Returns:
        The shards, each empty or of at least :data:`MIN_SHARD_SAMPLES` positions.
    """
    result = [np.asarray(s, dtype=np.int64) for s in shards]
    for j in range(len(result)):
        if len(result[j]) != 1 or len(result) == 1:
            continue
        largest = max((k for k in range(len(result)) if k != j), key=lambda k: (len(result[k]), -k))
        if len(result[largest]):
            result[largest] = np.sort(np.concatenate([result[largest], result[j]]))
            result[j] = np.empty(0, dtype=np.int64)
    return result


def label_histogram(labels: np.ndarray, indices: np.ndarray, num_classes: int) -> list[int]:
    """Count a shard's samples per class.

    Args:
        labels: the split's labels, integer array of shape ``(N,)``.
        indices: the shard's positions in ``[0, N)``, integer array of shape ``(n,)``.
        num_classes: ``C >= 1``.

    Returns:
        ``C`` counts summing to ``n``: entry ``c`` is how many of the shard's samples have
        label ``c``.

    Raises:
        ValueError: ``num_classes < 1``, positions out of range, or a label of the shard
            outside ``[0, num_classes)`` (naming ``num_classes``).
    """
    _require_int("num_classes", num_classes, minimum=1)
    array = np.asarray(labels)
    positions = np.asarray(indices, dtype=np.int64)
    if positions.size and (positions.min() < 0 or positions.max() >= len(array)):
        raise ValueError(f"indices must lie in [0, {len(array)}), got min {positions.min()} max {positions.max()}")
    chosen = array[positions].astype(np.int64, copy=False)
    if chosen.size and (chosen.min() < 0 or chosen.max() >= num_classes):
        raise ValueError(
            f"num_classes={num_classes}: the shard has labels from {chosen.min()} to {chosen.max()}; "
            f"labels must lie in [0, {num_classes})"
        )
    return [int(c) for c in np.bincount(chosen, minlength=num_classes)]


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
    """Return a window shard's sample indices into the task's training split.

    ``np.random.default_rng(permutation_seed).permutation(train_size)[offset : offset + count]``
    — every device of a task uses the same ``permutation_seed``, so windows that do not overlap
    give disjoint shards (the shards of experiments stored as windows, and of the ``explicit``
    rule).

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
