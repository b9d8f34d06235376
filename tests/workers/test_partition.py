from __future__ import annotations

import numpy as np
import pytest

from workers.training.partition import shard_counts, shard_indices, shard_offsets


@pytest.mark.parametrize("rule,alpha", [("iid", None), ("dirichlet", 0.5), ("dirichlet", 100.0)])
@pytest.mark.parametrize("train_size,num_devices", [(0, 3), (1, 4), (1437, 5), (50_000, 7)])
def test_shard_counts_sum_to_train_size(rule, alpha, train_size, num_devices):
    counts = shard_counts(train_size, num_devices, rule, alpha=alpha, seed=1)

    assert len(counts) == num_devices
    assert sum(counts) == train_size
    assert all(isinstance(c, int) and c >= 0 for c in counts)


def test_iid_counts_differ_by_at_most_one():
    counts = shard_counts(1437, 4, "iid")

    assert counts == [360, 359, 359, 359]


def test_dirichlet_counts_are_deterministic_per_seed():
    first = shard_counts(1437, 5, "dirichlet", alpha=0.3, seed=11)
    again = shard_counts(1437, 5, "dirichlet", alpha=0.3, seed=11)
    other = shard_counts(1437, 5, "dirichlet", alpha=0.3, seed=12)

    assert first == again
    assert first != other


def test_small_alpha_skews_volumes_more_than_large_alpha():
    def spread(alpha: float) -> float:
        return float(np.mean([np.std(shard_counts(10_000, 5, "dirichlet", alpha=alpha, seed=s)) for s in range(20)]))

    assert spread(0.1) > 5 * spread(100.0)


@pytest.mark.parametrize("alpha", [None, 0.0, -1.0, float("nan"), float("inf")])
def test_dirichlet_rejects_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        shard_counts(100, 3, "dirichlet", alpha=alpha)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"train_size": -1, "num_devices": 2}, "train_size"),
        ({"train_size": 10, "num_devices": 0}, "num_devices"),
    ],
)
def test_shard_counts_rejects_bad_sizes(kwargs, field):
    with pytest.raises(ValueError, match=field):
        shard_counts(rule="iid", **kwargs)


def test_shard_counts_rejects_unknown_rule():
    with pytest.raises(ValueError, match="rule"):
        shard_counts(10, 2, "label-skew")  # type: ignore[arg-type]


def test_shard_offsets_are_cumulative():
    assert shard_offsets([3, 0, 5, 2]) == [0, 3, 3, 8]


def test_shard_offsets_reject_negative_count():
    with pytest.raises(ValueError, match=r"counts\[1\]"):
        shard_offsets([3, -1])


def test_shard_indices_are_disjoint_and_cover_the_split():
    train_size = 1437
    counts = shard_counts(train_size, 4, "dirichlet", alpha=0.5, seed=3)
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


@pytest.mark.parametrize("rule,alpha", [("iid", None), ("dirichlet", 0.3)])
def test_no_device_gets_a_single_sample(rule, alpha):
    for seed in range(50):
        counts = shard_counts(7, 5, rule, alpha=alpha, seed=seed)
        assert all(c != 1 for c in counts) and sum(counts) == 7
