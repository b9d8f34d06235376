"""FL algorithms compared on one experiment (issue 23, item 4): the experiment page's accuracy
curves against wall-clock time and per round, one series per algorithm and strategy, and the
results ``mtfl demo --algorithms`` prints (final accuracy, rounds and seconds to a target)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from controlplane.core.demo import algorithm_options, algorithm_rows
from controlplane.dashboard import data, figures
from controlplane.experiments.models import Checkpoint, Round, Run
from tests.controlplane import stateful_aggregator

MOMENTUM = stateful_aggregator.NAME
T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _series(algorithm: str | None, strategy: str, run: int, task: str, rounds: int = 3) -> dict:
    curve = [(float(k), 0.1 + 0.2 * k) for k in range(rounds)]
    return {
        "strategy": strategy,
        "algorithm": algorithm,
        "run": run,
        "task": task,
        "points": [(10.0 * k, a) for k, a in curve],
        "rounds": curve,
    }


def _legend(fig) -> list[str]:
    return [t.name for t in fig.data if t.showlegend is not False]


# --- the figures (pure) --------------------------------------------------------------------------


@pytest.mark.parametrize("build", [figures.accuracy_over_time, figures.accuracy_per_round])
def test_lines_of_runs_that_differ_in_algorithm_are_labelled_algorithm_and_strategy(build):
    series = [
        _series(algorithm, strategy, run, task)
        for run, (algorithm, strategy) in enumerate(
            [("fedavg", "sharing"), ("fedadam", "sharing"), ("fedadam", "temporal")]
        )
        for task in ("t1", "t2")
    ]

    fig = build(series)

    assert _legend(fig) == ["fedavg · sharing", "fedadam · sharing", "fedadam · temporal"]
    assert [a.text for a in fig.layout.annotations] == ["t1", "t2"]  # one panel per task
    colours = {t.name: t.line.color for t in fig.data}
    assert len(set(colours.values())) == 3  # one colour per algorithm and strategy
    # and each its own line style and marker, so lines that coincide stay told apart
    assert len({t.line.dash for t in fig.data}) == 3 and len({t.marker.symbol for t in fig.data}) == 3
    assert {t.legendgroup for t in fig.data} == {"fedavg · sharing", "fedadam · sharing", "fedadam · temporal"}
    assert any("fedadam · sharing · t2 · run 1" in t.hovertemplate for t in fig.data)


@pytest.mark.parametrize("build", [figures.accuracy_over_time, figures.accuracy_per_round])
def test_lines_of_one_algorithm_keep_their_strategy_labels_and_colours(build):
    series = [_series("fedavg", s, k, "t1") for k, s in enumerate(("temporal", "sharing"))]

    fig = build(series)

    assert _legend(fig) == ["temporal", "sharing"]
    lines = {t.name: t for t in fig.data}
    assert lines["sharing"].line.color == figures.strategy_color("sharing")
    assert lines["temporal"].line.color == figures.strategy_color("temporal")


def test_accuracy_per_round_draws_rounds_done_from_the_initial_model():
    fig = figures.accuracy_per_round([_series("fedavg", "sharing", 1, "t1", rounds=4)])

    line = fig.data[0]
    assert list(line.x) == [0, 1, 2, 3] and list(line.y) == pytest.approx([0.1, 0.3, 0.5, 0.7])
    assert fig.layout.xaxis.title.text == "rounds done (0: the initial model)"
    assert fig.layout.title.text == "Test accuracy per round"


def test_a_long_run_keeps_at_most_max_points_per_line():
    long = _series("fedadam", "sharing", 1, "t1", rounds=10_000)

    fig = figures.accuracy_per_round([long, _series("fedavg", "sharing", 2, "t1", rounds=10_000)])

    assert all(len(t.x) <= figures.MAX_POINTS for t in fig.data)
    assert "1000 of up to 10,000 checkpoints a line" in fig.layout.title.text
    assert len(json.dumps(data.figure_json(fig))) < 2 * 1024 * 1024


# --- the experiment page -------------------------------------------------------------------------


@pytest.fixture
def momentum():
    with stateful_aggregator.registered() as record:
        yield record


def _finished(experiment, *, strategy: str, options: dict | None, accuracies: dict[str, list[float]], made_by: str):
    """A succeeded run with one checkpoint per task per round (the initial model first),
    ``accuracies[task]`` after each round, its rounds 10 s apart and 8 s of FL round time."""
    run = Run.objects.create(
        experiment=experiment,
        strategy=strategy,
        options=options or {},
        status=Run.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=60),
    )
    tasks = {t.name: t for t in experiment.tasks.all()}
    for task in tasks.values():
        Checkpoint.objects.create(run=run, task=task, artifact_path="x", sha256="0" * 64, test_accuracy=0.1)
    for index in range(len(next(iter(accuracies.values())))):
        rnd = Round.objects.create(
            run=run, index=index, status=Round.Status.SUCCEEDED, round_time_s=8.0, wall_time_s=10.0
        )
        for name, curve in accuracies.items():
            Checkpoint.objects.create(
                run=run,
                task=tasks[name],
                round=rnd,
                artifact_path="x",
                sha256="0" * 64,
                test_accuracy=curve[index],
                aggregation=made_by,
            )
    for k, ckpt in enumerate(Checkpoint.objects.filter(run=run).order_by("id")):
        Checkpoint.objects.filter(id=ckpt.id).update(created_at=T0 + dt.timedelta(seconds=10 * k))
    return run


@pytest.fixture
def algorithm_runs(make_experiment, momentum):
    experiment = make_experiment(name="algorithms", rounds=3)
    fedavg = _finished(
        experiment,
        strategy="sharing",
        options=None,
        accuracies={"t-mobilenet": [0.5, 0.7, 0.8], "t-shufflenet": [0.4, 0.6, 0.9]},
        made_by="fedavg",
    )
    momentum_run = _finished(
        experiment,
        strategy="sharing",
        options=algorithm_options(MOMENTUM),
        accuracies={"t-mobilenet": [0.6, 0.75, 0.85], "t-shufflenet": [0.3, 0.5, 0.6]},
        made_by=MOMENTUM,
    )
    pending = Run.objects.create(experiment=experiment, strategy="temporal", options=algorithm_options(MOMENTUM))
    return experiment, fedavg, momentum_run, pending


def test_the_experiment_page_draws_one_series_per_algorithm_and_strategy(browser_client, algorithm_runs):
    experiment, fedavg, momentum_run, _ = algorithm_runs

    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    built = json.loads(
        re.search(r'<script id="experiment-figures" type="application/json">(.*?)</script>', html, re.S).group(1)
    )
    for name in ("accuracy", "accuracy_rounds"):
        lines = {(t["name"], t["hovertemplate"].split(" · ")[-2]): t for t in built[name]["data"] if t["x"] != [None]}
        assert set(lines) == {
            ("fedavg · sharing", "t-mobilenet"),
            ("fedavg · sharing", "t-shufflenet"),
            (f"{MOMENTUM} · sharing", "t-mobilenet"),
            (f"{MOMENTUM} · sharing", "t-shufflenet"),
        }
    rounds = {
        (t["name"], t["hovertemplate"].split(" · ")[-2]): t
        for t in built["accuracy_rounds"]["data"]
        if t["x"] != [None]
    }
    shown_x = rounds[(f"{MOMENTUM} · sharing", "t-shufflenet")]["x"]
    assert [round(x) for x in shown_x] == [0, 1, 2, 3]  # whole rounds, dodged beside the other algorithm
    assert rounds[(f"{MOMENTUM} · sharing", "t-shufflenet")]["y"] == pytest.approx([0.1, 0.3, 0.5, 0.6])
    wall = {(t["name"], t["hovertemplate"].split(" · ")[-2]): t for t in built["accuracy"]["data"] if t["x"] != [None]}
    assert wall[("fedavg · sharing", "t-mobilenet")]["x"][0] == 0.0
    bars = next(t for t in built["speedup"]["data"] if t["name"] == "raw throughput" and t["x"] != [None])
    assert bars["x"] == ["fedavg · sharing", f"{MOMENTUM} · sharing"]
    assert 'id="fig-accuracy_rounds"' in html
    cells = re.findall(r'<td class="run-aggregation">(.*?)</td>', html)
    assert cells[0] == "fedavg" and all(MOMENTUM in c and "own aggregator" in c for c in cells[1:])


def test_a_run_before_its_first_round_is_labelled_with_the_algorithm_it_will_use(algorithm_runs):
    experiment, *_, pending = algorithm_runs
    Checkpoint.objects.create(
        run=pending, task=experiment.tasks.first(), artifact_path="x", sha256="0" * 64, test_accuracy=0.1
    )
    Run.objects.filter(id=pending.id).update(started_at=T0)

    built = data.experiment_figures(experiment, data.experiment_runs(experiment))

    names = {t["name"] for t in built["accuracy_rounds"]["data"] if t["x"] != [None]}
    assert f"{MOMENTUM} · temporal" in names


def test_an_experiment_of_one_algorithm_keeps_strategy_labels(make_experiment):
    experiment = make_experiment(name="one algorithm", rounds=2)
    for strategy in ("temporal", "sharing"):
        _finished(
            experiment,
            strategy=strategy,
            options=None,
            accuracies={"t-mobilenet": [0.5, 0.7], "t-shufflenet": [0.4, 0.6]},
            made_by="fedavg",
        )

    built = data.experiment_figures(experiment, data.experiment_runs(experiment))

    for name in ("accuracy", "accuracy_rounds"):
        shown = [t for t in built[name]["data"] if t.get("visible") is not False]  # the clock shown first
        assert [t["name"] for t in shown if t.get("showlegend") is not False] == ["temporal", "sharing"]
        assert [a["text"] for a in built[name]["layout"]["annotations"]] == ["t-mobilenet", "t-shufflenet"]


# --- what `mtfl demo --algorithms` prints ----------------------------------------------------------


def test_the_algorithm_rows_give_final_accuracy_and_rounds_to_the_lowest_final_accuracy(algorithm_runs):
    experiment, fedavg, momentum_run, pending = algorithm_runs

    results = algorithm_rows(experiment)

    # targets: the lowest final accuracy a succeeded run reached, per task
    assert results["targets"] == {"t-mobilenet": 0.8, "t-shufflenet": 0.6}
    rows = {r["run"]: r for r in results["rows"]}
    assert [r["algorithm"] for r in results["rows"]] == ["fedavg", MOMENTUM, MOMENTUM]
    assert rows[fedavg.id]["accuracy"] == {"t-mobilenet": 0.8, "t-shufflenet": 0.9}
    assert rows[fedavg.id]["wall_s"] == 60.0 and rows[pending.id]["wall_s"] is None
    reached = rows[momentum_run.id]["to_target"]
    assert (reached["t-mobilenet"].rounds, reached["t-mobilenet"].time_s) == (3, 24.0)  # 0.85 in round 3
    assert (reached["t-shufflenet"].rounds, reached["t-shufflenet"].time_s) == (3, 24.0)
    assert rows[fedavg.id]["to_target"]["t-shufflenet"].rounds == 2  # 0.6 in round 2
    assert rows[pending.id]["to_target"] == {"t-mobilenet": None, "t-shufflenet": None}


def test_algorithm_options_carry_the_demos_measured_parameters():
    assert algorithm_options("fedprox") == {"aggregation": "fedprox", "aggregation_params": {"mu": 0.01}}
    assert algorithm_options("fedavg") == {"aggregation": "fedavg", "aggregation_params": {}}
    assert set(algorithm_options("fedadam")["aggregation_params"]) == {"server_learning_rate"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algorithms", "fedsgd"], "--algorithms: 'fedsgd' is not allowed; allowed: fedavg"),
        (["--algorithms", "fedavg,fedavg"], "--algorithms lists 'fedavg' more than once"),
        (["--algorithms", "--strategies", ""], "--strategies is empty"),
        (["--algorithms", "--rounds", "0"], "--rounds=0 is out of range: allowed 1 to 1000"),
    ],
)
def test_the_algorithm_demo_refuses_bad_input_in_one_line(args, message, tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL"}
    }
    out = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "demo", *args],
        capture_output=True,
        text=True,
        env={**env, "MTFL_HOME": str(tmp_path)},
        timeout=120,
    )

    assert out.returncode != 0 and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# --- the demo's quick path keeps its label skew ----------------------------------------------------


def test_train_samples_partitions_the_first_samples_with_the_rules_skew(make_device, make_task):
    from controlplane.experiments.services import experiment_create
    from workers.protocol.indices import decode_indices

    devices = [make_device("dev-a"), make_device("dev-b")]
    task = make_task("t-mobilenet", "mobilenet_v3_small")

    experiment = experiment_create(
        name="quick",
        task_ids=[task.id],
        device_ids=[d.id for d in devices],
        rounds=1,
        partition_rule="dirichlet_labels",
        partition_params={"alpha": 0.1},
        train_samples=200,
    )

    shards = list(experiment.shards.order_by("device__name"))
    positions = np.concatenate([decode_indices(s.indices) for s in shards])
    assert sum(s.num_samples for s in shards) == 200 and sorted(positions) == list(range(200))
    histograms = np.array([s.label_counts for s in shards])
    # label skew: with alpha 0.1 most classes sit almost wholly on one device
    assert (histograms.max(axis=0) >= 0.8 * histograms.sum(axis=0)).sum() >= 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_samples": 1}, "train_samples=1 is out of range: allowed [2, 1437]"),
        ({"train_samples": 5000}, "train_samples=5000 is out of range: allowed [2, 1437]"),
        (
            {"train_samples": 100, "partition_rule": "explicit", "partition_params": None},
            "train_samples is not allowed with partition_rule 'explicit'",
        ),
    ],
)
def test_train_samples_out_of_range_is_refused_naming_it(make_device, make_task, change, message):
    from controlplane.common.errors import ApplicationError
    from controlplane.experiments.services import experiment_create

    devices = [make_device("dev-a"), make_device("dev-b")]
    task = make_task("t-mobilenet", "mobilenet_v3_small")
    arguments = {
        "name": "quick",
        "task_ids": [task.id],
        "device_ids": [d.id for d in devices],
        "rounds": 1,
        "partition_rule": "dirichlet_labels",
        "partition_params": {"alpha": 0.5},
        **change,
    }

    with pytest.raises(ApplicationError) as refused:
        experiment_create(**arguments)

    assert refused.value.field == "train_samples" and message in refused.value.message
