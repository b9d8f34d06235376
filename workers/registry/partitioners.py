"""The partitioner registry: how a task's training split is divided among devices, by the name
stored on an experiment (``partition_rule``).

A :class:`Partitioner` record's ``split`` chooses which positions of a task's training split
each device holds, from the split's labels; :func:`workers.training.partition.partition_indices`
checks its arguments (the rule's declared :class:`PartitionParameter` values included), calls
it, checks the result and applies the one rule every partitioner shares (no shard of exactly one
sample). Built-ins, in the federated-learning vocabulary of *quantity skew* and *label skew*:

- ``iid``: even shares of a seeded permutation;
- ``quantity``: quantity skew, volumes ``p ~ Dir(alpha · 1_J)`` (the paper's "highly skewed data
  volumes per task", Yu et al. 2022 §5; this rule was called ``dirichlet`` before);
- ``dirichlet_labels``: label skew, per class ``c`` device proportions ``p_c ~ Dir(alpha · 1_J)``
  (Hsu, Qi and Brown 2019, "Measuring the Effects of Non-Identical Data Distribution for
  Federated Visual Classification"; the per-class form of Yurochkin et al. 2019 and NIID-Bench,
  Li et al. 2022);
- ``shards``: pathological label skew, the label-sorted split cut into ``J · k`` shards, ``k``
  per device (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
  Decentralized Data", §3).

Plug-ins register in the ``mtfl.partitioners`` entry-point group: either a :class:`Partitioner`
record, or a bare :data:`SplitRule` callable, which :func:`partitioner_from_entry_point` wraps
(its ``parameters`` attribute, a tuple of :class:`PartitionParameter`, declares its parameters;
its ``label`` attribute or the first line of its docstring labels it).

NumPy only: the control plane's services import this module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# Parameter and ParamValue live in the registry base; plug-ins written before they moved still
# import them from here.
from workers.registry.base import Parameter, ParamValue, PluginLoadError, Registry, plugin_label

SplitRule = Callable[[np.ndarray, int, Mapping[str, ParamValue], int], Sequence[np.ndarray]]
"""``(labels, num_devices, params, seed) -> shards``.

``labels``: int64 array of shape ``(N,)``, the training split's class labels (position ``i`` is
sample ``i``). ``num_devices``: ``J >= 1``. ``params``: every parameter the record declares, each
checked against its range (defaults filled in). ``seed``: ``>= 0``; the same arguments must give
the same shards (draw from ``np.random.default_rng(seed)``). Returns ``J`` integer arrays of
positions in ``[0, N)``, pairwise disjoint (a rule may leave samples out). Checked by
:func:`workers.training.partition.partition_indices`."""


PartitionParameter = Parameter
"""The name partition-rule plug-ins imported :class:`~workers.registry.base.Parameter` by before it
moved to the registry base; kept so their imports still work."""


@dataclass(frozen=True)
class Partitioner:
    """A registered partition rule.

    Attributes:
        name: stored on an experiment as ``partition_rule`` (``"iid"``).
        label: one line for forms and docs.
        split: the :data:`SplitRule`.
        parameters: the numeric parameters it takes (an experiment's ``partition_params``);
            any other key is refused.
    """

    name: str
    label: str
    split: SplitRule
    parameters: tuple[PartitionParameter, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.split):
            raise TypeError(f"partition rule {self.name!r}: split must be callable, got {type(self.split).__name__}")
        parameters = tuple(self.parameters)
        if not all(isinstance(p, PartitionParameter) for p in parameters):
            raise TypeError(f"partition rule {self.name!r}: parameters must be PartitionParameter records")
        names = [p.name for p in parameters]
        if len(set(names)) != len(names):
            raise ValueError(f"partition rule {self.name!r}: a parameter name repeats in {names}")
        object.__setattr__(self, "parameters", parameters)

    def parameter(self, name: str) -> PartitionParameter | None:
        """The declared parameter called ``name``, or ``None``."""
        return next((p for p in self.parameters if p.name == name), None)


def partitioner_from_entry_point(name: str, obj: object, source: str) -> Partitioner:
    """Turn what an ``mtfl.partitioners`` entry point names into a :class:`Partitioner`.

    The registry's ``from_entry_point`` hook (:class:`workers.registry.base.Registry`).

    Args:
        name: the entry point's name, the rule's name.
        obj: the loaded object: a :class:`Partitioner` (kept as it is), a zero-argument
            callable returning one, or a :data:`SplitRule` callable, wrapped with its
            ``parameters`` attribute (a tuple of :class:`PartitionParameter`, default none) and
            its ``label`` attribute (default: :func:`~workers.registry.base.plugin_label`, the
            name, the first line of its docstring and ``source``).
        source: the providing distribution and version (``"my-plugin 1.0"``), for messages.

    Raises:
        PluginLoadError: ``obj`` is none of those, its record's name is not ``name``, or its
            ``parameters`` are not :class:`PartitionParameter` records.
    """
    record = obj
    if not isinstance(record, Partitioner) and callable(record) and _takes_no_arguments(record):
        record = record()
    if isinstance(record, Partitioner):
        if record.name != name:
            raise PluginLoadError(f"entry point {name!r} ({source}) gave a partition rule named {record.name!r}")
        return record
    if not callable(record):
        raise PluginLoadError(
            f"entry point {name!r} ({source}) gave {type(record).__name__}, not a Partitioner or a split callable"
        )
    label = getattr(record, "label", None) or plugin_label(name, record, source)
    try:
        return Partitioner(name, str(label), record, tuple(getattr(record, "parameters", ())))
    except (TypeError, ValueError) as exc:
        raise PluginLoadError(f"entry point {name!r} ({source}): {exc}") from None


def _takes_no_arguments(fn: Callable[..., object]) -> bool:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return not any(
        p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in signature.parameters.values()
    )


PARTITIONER_REGISTRY: Registry[Partitioner] = Registry(
    "partition rule", "mtfl.partitioners", Partitioner, from_entry_point=partitioner_from_entry_point
)
"""Every partition rule an experiment may use; plug-ins register in ``mtfl.partitioners``."""


# --------------------------------------------------------------------------- count helpers


def even_counts(total: int, num_devices: int) -> list[int]:
    """``total`` samples as even as possible over ``num_devices``: the first
    ``total % num_devices`` devices hold one sample more than the others."""
    base, extra = divmod(total, num_devices)
    return [base + (1 if j < extra else 0) for j in range(num_devices)]


def largest_remainder(proportions: np.ndarray, total: int) -> list[int]:
    """Apportion ``total`` by ``proportions`` (shape ``(J,)``, non-negative, summing to 1) into
    integers summing to ``total`` exactly (the largest-remainder, or Hamilton, method).

    Each device first gets ``floor(p_j · total)``; the samples left go one each to the devices
    with the largest fractional parts, ties to the lower device index.
    """
    exact = np.asarray(proportions, dtype=np.float64) * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    # Stable sort keeps ties in device order, so the result is reproducible across platforms.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:short]] += 1
    return [int(c) for c in counts]


def no_single_samples(counts: Sequence[int]) -> list[int]:
    """Move every count of exactly 1 to the largest other count (ties: lowest index), so no
    device is asked to train on a single sample; the total is unchanged. A lone sample (every
    other count 0) stays where it is: there is nowhere to merge it."""
    counts = [int(c) for c in counts]
    for j, c in enumerate(counts):
        if c != 1 or len(counts) == 1:
            continue
        largest = max((k for k in range(len(counts)) if k != j), key=lambda k: (counts[k], -k))
        if counts[largest] > 0:
            counts[j], counts[largest] = 0, counts[largest] + 1
    return counts


def permutation_windows(size: int, counts: Sequence[int], seed: int) -> list[np.ndarray]:
    """Cut ``np.random.default_rng(seed).permutation(size)`` into consecutive windows of
    ``counts`` (summing to ``size``): device ``j`` holds
    ``permutation[c_0 + … + c_{j-1} : c_0 + … + c_j]``, exactly the window
    :func:`workers.training.partition.shard_indices` gives for that offset and count, so an
    experiment stored as windows reproduces these shards."""
    permutation = np.random.default_rng(seed).permutation(size).astype(np.int64, copy=False)
    bounds = np.cumsum([0, *counts])
    return [permutation[bounds[j] : bounds[j + 1]] for j in range(len(counts))]


# --------------------------------------------------------------------------- built-in rules


def iid_split(labels: np.ndarray, num_devices: int, params: Mapping[str, ParamValue], seed: int) -> list[np.ndarray]:
    """``iid``: a seeded permutation of the split cut into windows as even as possible (the
    first ``N % J`` devices hold one sample more). Labels are not read: each device's label mix
    follows the split's in expectation."""
    return permutation_windows(len(labels), no_single_samples(even_counts(len(labels), num_devices)), seed)


def quantity_split(
    labels: np.ndarray, num_devices: int, params: Mapping[str, ParamValue], seed: int
) -> list[np.ndarray]:
    """``quantity``: quantity skew (data volumes differ, labels mixed as in the split).

    Volumes ``p ~ Dir(alpha · 1_J)`` are drawn with ``np.random.default_rng(seed)`` and turned
    into counts summing to ``N`` by :func:`largest_remainder` (the counts of the former
    ``dirichlet`` rule for the same seed); the shards are windows of the seeded permutation
    (:func:`permutation_windows`). Small ``alpha`` (0.1) gives highly skewed volumes, large
    ``alpha`` (100) nearly even ones. A count of 1 is merged first (:func:`no_single_samples`).
    """
    alpha = float(params["alpha"])
    proportions = np.random.default_rng(seed).dirichlet(np.full(num_devices, alpha))
    counts = no_single_samples(largest_remainder(proportions, len(labels)))
    return permutation_windows(len(labels), counts, seed)


def dirichlet_labels_split(
    labels: np.ndarray, num_devices: int, params: Mapping[str, ParamValue], seed: int
) -> list[np.ndarray]:
    """``dirichlet_labels``: label skew by a Dirichlet draw per class.

    With ``rng = np.random.default_rng(seed)``, for each class ``c`` present in ``labels``, in
    ascending order: the class's positions are shuffled (``rng.permutation``), device
    proportions ``p_c ~ Dir(alpha · 1_J)`` are drawn (``rng.dirichlet``), and the shuffled
    positions are cut into consecutive runs of :func:`largest_remainder` counts, device 0 first.
    Device ``j`` holds its runs of every class (Hsu, Qi and Brown 2019; the per-class form of
    Yurochkin et al. 2019 and Li et al. 2022's NIID-Bench). Small ``alpha`` (0.1): most devices
    see one or two classes; large ``alpha`` (1000): every device's label mix is the split's,
    each class cut nearly evenly. Every sample goes to some device.
    """
    alpha = float(params["alpha"])
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_devices)]
    for c in np.unique(labels):
        positions = rng.permutation(np.flatnonzero(labels == c)).astype(np.int64, copy=False)
        counts = largest_remainder(rng.dirichlet(np.full(num_devices, alpha)), len(positions))
        bounds = np.cumsum([0, *counts])
        for j in range(num_devices):
            parts[j].append(positions[bounds[j] : bounds[j + 1]])
    return [np.concatenate(p) if p else np.empty(0, dtype=np.int64) for p in parts]


def shards_split(labels: np.ndarray, num_devices: int, params: Mapping[str, ParamValue], seed: int) -> list[np.ndarray]:
    """``shards``: the pathological non-IID split of McMahan et al. 2017 §3.

    With ``rng = np.random.default_rng(seed)``: the positions are shuffled
    (``rng.permutation``) and then sorted by label with a stable sort, so the order within a
    class is random; that sequence is cut into ``S = J · k`` shards as equal as possible
    (``np.array_split``: sizes differ by at most one), and a second draw
    (``rng.permutation(S)``) deals them, device ``j`` taking shards ``order[j·k : (j+1)·k]``
    (``k`` = ``shards_per_device``). When every class's size is a multiple of the shard size,
    every shard holds one label and a device sees at most ``k`` labels (McMahan et al.: 200
    shards of 300 MNIST digits, 2 per client). Every sample goes to some device.

    Raises:
        ValueError: naming ``partition_params.shards_per_device``, when ``J · k`` exceeds the
            split's ``N`` samples (a shard would be empty).
    """
    per_device = int(params["shards_per_device"])
    num_shards = num_devices * per_device
    if num_shards > len(labels):
        raise ValueError(
            f"partition_params.shards_per_device={per_device}: {num_devices} devices × {per_device} shards = "
            f"{num_shards} shards, more than the split's {len(labels)} samples; allowed at most "
            f"{len(labels) // num_devices} shards per device"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(labels)).astype(np.int64, copy=False)
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_shards)
    deal = rng.permutation(num_shards)
    return [
        np.concatenate([shards[s] for s in deal[j * per_device : (j + 1) * per_device]]) for j in range(num_devices)
    ]


ALPHA = PartitionParameter(
    "alpha",
    "α — Dirichlet concentration: small (0.1) very skewed, large (100) nearly even",
    "float",
    0.0,
    1000.0,
    minimum_open=True,
)
"""The concentration of the Dirichlet rules; required (no default), in ``(0, 1000]``."""

SHARDS_PER_DEVICE = PartitionParameter(
    "shards_per_device",
    "k — label-sorted shards per device (McMahan et al. 2017 use 2)",
    "int",
    1,
    10_000,
    default=2,
)
"""Shards each device is dealt by ``shards``, in ``[1, 10000]``, default 2 (McMahan et al.)."""

PARTITIONER_REGISTRY.register(Partitioner("iid", "iid — even shares of every task", iid_split))
PARTITIONER_REGISTRY.register(
    Partitioner("quantity", "quantity — skewed volumes per task and device, Dir(α)", quantity_split, (ALPHA,))
)
PARTITIONER_REGISTRY.register(
    Partitioner(
        "dirichlet_labels",
        "dirichlet_labels — skewed labels: per class, device shares from Dir(α) (Hsu et al. 2019)",
        dirichlet_labels_split,
        (ALPHA,),
    )
)
PARTITIONER_REGISTRY.register(
    Partitioner(
        "shards",
        "shards — k label-sorted shards per device (McMahan et al. 2017)",
        shards_split,
        (SHARDS_PER_DEVICE,),
    )
)
