"""The lab load test's figures on hand-made intervals (benchmarks/lab_metrics.py)."""

from __future__ import annotations

import pytest

from benchmarks.lab_metrics import (
    all_waiting_window,
    found_free,
    idle_while_waiting,
    intersect,
    jain_index,
    leased_seconds,
    length,
    subtract,
    union,
)
from tests.benchmarks import load_benchmark


def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones():
    assert union([(5, 7), (0, 2), (1, 3), (3, 4), (8, 8), (9, 6)]) == [(0, 4), (5, 7)]


def test_intersect_and_subtract_are_set_operations_on_instants():
    a = [(0, 10), (20, 30)]
    b = [(5, 25)]
    assert intersect(a, b) == [(5, 10), (20, 25)]
    assert subtract(a, b) == [(0, 5), (25, 30)]
    assert subtract([(0, 10)], [(2, 3), (4, 5), (9, 12)]) == [(0, 2), (3, 4), (5, 9)]
    assert length([(0, 2), (1, 4), (10, 11)]) == 5


def test_the_window_is_where_every_user_had_a_round_waiting_at_once():
    waiting = {
        "ana": [(0, 50), (40, 100)],  # her rounds overlap: one union, 0-100
        "ben": [(10, 30), (60, 90)],
        "cai": [(20, 70)],
    }
    assert all_waiting_window(waiting, ["ana", "ben", "cai"]) == [(20, 30), (60, 70)]
    # a user who never waited (or waited alone) leaves no window
    assert all_waiting_window({**waiting, "dee": [(100, 120)]}, ["ana", "ben", "cai", "dee"]) == []
    assert all_waiting_window(waiting, ["ana", "ben", "cai", "eli"]) == []


def test_leased_seconds_add_a_users_devices_inside_the_window_only():
    leases = {"ana": [(0, 25), (0, 25)], "ben": [(22, 65)], "cai": []}  # ana holds two devices
    window = [(20, 30), (60, 70)]
    assert leased_seconds(leases, window) == {"ana": 10.0, "ben": 8 + 5, "cai": 0}


def test_jain_index_is_one_for_equal_shares_and_one_over_n_when_one_takes_all():
    assert jain_index([3.0, 3.0, 3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([10.0, 0, 0, 0, 0]) == pytest.approx(0.2)
    # FIFO serving runs in turn: one user with 6 of 10 runs, four with 1 each
    assert jain_index([6, 1, 1, 1, 1]) == pytest.approx(100 / (5 * 40))
    for bad in ([], [0.0, 0.0], [1.0, -1.0]):
        with pytest.raises(ValueError, match="values"):
            jain_index(bad)


def test_a_device_is_idle_while_free_and_wanted_by_a_waiting_round():
    busy = {"d1": [(0, 10), (12, 30)], "d2": [(0, 30)], "d3": []}
    waiting = [
        ((5, 14), ["d1", "d2"]),  # waits from 5 to 14: d1 free 10-12 while it waits
        ((20, 25), ["d2"]),  # d2 is busy then: no idle time
    ]
    idle = idle_while_waiting(busy, waiting, span=(0, 30))
    assert idle == {"d1": [(10, 12)], "d2": [], "d3": []}
    # nobody wants d3, and a paused device is not idle
    idle = idle_while_waiting(busy, [((0, 30), ["d3"])], span=(0, 30), paused={"d3": [(0, 20)]})
    assert idle["d3"] == [(20, 30)]
    # only the measured span counts
    assert idle_while_waiting({"d1": []}, [((-5, 50), ["d1"])], span=(0, 30))["d1"] == [(0, 30)]


def test_a_round_found_free_devices_when_enough_candidates_held_nothing():
    busy = {"d1": [(0, 10)], "d2": [(5, 15)], "d3": []}
    assert found_free(busy, ["d1", "d2", "d3"], 2, at=2.0)  # d2 and d3
    assert not found_free(busy, ["d1", "d2", "d3"], 2, at=7.0)  # only d3
    assert found_free(busy, ["d1", "d2"], 1, at=10.0)  # d1's lease ended at 10
    with pytest.raises(ValueError, match="slots"):
        found_free(busy, ["d1"], 0, at=0.0)


def test_the_benchmarks_figures_come_from_lease_round_and_run_rows():
    lab_queue = load_benchmark("lab_queue")
    # one pool of two devices; ana has runs 1 and 2, ben run 3, which fails at 95; span 0-100 s
    rows = {
        "policy": "fair",
        "span_s": 100.0,
        "pools": {"p": [1, 2]},
        "leases": [
            {"user": "ana", "device": 1, "granted": 0.01, "released": 40.0},
            {"user": "ana", "device": 2, "granted": 0.01, "released": 40.0},
            {"user": "ben", "device": 1, "granted": 40.5, "released": 80.0},
            {"user": "ben", "device": 2, "granted": 40.5, "released": 80.0},
            {"user": "ana", "device": 1, "granted": 80.0, "released": None},  # held at the end
            {"user": "ana", "device": 2, "granted": 80.0, "released": 130.0},  # released after it
        ],
        "rounds": [
            {"user": "ana", "run": 1, "pool": "p", "queued": 0.0, "started": 0.01, "finished": 40.0, "queue_s": 0.01},
            {"user": "ana", "run": 2, "pool": "p", "queued": 5.0, "started": 80.0, "finished": None, "queue_s": 75.0},
            {"user": "ben", "run": 3, "pool": "p", "queued": 10.0, "started": 40.5, "finished": 80.0, "queue_s": 30.5},
            {"user": "ana", "run": 1, "pool": "p", "queued": 41.0, "started": None, "finished": 101.0, "queue_s": None},
            {"user": "ben", "run": 3, "pool": "p", "queued": 81.0, "started": None, "finished": 95.0, "queue_s": None},
            {"user": "ana", "run": 1, "pool": "p", "queued": 120.0, "started": None, "finished": None, "queue_s": None},
        ],
        "runs": {
            1: {"user": "ana", "status": "cancelled", "error": "", "finished": 101.0},
            2: {"user": "ana", "status": "cancelled", "error": "", "finished": 101.0},
            3: {"user": "ben", "status": "failed", "error": "x", "finished": 95.0},
        },
    }

    f = lab_queue.figures(rows, ["ana", "ben"])

    # both had work waiting from ben's first round (10) to his run's end (95)
    assert f["window_s"] == 85.0 and f["window_first_last_s"] == [10.0, 95.0]
    assert f["users"]["ana"]["device_s_in_window"] == 2 * 30 + 2 * 15
    assert f["users"]["ben"]["device_s_in_window"] == 2 * 39.5
    assert f["jain_fairness"] == round(169**2 / (2 * (90**2 + 79**2)), 4)
    assert f["jain_per_block"] == [round(119**2 / (2 * (60**2 + 59**2)), 4)]  # 10-70 s
    # both had a round queued 10-40.5 and 81-95 only, when ana held the devices
    assert f["queued_instants_s"] == 44.5 and f["queued_instants_intervals"] == 2
    assert f["jain_queued_instants"] == 0.5
    # over the span (leases cut at its end)
    assert f["users"]["ana"]["device_s"] == 120.0 and f["users"]["ben"]["device_s"] == 79.0
    assert f["users"]["ana"]["rounds_started"] == 2 and f["users"]["ben"]["mean_queue_s"] == 30.5
    # both devices idle while ana's first round was granted (0-0.01) and 40-40.5
    assert f["idle_while_waiting_s"] == 1.02 and f["idle_episodes"] == 4
    # only ana's first round found its devices free: 0.01 s, which the 40-40.5 gap exceeds by 0.49
    assert f["dispatch_latency_median_s"] == 0.01 and f["dispatch_latency_rounds"] == 1
    assert f["idle_beyond_dispatch_latency_s"] == 0.98
    assert f["runs_failed"] == {"3": "x"}
