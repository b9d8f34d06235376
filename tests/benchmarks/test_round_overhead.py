"""The round overhead benchmark's figures on hand-made timestamps (benchmarks/round_overhead.py)."""

from __future__ import annotations

import pytest

from benchmarks import round_overhead as ro

T = 1_000_000.0
"""A Unix time the hand-made runs start at."""


def _round(index, start, *, status="succeeded", evaluations=None, devices=None, receipt=True):
    """A round whose timestamps are offsets from ``start`` (seconds): leased +0.2, dispatched
    +0.5, agent receipt +0.6, device a trains 1.6-7.6 and b 1.8-7.0, results in at +8.0, ended
    +10.0 (unless ``devices`` says otherwise)."""
    devices = devices or {
        "a": {
            "received_at": start + 0.6 if receipt else None,
            "first_step_at": start + 1.6,
            "last_end_at": start + 7.6,
        },
        "b": {
            "received_at": start + 0.7 if receipt else None,
            "first_step_at": start + 1.8,
            "last_end_at": start + 7.0,
        },
    }
    return {
        "index": index,
        "status": status,
        "started_at": start + 0.2,
        "dispatched_at": start + 0.5,
        "aggregating_at": start + 8.0,
        "finished_at": start + 10.0,
        "retried": False,
        "devices": devices,
        "evaluations": [{"on_path": True, "done_at": start + 9.9, "failed": False}]
        if evaluations is None
        else evaluations,
    }


def test_a_rounds_overhead_is_its_wall_time_less_the_slowest_devices_training_and_its_parts_add_up():
    run = {"started_at": T, "rounds": [_round(0, T), _round(1, T + 10.0)]}

    first, second = ro.round_figures(run)

    assert second["wall_s"] == pytest.approx(10.0)  # previous round's end to this one's
    assert second["train_s"] == pytest.approx(6.0)  # device a, the slowest
    assert second["overhead_s"] == pytest.approx(4.0)
    assert second["training_share"] == pytest.approx(0.6)
    assert second["critical_device"] == "a"  # it ended last
    assert (second["start_s"], second["plan_s"], second["send_s"]) == pytest.approx((0.2, 0.3, 0.1))
    assert second["dispatch_s"] == pytest.approx(0.6)
    assert second["process_start_s"] == pytest.approx(1.0)
    assert second["collection_s"] == pytest.approx(0.4)
    assert second["agg_eval_s"] == pytest.approx(2.0)
    parts = ("dispatch_s", "process_start_s", "collection_s", "agg_eval_s", "other_s")
    assert sum(second[p] for p in parts) == pytest.approx(second["overhead_s"])
    assert first["wall_s"] == pytest.approx(10.0)  # from the run's start


def test_evaluation_on_the_critical_path_leaves_aggregation_and_evaluation_alone_unknown():
    (r,) = ro.round_figures({"started_at": T, "rounds": [_round(0, T)]})

    assert r["evaluation"] == "on path"
    assert r["aggregation_s"] is None and r["evaluation_s"] is None
    assert r["agg_eval_s"] == pytest.approx(2.0)


def test_evaluation_beside_the_critical_path_is_timed_from_the_rounds_end_and_seen_to_overlap_the_next_round():
    beside = [
        {"on_path": False, "done_at": T + 11.5, "failed": False},
        {"on_path": False, "done_at": T + 12.0, "failed": False},
    ]
    run = {"started_at": T, "rounds": [_round(0, T, evaluations=beside), _round(1, T + 10.0)]}

    first, _ = ro.round_figures(run)

    assert first["evaluation"] == "beside"
    assert first["aggregation_s"] == pytest.approx(2.0)
    assert first["evaluation_s"] == pytest.approx(2.0)  # the later of the two, after the round's end
    assert first["evaluation_overlaps_next"] is True  # ended after round 1's dispatch at +10.5


def test_a_missed_agent_receipt_makes_only_the_parts_that_need_it_unknown():
    (r,) = ro.round_figures({"started_at": T, "rounds": [_round(0, T, receipt=False)]})

    assert r["send_s"] is None and r["dispatch_s"] is None and r["process_start_s"] is None
    assert r["other_s"] is None
    assert r["start_s"] == pytest.approx(0.2) and r["plan_s"] == pytest.approx(0.3)
    assert r["overhead_s"] == pytest.approx(4.0)


def test_a_run_summary_counts_only_rounds_every_device_trained_and_medians_over_later_rounds():
    rounds = [_round(0, T), _round(1, T + 10.0), _round(2, T + 20.0, status="partial"), _round(3, T + 30.0)]
    run = {"started_at": T, "created_at": T - 0.5, "first_step_at": T + 1.6, "finished_at": T + 40.0, "rounds": rounds}
    figures = ro.round_figures(run)

    summary = ro.run_summary(run, figures)

    assert summary["start_to_first_step_s"] == pytest.approx(1.6)
    assert summary["launch_to_start_s"] == pytest.approx(0.5)
    assert summary["first_round_overhead_s"] == pytest.approx(4.0)
    assert summary["later_rounds_counted"] == 2
    assert summary["rounds_not_counted"] == [2]
    assert summary["later_overhead_median_s"] == pytest.approx(4.0)


def test_a_case_summary_takes_medians_over_runs_and_skips_unknown_figures():
    runs = [
        {
            "start_to_first_step_s": s,
            "first_round_overhead_s": f,
            "first_round_training_share": None,
            "later_overhead_median_s": o,
            "later_training_share_median": 0.5,
        }
        for s, f, o in ((3.0, 10.0, 1.0), (5.0, 20.0, None), (4.0, 30.0, 3.0))
    ]

    summary = ro.case_summary(runs)

    assert summary["median_start_to_first_step_s"] == 4.0
    assert summary["median_first_round_overhead_s"] == 20.0
    assert summary["median_later_overhead_median_s"] == 2.0
    assert summary["median_first_round_training_share"] is None
    assert summary["runs"] == 3
