"""Issue 33 items 1–2, the follow-ups (brief F2): the small-n note with a strategy that has no
succeeded run, accuracy bands over the newest comparison's succeeded runs aligned on the round,
the waiting split of rounds recorded before it changed, a positive figure with a 0 value that
stays at or above 0, which runs measured ``P_alone`` (their wall clock includes it), and the
wording of what is a geometric mean and what is paired."""

from __future__ import annotations

import datetime as dt
import importlib
import math
import random
from types import SimpleNamespace

import pytest
from django.apps import apps as django_apps
from django.db import connection

from controlplane.core.cli_support import comparison_report_tables
from controlplane.dashboard import data, figures
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run, StandaloneThroughput
from controlplane.experiments.selectors import comparison_report
from controlplane.planning import metrics
from tests.controlplane.comparison_seed import _seed_run, seed_comparison

T0 = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC)


def _shown(chart: dict) -> list[dict]:
    """The traces of the clock a chart shows first."""
    return [t for t in chart["data"] if t.get("visible") is not False]


# --- item 2: the small-n note -------------------------------------------------------------------


def test_a_strategy_without_a_succeeded_run_does_not_hide_the_note_of_the_others_two(make_experiment):
    experiment = make_experiment(name="one strategy failed", rounds=3)
    comparison = seed_comparison(experiment, ["temporal", "isolation", "sharing"], repeats=2)
    Run.objects.filter(comparison=comparison, strategy="isolation").update(status=Run.Status.FAILED)

    report = comparison_report(comparison)

    succeeded = {row["strategy"]: row["succeeded"] for row in report["strategies"]}
    assert succeeded == {"temporal": 2, "isolation": 0, "sharing": 2}
    assert report["small_n_note"] == "n = 2: interval wide"


def test_no_note_when_every_strategy_with_runs_has_three(make_experiment):
    experiment = make_experiment(name="three and none", rounds=3)
    comparison = seed_comparison(experiment, ["temporal", "sharing"], repeats=3)
    Run.objects.filter(comparison=comparison, strategy="sharing").update(status=Run.Status.FAILED)

    assert comparison_report(comparison)["small_n_note"] == ""


# --- item 3: accuracy bands ---------------------------------------------------------------------


def _curve(run: int, accuracies: dict[int, float], *, seconds_per_round: float = 10.0, **extra) -> dict:
    """A series of ``{rounds done: accuracy}``: wall time ``seconds_per_round`` a round."""
    done = sorted(accuracies)
    return {
        "strategy": "sharing",
        "run": run,
        "task": "t1",
        "points": [(seconds_per_round * d, accuracies[d]) for d in done],
        "round_clock": [(4.0 * d, accuracies[d]) for d in done],
        "rounds": [(d, accuracies[d]) for d in done],
        **extra,
    }


def test_strategies_that_reach_the_same_accuracies_are_drawn_side_by_side_at_each_round():
    """Deterministic training gave temporal, sharing and a planner exactly the same accuracies
    (a real 3-repeat comparison on digits): on the rounds chart their points stand apart around
    each round, each with its own marker, instead of one hiding the others."""
    same = {0: 0.1, 1: 0.6, 2: 0.8}
    series = [_curve(k, same, strategy=name) for k, name in enumerate(["temporal", "sharing", "vres_sync"])]
    fig = figures.accuracy_per_round(series)
    means = {t.name: t for t in fig.data if t.mode == "lines+markers"}
    assert set(means) == {"temporal", "sharing", "vres_sync"}
    xs = [list(means[name].x) for name in ("temporal", "sharing", "vres_sync")]
    for d in range(3):
        at = [x[d] for x in xs]
        assert len(set(at)) == 3 and all(abs(x - d) <= 0.5 for x in at)  # apart, but near round d
    assert len({means[name].marker.symbol for name in means}) == 3
    assert fig.layout.xaxis.dtick == 1 and "side by side" in fig.layout.title.text
    # the time clocks are not moved: a point's time is what was measured
    wall = figures.accuracy_over_time(series)
    assert {tuple(t.x) for t in wall.data if t.mode == "lines+markers" and t.visible is not False} == {
        (0.0, 10.0, 20.0)
    }


def test_runs_are_averaged_round_by_round_when_one_missed_an_evaluation():
    full = _curve(1, {0: 0.1, 1: 0.3, 2: 0.5, 3: 0.7}, seconds_per_round=10.0)
    missing = _curve(2, {0: 0.1, 1: 0.4, 3: 0.8}, seconds_per_round=20.0)  # round 2 not evaluated

    fig = figures.accuracy_per_round([full, missing])
    wall = figures.accuracy_over_time([full, missing])

    mean = next(t for t in fig.data if t.mode == "lines+markers")
    assert list(mean.x) == [0, 1, 2, 3]  # whole rounds, never a mean of different rounds
    assert list(mean.y) == pytest.approx([0.1, 0.35, 0.5, 0.75])
    assert list(mean.customdata) == [2, 2, 1, 2]  # round 2: the full run only
    low, high = (t for t in fig.data if t.name == "sharing: lowest to highest of 2 runs")
    assert list(low.y) == pytest.approx([0.1, 0.4, 0.5, 0.8]) and list(high.y) == pytest.approx([0.1, 0.3, 0.5, 0.7])
    shown = [t for t in wall.data if t.visible is not False and t.mode == "lines+markers"]
    # wall clock: each round at the runs' mean time of that round (10 s and 20 s a round)
    assert list(shown[0].x) == pytest.approx([0.0, 15.0, 20.0, 45.0])
    assert list(shown[0].y) == pytest.approx([0.1, 0.35, 0.5, 0.75])


def test_a_run_set_aside_is_dotted_labelled_and_out_of_the_mean():
    kept = [_curve(k, {0: 0.1, 1: 0.3 + 0.1 * k}) for k in (1, 2)]
    failed = _curve(3, {0: 0.1, 1: 0.9}, aside="failed")

    fig = figures.accuracy_per_round([*kept, failed])

    mean = next(t for t in fig.data if t.mode == "lines+markers" and t.name == "sharing")
    assert list(mean.y) == pytest.approx([0.1, 0.45]) and list(mean.customdata) == [2, 2]
    dotted = next(t for t in fig.data if t.name == "sharing run 3 (failed)")
    assert dotted.line.dash == "dot" and dotted.showlegend is False and list(dotted.y) == [0.1, 0.9]
    assert "(failed)" in dotted.hovertemplate
    assert "dotted: runs outside the mean (failed)" in fig.layout.title.text


def test_a_strategy_with_only_runs_set_aside_keeps_a_legend_entry():
    fig = figures.accuracy_per_round([_curve(5, {0: 0.1, 1: 0.5}, aside="running")])

    assert [t.name for t in fig.data if t.showlegend is not False] == ["sharing run 5 (running)"]


def _missing_evaluation(run: Run, task, rounds_done: int) -> None:
    Checkpoint.objects.filter(run=run, task=task, round__index=rounds_done - 1).update(test_accuracy=None)


@pytest.fixture
def comparison_beside_other_runs(make_experiment):
    """A 2-repeat comparison of temporal and sharing, sharing's repeat 1 missing its evaluation
    after 2 rounds of the first task, and beside it a failed sharing run and a one-off one."""
    experiment = make_experiment(name="bands", rounds=4)
    comparison = seed_comparison(experiment, ["temporal", "sharing"], repeats=2, rounds=4)
    task = experiment.tasks.order_by("id").first()
    _missing_evaluation(comparison.runs.get(strategy="sharing", repeat=1), task, 2)
    rng = random.Random(7)
    others = {}
    for name, status in (("failed", Run.Status.FAILED), ("one-off", Run.Status.SUCCEEDED)):
        run = Run.objects.create(experiment=experiment, strategy="sharing", simulated=True)
        _seed_run(run, rng, rounds=4, drift=1.0, start=T0 + dt.timedelta(hours=2))
        Run.objects.filter(id=run.id).update(status=status)
        others[name] = run
    return experiment, comparison, task, others


def test_the_bands_hold_only_the_newest_comparisons_succeeded_runs(comparison_beside_other_runs):
    experiment, comparison, task, others = comparison_beside_other_runs

    built = data.experiment_figures(experiment, data.experiment_runs(experiment))

    repeats = list(comparison.runs.filter(strategy="sharing").order_by("repeat"))
    accuracy = {
        (run.id, k): a
        for run in repeats
        for k, a in enumerate(
            Checkpoint.objects.filter(run=run, task=task)
            .order_by("created_at", "id")
            .values_list("test_accuracy", flat=True)
        )
    }
    rounds = _shown(built["accuracy_rounds"])
    mean = next(t for t in rounds if t["name"] == "sharing" and task.name in t["hovertemplate"])
    # whole rounds, each strategy's points moved by the same dodge beside the others'
    assert [round(x) for x in mean["x"]] == [0, 1, 2, 3, 4]
    assert len({round(x - round(x), 6) for x in mean["x"]}) == 1 and abs(mean["x"][0]) <= figures.ROUND_DODGE
    # round 2 of repeat 1 was not evaluated: the mean there is repeat 0's alone, the others both
    for d, (y, n) in enumerate(zip(mean["y"], mean["customdata"], strict=True)):
        present = [accuracy[(r.id, d)] for r in repeats if accuracy[(r.id, d)] is not None]
        assert (y, n) == (pytest.approx(sum(present) / len(present)), len(present))
    for name, run in others.items():
        dotted = [t for t in rounds if t["name"] == f"sharing run {run.id} ({name})"]
        assert len(dotted) == experiment.tasks.count() and all(t["line"]["dash"] == "dot" for t in dotted)
    assert "dotted: runs outside the mean (failed, one-off)" in built["accuracy_rounds"]["layout"]["title"]["text"]
    wall = _shown(built["accuracy"])
    wall_mean = next(t for t in wall if t["name"] == "sharing" and task.name in t["hovertemplate"])
    started = {r.id: r.started_at for r in repeats}
    times = {
        (c.run_id, k): (c.created_at - started[c.run_id]).total_seconds()
        for run in repeats
        for k, c in enumerate(Checkpoint.objects.filter(run=run, task=task).order_by("created_at", "id"))
    }
    assert wall_mean["x"][2] == pytest.approx(times[(repeats[0].id, 2)])  # the one run evaluated then
    assert wall_mean["x"][3] == pytest.approx((times[(repeats[0].id, 3)] + times[(repeats[1].id, 3)]) / 2)


def test_without_a_comparison_each_strategy_draws_its_newest_succeeded_run(make_experiment):
    experiment = make_experiment(name="one-offs", rounds=3)
    rng = random.Random(3)
    made = []
    for status in (Run.Status.SUCCEEDED, Run.Status.SUCCEEDED, Run.Status.CANCELLED):
        run = Run.objects.create(experiment=experiment, strategy="sharing", simulated=True)
        _seed_run(run, rng, rounds=3, drift=1.0, start=T0)
        Run.objects.filter(id=run.id).update(status=status)
        made.append(run)

    built = data.experiment_figures(experiment, data.experiment_runs(experiment))

    rounds = _shown(built["accuracy_rounds"])
    means = [t for t in rounds if t["name"] == "sharing"]
    assert means and all(t["hovertemplate"].endswith(f"run {made[1].id}</extra>") for t in means)
    names = {t["name"] for t in rounds}
    assert {f"sharing run {made[0].id} (earlier run)", f"sharing run {made[2].id} (cancelled)"} <= names


# --- item 4: the waiting split of rounds recorded before it changed -------------------------------


def _recorded_round(experiment, spans: dict[str, tuple[float, float]], device_metrics: dict) -> Round:
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.SUCCEEDED, started_at=T0)
    rnd = Round.objects.create(run=run, index=0, status=Round.Status.SUCCEEDED)
    task = experiment.tasks.order_by("id").first()
    for device in experiment.devices.order_by("name"):
        start, end = spans[device.name]
        Assignment.objects.create(
            round=rnd, device=device, task=task, batch_size=128, active_thread_percentage=100, samples=100,
            samples_trained=100, throughput_sps=50.0, status=Assignment.Status.SUCCEEDED,
            started_at=T0 + dt.timedelta(seconds=start), finished_at=T0 + dt.timedelta(seconds=end),
        )  # fmt: skip
    Round.objects.filter(id=rnd.id).update(round_time_s=10.0, device_metrics=device_metrics)
    return rnd


def test_rounds_stored_with_the_old_waiting_rule_are_recomputed_so_only_early_devices_wait(make_experiment):
    experiment = make_experiment(name="old waits")
    # dev-a trains 0–6 s; dev-b starts late (4 s) and ends last (10 s): only dev-a waits (4 s)
    spans = {"dev-a": (0.0, 6.0), "dev-b": (4.0, 10.0)}
    old = {  # the old rule: round time (10 s) less the device's own compute (6 s) for both
        name: {"counts": True, "raw_throughput_sps": 50.0, "fair_throughput": None, "samples_trained": 100,
               "compute_s": 6.0, "idle_s": 4.0}
        for name in spans
    }  # fmt: skip
    failed = {**old, "dev-b": {"counts": False}}
    rnd = _recorded_round(experiment, spans, old)
    partial = _recorded_round(experiment, spans, failed)
    migration = importlib.import_module("controlplane.experiments.migrations.0021_device_waits")

    migration.recompute_waits(django_apps, SimpleNamespace(connection=connection))

    rnd.refresh_from_db()
    assert rnd.device_metrics["dev-a"]["idle_s"] == pytest.approx(4.0)
    assert rnd.device_metrics["dev-b"]["idle_s"] == pytest.approx(0.0)
    assert rnd.device_metrics["dev-b"]["compute_s"] == 6.0  # nothing else changes
    split = metrics.time_split({("sharing", 0): metrics.RoundMetrics.from_stored(rnd, rnd.device_metrics)})
    assert split[("sharing", "dev-b")] == (6.0, pytest.approx(0.0))
    # a device that did not count is no one's slowest: dev-a alone waits 0 s
    partial.refresh_from_db()
    assert partial.device_metrics["dev-a"]["idle_s"] == pytest.approx(0.0)
    assert partial.device_metrics["dev-b"] == {"counts": False}


def test_recomputing_leaves_a_round_recorded_by_the_new_rule_as_it_is(make_experiment):
    experiment = make_experiment(name="new waits")
    spans = {"dev-a": (0.0, 6.0), "dev-b": (4.0, 10.0)}
    totals = {
        name: metrics.DeviceTotals.from_tasks(
            [metrics.TaskMeasurement(True, 100, 50.0, None, T0.timestamp() + s, T0.timestamp() + e)]
        )
        for name, (s, e) in spans.items()
    }
    stored = metrics.round_metrics(totals).devices_json()
    rnd = _recorded_round(experiment, spans, stored)
    migration = importlib.import_module("controlplane.experiments.migrations.0021_device_waits")

    migration.recompute_waits(django_apps, SimpleNamespace(connection=connection))

    rnd.refresh_from_db()
    assert rnd.device_metrics == stored


# --- item 5: a positive figure with a 0 in it ---------------------------------------------------------


def test_a_positive_figure_with_a_zero_falls_back_to_linear_but_never_below_zero():
    # 0 s and 2 s: mean 1, s = √2, half = t(0.975, 1) · √2 / √2 = 12.706 → [−11.7, 13.7] unbounded
    e = metrics.estimate([0.0, 2.0], scale="log")

    assert e.scale == "linear" and e.mean == pytest.approx(1.0)
    assert e.low == 0.0
    assert e.high == pytest.approx(1.0 + 12.706205, rel=1e-6)


def test_a_zero_figure_keeps_tighter_bounds_it_was_given():
    e = metrics.estimate([0.0, 0.5], scale="log", bounds=(0.0, 1.0))

    assert (e.scale, e.low, e.high) == ("linear", 0.0, 1.0)


# --- item 6: which runs measured P_alone -------------------------------------------------------------


def test_the_report_says_which_runs_measured_p_alone_themselves(make_experiment):
    experiment = make_experiment(name="alone", rounds=2)
    comparison = seed_comparison(experiment, ["temporal", "sharing"], repeats=2, rounds=2)
    # every seeded run measured P_alone of 2 tasks on 2 devices; say sharing's repeat 1 found its
    # answers in the cache instead (as a run on a real GPU after another at batch 128 would)
    cached = comparison.runs.get(strategy="sharing", repeat=1)
    StandaloneThroughput.objects.filter(run=cached).update(source=StandaloneThroughput.Source.CACHE)

    report = comparison_report(comparison)

    runs = {r["run"]: r for r in report["runs"]}
    assert (runs[cached.id]["alone_measured"], runs[cached.id]["alone_cached"]) == (0, 4)
    assert all((r["alone_measured"], r["alone_cached"]) == (4, 0) for r in runs.values() if r["run"] != cached.id)
    by_strategy = {row["strategy"]: row["alone_measured_runs"] for row in report["strategies"]}
    assert by_strategy["sharing"] == [r.id for r in comparison.runs.filter(strategy="sharing", repeat=0)]
    assert len(by_strategy["temporal"]) == 2
    table = {row["strategy"]: row["alone_measured"] for row in data.report_table(report)["rows"]}
    assert table == {"temporal": "2/2", "sharing": "1/2"}


# --- item 9: wording ---------------------------------------------------------------------------------


def test_the_wording_says_geometric_means_and_pairs_only_speedups_and_verdicts(make_experiment, browser_client):
    from rich.console import Console

    from controlplane.api.serializers.runs import ComparisonCreateSerializer

    experiment = make_experiment(name="wording", rounds=2)
    comparison = seed_comparison(experiment, ["temporal", "sharing"], repeats=3, rounds=2)
    report = comparison_report(comparison)
    console = Console(width=300, record=True)
    for table in comparison_report_tables(report):
        console.print(table)

    text = console.export_text()
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    help_text = ComparisonCreateSerializer().fields["repeats"].help_text

    assert "geometric mean of 3 repeats" in text and "(mean of 3 repeats" not in text
    assert "P_alone measured" in text
    assert "Speedups and verdicts are paired" in page and "paired with repeat k of the baseline)" not in page
    assert "a mean with its" not in help_text and "geometric means" in help_text
    assert math.isfinite(report["strategies"][0]["raw_throughput_sps"]["mean"])
