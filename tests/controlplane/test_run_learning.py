"""The run page's learning curves (controlplane.dashboard.run_charts): each task's test accuracy
and loss after every round and its training loss in the round, as a chart and as a table."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from controlplane.dashboard import figures, run_charts
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _live(html: str) -> dict:
    match = re.search(r'<script id="run-live" type="application/json">(.*?)</script>', html, re.S)
    assert match
    return json.loads(match.group(1))


@pytest.fixture
def learned_run(make_experiment):
    """A sharing run of two rounds on two devices and two tasks: every device reports a training
    loss per task and round (dev-a trained 3× the samples of dev-b), each round's checkpoint its
    test accuracy and loss; the second round of t-shufflenet is still being evaluated."""
    experiment = make_experiment(name="learn")
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.RUNNING, started_at=T0)
    tasks = {t.name: t for t in experiment.tasks.all()}
    for task in tasks.values():
        Checkpoint.objects.create(
            run=run, task=task, artifact_path="x", sha256="0" * 64, test_accuracy=0.1, test_loss=2.3
        )
    for index in range(2):
        rnd = Round.objects.create(run=run, index=index, status=Round.Status.SUCCEEDED, started_at=T0)
        for shard in experiment.shards.select_related("device", "task"):
            n = 30 if shard.device.name == "dev-a" else 10
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=8,
                active_thread_percentage=100,
                samples=n,
                samples_trained=n,
                throughput_sps=50.0,
                train_loss=(2.0 if shard.device.name == "dev-a" else 1.0) / (index + 1),
                status=Assignment.Status.SUCCEEDED,
            )
        for name, task in tasks.items():
            pending = index == 1 and name == "t-shufflenet"
            Checkpoint.objects.create(
                run=run,
                task=task,
                round=rnd,
                artifact_path="x",
                sha256="0" * 64,
                test_accuracy=None if pending else 0.5 + 0.2 * index,
                test_loss=None if pending else 1.5 - 0.5 * index,
                evaluation_status=Checkpoint.Evaluation.PENDING if pending else Checkpoint.Evaluation.DONE,
            )
    return run


def test_the_training_loss_is_the_devices_losses_weighted_by_samples_trained(learned_run):
    rows = {(r["rounds_done"], r["task"]): r for r in run_charts.run_learning(learned_run)}

    # round index 0 stands at 1 round done: (30·2.0 + 10·1.0) / 40
    assert rows[(1, "t-mobilenet")]["train_loss"] == pytest.approx(70 / 40)
    assert rows[(2, "t-mobilenet")]["train_loss"] == pytest.approx(35 / 40)
    assert rows[(1, "t-mobilenet")]["devices"] == 2
    assert rows[(0, "t-mobilenet")] == {
        "rounds_done": 0,
        "task": "t-mobilenet",
        "test_accuracy": 0.1,
        "test_loss": 2.3,
        "train_loss": None,
        "devices": 0,
        "note": "",
    }
    assert rows[(2, "t-shufflenet")]["test_accuracy"] is None
    assert rows[(2, "t-shufflenet")]["note"] == "evaluating"


def test_the_run_page_draws_accuracy_and_both_losses_per_task_first_with_their_table(browser_client, learned_run):
    html = browser_client.get(f"/runs/{learned_run.id}/").content.decode()
    live = _live(html)

    assert list(live["figures"])[0] == "learning"
    traces = {t["name"]: t for t in live["figures"]["learning"]["data"]}
    assert traces["t-mobilenet · test accuracy"]["x"] == [0, 1, 2]
    assert traces["t-mobilenet · test accuracy"]["y"] == pytest.approx([0.1, 0.5, 0.7])
    assert traces["t-shufflenet · test accuracy"]["y"] == pytest.approx([0.1, 0.5])  # round 2 still evaluating
    assert traces["t-mobilenet · training loss"]["x"] == [1, 2]
    assert traces["t-mobilenet · training loss"]["y"] == pytest.approx([70 / 40, 35 / 40])
    assert traces["t-mobilenet · test loss"]["y"] == pytest.approx([2.3, 1.5, 1.0])
    assert traces["t-mobilenet · training loss"]["yaxis"] == traces["t-mobilenet · test loss"]["yaxis"] == "y2"
    assert not figures.is_empty(live["figures"]["learning"])
    assert live["figures"]["learning"]["layout"]["xaxis2"]["dtick"] == 1  # whole rounds
    assert 'id="fig-learning"' in html and html.index('id="learning-card"') < html.index('id="rounds-table"')
    # the table, newest round first, served in the page (no script needed) and in the live JSON
    table = live["learning"]
    assert table["tasks"] == ["t-mobilenet", "t-shufflenet"]
    assert [r["rounds_done"] for r in table["rounds"]] == [2, 1, 0]
    newest = html[html.index('id="learning-table"') :]
    assert "0.700" in newest and "0.8750" in newest and "evaluating" in newest
    polled = browser_client.get(f"/runs/{learned_run.id}/live/").json()
    assert polled["learning"] == table
    # the same values in long format for pandas, linked from the page
    assert f'href="/runs/{learned_run.id}/metrics.csv" download' in html
    csv_text = b"".join(browser_client.get(f"/runs/{learned_run.id}/metrics.csv").streaming_content).decode()
    assert f"{learned_run.id}" in csv_text and "train_loss" in csv_text and "0.875" in csv_text


def test_a_run_without_measurements_yet_says_so_and_a_finished_one_leaves_the_chart_out(
    browser_client, make_experiment
):
    run = Run.objects.create(experiment=make_experiment(name="none"), strategy="sharing", status=Run.Status.RUNNING)
    live = browser_client.get(f"/runs/{run.id}/live/").json()
    assert figures.is_empty(live["figures"]["learning"]) and live["learning"]["rounds"] == []

    Run.objects.filter(id=run.id).update(status=Run.Status.FAILED, error="no device")
    html = browser_client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="learning-card"' not in html


def test_a_long_runs_table_keeps_the_newest_rounds_and_its_lines_stay_bounded():
    rows = [
        {
            "rounds_done": n,
            "task": "t",
            "test_accuracy": n / 5000,
            "test_loss": 1.0,
            "train_loss": 1.0,
            "devices": 1,
            "note": "",
        }
        for n in range(5000)
    ]
    table = run_charts.learning_table(rows, limit=100)
    fig = run_charts.learning_figure(rows)

    assert table["shown"] == 100 and table["total"] == 5000 and table["rounds"][0]["rounds_done"] == 4999
    assert all(len(trace.x) <= figures.MAX_POINTS for trace in fig.data)
    assert "mean of 5 consecutive rounds" in fig.layout.title.text
