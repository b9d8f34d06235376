"""Dashboard pages: login required, and the figures carry the run's own data."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from controlplane.experiments.models import Assignment, Checkpoint, Round, Run

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
        run = Run.objects.create(experiment=experiment, strategy=strategy, status=Run.Status.SUCCEEDED,
                                 started_at=T0, finished_at=T0 + dt.timedelta(seconds=30))
        rnd = Round.objects.create(run=run, index=0, status=Round.Status.SUCCEEDED, started_at=T0,
                                   finished_at=T0 + dt.timedelta(seconds=20), round_time_s=12.5,
                                   raw_throughput_sps=2 * p, fair_throughput=0.8 if strategy == "sharing" else 0.5)
        for k, shard in enumerate(experiment.shards.select_related("device", "task")):
            Assignment.objects.create(
                round=rnd, device=shard.device, task=shard.task, batch_size=shard.num_samples,
                active_thread_percentage=share, samples=shard.num_samples, samples_trained=shard.num_samples,
                throughput_sps=p + k, status=Assignment.Status.SUCCEEDED,
                started_at=T0 + dt.timedelta(seconds=1), finished_at=T0 + dt.timedelta(seconds=5 + k),
            )
        for task in experiment.tasks.all():
            Checkpoint.objects.create(run=run, task=task, round=rnd, artifact_path="x", sha256="0" * 64,
                                      test_accuracy=0.42 if strategy == "sharing" else 0.3, test_loss=1.0)
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
    accuracy = figures["accuracy"]["data"]
    assert {t["name"].split(" · ")[0] for t in accuracy} == {"temporal", "sharing"}
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
    assert durations == sorted((a.finished_at - a.started_at).total_seconds() * 1000 for a in
                               Assignment.objects.filter(round__run=run))


def test_run_live_json_reports_progress_of_a_round_in_flight(browser_client, make_experiment):
    experiment = make_experiment(name="live", rounds=2)
    run = Run.objects.create(experiment=experiment, strategy="isolation", status=Run.Status.RUNNING, started_at=T0)
    rnd = Round.objects.create(run=run, index=0, status=Round.Status.RUNNING, started_at=T0)
    shards = list(experiment.shards.all())
    for k, shard in enumerate(shards):
        Assignment.objects.create(round=rnd, device=shard.device, task=shard.task, batch_size=8,
                                  active_thread_percentage=50, samples=shard.num_samples,
                                  status=Assignment.Status.SUCCEEDED if k == 0 else Assignment.Status.RUNNING)
    live = browser_client.get(f"/runs/{run.id}/live/").json()
    current = live["progress"]["current_round"]
    assert current["assignments_total"] == 4 and current["assignments_finished"] == 1
    assert current["assignments_running"] == 3
    assert live["progress"]["fraction"] == pytest.approx(1 / 4 / 2)


def test_a_run_cancelled_before_any_round_shows_no_progress_and_no_result(browser_client, make_experiment):
    experiment = make_experiment(name="cancelled", rounds=2)
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.CANCELLED, started_at=T0)
    for task in experiment.tasks.all():  # the initial model is evaluated before round 0
        Checkpoint.objects.create(run=run, task=task, round=None, artifact_path="x", sha256="0" * 64,
                                  test_accuracy=0.1, test_loss=2.3)
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
    per_device = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in figures["per_device"]["data"] if t["visible"]}
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

    fig = learning_curve([{"version": 1, "training_samples": 126, "heldout_rmsle": 0.1376, "kept_family": "random_forest"}])
    assert (fig.layout.xaxis.rangemode, fig.layout.xaxis.tickformat) == ("tozero", "d")
    assert list(fig.data[0].x) == [126] and list(fig.data[0].text) == ["v1"]
