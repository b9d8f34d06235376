from __future__ import annotations

import pytest

from workers.backends.cpu import cpu_allocation


def test_isolation_shares_get_disjoint_cores():
    windows = cpu_allocation([33, 33, 33], list(range(6)))

    assert windows == [[0, 1], [2, 3], [4, 5]]


def test_sharing_gives_every_task_all_cores():
    windows = cpu_allocation([100, 100, 100], [4, 5, 6, 7])

    assert windows == [[4, 5, 6, 7]] * 3


def test_shares_over_100_percent_overlap():
    windows = cpu_allocation([60, 60], list(range(10)))

    assert windows == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 0, 1]]
    assert set(windows[0]) & set(windows[1]) == {0, 1}


def test_tiny_share_still_gets_one_core_and_halves_round_up():
    assert cpu_allocation([1], [0, 1]) == [[0]]
    assert cpu_allocation([50, 50], [0, 1, 2]) == [[0, 1], [2, 0]]


@pytest.mark.parametrize("shares", [[0], [101], [50.0]])
def test_rejects_shares_outside_1_to_100(shares):
    with pytest.raises(ValueError, match=r"shares\[0\]"):
        cpu_allocation(shares, [0, 1])


def test_rejects_empty_or_repeated_cores():
    with pytest.raises(ValueError, match="cores"):
        cpu_allocation([50], [])
    with pytest.raises(ValueError, match="cores"):
        cpu_allocation([50], [1, 1])
