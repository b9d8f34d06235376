"""Dashboard pages: login required, and the figures carry the run's own data."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from html import escape

import pytest

from controlplane.dashboard import figures as dashboard_figures
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from tests.controlplane.comparison_rows import store_round_metrics

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _json_script(html: str, element_id: str) -> dict:
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no json_script {element_id}"
    return json.loads(match.group(1))


@pytest.fixture
def finished_runs(make_experiment):
    """A temporal and a sharing run with one measured round each."""
    experiment = make_experiment(name="dash")
    runs = {}
    for strategy, p, share in (("temporal", 20.0, 100), ("sharing", 45.0, 100)):
        run = Run.objects.create(
            experiment=experiment,
            strategy=strategy,
            status=Run.Status.SUCCEEDED,
            started_at=T0,
            finished_at=T0 + dt.timedelta(seconds=30),
        )
        rnd = Round.objects.create(
            run=run,
            index=0,
            status=Round.Status.SUCCEEDED,
            started_at=T0,
            finished_at=T0 + dt.timedelta(seconds=20),
            round_time_s=12.5,
            raw_throughput_sps=2 * p,
            fair_throughput=0.8 if strategy == "sharing" else 0.5,
        )
        for k, shard in enumerate(experiment.shards.select_related("device", "task")):
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=shard.num_samples,
                active_thread_percentage=share,
                samples=shard.num_samples,
                samples_trained=shard.num_samples,
                throughput_sps=p + k,
                status=Assignment.Status.SUCCEEDED,
                started_at=T0 + dt.timedelta(seconds=1),
                finished_at=T0 + dt.timedelta(seconds=5 + k),
            )
        store_round_metrics([rnd])
        for task in experiment.tasks.all():
            Checkpoint.objects.create(
                run=run,
                task=task,
                round=rnd,
                artifact_path="x",
                sha256="0" * 64,
                test_accuracy=0.42 if strategy == "sharing" else 0.3,
                test_loss=1.0,
            )
        run.raw_throughput_sps = 2 * p
        run.fair_throughput = 0.8 if strategy == "sharing" else 0.5
        run.save()
        runs[strategy] = run
    return experiment, runs


def test_pages_require_login(client, finished_runs):
    experiment, runs = finished_runs
    for url in ["/", f"/experiments/{experiment.id}/", f"/runs/{runs['sharing'].id}/"]:
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_login_page_and_login(client, user):
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "researcher", "password": "s3cret-pass"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200


def test_index_lists_experiments_and_devices(browser_client, finished_runs):
    html = browser_client.get("/").content.decode()
    assert "dash" in html and "dev-a" in html and "device.dev-a" in html


def test_experiment_page_speedup_bars_carry_the_runs_speedups(browser_client, finished_runs):
    experiment, runs = finished_runs
    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    figures = _json_script(html, "experiment-figures")
    bars = {trace["name"]: dict(zip(trace["x"], trace["y"], strict=True)) for trace in figures["speedup"]["data"]}
    assert bars["raw throughput"]["temporal"] == pytest.approx(1.0)
    assert bars["raw throughput"]["sharing"] == pytest.approx(90.0 / 40.0)
    assert bars["fair throughput"]["sharing"] == pytest.approx(0.8 / 0.5)
    accuracy = [t for t in figures["accuracy"]["data"] if t.get("visible") is not False]  # the first clock's
    # one line per task and strategy (one run each: no band), grouped by strategy in the legend
    assert {t["legendgroup"] for t in accuracy} == {"temporal", "sharing"}
    assert len(accuracy) == 2 * experiment.tasks.count()
    assert any(0.42 in t["y"] for t in accuracy)
    assert "2.25×" in html  # the runs table shows the raw speedup too


def test_run_page_figures_carry_plan_throughput_and_timeline(browser_client, finished_runs):
    experiment, runs = finished_runs
    run = runs["sharing"]
    html = browser_client.get(f"/runs/{run.id}/").content.decode()
    live = _json_script(html, "run-live")
    assert live["progress"]["status"] == "succeeded" and live["progress"]["fraction"] == 1.0
    assert live["rounds"][0]["round_time_s"] == 12.5
    plan = live["figures"]["plan"]["data"]
    shares = [y for trace in plan for y in trace["y"] if y is not None]
    assert shares and set(shares) == {100}
    assert any("B=" in text for trace in plan for text in trace["text"])
    throughput = {t["name"]: t["y"] for t in live["figures"]["throughput"]["data"]}
    expected = {}
    for a in Assignment.objects.filter(round__run=run).select_related("task"):
        expected[a.task.name] = expected.get(a.task.name, 0.0) + a.throughput_sps
    assert {name: ys[0] for name, ys in throughput.items()} == pytest.approx(expected)
    timeline = live["figures"]["timeline"]["data"]
    durations = sorted(x for trace in timeline for x in trace["x"])
    assert durations == sorted(
        (a.finished_at - a.started_at).total_seconds() * 1000 for a in Assignment.objects.filter(round__run=run)
    )


def test_run_live_json_reports_progress_of_a_round_in_flight(browser_client, make_experiment):
    experiment = make_experiment(name="live", rounds=2)
    run = Run.objects.create(experiment=experiment, strategy="isolation", status=Run.Status.RUNNING, started_at=T0)
    rnd = Round.objects.create(run=run, index=0, status=Round.Status.RUNNING, started_at=T0)
    shards = list(experiment.shards.all())
    for k, shard in enumerate(shards):
        Assignment.objects.create(
            round=rnd,
            device=shard.device,
            task=shard.task,
            batch_size=8,
            active_thread_percentage=50,
            samples=shard.num_samples,
            status=Assignment.Status.SUCCEEDED if k == 0 else Assignment.Status.RUNNING,
        )
    live = browser_client.get(f"/runs/{run.id}/live/").json()
    current = live["progress"]["current_round"]
    assert current["assignments_total"] == 4 and current["assignments_finished"] == 1
    assert current["assignments_running"] == 3
    assert live["progress"]["fraction"] == pytest.approx(1 / 4 / 2)


def test_a_run_cancelled_before_any_round_shows_no_progress_and_no_result(browser_client, make_experiment):
    experiment = make_experiment(name="cancelled", rounds=2)
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.CANCELLED, started_at=T0)
    for task in experiment.tasks.all():  # the initial model is evaluated before round 0
        Checkpoint.objects.create(
            run=run, task=task, round=None, artifact_path="x", sha256="0" * 64, test_accuracy=0.1, test_loss=2.3
        )
    live = browser_client.get(f"/runs/{run.id}/live/").json()
    assert live["progress"]["fraction"] == 0.0 and live["progress"]["rounds_done"] == 0
    for name in ("plan", "throughput", "timeline"):
        figure = live["figures"][name]
        assert figure["data"] == [] or all(not t.get("x") for t in figure["data"])
        assert figure["layout"]["annotations"][-1]["text"].startswith("no ")
    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert "0.100" not in html  # the untrained model's accuracy is not the run's result


def test_experiment_page_compares_strategies_inside_devices_per_round_and_in_time(browser_client, finished_runs):
    experiment, runs = finished_runs
    # Give the sharing run predictions and standalone speeds, as a planned run would carry.
    Assignment.objects.filter(round__run=runs["sharing"]).update(predicted_throughput_sps=50.0)
    Assignment.objects.update(standalone_throughput_sps=60.0)
    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert 'id="compare-button"' in html
    figures = _json_script(html, "experiment-figures")
    per_device = {
        t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in figures["per_device"]["data"] if t["visible"]
    }
    # dev-a holds tasks 0 and 1: sharing measured 45+46 against temporal's 20+21.
    assert per_device["temporal"]["dev-a"] == pytest.approx(1.0)
    assert per_device["sharing"]["dev-a"] == pytest.approx(91 / 41)
    per_round = {t["name"]: t["y"] for t in figures["per_round"]["data"] if t["visible"]}
    assert per_round["sharing"][0] == pytest.approx(((91 / 41) + (95 / 45)) / 2)
    split = {t["name"]: t["y"] for t in figures["round_time"]["data"]}
    # All start at 1 s; dev-a's end at 5 s and 6 s, dev-b's at 7 s and 8 s: dev-a computes 5 s
    # and waits 2 s for dev-b, which computes 7 s.
    assert split["compute (own tasks)"] == [5.0, 7.0, 5.0, 7.0]
    assert split["waiting for the slowest device"] == [2.0, 0.0, 2.0, 0.0]
    predicted = [t for t in figures["predicted"]["data"] if t["name"] == "sharing"][0]
    assert set(predicted["y"]) == {50.0}
    accuracy = {t["name"]: t["y"] for t in figures["final_accuracy"]["data"]}
    assert set(accuracy["sharing"]) == {0.42} and set(accuracy["temporal"]) == {0.3}


def test_compare_button_without_a_predictor_says_how_to_make_one(browser_client, finished_runs):
    experiment, _runs = finished_runs
    response = browser_client.post(f"/experiments/{experiment.id}/compare/")
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="compare-error"' in html and "no fitted throughput predictor" in html


def test_the_learning_curve_counts_training_samples_from_zero_in_whole_samples():
    from controlplane.dashboard.figures import learning_curve

    fig = learning_curve(
        [{"version": 1, "training_samples": 126, "heldout_rmsle": 0.1376, "kept_family": "random_forest"}]
    )
    assert (fig.layout.xaxis.rangemode, fig.layout.xaxis.tickformat) == ("tozero", "d")
    assert list(fig.data[0].x) == [126] and list(fig.data[0].text) == ["v1"]


# ------------------------------------------------------------------------------ mends


def test_downloads_take_the_api_token_instead_of_sending_it_to_the_login_page(client, api, finished_runs):
    experiment, runs = finished_runs
    token = api._credentials["HTTP_AUTHORIZATION"]
    urls = [
        f"/runs/{runs['sharing'].id}/rounds.csv",
        f"/runs/{runs['sharing'].id}/results.json",
        f"/experiments/{experiment.id}/assignments.csv",
        f"/experiments/{experiment.id}/results.json",
    ]

    responses = {url: client.get(url, HTTP_AUTHORIZATION=token) for url in urls}

    assert {url: r.status_code for url, r in responses.items()} == dict.fromkeys(urls, 200)
    assert responses[urls[0]]["Content-Type"].startswith("text/csv")
    rounds_csv = b"".join(responses[urls[0]].streaming_content).decode().strip().splitlines()
    assert len(rounds_csv) == 2  # the header and the run's one round


def test_a_download_with_a_bad_token_gets_401_and_none_gets_the_login_page(client, finished_runs):
    _experiment, runs = finished_runs
    url = f"/runs/{runs['sharing'].id}/rounds.csv"

    bad = client.get(url, HTTP_AUTHORIZATION="Token not-a-key")
    anonymous = client.get(url)

    assert bad.status_code == 401 and "Invalid token" in bad.json()["detail"]
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_a_strategy_keeps_its_colour_in_every_chart_of_the_experiment_page(browser_client, finished_runs):
    from controlplane.dashboard.figures import strategy_color

    experiment, runs = finished_runs
    Assignment.objects.update(standalone_throughput_sps=60.0, predicted_throughput_sps=50.0)
    figs = _json_script(browser_client.get(f"/experiments/{experiment.id}/").content.decode(), "experiment-figures")

    seen: dict[str, set] = {"temporal": set(), "sharing": set()}
    for name in ("per_device", "per_round", "final_accuracy", "predicted"):
        for trace in figs[name]["data"]:
            if trace["name"] in seen:
                marker = trace.get("marker", {}).get("color") or trace.get("line", {}).get("color")
                seen[trace["name"]].add(marker)
    for trace in figs["accuracy"]["data"]:
        if trace["legendgroup"] in seen:
            seen[trace["legendgroup"]].add(trace["line"]["color"])
    bars = [t for t in figs["speedup"]["data"] if t["x"] != [None]]
    for trace in bars:
        for label, color in zip(trace["x"], trace["marker"]["color"], strict=True):
            seen[label].add(color)

    assert seen == {"temporal": {strategy_color("temporal")}, "sharing": {strategy_color("sharing")}}
    assert strategy_color("temporal") != strategy_color("sharing")


def test_bar_values_are_written_upright_inside_their_bars_and_hidden_when_they_do_not_fit():
    from controlplane.dashboard.figures import final_accuracy

    rows = [
        {"strategy": s, "accuracy": {"t1": 0.95, "t2": 0.95}}
        for s in ("temporal", "isolation", "sharing", "vres_greedy", "vres_sync")
    ]

    fig = final_accuracy(rows, [r["strategy"] for r in rows])

    assert all(t.textposition == "inside" and t.textangle == -90 for t in fig.data)
    assert fig.layout.uniformtext.mode == "hide"


def test_the_baseline_note_is_in_the_subtitle_not_over_a_bar():
    from controlplane.dashboard.figures import speedup_bars

    fig = speedup_bars(
        [
            {"label": "temporal", "strategy": "temporal", "raw_speedup": 1.0, "fair_speedup": 1.0},
            {"label": "sharing", "strategy": "sharing", "raw_speedup": 2.0, "fair_speedup": None},
        ]
    )

    assert not fig.layout.annotations  # no text drawn inside the plotting area
    assert "temporal = 1×" in fig.layout.title.text


def test_the_accuracy_legend_stands_beside_the_plot_clear_of_the_axis_title():
    from controlplane.dashboard.figures import accuracy_over_time

    series = [
        {"strategy": s, "run": k, "task": t, "points": [(0.0, 0.1), (10.0, 0.5)]}
        for k, s in enumerate(("temporal", "isolation", "sharing", "vres_greedy", "vres_sync"))
        for t in ("t1", "t2", "t3")
    ]

    fig = accuracy_over_time(series)

    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1
    assert fig.layout.legend.groupclick == "togglegroup"
    entries = [t.name for t in fig.data if t.showlegend is not False]
    assert entries == ["temporal", "isolation", "sharing", "vres_greedy", "vres_sync"]
    assert [a.text for a in fig.layout.annotations] == ["t1", "t2", "t3"]  # a panel per task


def test_a_failed_runs_page_shows_its_error_and_no_empty_chart(browser_client, make_experiment):
    experiment = make_experiment(name="broken")
    run = Run.objects.create(
        experiment=experiment,
        strategy="sharing",
        status=Run.Status.FAILED,
        started_at=T0,
        error="round 0 failed on every device: dev-a: CUDA out of memory",
    )

    html = browser_client.get(f"/runs/{run.id}/").content.decode()

    assert "CUDA out of memory" in html
    assert 'class="figure"' not in html and 'id="rounds-table"' not in html


def test_a_running_runs_page_keeps_its_chart_boxes_to_fill_in(browser_client, make_experiment):
    experiment = make_experiment(name="starting")
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.RUNNING, started_at=T0)

    html = browser_client.get(f"/runs/{run.id}/").content.decode()

    assert all(f'id="fig-{name}"' in html for name in ("plan", "throughput", "timeline"))


def test_every_page_links_the_favicon_and_it_is_served(browser_client, client):
    html = browser_client.get("/").content.decode()
    href = re.search(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)"', html).group(1)

    icon = client.get(href)
    legacy = client.get("/favicon.ico")

    assert icon.status_code == 200 and b"<svg" in b"".join(icon.streaming_content)
    assert legacy.status_code == 301 and legacy["Location"] == href


def test_an_experiment_of_baselines_only_has_no_empty_predicted_chart(browser_client, finished_runs):
    experiment, _runs = finished_runs
    Assignment.objects.update(predicted_throughput_sps=None)

    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    assert 'id="fig-predicted"' not in html
    assert "predicted" not in _json_script(html, "experiment-figures")
    assert 'id="fig-per_device"' in html


def test_a_failed_runs_progress_counts_its_failed_rounds(browser_client, make_experiment):
    experiment = make_experiment(name="lost")
    run = Run.objects.create(
        experiment=experiment, strategy="sharing", status=Run.Status.FAILED, started_at=T0, error="agent lost"
    )
    Round.objects.create(run=run, index=0, status=Round.Status.FAILED, started_at=T0, error="agent lost")

    live = browser_client.get(f"/runs/{run.id}/live/").json()

    assert live["progress"]["status"] == "failed"
    assert live["progress"]["rounds_done"] == 1 and live["progress"]["rounds_failed"] == 1


# ------------------------------------------------------------------------------- label histograms


def _label_figures(html: str) -> dict[int, dict]:
    return {h["task"]: h["figure"] for h in _json_script(html, "label-histogram-figures")}


def _drawn_counts(figure: dict) -> dict[str, dict[str, int]]:
    """device → trace name → samples, from a label histogram's JSON."""
    drawn: dict[str, dict[str, int]] = {}
    for trace in figure["data"]:
        for device, count in zip(trace["x"], trace["y"], strict=True):
            drawn.setdefault(device, {})[trace["name"]] = count
    return drawn


def test_the_experiment_page_draws_each_devices_label_histogram_per_task(browser_client, make_experiment):
    from controlplane.experiments.models import Shard

    experiment = make_experiment(name="skewed", partition_rule="dirichlet_labels", partition_params={"alpha": 0.3})
    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    figures = _label_figures(html)
    assert set(figures) == set(experiment.tasks.values_list("id", flat=True))
    for task in experiment.tasks.all():
        figure = figures[task.id]
        assert figure["layout"]["barmode"] == "stack" and task.name in figure["layout"]["title"]["text"]
        drawn = _drawn_counts(figure)
        shards = Shard.objects.filter(experiment=experiment, task=task).select_related("device")
        assert set(drawn) == {s.device.name for s in shards}
        for shard in shards:
            assert len(shard.label_counts) == task.num_classes and sum(shard.label_counts) == shard.num_samples
            expected = {f"class {k}": c for k, c in enumerate(shard.label_counts)}
            # classes no device holds are left out of the chart; every drawn count is the shard's
            assert {name: drawn[shard.device.name].get(name, 0) for name in expected} == expected
        # hover gives the counts; class k has the same colour in every task's chart
        for trace in figure["data"]:
            k = int(trace["name"].split()[-1])
            assert trace["marker"]["color"] == dashboard_figures.PALETTE[k]
            assert "%{y:,} samples" in trace["hovertemplate"]
        assert f'id="fig-labels-{task.id}"' in html and f'id="label-table-{task.id}"' in html
    # the rule and its parameter, with the parameter's label from the rule's record
    from workers.registry.partitioners import PARTITIONER_REGISTRY

    alpha = next(p for p in PARTITIONER_REGISTRY.get("dirichlet_labels").parameters if p.name == "alpha")
    assert '<strong id="partition-rule">dirichlet_labels</strong>' in html
    assert f'<span class="partition-param"><abbr title="{escape(alpha.label)}">alpha</abbr> = 0.3</span>' in html


def test_the_label_histograms_numbers_are_a_table_and_a_csv(browser_client, make_experiment):
    from controlplane.experiments.models import Shard

    experiment = make_experiment(
        name="shards-split", partition_rule="shards", partition_params={"shards_per_device": 2}
    )
    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    shard = Shard.objects.filter(experiment=experiment).select_related("device", "task").first()
    row = f'<tr><th scope="row">{shard.device.name}</th><td>{shard.num_samples}</td>' + "".join(
        f"<td>{c}</td>" for c in shard.label_counts
    )
    assert row in html

    response = browser_client.get(f"/experiments/{experiment.id}/label-histograms.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    shards = list(Shard.objects.filter(experiment=experiment).select_related("device", "task"))
    assert len(rows) == sum(s.task.num_classes for s in shards)
    for s in shards:
        mine = [r for r in rows if r["task"] == s.task.name and r["device"] == s.device.name]
        assert [int(r["samples"]) for r in sorted(mine, key=lambda r: int(r["class"]))] == s.label_counts
        assert {int(r["num_samples"]) for r in mine} == {s.num_samples}
    assert f'href="/experiments/{experiment.id}/label-histograms.csv"' in html


def test_a_label_histogram_draws_unknown_classes_grey_and_many_devices_spread():
    rows = [{"device": f"d{k:03d}", "num_samples": 10, "label_counts": [7, 0, 3]} for k in range(80)]
    rows.append({"device": "d999", "num_samples": 12, "label_counts": []})
    figure = dashboard_figures.label_histogram("t", rows, 3)
    names = [trace.name for trace in figure.data]
    assert names == ["class 0", "class 2", "class unknown"]  # class 1: no device holds it
    assert len(figure.data[0].x) == dashboard_figures.MAX_DEVICES and figure.data[0].x[-1] == "d999"
    assert figure.data[-1].y[-1] == 12 and figure.data[-1].marker.color == dashboard_figures.UNKNOWN_CLASS_COLOR
    assert "50 of 81 devices shown" in figure.layout.title.text
    many = dashboard_figures.label_histogram("t", [{"device": "a", "num_samples": 100, "label_counts": [1] * 100}], 100)
    colors = [trace.marker.color for trace in many.data]
    assert len(set(colors)) == 100 and not any(trace.showlegend for trace in many.data)
    empty = dashboard_figures.label_histogram("t", [], 10)
    assert dashboard_figures.is_empty(empty)
