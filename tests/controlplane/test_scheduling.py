"""The lab scheduler's pure decisions (controlplane.planning.scheduling), worked by hand."""

from __future__ import annotations

import pytest

from controlplane.planning.scheduling import (
    DEFAULT_ROUND_S,
    WaitingRound,
    estimate_starts,
    order_waiting,
    owner_usage,
    place_pool_rounds,
    schedule_pass,
)


def named(key, owner, devices, *, at=0.0, priority=0, expected_s=10.0):
    return WaitingRound(
        key=key, owner=owner, priority=priority, queued_at=at, devices=frozenset(devices), expected_s=expected_s
    )


def pooled(key, owner, candidates, slots, *, pool=1, at=0.0, cost=None, expected_s=10.0):
    return WaitingRound(
        key=key,
        owner=owner,
        priority=0,
        queued_at=at,
        pool=pool,
        candidates=frozenset(candidates),
        slots=slots,
        cost_s=cost or {},
        expected_s=expected_s,
    )


def test_owner_usage_counts_only_the_window_and_held_leases_up_to_now():
    leases = [
        ("a", 0.0, 50.0),  # 10 s of it inside [40, 100]
        ("a", 60.0, None),  # held: 40 s up to now
        ("b", 10.0, 30.0),  # before the window
        ("b", 90.0, 95.0),
    ]
    assert owner_usage(leases, now=100.0, window_s=60.0) == {"a": 50.0, "b": 5.0}


def test_fifo_serves_in_arrival_order_and_priority_first():
    waiting = [named(1, "a", [1], at=3.0), named(2, "b", [2], at=1.0), named(3, "c", [3], at=2.0, priority=5)]
    assert [r.key for r in order_waiting(waiting, policy="fifo")] == [3, 2, 1]


def test_fair_serves_the_owner_with_the_least_weighted_service_and_counts_what_it_grants():
    # a has used 100 device-s, b 40, c nothing; c is weighed 0.5 (its 20 planned device-s count 40).
    waiting = [named(k, "a", [k], at=k) for k in (1, 2)] + [named(3, "b", [3], at=3.0), named(4, "c", [4], at=4.0)]
    usage = {"a": 100.0, "b": 40.0}
    ordered = order_waiting(waiting, policy="fair", usage=usage, weights={"c": 0.5})
    # c (0) first, then c's 10 s counts 20 → b (40) before c... c has no more rounds: b, then a twice
    assert [r.key for r in ordered] == [4, 3, 1, 2]


def test_fair_pass_shares_freed_devices_between_owners_instead_of_giving_all_to_one():
    # a queued 4 one-device rounds first; b two, later. 4 devices free.
    waiting = [named(k, "a", [k], at=k) for k in range(4)] + [named(10 + k, "b", [4 + k], at=10 + k) for k in range(2)]
    # everything fits on distinct devices: both get everything
    assert set(schedule_pass(waiting, busy=[], policy="fair")) == {0, 1, 2, 3, 10, 11}
    # rounds compete for devices 0 and 1 only
    compete = [named(k, "a", [k % 2], at=k) for k in range(4)] + [named(10 + k, "b", [k], at=10 + k) for k in range(2)]
    fifo = schedule_pass(compete, busy=[], policy="fifo")
    fair = schedule_pass(compete, busy=[], policy="fair", usage={"a": 5.0})
    assert fifo == {0: [0], 1: [1]}
    # b has used nothing: its first round goes first; then a (5) < b (10): a's round on device 1
    assert fair == {10: [0], 1: [1]}


def test_a_round_whose_devices_are_busy_is_passed_over_for_one_that_fits():
    waiting = [named(1, "a", [1, 2], at=0.0), named(2, "b", [3], at=1.0)]
    assert schedule_pass(waiting, busy=[2], policy="fifo") == {2: [3]}


def test_pool_rounds_are_matched_to_the_cheapest_free_candidates():
    # round 1 needs 2 of {1,2,3}; round 2 needs 1 of {1,2}; device 3 is slow for round 1.
    r1 = pooled(1, "a", [1, 2, 3], 2, cost={1: 5.0, 2: 5.0, 3: 50.0})
    r2 = pooled(2, "b", [1, 2], 1, cost={1: 5.0, 2: 6.0}, at=1.0)
    # Greedy (r1 takes 1 and 2) would leave r2 nothing; the matching gives r1 device 3.
    assert place_pool_rounds([r1, r2], [1, 2, 3]) in ({1: [2, 3], 2: [1]}, {1: [1, 3], 2: [2]})
    assert place_pool_rounds([r1, r2], [1, 2, 3]) == {1: [2, 3], 2: [1]}  # cheaper total: 5+50+5 vs 5+50+6
    assert schedule_pass([r1, r2], busy=[], pool_devices={1: [1, 2, 3]}, policy="fifo") == {1: [2, 3], 2: [1]}
    # not enough candidates free: r1 waits, r2 (backfilled) runs
    assert schedule_pass([r1, r2], busy=[3, 2], pool_devices={1: [1, 2, 3]}, policy="fifo") == {2: [1]}
    assert place_pool_rounds([r1], [1]) is None


@pytest.mark.parametrize("policy", ["fifo", "fair"])
def test_a_pool_round_served_first_keeps_its_devices_from_a_named_round_served_later(policy):
    # Found by a new user: the pool round (priority 2, queued first) was placed on devices 1 and
    # 2 and the named round on the same two: both granted, and the later one won the leases.
    first = WaitingRound(
        key=7, owner=1, priority=2, queued_at=1.0, pool=1, candidates=frozenset({1, 2}), slots=2, expected_s=10.0
    )
    later = WaitingRound(key=6, owner=2, priority=0, queued_at=2.0, devices=frozenset({1, 2}), expected_s=10.0)
    other = WaitingRound(key=5, owner=2, priority=0, queued_at=3.0, devices=frozenset({3, 4}), expected_s=10.0)

    granted = schedule_pass([first, later, other], busy=set(), pool_devices={1: [1, 2, 3]}, policy=policy)

    assert granted == {7: [1, 2], 5: [3, 4]}
    starts = estimate_starts([first, later], free_at={}, now=0.0, pool_devices={1: [1, 2, 3]}, policy=policy)
    assert starts == {7: 0.0, 6: 10.0}


def test_estimated_starts_replay_the_policy_as_devices_come_free():
    waiting = [named(1, "a", [1], at=0.0, expected_s=10.0), named(2, "b", [1], at=1.0, expected_s=5.0)]
    starts = estimate_starts(waiting, free_at={1: 130.0}, now=100.0, policy="fifo")
    assert starts == {1: 130.0, 2: 140.0}
    # a paused device: never
    assert estimate_starts(waiting, free_at={}, now=100.0, paused=[1], policy="fifo") == {1: None, 2: None}
    unknown = named(3, "c", [2], expected_s=None)
    assert unknown.device_seconds == DEFAULT_ROUND_S


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy must be one of fifo, fair"):
        schedule_pass([], busy=[], policy="lottery")
