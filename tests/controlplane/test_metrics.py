"""The one metrics module: hand-worked rounds, including a failed device and a partial round."""

from __future__ import annotations

import datetime as dt

import pytest

from controlplane.planning import metrics
from controlplane.planning.metrics import DeviceMetrics, DeviceTotals, TaskMeasurement
from tests.controlplane.comparison_rows import comparison_from_rows


def _ok(p: float, alone: float | None, start: float, end: float, samples: int = 100) -> TaskMeasurement:
    return TaskMeasurement(
        succeeded=True,
        samples_trained=samples,
        throughput_sps=p,
        standalone_sps=alone,
        started_at=start,
        finished_at=end,
    )


def test_a_device_sums_raw_and_fair_throughput_of_its_tasks():
    totals = DeviceTotals.from_tasks([_ok(50.0, 100.0, 0.0, 4.0), _ok(30.0, 60.0, 1.0, 5.0)])

    m = metrics.round_metrics({"a": totals}).devices["a"]

    assert m.raw_throughput_sps == pytest.approx(80.0)
    assert m.fair_throughput == pytest.approx(0.5 + 0.5)
    assert m.compute_s == pytest.approx(5.0) and m.idle_s == pytest.approx(0.0)


def test_a_round_of_two_healthy_devices_averages_them_and_times_the_slowest():
    # Device a: P = 50 + 30 (alone 100, 60), spans 0-4 and 1-5 s, 200 samples.
    # Device b: P = 20 (alone 40), span 2-10 s, 100 samples.
    a = DeviceTotals.from_tasks([_ok(50.0, 100.0, 0.0, 4.0), _ok(30.0, 60.0, 1.0, 5.0)])
    b = DeviceTotals.from_tasks([_ok(20.0, 40.0, 2.0, 10.0)])

    m = metrics.round_metrics({"a": a, "b": b})

    assert m.round_time_s == pytest.approx(10.0)  # first start 0 s, last end 10 s
    assert m.samples_trained == 300
    assert m.fl_throughput_sps == pytest.approx(30.0)  # 300 samples / 10 s
    assert m.raw_throughput_sps == pytest.approx((80.0 + 20.0) / 2)
    assert m.fair_throughput == pytest.approx((1.0 + 0.5) / 2)
    assert m.devices["a"].idle_s == pytest.approx(10.0 - 5.0)  # a computes 0-5 s, waits for b
    assert m.devices["b"].idle_s == pytest.approx(0.0)  # b computes 2-10 s: it is the slowest
    assert m.counted == ("a", "b")


def test_a_failed_device_adds_nothing_to_the_round_even_its_finished_tasks():
    healthy = DeviceTotals.from_tasks([_ok(40.0, 80.0, 0.0, 5.0)])
    # One task finished (fast, long span), the other crashed: the device's round failed.
    failed = DeviceTotals.from_tasks(
        [_ok(500.0, 500.0, 0.0, 50.0, samples=900), TaskMeasurement(succeeded=False, started_at=0.0, finished_at=1.0)]
    )

    m = metrics.round_metrics({"ok": healthy, "broken": failed})

    assert not failed.counts
    assert m.devices["broken"] == DeviceMetrics(counts=False)
    assert m.round_time_s == pytest.approx(5.0)  # not the broken device's 50 s
    assert m.samples_trained == 100
    assert m.fl_throughput_sps == pytest.approx(20.0)
    assert m.raw_throughput_sps == pytest.approx(40.0)
    assert m.fair_throughput == pytest.approx(0.5)
    assert m.counted == ("ok",)


def test_a_device_that_reported_failure_does_not_count_even_if_every_task_succeeded():
    totals = DeviceTotals.from_tasks([_ok(40.0, 80.0, 0.0, 5.0)], device_failed=True)

    m = metrics.round_metrics({"a": totals})

    assert m.raw_throughput_sps is None and m.round_time_s is None and m.samples_trained == 0


def test_a_failed_round_reports_no_metrics_and_a_run_ignores_it():
    failed = metrics.round_metrics({"a": DeviceTotals.from_tasks([TaskMeasurement(succeeded=False)])})
    partial = metrics.round_metrics(
        {
            "a": DeviceTotals.from_tasks([_ok(40.0, 80.0, 0.0, 4.0)]),
            "b": DeviceTotals.from_tasks([TaskMeasurement(succeeded=False)]),
        }
    )
    whole = metrics.round_metrics(
        {
            "a": DeviceTotals.from_tasks([_ok(60.0, 80.0, 0.0, 2.0)]),
            "b": DeviceTotals.from_tasks([_ok(20.0, 40.0, 0.0, 2.0)]),
        }
    )

    run = metrics.run_metrics([failed, partial, whole])

    assert (failed.round_time_s, failed.fl_throughput_sps, failed.raw_throughput_sps, failed.fair_throughput) == (
        None,
        None,
        None,
        None,
    )
    assert failed.samples_trained == 0
    # The partial round reports device a alone: 40 sps raw, 0.5 fair, 100 samples in 4 s.
    assert (partial.raw_throughput_sps, partial.fair_throughput, partial.fl_throughput_sps) == (40.0, 0.5, 25.0)
    # The run: the mean over the partial and the whole round (raw 40 and 40, fair 0.5 and 0.625,
    # FL 25 and 100); the failed round adds nothing.
    assert run.raw_throughput_sps == pytest.approx(40.0)
    assert run.fair_throughput == pytest.approx((0.5 + 0.625) / 2)
    assert run.fl_throughput_sps == pytest.approx((25.0 + 100.0) / 2)


def test_fair_throughput_needs_every_task_measured_with_a_standalone_speed():
    no_alone = DeviceTotals.from_tasks([_ok(50.0, 100.0, 0.0, 1.0), _ok(30.0, None, 0.0, 1.0)])
    unmeasured = DeviceTotals.from_tasks(
        [
            _ok(50.0, 100.0, 0.0, 1.0),
            TaskMeasurement(succeeded=True, samples_trained=10, started_at=0.0, finished_at=1.0),
        ]
    )
    with_fair = DeviceTotals.from_tasks([_ok(10.0, 20.0, 0.0, 1.0)])

    m = metrics.round_metrics({"no_alone": no_alone, "unmeasured": unmeasured, "with_fair": with_fair})

    assert m.devices["no_alone"].fair_throughput is None
    assert m.devices["no_alone"].raw_throughput_sps == pytest.approx(80.0)
    assert m.devices["unmeasured"].fair_throughput is None
    assert m.devices["unmeasured"].raw_throughput_sps == pytest.approx(50.0)  # the measured task only
    assert m.fair_throughput == pytest.approx(0.5)  # the one device that has one
    assert m.raw_throughput_sps == pytest.approx((80.0 + 50.0 + 10.0) / 3)


def test_totals_a_database_computes_give_the_same_round_as_the_tasks():
    tasks = [_ok(50.0, 100.0, 0.0, 4.0), _ok(30.0, 60.0, 1.0, 5.0)]
    summed = DeviceTotals(
        tasks=2,
        measured=2,
        with_standalone=2,
        raw_sps=80.0,
        fair=1.0,
        samples_trained=200,
        started_at=0.0,
        finished_at=5.0,
    )

    assert metrics.round_metrics({"a": summed}) == metrics.round_metrics({"a": DeviceTotals.from_tasks(tasks)})


def test_speedups_are_taken_against_the_named_baseline_inside_devices_and_per_round():
    # Baseline "slow": device d 10 sps in round 0, 30 in round 1. Strategy "fast": 20 and 30.
    rows = {
        ("slow", "d", 0): DeviceMetrics(counts=True, raw_throughput_sps=10.0, fair_throughput=0.5),
        ("slow", "d", 1): DeviceMetrics(counts=True, raw_throughput_sps=30.0, fair_throughput=0.5),
        ("fast", "d", 0): DeviceMetrics(counts=True, raw_throughput_sps=20.0, fair_throughput=1.0),
        ("fast", "d", 1): DeviceMetrics(counts=True, raw_throughput_sps=30.0, fair_throughput=None),
    }

    sp = metrics.comparison_speedups(rows, ["slow", "fast"], baseline="slow")

    assert sp["per_device"]["raw"]["fast"]["d"] == pytest.approx(25.0 / 20.0)  # mean 25 over mean 20
    assert sp["per_round"]["raw"]["fast"] == {0: pytest.approx(2.0), 1: pytest.approx(1.0)}
    assert sp["per_device"]["raw"]["slow"]["d"] == pytest.approx(1.0)
    assert sp["per_device"]["fair"]["fast"]["d"] == pytest.approx(1.0 / 0.5)
    assert sp["per_round"]["fair"]["fast"] == {0: pytest.approx(2.0)}  # round 1 has no fair value


def test_a_device_that_failed_under_the_baseline_has_no_speedup_in_that_round():
    rows = {
        ("base", "d", 0): DeviceMetrics(counts=False),
        ("other", "d", 0): DeviceMetrics(counts=True, raw_throughput_sps=20.0),
    }

    sp = metrics.comparison_speedups(rows, ["base", "other"], baseline="base")

    assert sp["per_device"]["raw"]["other"] == {} and sp["per_round"]["raw"]["other"] == {}


def test_comparison_from_assignment_rows_applies_the_same_rule_as_a_round():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        {
            "strategy": "base",
            "device": "d",
            "round_index": 0,
            "status": "succeeded",
            "samples_trained": 10,
            "throughput_sps": 10.0,
            "standalone_throughput_sps": 20.0,
            "started_at": t0,
            "finished_at": t0 + dt.timedelta(seconds=4),
        },
        {
            "strategy": "base",
            "device": "e",
            "round_index": 0,
            "status": "succeeded",
            "samples_trained": 10,
            "throughput_sps": 10.0,
            "standalone_throughput_sps": 20.0,
            "started_at": t0,
            "finished_at": t0 + dt.timedelta(seconds=6),
        },
        {
            "strategy": "new",
            "device": "d",
            "round_index": 0,
            "status": "succeeded",
            "samples_trained": 10,
            "throughput_sps": 30.0,
            "standalone_throughput_sps": 20.0,
            "started_at": t0,
            "finished_at": t0 + dt.timedelta(seconds=2),
        },
        {
            "strategy": "new",
            "device": "e",
            "round_index": 0,
            "status": "failed",
            "samples_trained": 0,
            "throughput_sps": 99.0,
            "standalone_throughput_sps": 20.0,
            "started_at": t0,
            "finished_at": t0 + dt.timedelta(seconds=60),
        },
    ]

    speedups, split = comparison_from_rows(rows, ["base", "new"], baseline="base")

    assert speedups["per_device"]["raw"]["new"] == {"d": pytest.approx(3.0)}  # e failed under "new"
    assert split[("base", "d")] == (pytest.approx(4.0), pytest.approx(2.0))  # waits 2 s for e
    assert split[("new", "d")] == (pytest.approx(2.0), pytest.approx(0.0))  # the failed e is not waited for
    assert ("new", "e") not in split


def test_an_unknown_metric_name_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="metric: 'speed' is not allowed; allowed: raw, fair"):
        DeviceMetrics(counts=True).get("speed")


def test_only_the_devices_that_finished_early_wait_for_the_slowest():
    # Issue 33: one round, three devices. a trains 0-6 s, b starts late and trains 1-10 s (it
    # ends last: the slowest), c trains 0.5-8 s. The round runs 0-10 s. a waits 10 - 6 = 4 s,
    # c 10 - 8 = 2 s, b 0 s: its late start is not a wait for another device.
    devices = {
        "a": DeviceTotals.from_tasks([_ok(10.0, 20.0, 0.0, 6.0)]),
        "b": DeviceTotals.from_tasks([_ok(10.0, 20.0, 1.0, 10.0)]),
        "c": DeviceTotals.from_tasks([_ok(10.0, 20.0, 0.5, 8.0)]),
    }

    m = metrics.round_metrics(devices)

    assert m.round_time_s == pytest.approx(10.0)
    assert {d: m.devices[d].idle_s for d in devices} == pytest.approx({"a": 4.0, "b": 0.0, "c": 2.0})
    assert {d: m.devices[d].compute_s for d in devices} == pytest.approx({"a": 6.0, "b": 9.0, "c": 7.5})
    # what the round-time chart draws: per strategy and device, the mean over rounds
    split = metrics.time_split({("sharing", 0): m})
    assert split[("sharing", "b")] == pytest.approx((9.0, 0.0))
    assert split[("sharing", "a")] == pytest.approx((6.0, 4.0))
