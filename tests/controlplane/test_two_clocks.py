"""Issue 33 items 1 and 2 end to end on a seeded comparison (tests/controlplane/comparison_seed.py):
time to accuracy on both clocks, log-scale intervals paired by repeat, every repeat drawn, the
note below three repeats, in the report, the API, ``mtfl compare``'s tables, the experiment page
and its charts; and the comparison listed in the order its runs ran."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from controlplane.core.cli_support import comparison_report_tables
from controlplane.dashboard import data, figures
from controlplane.experiments.models import Run
from controlplane.experiments.selectors import comparison_report
from tests.controlplane.comparison_seed import seed_comparison

STRATEGIES = ["temporal", "isolation", "sharing", "vres_sync"]
CLOCKS = ("time_to_accuracy_s", "wall_time_to_accuracy_s")


@pytest.fixture
def three_repeats(make_experiment):
    experiment = make_experiment(name="three repeats", rounds=5)
    return experiment, seed_comparison(experiment, STRATEGIES, repeats=3)


def _figures(html: str) -> dict:
    found = re.search(r'<script id="experiment-figures" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def _tables_text(report: dict) -> str:
    console = Console(width=400, record=True)
    for table in comparison_report_tables(report):
        console.print(table)
    return console.export_text()


def test_time_to_accuracy_is_reported_on_both_clocks_with_positive_paired_log_intervals(three_repeats):
    experiment, comparison = three_repeats

    report = comparison_report(comparison)

    assert report["small_n_note"] == ""
    for row in report["strategies"]:
        for task in row["tasks"]:
            fl, wall = (task[clock] for clock in CLOCKS)
            assert fl["scale"] == wall["scale"] == "log" and fl["n"] == wall["n"] == 3
            assert 0 < fl["low"] < fl["mean"] < fl["high"] and 0 < wall["low"] < wall["mean"] < wall["high"]
            assert len(wall["values"]) == 3
            # the wall clock counts the waiting between rounds the FL round time leaves out
            assert all(w > f for w, f in zip(wall["values"], fl["values"], strict=True))
        assert row["raw_speedup"]["low"] > 0 and row["raw_speedup"]["scale"] == "log"
    runs = {(r["strategy"], r["repeat"]): r for r in report["runs"]}
    first = comparison.runs.get(strategy="sharing", repeat=0)
    rounds = list(first.rounds.order_by("index"))
    reached = runs[("sharing", 0)]["tasks"][0]
    k = reached["rounds_to_accuracy"] - 1
    assert reached["wall_time_to_accuracy_s"] == pytest.approx(
        (rounds[k].finished_at - first.started_at).total_seconds()
    )
    assert reached["time_to_accuracy_s"] == pytest.approx(sum(r.round_time_s for r in rounds[: k + 1]))
    verdicts = [v for v in report["verdicts"] if v["figure"] in CLOCKS]
    assert {(v["figure"], v["task_name"]) for v in verdicts} == {
        (clock, t.name) for clock in CLOCKS for t in experiment.tasks.all()
    }
    assert all(v["difference"]["method"] == "paired t" and v["difference"]["n"] == 3 for v in verdicts)
    assert all(v["difference"]["kind"] == "ratio" and v["difference"]["low"] > 0 for v in verdicts)


def test_the_page_the_api_and_mtfl_compare_show_both_clocks_labelled(three_repeats, browser_client, api):
    experiment, comparison = three_repeats
    report = comparison_report(comparison)

    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    text = _tables_text(report)
    served = api.get(f"/api/comparisons/{comparison.id}/").json()["report"]

    assert "Time to t-mobilenet, FL round time (s)" in page
    assert "Time to t-mobilenet, wall-clock from the run&#x27;s start (s)" in page
    assert 'class="clock-wall"' in page and "n = 2" not in page
    assert "time to accuracy (wall-clock from the run&#x27;s start) of t-mobilenet" in page  # a verdict
    assert "FL round time" in text and "wall-clock from the run's start" in text
    assert "time to accuracy, wall-clock from the run's start (t-mobilenet)" in text
    assert "paired t, n = 3" in text
    assert served["clocks"] == report["clocks"] and served["small_n_note"] == ""
    assert served["strategies"][0]["tasks"][0]["wall_time_to_accuracy_s"]["values"]


def test_below_three_repeats_the_table_the_cli_and_the_charts_say_the_interval_is_wide(make_experiment, browser_client):
    experiment = make_experiment(name="two repeats", rounds=4)
    comparison = seed_comparison(experiment, ["temporal", "sharing"], repeats=2)
    report = comparison_report(comparison)

    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    charts = _figures(page)

    assert report["small_n_note"] == "n = 2: interval wide"
    assert 'id="small-n-note"' in page and page.count("n = 2: interval wide") >= 3  # note, two rows
    assert "n = 2: interval wide" in _tables_text(report)
    for name in ("comparison_throughput", "time_to_accuracy", "per_device"):
        assert "n = 2: interval wide" in charts[name]["layout"]["title"]["text"], name


def test_the_comparison_is_listed_in_the_order_its_runs_ran_with_their_repeats(three_repeats, browser_client):
    experiment, comparison = three_repeats

    listed = data.compared_runs(experiment)
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    expected = [s for order in ([*STRATEGIES], STRATEGIES[::-1], [*STRATEGIES]) for s in order]
    assert [r.strategy for r in listed] == expected
    assert [r.repeat for r in listed] == [k for k in range(3) for _ in STRATEGIES]
    line = re.search(r'<p id="comparison-line">(.*?)</p>', page, re.S).group(1)
    shown = re.findall(r'class="compared-run">(\w+) <span class="muted small">repeat (\d)</span>', line)
    assert shown == [(r.strategy, str(r.repeat + 1)) for r in listed]
    assert page.count('class="muted small run-repeat"') == Run.objects.filter(comparison=comparison).count()


def test_every_bar_chart_draws_each_repeat_and_writes_values_clear_of_the_whiskers(three_repeats, browser_client):
    experiment, _ = three_repeats

    charts = _figures(browser_client.get(f"/experiments/{experiment.id}/").content.decode())

    for name in ("comparison_throughput", "time_to_accuracy", "final_accuracy", "per_device"):
        traces = charts[name]["data"]
        assert charts[name]["layout"]["scattermode"] == "group", name
        for bar in (t for t in traces if t["type"] == "bar"):
            group = [t for t in traces if t.get("offsetgroup") == bar["name"] and t.get("xaxis") == bar.get("xaxis")]
            points = next(t for t in group if t.get("mode") == "markers" and t.get("visible") == bar.get("visible"))
            labels = next(t for t in group if t.get("mode") == "text" and t.get("visible") == bar.get("visible"))
            # three repeats: three points per bar
            assert len(points["y"]) == 3 * len(bar["x"]), (name, bar["name"])
            whiskers = bar.get("error_y") or {}
            for k, mean in enumerate(bar["y"]):
                top = mean + (whiskers.get("array") or [0] * len(bar["y"]))[k]
                assert labels["y"][k] >= top - 1e-9, (name, bar["name"], k)
                assert labels["y"][k] >= max(points["y"][3 * k : 3 * k + 3]) - 1e-9
                assert mean - (whiskers.get("arrayminus") or [0] * len(bar["y"]))[k] >= 0  # never below 0
            assert not bar.get("text"), "no value inside the bar, where the whisker runs"


def test_accuracy_curves_show_a_band_per_strategy_and_tell_coinciding_strategies_apart(three_repeats, browser_client):
    experiment, _ = three_repeats

    charts = _figures(browser_client.get(f"/experiments/{experiment.id}/").content.decode())

    for name in ("accuracy", "accuracy_rounds"):
        shown = [t for t in charts[name]["data"] if t.get("visible") is not False]
        means = {t["name"]: t for t in shown if t.get("mode") == "lines+markers" and t.get("xaxis") in (None, "x")}
        # temporal and sharing train alike: their curves coincide, their styles do not
        assert means["sharing"]["y"] == means["temporal"]["y"]
        assert means["sharing"]["line"]["dash"] != means["temporal"]["line"]["dash"]
        assert means["sharing"]["marker"]["symbol"] != means["temporal"]["marker"]["symbol"]
        bands = [t for t in shown if t.get("fill") == "tonexty"]
        assert {t["legendgroup"] for t in bands} == set(STRATEGIES)
        thin = [t for t in shown if t["name"].startswith("sharing run ")]
        assert len(thin) == 3 * experiment.tasks.count()
        assert {t["line"]["color"] for t in thin} == {figures.strategy_color("sharing")}
    buttons = charts["accuracy"]["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["wall-clock", "FL round time"]
