from __future__ import annotations

import math

import numpy as np
import pytest

from workers.registry.base import UnknownEntryError
from workers.registry.partitioners import (
    PARTITIONER_REGISTRY,
    Partitioner,
    PartitionParameter,
    partitioner_from_entry_point,
)
from workers.training.partition import (
    MIN_SHARD_SAMPLES,
    check_partition_params,
    label_histogram,
    partition_indices,
    shard_indices,
    shard_offsets,
)

RULES = [
    ("iid", {}),
    ("quantity", {"alpha": 0.5}),
    ("dirichlet_labels", {"alpha": 0.5}),
    ("shards", {"shards_per_device": 2}),
]


def _counts(size: int, num_devices: int, rule: str, params: dict, seed: int) -> list[int]:
    return [len(s) for s in partition_indices(np.zeros(size, dtype=np.int64), num_devices, rule, params, seed)]


def _labels(num_classes: int = 10, per_class: int = 100, seed: int = 0) -> np.ndarray:
    """A balanced split in a shuffled order: ``per_class`` samples of each class."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class)).astype(np.int64)


def _entropy(histogram: list[int]) -> float:
    counts = np.asarray(histogram, dtype=np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.mark.parametrize("rule,params", RULES)
def test_the_same_seed_gives_the_same_indices_and_another_seed_others(rule, params):
    labels = _labels()

    first = partition_indices(labels, 5, rule, params, seed=11)
    again = partition_indices(labels, 5, rule, params, seed=11)
    other = partition_indices(labels, 5, rule, params, seed=12)

    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("rule,params", RULES)
@pytest.mark.parametrize("num_devices", [1, 3, 7])
def test_shards_are_sorted_disjoint_and_cover_the_split(rule, params, num_devices):
    labels = _labels(per_class=37)

    shards = partition_indices(labels, num_devices, rule, params, seed=3)

    assert len(shards) == num_devices
    assert all(s.dtype == np.int64 and np.array_equal(s, np.sort(s)) for s in shards)
    joined = np.concatenate(shards)
    assert len(joined) == len(labels)
    assert np.array_equal(np.sort(joined), np.arange(len(labels)))
    assert all(len(s) == 0 or len(s) >= MIN_SHARD_SAMPLES for s in shards)


def test_iid_shards_are_even_windows_of_the_seeded_permutation():
    labels = np.arange(1437, dtype=np.int64) % 10

    shards = partition_indices(labels, 4, "iid", seed=9)

    assert [len(s) for s in shards] == [360, 359, 359, 359]
    offsets = shard_offsets([len(s) for s in shards])
    for shard, offset in zip(shards, offsets, strict=True):
        assert np.array_equal(shard, np.sort(shard_indices(1437, 9, offset, len(shard))))


def test_quantity_keeps_the_former_dirichlet_counts_and_windows():
    """``quantity`` is the rule formerly called ``dirichlet``: same counts for the same seed,
    and its shards are the windows an experiment stored as offsets reproduces."""
    proportions = np.random.default_rng(11).dirichlet(np.full(5, 2.0))
    exact = proportions * 1437
    floors = np.floor(exact).astype(int)
    floors[np.argsort(-(exact - floors), kind="stable")[: 1437 - floors.sum()]] += 1

    shards = partition_indices(np.zeros(1437, dtype=np.int64), 5, "quantity", {"alpha": 2.0}, seed=11)

    counts = [len(s) for s in shards]
    assert 1 not in floors.tolist(), "the premise: this seed leaves no 1-sample count to merge"
    assert counts == floors.tolist()
    for shard, offset in zip(shards, shard_offsets(counts), strict=True):
        assert np.array_equal(shard, np.sort(shard_indices(1437, 11, offset, len(shard))))


def test_small_alpha_skews_volumes_more_than_large_alpha():
    def spread(alpha: float) -> float:
        return float(np.mean([np.std(_counts(10_000, 5, "quantity", {"alpha": alpha}, seed=s)) for s in range(20)]))

    assert spread(0.1) > 5 * spread(100.0)


def test_quantity_leaves_the_label_mix_alone():
    labels = _labels(per_class=500)
    shards = partition_indices(labels, 5, "quantity", {"alpha": 0.1}, seed=4)

    big = [s for s in shards if len(s) > 200]
    assert big
    assert all(_entropy(label_histogram(labels, s, 10)) > 0.95 * math.log(10) for s in big)


def test_dirichlet_labels_skews_labels_for_small_alpha_and_not_for_large():
    labels = _labels(per_class=500)

    def mean_entropy(alpha: float) -> float:
        values = []
        for seed in range(5):
            for shard in partition_indices(labels, 10, "dirichlet_labels", {"alpha": alpha}, seed=seed):
                if len(shard):
                    values.append(_entropy(label_histogram(labels, shard, 10)))
        return float(np.mean(values))

    assert mean_entropy(0.1) < 0.5 * math.log(10)
    assert mean_entropy(1000.0) > 0.99 * math.log(10)


def test_dirichlet_labels_cuts_every_class_by_its_own_draw():
    labels = _labels(per_class=200)
    shards = partition_indices(labels, 4, "dirichlet_labels", {"alpha": 0.2}, seed=1)
    histograms = np.array([label_histogram(labels, s, 10) for s in shards])

    assert histograms.sum(axis=0).tolist() == [200] * 10
    # per-class shares differ between classes: not one quantity split applied to every class
    shares = histograms / 200
    assert np.ptp(shares, axis=1).max() > 0.5


def test_shards_gives_each_device_at_most_k_labels_when_classes_align():
    labels = _labels(num_classes=10, per_class=100)  # 20 shards of 50: one label each

    for seed in range(10):
        shards = partition_indices(labels, 10, "shards", {"shards_per_device": 2}, seed=seed)
        assert [len(s) for s in shards] == [100] * 10
        assert all(np.count_nonzero(label_histogram(labels, s, 10)) <= 2 for s in shards)


def test_shards_within_a_class_are_random():
    labels = _labels(num_classes=2, per_class=100)
    first = partition_indices(labels, 2, "shards", {"shards_per_device": 2}, seed=0)
    other = partition_indices(labels, 2, "shards", {"shards_per_device": 2}, seed=1)

    # the same label structure, but not the same positions
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_shards_refuses_more_shards_than_samples():
    with pytest.raises(ValueError, match=r"partition_params\.shards_per_device=4: 3 devices × 4 shards = 12 shards"):
        partition_indices(np.zeros(10, dtype=np.int64), 3, "shards", {"shards_per_device": 4})


def test_shards_per_device_defaults_to_two():
    assert check_partition_params("shards", {}) == {"shards_per_device": 2}
    assert check_partition_params("shards", {"shards_per_device": 3.0}) == {"shards_per_device": 3}


@pytest.mark.parametrize("rule", ["quantity", "dirichlet_labels"])
@pytest.mark.parametrize("alpha", [0.0, -1.0, 1000.5, float("nan"), float("inf"), "x", True])
def test_a_bad_alpha_names_the_field_and_the_range(rule, alpha):
    with pytest.raises(ValueError, match=r"partition_params\.alpha must be a number in \(0, 1000\]"):
        partition_indices(_labels(), 3, rule, {"alpha": alpha})


@pytest.mark.parametrize("rule", ["quantity", "dirichlet_labels"])
def test_alpha_is_required(rule):
    with pytest.raises(ValueError, match=r"partition_params\.alpha is required with partition rule .*\(0, 1000\]"):
        partition_indices(_labels(), 3, rule, {})


@pytest.mark.parametrize("value", [0, 10_001, 1.5, "2"])
def test_a_bad_shards_per_device_names_the_field_and_the_range(value):
    with pytest.raises(ValueError, match=r"partition_params\.shards_per_device must be an integer in \[1, 10000\]"):
        partition_indices(_labels(), 3, "shards", {"shards_per_device": value})


def test_a_parameter_the_rule_does_not_take_is_refused():
    with pytest.raises(
        ValueError, match=r"partition_params\.alpha is not a parameter of partition rule 'iid'; allowed: none"
    ):
        partition_indices(_labels(), 3, "iid", {"alpha": 1.0})
    with pytest.raises(ValueError, match=r"partition_params\.k .*'shards'; allowed: shards_per_device"):
        partition_indices(_labels(), 3, "shards", {"k": 2})


def test_an_unknown_rule_lists_the_allowed_ones():
    with pytest.raises(UnknownEntryError, match="partition_rule: 'dirichlet' is not allowed; allowed: iid, quantity"):
        partition_indices(_labels(), 2, "dirichlet")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"labels": np.zeros((3, 2), dtype=np.int64)}, "labels must be a 1-d integer array"),
        ({"labels": np.zeros(4, dtype=np.float32)}, "labels must be a 1-d integer array"),
        ({"num_devices": 0}, "num_devices must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, message):
    arguments = {"labels": _labels(), "num_devices": 2, "rule": "iid", "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        partition_indices(**arguments)


@pytest.mark.parametrize("rule,params", RULES[:3])
def test_no_device_gets_a_single_sample(rule, params):
    for seed in range(50):
        shards = partition_indices(_labels(num_classes=3, per_class=3)[:7], 5, rule, params, seed=seed)
        assert all(len(s) != 1 for s in shards) and sum(len(s) for s in shards) == 7


@pytest.fixture
def registered():
    names: list[str] = []

    def register(record: Partitioner) -> Partitioner:
        PARTITIONER_REGISTRY.register(record)
        names.append(record.name)
        return record

    yield register
    for name in names:
        PARTITIONER_REGISTRY.unregister(name)


def test_a_one_sample_shard_moves_to_the_largest_device(registered):
    def lopsided(labels, num_devices, params, seed):
        return [np.array([4]), np.array([0, 1]), np.array([2, 3, 5, 6]), np.array([7])]

    registered(Partitioner("lopsided", "lopsided", lopsided))
    shards = partition_indices(np.zeros(8, dtype=np.int64), 4, "lopsided")

    assert [s.tolist() for s in shards] == [[], [0, 1], [2, 3, 4, 5, 6, 7], []]


def test_a_lone_sample_stays(registered):
    registered(
        Partitioner("lone", "lone", lambda labels, j, params, seed: [np.array([0]), np.array([], dtype=np.int64)])
    )

    assert [s.tolist() for s in partition_indices(np.zeros(1, dtype=np.int64), 2, "lone")] == [[0], []]


@pytest.mark.parametrize(
    "result,message",
    [
        ([np.array([0, 1])], "gave 1 shards for 2 devices"),
        ([np.array([0, 1]), np.array([1, 2])], "a position to two devices"),
        ([np.array([0, 1]), np.array([2, 9])], r"positions from 2 to 9: allowed \[0, 4\)"),
        ([np.array([0.0, 1.0]), np.array([2, 3])], "1-d integer array of positions"),
    ],
)
def test_a_rule_with_a_bad_result_is_refused(registered, result, message):
    registered(Partitioner("broken", "broken", lambda labels, j, params, seed: result))

    with pytest.raises(ValueError, match=message):
        partition_indices(np.zeros(4, dtype=np.int64), 2, "broken")


def test_label_histogram_counts_a_shards_labels():
    labels = np.array([0, 2, 2, 1, 0, 2], dtype=np.int64)

    assert label_histogram(labels, np.array([1, 2, 4]), 4) == [1, 0, 2, 0]
    assert label_histogram(labels, np.array([], dtype=np.int64), 3) == [0, 0, 0]
    with pytest.raises(ValueError, match=r"num_classes=2: the shard has labels from 0 to 2"):
        label_histogram(labels, np.array([0, 1]), 2)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 6\)"):
        label_histogram(labels, np.array([6]), 3)


def test_partition_parameters_check_their_declaration():
    with pytest.raises(ValueError, match="identifier"):
        PartitionParameter("a b", "x", "float", 0, 1)
    with pytest.raises(ValueError, match="kind"):
        PartitionParameter("a", "x", "str", 0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="minimum <= maximum"):
        PartitionParameter("a", "x", "float", 2, 1)
    with pytest.raises(ValueError, match=r"partition_params\.a must be a number in \[0, 1\]"):
        PartitionParameter("a", "x", "float", 0, 1, default=2.0)
    with pytest.raises(ValueError, match="repeats"):
        Partitioner("p", "p", lambda *a: [], (PartitionParameter("a", "x", "int", 0, 1),) * 2)


def test_an_entry_point_callable_is_wrapped_with_its_parameters():
    def half(labels, num_devices, params, seed):
        """The first device holds a fraction of every task."""
        cut = int(len(labels) * params["fraction"])
        rest = np.array_split(np.arange(cut, len(labels)), num_devices - 1)
        return [np.arange(cut), *rest]

    half.parameters = (PartitionParameter("fraction", "share of device 0", "float", 0, 1, default=0.5),)  # type: ignore[attr-defined]

    record = partitioner_from_entry_point("half", half, "my-plugin 1.0")

    assert record.name == "half" and record.label == "half — The first device holds a fraction of every task."
    assert record.parameters == half.parameters  # type: ignore[attr-defined]
    PARTITIONER_REGISTRY.register(record)
    try:
        shards = partition_indices(np.zeros(10, dtype=np.int64), 3, "half", {"fraction": 0.6})
        assert [len(s) for s in shards] == [6, 2, 2]
        with pytest.raises(ValueError, match=r"partition_params\.fraction must be a number in \[0, 1\]"):
            partition_indices(np.zeros(10, dtype=np.int64), 3, "half", {"fraction": 2})
    finally:
        PARTITIONER_REGISTRY.unregister("half")


def test_an_entry_point_record_or_factory_is_kept_and_anything_else_refused():
    from workers.registry.base import PluginLoadError
    from workers.registry.partitioners import iid_split

    record = Partitioner("even", "even", iid_split)
    assert partitioner_from_entry_point("even", record, "x 1") is record
    assert partitioner_from_entry_point("even", lambda: record, "x 1") is record
    with pytest.raises(PluginLoadError, match="gave a partition rule named 'even'"):
        partitioner_from_entry_point("other", record, "x 1")
    with pytest.raises(PluginLoadError, match="gave int"):
        partitioner_from_entry_point("n", 3, "x 1")

    def bad(labels, num_devices, params, seed):
        return []

    bad.parameters = ("alpha",)  # type: ignore[attr-defined]
    with pytest.raises(PluginLoadError, match="PartitionParameter"):
        partitioner_from_entry_point("bad", bad, "x 1")


def _plugin_split(labels, num_devices, params, seed):
    """Every device holds every ``params['every']``-th sample, from its own start."""
    return [np.arange(j, len(labels), num_devices) for j in range(num_devices)]


_plugin_split.parameters = (PartitionParameter("every", "unused stride", "int", 1, 5, default=1),)  # type: ignore[attr-defined]


def test_the_registry_wraps_an_installed_split_callable(monkeypatch):
    from importlib.metadata import EntryPoint

    import workers.registry.base as base

    entry = EntryPoint("strided", f"{__name__}:_plugin_split", "mtfl.partitioners")
    monkeypatch.setattr(base, "entry_points", lambda group: [entry] if group == "mtfl.partitioners" else [])
    PARTITIONER_REGISTRY.reload_plugins()
    try:
        assert PARTITIONER_REGISTRY.get("strided").parameters == _plugin_split.parameters  # type: ignore[attr-defined]
        shards = partition_indices(np.zeros(9, dtype=np.int64), 3, "strided", {"every": 2})
        assert [s.tolist() for s in shards] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    finally:
        PARTITIONER_REGISTRY.unregister("strided")
        monkeypatch.undo()
        PARTITIONER_REGISTRY.reload_plugins()


def test_shard_offsets_are_cumulative():
    assert shard_offsets([3, 0, 5, 2]) == [0, 3, 3, 8]


def test_shard_offsets_reject_negative_count():
    with pytest.raises(ValueError, match=r"counts\[1\]"):
        shard_offsets([3, -1])


def test_shard_indices_are_disjoint_and_cover_the_split():
    train_size = 1437
    counts = _counts(train_size, 4, "quantity", {"alpha": 0.5}, seed=3)
    shards = [
        shard_indices(train_size, 9, offset, count) for offset, count in zip(shard_offsets(counts), counts, strict=True)
    ]

    joined = np.concatenate(shards)
    assert all(s.dtype == np.int64 for s in shards)
    assert len(joined) == train_size
    assert np.array_equal(np.sort(joined), np.arange(train_size))


def test_shard_indices_reject_window_past_the_split():
    with pytest.raises(ValueError, match="exceeds"):
        shard_indices(100, 0, 90, 11)
