"""Exports for a researcher's own tools (issue 33 item 7): ``mtfl export EXPERIMENT --mlflow URI``
logs each run as an MLflow run, read back here with MLflow's own API; the tidy long-format CSV of
per-round, per-task metrics (``--csv`` and the ``metrics`` table of the downloads); an unknown
table's download answers 404 with the allowed tables. Issue 33's review (item 7, 10): two
control planes exporting to one store keep each other's runs, task names that MLflow would
refuse or that would share a key get keys of their own, a run carries its comparison's current
report, the initial model's accuracy is exported at 0 rounds done, and a run of its own has no
repeat.

The experiment is a comparison of ``temporal`` and ``sharing`` with 2 repeats whose runs have
rounds, assignments and evaluated checkpoints (the initial model's included), written as
recording them would (as the comparison report tests build theirs)."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import importlib.util
import io
import json
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run, Task
from controlplane.storage import exports, mlflow_export

mlflow = pytest.importorskip("mlflow")  # the mlflow extra: in the test extra, so CI runs these

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)
ROUND_TIMES = {"temporal": [10.0, 10.0, 10.0], "sharing": [6.0, 6.0, 7.0]}
INITIAL_ACCURACY = 0.1
"""Each task's initial model's test accuracy (0 rounds done; t-shufflenet's one tenth higher)."""
ACCURACY = [0.25, 0.5, 0.75]
"""Each task's test accuracy after rounds 0, 1, 2 (t-shufflenet's one tenth higher)."""


def _accuracy(task: str, index: int | None) -> float:
    """The test accuracy :func:`_finish` gives ``task`` after round ``index`` (None: the initial model)."""
    return (INITIAL_ACCURACY if index is None else ACCURACY[index]) + (0.1 if "shufflenet" in task else 0.0)


def _finish(run: Run, *, rounds: int = 3) -> None:
    """Give ``run`` an evaluated initial model per task (test loss 2.5), rounds (every 20 s from
    T0), an assignment per shard (device k's loss 1 − k/4 less a tenth a round) and a checkpoint
    per task, as if it had trained."""
    times = ROUND_TIMES[run.strategy]
    Run.objects.filter(id=run.id).update(
        status=Run.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=20 * rounds),
        raw_throughput_sps=100.0 if run.strategy == "sharing" else 50.0,
        fair_throughput=1.5,
        fl_throughput_sps=40.0 if run.strategy == "sharing" else 20.0,
    )
    shards = list(run.experiment.shards.select_related("device", "task").order_by("device__name", "task__name"))
    for task in run.experiment.tasks.all():
        Checkpoint.objects.create(
            run=run, task=task, artifact_path="x", sha256="0", test_accuracy=_accuracy(task.name, None), test_loss=2.5
        )
    for index in range(rounds):
        rnd = Round.objects.create(
            run=run,
            index=index,
            status=Round.Status.SUCCEEDED,
            started_at=T0 + dt.timedelta(seconds=20 * index),
            finished_at=T0 + dt.timedelta(seconds=20 * index + 15),
            round_time_s=times[index],
            wall_time_s=times[index] + 5,
            samples_trained=sum(s.num_samples for s in shards),
            fl_throughput_sps=10.0 + index,
        )
        for shard in shards:
            k = 0 if shard.device.name == "dev-a" else 1
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=16 * (k + 1),
                active_thread_percentage=50 + 25 * k,
                samples=shard.num_samples,
                samples_trained=shard.num_samples,
                throughput_sps=30.0 + k,
                train_loss=1.0 - k / 4 - index / 10,
                status=Assignment.Status.SUCCEEDED,
            )
        for task in run.experiment.tasks.all():
            Checkpoint.objects.create(
                run=run,
                task=task,
                round=rnd,
                artifact_path="x",
                sha256="0",
                test_accuracy=_accuracy(task.name, index),
                test_loss=2.0 - index / 2,
            )


@pytest.fixture
def compared(make_experiment, django_capture_on_commit_callbacks):
    """A finished comparison of temporal and sharing, 2 repeats, 3 rounds each."""
    experiment = make_experiment(name="exported", rounds=3)
    with django_capture_on_commit_callbacks():  # the runs are not dispatched: they are finished by hand
        comparison = services.comparison_create(experiment=experiment, strategies=["temporal", "sharing"], repeats=2)
    for run in comparison.runs.all():
        _finish(run)
    return experiment, comparison


def _expected_train_loss(experiment, task: str, index: int) -> float:
    """Σ_j n_j·L_j / Σ_j n_j over the task's shards, with the losses :func:`_finish` gives."""
    shards = experiment.shards.filter(task__name=task).select_related("device")
    weighted = [(s.num_samples, 1.0 - (0 if s.device.name == "dev-a" else 1) / 4 - index / 10) for s in shards]
    return sum(n * loss for n, loss in weighted) / sum(n for n, _ in weighted)


# --- the tidy CSV ---------------------------------------------------------------------------------


def _json(response) -> dict:
    assert response.status_code == 200
    return json.loads(b"".join(response.streaming_content))


def _metrics_csv(browser_client, experiment) -> list[dict]:
    response = browser_client.get(f"/experiments/{experiment.id}/metrics.csv")
    assert response.status_code == 200
    reader = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    assert reader.fieldnames == list(exports.METRIC_COLUMNS)
    return list(reader)


def test_the_metrics_table_is_one_row_per_run_round_task_and_metric(browser_client, compared):
    experiment, comparison = compared

    rows = _metrics_csv(browser_client, experiment)

    # 4 runs × (3 rounds × (5 whole-round figures + 2 tasks × 5 per-task figures) + the initial
    # model's test accuracy and loss of 2 tasks)
    assert len(rows) == 4 * (3 * (len(exports.ROUND_METRICS) + 2 * len(exports.TASK_METRICS)) + 2 * 2)
    run = comparison.runs.get(strategy="sharing", repeat=1)
    trained = [r for r in rows if r["run"] == str(run.id) and r["round"] != ""]  # the initial model's have no round
    mine = {(int(r["round"]), r["task"], r["metric"]): float(r["value"]) for r in trained}
    assert {r["experiment"] for r in rows} == {"exported"}
    assert {(r["strategy"], r["comparison"], r["repeat"]) for r in rows if r["run"] == str(run.id)} == {
        ("sharing", str(comparison.id), "1")
    }
    assert mine[(2, "", "round_time_s")] == 7.0 and mine[(2, "", "wall_time_s")] == 12.0
    assert mine[(1, "", "elapsed_s")] == 35.0  # T0 to the end of round 1 (20 s + 15 s)
    assert mine[(1, "t-shufflenet", "test_accuracy")] == pytest.approx(0.6)
    assert mine[(1, "t-mobilenet", "test_loss")] == 1.5
    assert mine[(2, "t-mobilenet", "train_loss")] == pytest.approx(_expected_train_loss(experiment, "t-mobilenet", 2))
    assert mine[(0, "t-mobilenet", "throughput_sps")] == 61.0  # 30 + 31 samples/s over the two devices


def test_a_figure_not_measured_has_no_row(browser_client, compared):
    experiment, comparison = compared
    run = comparison.runs.get(strategy="temporal", repeat=0)
    Checkpoint.objects.filter(run=run, round__index=2).update(test_accuracy=None, test_loss=None)
    Assignment.objects.filter(round__run=run).update(train_loss=None)  # the simulated backend reports none

    rows = [r for r in _metrics_csv(browser_client, experiment) if r["run"] == str(run.id)]

    assert not [r for r in rows if r["metric"] == "train_loss"]
    assert {r["round"] for r in rows if r["metric"] == "test_accuracy"} == {"", "0", "1"}
    assert all(r["value"] != "" for r in rows)


def test_a_runs_metrics_table_holds_that_run_only(browser_client, compared):
    _, comparison = compared
    run = comparison.runs.get(strategy="sharing", repeat=0)

    response = browser_client.get(f"/runs/{run.id}/metrics.csv")

    body = b"".join(response.streaming_content).decode()
    assert {row["run"] for row in csv.DictReader(io.StringIO(body))} == {str(run.id)}


def test_the_initial_model_is_at_0_rounds_done_and_rounds_done_is_the_round_plus_one(browser_client, compared):
    experiment, comparison = compared
    run = comparison.runs.get(strategy="temporal", repeat=1)

    rows = [r for r in _metrics_csv(browser_client, experiment) if r["run"] == str(run.id)]

    initial = {(r["task"], r["metric"]): float(r["value"]) for r in rows if r["rounds_done"] == "0"}
    assert initial == {
        ("t-mobilenet", "test_accuracy"): pytest.approx(_accuracy("t-mobilenet", None)),
        ("t-mobilenet", "test_loss"): 2.5,
        ("t-shufflenet", "test_accuracy"): pytest.approx(_accuracy("t-shufflenet", None)),
        ("t-shufflenet", "test_loss"): 2.5,
    }
    assert all(r["round"] == "" for r in rows if r["rounds_done"] == "0")
    assert all(int(r["rounds_done"]) == int(r["round"]) + 1 for r in rows if r["rounds_done"] != "0")
    assert [r["rounds_done"] for r in rows] == sorted(
        (r["rounds_done"] for r in rows), key=int
    )  # the initial model first


def test_a_run_of_its_own_has_no_comparison_and_no_repeat(browser_client, compared):
    experiment, _ = compared
    alone = Run.objects.create(experiment=experiment, strategy="sharing")
    _finish(alone)

    rows = [r for r in _metrics_csv(browser_client, experiment) if r["run"] == str(alone.id)]
    summaries = browser_client.get(f"/experiments/{experiment.id}/results.json")
    summary = next(r for r in _json(summaries)["runs"] if r["run"] == alone.id)

    assert rows and {(r["comparison"], r["repeat"]) for r in rows} == {("", "")}
    assert (summary["comparison"], summary["repeat"]) == (None, None)


def test_export_csv_writes_the_same_table(browser_client, compared, tmp_path):
    experiment, _ = compared
    out = io.StringIO()

    call_command("export", "exported", "--csv", str(tmp_path / "metrics.csv"), stdout=out)

    with (tmp_path / "metrics.csv").open(newline="") as f:
        assert list(csv.DictReader(f)) == _metrics_csv(browser_client, experiment)
    assert out.getvalue().startswith(f"{4 * (3 * 15 + 4)} metric values of 4 runs written to ")


@pytest.mark.parametrize("url", ["/experiments/{experiment}/round.csv", "/runs/{run}/assignment.csv"])
def test_an_unknown_table_is_404_naming_the_allowed_ones(browser_client, compared, url):
    experiment, comparison = compared

    response = browser_client.get(url.format(experiment=experiment.id, run=comparison.runs.first().id))

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/plain")
    assert "allowed: rounds, assignments, metrics" in response.content.decode()


# --- MLflow ---------------------------------------------------------------------------------------


def _export(experiment, uri: str, *more: str) -> list[str]:
    out = io.StringIO()
    call_command("export", str(experiment.id), "--mlflow", uri, *more, stdout=out)
    return out.getvalue().splitlines()


def _mlflow_runs(uri: str, name: str) -> dict[int, object]:
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[name], output_format="list")
    return {int(r.data.tags["mtfl.run_id"]): r for r in runs}


def test_every_run_opens_in_mlflow_with_its_params_metrics_and_tags(compared, tmp_path):
    experiment, comparison = compared
    uri = f"file:{tmp_path / 'mlruns'}"

    lines = _export(experiment, uri)

    runs = {r.id: r for r in comparison.runs.all()}
    found = _mlflow_runs(uri, "exported")
    assert set(found) == set(runs)
    assert len(lines) == 5 and all(" exported as MLflow run " in line for line in lines[:4])
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    for run_id, logged in found.items():
        run = runs[run_id]
        params, tags = logged.data.params, logged.data.tags
        assert params["strategy"] == run.strategy and params["aggregation"] == "fedavg"
        assert params["partition_rule"] == "explicit" and params["rounds"] == "3"
        assert (params["batch_size.dev-a.t-mobilenet"], params["share.dev-b.t-shufflenet"]) == ("16", "75")
        assert tags["mtfl.status"] == "succeeded" and tags["mtfl.comparison_id"] == str(comparison.id)
        assert tags["mtfl.repeat"] == str(run.repeat) and logged.info.status == "FINISHED"
        # step = rounds done, as the dashboard's x axis: 0 is the initial model, round k is k + 1
        history = client.get_metric_history(logged.info.run_id, "test_accuracy.t-shufflenet")
        assert sorted((m.step, m.value) for m in history) == [
            (k + 1 if k is not None else 0, pytest.approx(_accuracy("t-shufflenet", k))) for k in (None, 0, 1, 2)
        ]
        rounds = client.get_metric_history(logged.info.run_id, "round_time_s")
        assert sorted((m.step, m.value) for m in rounds) == list(zip((1, 2, 3), ROUND_TIMES[run.strategy], strict=True))
        loss = client.get_metric_history(logged.info.run_id, "train_loss.t-mobilenet")
        assert sorted((m.step, m.value) for m in loss) == [
            (k + 1, pytest.approx(_expected_train_loss(experiment, "t-mobilenet", k))) for k in range(3)
        ]
        assert tags["mtfl.installation"] == mlflow_export.installation_id()


def test_the_comparisons_figures_are_metrics_of_its_runs(compared, tmp_path):
    experiment, comparison = compared
    uri = f"file:{tmp_path / 'mlruns'}"

    _export(experiment, uri)

    found = _mlflow_runs(uri, "exported")
    sharing = found[comparison.runs.get(strategy="sharing", repeat=0).id].data.metrics
    temporal = found[comparison.runs.get(strategy="temporal", repeat=0).id].data.metrics
    # sharing's raw throughput is 100 samples/s against its temporal baseline's 50; its FL throughput 40 against 20
    assert sharing["run.raw_speedup"] == pytest.approx(2.0) and sharing["comparison.fl_speedup"] == pytest.approx(2.0)
    assert temporal["comparison.fl_speedup"] == pytest.approx(1.0)
    # the default target is the lowest final accuracy (0.75 for t-mobilenet), reached after round 2
    assert sharing["comparison.rounds_to_accuracy.t-mobilenet"] == 3
    assert sharing["comparison.time_to_accuracy_s.t-mobilenet"] == pytest.approx(sum(ROUND_TIMES["sharing"]))
    assert sharing["run.final_accuracy.t-shufflenet"] == pytest.approx(0.85)


def _ids(uri: str, name: str = "exported") -> dict[int, str]:
    """mtfl run id → MLflow run id of the active runs in MLflow experiment ``name``."""
    return {k: r.info.run_id for k, r in _mlflow_runs(uri, name).items()}


def test_re_exporting_skips_unchanged_runs(compared, tmp_path):
    experiment, _ = compared
    uri = f"file:{tmp_path / 'mlruns'}"
    _export(experiment, uri)
    first = _ids(uri)

    again = _export(experiment, uri)

    assert sum(" skipped as MLflow run " in line for line in again) == 4
    assert _ids(uri) == first


def test_a_changed_run_is_replaced_and_its_comparisons_runs_carry_the_new_report(compared, tmp_path):
    experiment, comparison = compared
    uri = f"file:{tmp_path / 'mlruns'}"
    _export(experiment, uri)
    first = _ids(uri)
    changed = comparison.runs.get(strategy="sharing", repeat=1)
    untouched = comparison.runs.get(strategy="temporal", repeat=0)
    Checkpoint.objects.filter(run=changed, round__index=2).update(test_accuracy=0.95)

    lines = _export(experiment, uri)

    found = _mlflow_runs(uri, "exported")
    # every run of the comparison carries its report, which the change altered: all four replaced
    assert len(found) == 4 and sum(" replaced as MLflow run " in line for line in lines) == 4
    assert found[changed.id].info.run_id != first[changed.id]
    assert found[changed.id].data.metrics["test_accuracy.t-mobilenet"] == pytest.approx(0.95)
    artifact = f"{found[untouched.id].info.artifact_uri}/mtfl/comparison-{comparison.id}.json"
    report = mlflow.artifacts.load_dict(artifact)
    row = next(r for r in report["runs"] if r["run"] == changed.id)
    assert next(t for t in row["tasks"] if t["task_name"] == "t-mobilenet")["final_accuracy"] == pytest.approx(0.95)


def test_a_changed_run_of_its_own_is_replaced_alone(compared, tmp_path):
    experiment, _ = compared
    alone = Run.objects.create(experiment=experiment, strategy="sharing")
    _finish(alone)
    uri = f"file:{tmp_path / 'mlruns'}"
    _export(experiment, uri)
    first = _ids(uri)
    Checkpoint.objects.filter(run=alone, round__index=2).update(test_accuracy=0.95)

    lines = _export(experiment, uri)

    assert sum(" replaced as MLflow run " in line for line in lines) == 1
    assert sum(" skipped as MLflow run " in line for line in lines) == 4
    assert {k: v for k, v in _ids(uri).items() if k != alone.id} == {k: v for k, v in first.items() if k != alone.id}


def test_two_control_planes_exporting_to_one_store_keep_each_others_runs(compared, tmp_path, monkeypatch):
    """A laptop's and the lab's databases both hold runs with these ids, exported under one
    MLflow experiment name: neither export skips, replaces or deletes the other's runs."""
    experiment, comparison = compared
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setattr(mlflow_export, "installation_id", lambda: "laptop")
    _export(experiment, uri)
    mlflow.set_tracking_uri(uri)
    laptop = {r.info.run_id for r in mlflow.search_runs(experiment_names=["exported"], output_format="list")}

    monkeypatch.setattr(mlflow_export, "installation_id", lambda: "lab")
    first = _export(experiment, uri)
    Checkpoint.objects.filter(run=comparison.runs.first(), round__index=2).update(test_accuracy=0.95)
    again = _export(experiment, uri)

    runs = mlflow.search_runs(experiment_names=["exported"], output_format="list")
    assert sum(" exported as MLflow run " in line for line in first) == 4  # none of the laptop's was taken
    assert sum(" replaced as MLflow run " in line for line in again) == 4
    assert len(runs) == 8 and laptop <= {r.info.run_id for r in runs}
    assert {r.data.tags["mtfl.installation"] for r in runs} == {"laptop", "lab"}
    assert all(r.data.tags["mtfl.experiment_id"] == str(experiment.id) for r in runs)


def test_the_installation_id_is_the_databases_and_stable(db):
    recorder = MigrationRecorder(connection)
    first = recorder.migration_qs.order_by("id").first()

    same = mlflow_export.installation_id()

    assert same == mlflow_export.installation_id() and len(same) == 16 and int(same, 16) >= 0
    recorder.migration_qs.filter(id=first.id).update(applied=first.applied + dt.timedelta(microseconds=1))
    assert mlflow_export.installation_id() != same  # another database: created at another moment


# --- keys MLflow takes ------------------------------------------------------------------------------


def test_safe_names_replace_slashes_collapse_and_hash_only_colliding_altered_names():
    names = ["a/b", "a:b", "a_b", "x//y/", "plain name.v2"]

    safe = mlflow_export.safe_names(names)

    def digest(name: str) -> str:
        return hashlib.sha256(name.encode()).hexdigest()[:8]

    assert safe == {
        "a_b": "a_b",  # unchanged: keeps its name
        "a/b": f"a_b-{digest('a/b')}",
        "a:b": f"a_b-{digest('a:b')}",
        "x//y/": "x_y_",  # a run of refused characters is one _, no collision: no hash
        "plain name.v2": "plain name.v2",
    }
    assert mlflow_export.safe_names(reversed(names)) == safe  # stable: the order does not matter


@pytest.mark.parametrize(
    "mobilenet,shufflenet",
    [("cnn/v1", "cnn:v1"), ("a//b/", "a_b_"), ("a/b", "a_b"), ("/lead", "trail/")],
    ids=["both-altered-collide", "slashes-collide-with-plain", "one-altered", "leading-trailing-slash"],
)
def test_slashy_and_colliding_task_names_get_keys_of_their_own(compared, tmp_path, mobilenet, shufflenet):
    experiment, comparison = compared
    # renamed after the fact: the export reads the names as they are now
    Task.objects.filter(name="t-mobilenet").update(name=mobilenet)
    Task.objects.filter(name="t-shufflenet").update(name=shufflenet)
    uri = f"file:{tmp_path / 'mlruns'}"

    _export(experiment, uri)

    parts = mlflow_export.safe_names([mobilenet, shufflenet])
    assert parts[mobilenet] != parts[shufflenet] and not any("/" in part for part in parts.values())
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    for logged in _mlflow_runs(uri, "exported").values():
        for task, part in parts.items():
            history = client.get_metric_history(logged.info.run_id, f"test_accuracy.{part}")
            was = "t-shufflenet" if task == shufflenet else "t-mobilenet"
            assert sorted(m.value for m in history) == pytest.approx(sorted(_accuracy(was, k) for k in (None, 0, 1, 2)))
            assert f"batch_size.dev-a.{part}" in logged.data.params


def test_the_mlflow_experiment_may_be_named(compared, tmp_path):
    experiment, _ = compared
    uri = f"file:{tmp_path / 'mlruns'}"

    lines = _export(experiment, uri, "--mlflow-experiment", "paper figures")

    assert len(_mlflow_runs(uri, "paper figures")) == 4
    assert lines[-1].startswith("4 runs of 'exported' in MLflow experiment 'paper figures'")


@pytest.mark.parametrize(
    "args,message",
    [
        (["exported", "--mlflow", "nope://where"], "MLflow store 'nope://where': "),
        (["missing", "--mlflow", "file:/tmp/x"], "experiment 'missing' does not exist"),
        (["exported"], "nothing to export to: give --mlflow URI and/or --csv PATH"),
        (["exported", "--mlflow", " "], "--mlflow is empty"),
        (["exported", "--mlflow", "sqlite:///never.db"], "a sqlite: store needs the full mlflow package (SQLAlchemy)"),
    ],
)
def test_a_bad_uri_or_experiment_is_one_line(compared, args, message, monkeypatch):
    # mlflow-skinny (the `mlflow` extra) has no SQLAlchemy; where the full package put it here,
    # the export is shown a machine without it, so the refusal is checked on every machine
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        mlflow_export.importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "sqlalchemy" else find_spec(name, *rest),
    )
    with pytest.raises(CommandError) as refused:
        call_command("export", *args, stdout=io.StringIO())

    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_without_mlflow_installed_it_says_how_to_install_it(compared, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # import mlflow.tracking raises ImportError

    with pytest.raises(CommandError, match=r"MLflow is not installed: pip install 'mtfl-lab\[mlflow\]'"):
        call_command("export", "exported", "--mlflow", "file:/tmp/never", stdout=io.StringIO())
