"""Downloads of results (reads only, like :mod:`.selectors`): the rounds and the assignments of a
run, or of every run of an experiment, as CSV or JSON.

Rows are read with server-side iterators and written a chunk at a time, so a long run streams to
the browser instead of being built in memory. Columns use the models' and the API's names, in the
project's vocabulary (docs/DESIGN.md §2): one row per *round* (``round_index``, ``round_time_s``,
``raw_throughput_sps``, ``fair_throughput``, …) and one per *assignment* (``device``, ``task``,
``batch_size``, ``active_thread_percentage``, ``throughput_sps``, …, and on a GPU the trainer's
``peak_memory_bytes`` and what MPS granted); ``device`` and ``task`` are names, ``run`` is the
run's id, times are ISO 8601 in UTC, throughputs samples per second.

The JSON holds the same two tables under ``rounds`` and ``assignments`` (same keys as the CSV
columns), with the experiment's setup under ``experiment`` and one summary per run under ``runs``.

A third CSV table, ``metrics``, is the per-round figures in tidy long format for pandas and R
users (:data:`METRIC_COLUMNS`): one row per run, round, task and metric, ``task`` empty for a
round's whole-run figures, and no row for a value that was not measured. Its rounds are counted
both ways: ``round`` is the round index (from 0, as in the other tables) and ``rounds_done`` the
rounds trained, the dashboard's axis (``round`` + 1; 0 is the initial model, evaluated before any
training, whose row has ``round`` empty).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import Case, F, QuerySet, Sum, When

from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Checkpoint, Experiment, Round, Run

CHUNK_ROWS = 500
"""Rows read from the database and written to the response at a time."""

ROUND_COLUMNS: dict[str, str] = {
    "run": "run_id",
    "strategy": "run__strategy",
    "round_index": "index",
    "status": "status",
    "started_at": "started_at",
    "finished_at": "finished_at",
    "round_time_s": "round_time_s",
    "wall_time_s": "wall_time_s",
    "predicted_round_time_s": "predicted_round_time_s",
    "samples_trained": "samples_trained",
    "fl_throughput_sps": "fl_throughput_sps",
    "raw_throughput_sps": "raw_throughput_sps",
    "fair_throughput": "fair_throughput",
    "flags": "flags",
    "error": "error",
}
"""Columns of the rounds table → the :class:`Round` field each comes from."""

ASSIGNMENT_COLUMNS: dict[str, str] = {
    "run": "round__run_id",
    "strategy": "round__run__strategy",
    "round_index": "round__index",
    "device": "device__name",
    "task": "task__name",
    "status": "status",
    "batch_size": "batch_size",
    "active_thread_percentage": "active_thread_percentage",
    "samples": "samples",
    "samples_trained": "samples_trained",
    "throughput_sps": "throughput_sps",
    "predicted_throughput_sps": "predicted_throughput_sps",
    "standalone_throughput_sps": "standalone_throughput_sps",
    "seconds": "seconds",
    "train_loss": "train_loss",
    "started_at": "started_at",
    "finished_at": "finished_at",
    "simulated": "simulated",
    "torch_device": "torch_device",
    "peak_memory_bytes": "peak_memory_bytes",
    "mps_active_thread_percentage": "mps_active_thread_percentage",
    "mps_verified": "mps_verified",
    "execution_mode": "execution_mode",
    "execution_fallback": "execution_fallback",
    "error": "error",
}
"""Columns of the assignments table → the :class:`Assignment` field each comes from."""

METRIC_COLUMNS = (
    "experiment",
    "run",
    "strategy",
    "comparison",
    "repeat",
    "round",
    "rounds_done",
    "task",
    "metric",
    "value",
)
"""Columns of the tidy ``metrics`` table: the experiment's name, the run's id, strategy,
comparison id and repeat (both empty: a run of its own), the round index (empty for the initial
model), the rounds done (the round index + 1; 0: the initial model, the dashboard's x axis), the
task's name (empty for a whole-round figure), the metric's name (:data:`ROUND_METRICS`,
:data:`TASK_METRICS`) and its value."""

ROUND_METRICS = ("round_time_s", "wall_time_s", "elapsed_s", "samples_trained", "fl_throughput_sps")
"""The ``metrics`` table's whole-round figures (``task`` empty): the round's compute span and its
wall time from dispatch to aggregated (seconds; :class:`Round`), ``elapsed_s`` the wall clock
from the run's start to the round's end (seconds), the samples trained and the FL throughput
(samples per second)."""

TASK_METRICS = ("test_accuracy", "test_loss", "train_loss", "throughput_sps", "samples_trained")
"""The ``metrics`` table's per-task figures of a round: the global model's test accuracy (a
fraction in [0, 1]) and test loss after the round (its checkpoint's evaluation), the training
loss (the devices' last-epoch mean cross-entropy weighted by the samples each trained), the
task's throughput summed over its devices (samples per second) and the samples trained. The
initial model (0 rounds done) has its test accuracy and loss only."""

TABLES = ("rounds", "assignments", "metrics")
"""The CSV tables of a run or an experiment (``/runs/<id>/<table>.csv``,
``/experiments/<id>/<table>.csv``)."""


def round_rows(runs: QuerySet[Run]) -> Iterator[dict[str, Any]]:
    """Every round of ``runs``, by run and round index, as ``{column: value}``."""
    queryset = Round.objects.filter(run__in=runs).order_by("run_id", "index")
    yield from _rows(queryset, ROUND_COLUMNS)


def assignment_rows(runs: QuerySet[Run]) -> Iterator[dict[str, Any]]:
    """Every assignment of ``runs``, by run, round index, device name and task name."""
    queryset = Assignment.objects.filter(round__run__in=runs).order_by(
        "round__run_id", "round__index", "device__name", "task__name"
    )
    yield from _rows(queryset, ASSIGNMENT_COLUMNS)


def _rows(queryset: QuerySet, columns: dict[str, str]) -> Iterator[dict[str, Any]]:
    names = list(columns)
    for values in queryset.values_list(*columns.values()).iterator(chunk_size=CHUNK_ROWS):
        yield dict(zip(names, values, strict=True))


def metric_rows(runs: QuerySet[Run]) -> Iterator[dict[str, Any]]:
    """The tidy ``metrics`` table of ``runs`` (:data:`METRIC_COLUMNS`), by run id, rounds done
    (the initial model first), task (whole-round figures first) and metric in the order of
    :data:`ROUND_METRICS` and :data:`TASK_METRICS`; a figure not measured (a failed round's
    times, an evaluation still pending, the ``simulated`` backend's training loss) has no row.
    Three queries per run."""
    for run in runs.select_related("experiment").order_by("id"):
        meta = {
            "experiment": run.experiment.name,
            "run": run.id,
            "strategy": run.strategy,
            "comparison": run.comparison_id,
            "repeat": run_repeat(run),
        }
        for (done, task), figures in run_round_metrics(run).items():
            for metric, value in figures.items():
                row = {"round": done - 1 if done else None, "rounds_done": done, "task": task}
                yield {**meta, **row, "metric": metric, "value": value}


def run_repeat(run: Run) -> int | None:
    """The run's repeat in its comparison, ``None`` for a run of its own (whose stored
    :attr:`Run.repeat` is a placeholder 0)."""
    return run.repeat if run.comparison_id is not None else None


def run_round_metrics(run: Run) -> dict[tuple[int, str | None], dict[str, float]]:
    """Every measured per-round figure of ``run``: ``{(rounds done, task name or None):
    {metric: value}}`` sorted by rounds done then task (``None`` first). Rounds done is the round
    index + 1: round ``k``'s figures, its training loss and the test results of the model it
    made, are under ``k + 1``, as the dashboard draws them, and the initial model's test
    results under 0. Whole-round figures are under ``None`` (:data:`ROUND_METRICS`), each
    task's under its name (:data:`TASK_METRICS`), metrics in those orders, unmeasured ones left
    out. Three queries (rounds, checkpoints, assignments summed per round and task by the
    database)."""
    out: dict[tuple[int, str | None], dict[str, float]] = {}
    start = run.started_at
    stored = [m for m in ROUND_METRICS if m != "elapsed_s"]  # Round's fields; elapsed_s is derived
    for rnd in Round.objects.filter(run=run).order_by("index").only("index", "finished_at", *stored):
        elapsed = (rnd.finished_at - start).total_seconds() if start and rnd.finished_at else None
        values = {m: elapsed if m == "elapsed_s" else getattr(rnd, m) for m in ROUND_METRICS}
        out[(rnd.index + 1, None)] = {m: float(v) for m, v in values.items() if measured(v)}
    per_task: dict[tuple[int, str | None], dict[str, Any]] = {}
    # The latest checkpoint of a round and task wins (a restarted run's initial model is remade).
    evaluated = (
        Checkpoint.objects.filter(run=run)
        .order_by("created_at", "id")
        .values_list("round__index", "task__name", "test_accuracy", "test_loss")
    )
    for index, task, accuracy, loss in evaluated:
        done = 0 if index is None else index + 1
        per_task.setdefault((done, task), {}).update(test_accuracy=accuracy, test_loss=loss)
    for row in _task_training(run):
        figures = per_task.setdefault((row["round__index"] + 1, row["task__name"]), {})
        figures["train_loss"] = row["loss_x_n"] / row["loss_n"] if row["loss_n"] else None
        figures["throughput_sps"] = row["throughput"]
        figures["samples_trained"] = row["samples"]
    for key, figures in per_task.items():
        out[key] = {m: float(figures[m]) for m in TASK_METRICS if measured(figures.get(m))}
    return {key: out[key] for key in sorted(out, key=lambda k: (k[0], k[1] or "")) if out[key]}


def _task_training(run: Run) -> QuerySet:
    """Per round and task of ``run``, over its succeeded assignments: ``loss_x_n`` (Σ n·loss over
    those that reported a loss), ``loss_n`` (their Σ n), ``throughput`` (Σ samples/s) and
    ``samples`` (Σ samples trained)."""
    with_loss = When(train_loss__isnull=False, samples_trained__gt=0, then=F("samples_trained"))
    return (
        Assignment.objects.filter(round__run=run, status=Assignment.Status.SUCCEEDED)
        .values("round__index", "task__name")
        .annotate(
            loss_x_n=Sum(selectors.TRAIN_LOSS_X_SAMPLES),
            loss_n=Sum(Case(with_loss, default=0)),
            throughput=Sum("throughput_sps"),
            samples=Sum("samples_trained"),
        )
        .order_by("round__index", "task__name")
    )


def measured(value: Any) -> bool:
    """Whether ``value`` is a figure to write: not ``None``, and finite when it is a float."""
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def table_rows(table: str, runs: QuerySet[Run]) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` (one of :data:`TABLES`) of ``runs``.

    Raises:
        ValueError: an unknown table (:func:`unknown_table_message`).
    """
    if table == "rounds":
        return round_rows(runs)
    if table == "assignments":
        return assignment_rows(runs)
    if table == "metrics":
        return metric_rows(runs)
    raise ValueError(unknown_table_message(table))


def unknown_table_message(table: str) -> str:
    """``"no table 'x'; allowed: rounds, assignments, metrics"``: what a download of an unknown
    table answers (404)."""
    return f"no table {table!r}; allowed: {', '.join(TABLES)}"


def table_columns(table: str) -> list[str]:
    """The column names of ``table``, in order."""
    if table == "metrics":
        return list(METRIC_COLUMNS)
    return list(ROUND_COLUMNS if table == "rounds" else ASSIGNMENT_COLUMNS)


# --- CSV ----------------------------------------------------------------------------------------


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list):
        return ";".join(map(str, value))
    return value


def csv_chunks(table: str, runs: QuerySet[Run]) -> Iterator[str]:
    """``table`` of ``runs`` as CSV text, a header line then up to :data:`CHUNK_ROWS` rows per
    chunk. Empty cells are missing values; booleans are ``true``/``false``; a round's ``flags``
    are joined with ``;``."""
    columns = table_columns(table)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    n = 0
    for row in table_rows(table, runs):
        writer.writerow([_csv_cell(row[c]) for c in columns])
        n += 1
        if n % CHUNK_ROWS == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


# --- JSON ---------------------------------------------------------------------------------------


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json_row(row: dict[str, Any]) -> str:
    return json.dumps({k: _json_value(v) for k, v in row.items()})


def aggregation_settings(experiment: Experiment) -> dict[str, Any]:
    """The experiment's FL algorithm: its aggregator and parameters, each task's override
    (``task_aggregation`` keyed by task *name*, in task-name order; an override of a task no
    longer in the experiment keeps its id as the key) and its participation per round.

    Returns:
        ``{"aggregation", "aggregation_params", "task_aggregation", "clients_per_round",
        "client_fraction", "client_sampling"}``.
    """
    overrides = experiment.task_aggregation or {}
    ids = [int(k) for k in overrides if k.isdigit()]
    names = dict(experiment.tasks.filter(id__in=ids).values_list("id", "name")) if ids else {}
    by_name = {names.get(int(k), k) if k.isdigit() else k: v for k, v in overrides.items()}
    return {
        "aggregation": experiment.aggregation,
        "aggregation_params": experiment.aggregation_params,
        "task_aggregation": {name: by_name[name] for name in sorted(by_name)},
        "clients_per_round": experiment.clients_per_round,
        "client_fraction": experiment.client_fraction,
        "client_sampling": experiment.client_sampling,
    }


def experiment_summary(experiment: Experiment) -> dict[str, Any]:
    """The experiment's setup: owner, collaborators, tasks, devices, rounds, data split, its FL
    algorithm (:func:`aggregation_settings`), its retention policy (``keep_last_checkpoints``
    null: the lab default) and the samples each device holds of each task."""
    shards = experiment.shards.select_related("device", "task").order_by("device__name", "task__name")
    return {
        "id": experiment.id,
        "name": experiment.name,
        "description": experiment.description,
        "owner": experiment.owner.username if experiment.owner_id else None,
        "collaborators": sorted(u.username for u in experiment.collaborators.all()),
        "tasks": [
            {
                "task": t.name,
                "architecture": t.architecture,
                "dataset": t.dataset,
                "num_classes": t.num_classes,
                "input_shape": t.input_shape,
                "optimizer": t.optimizer,
                "learning_rate": t.learning_rate,
                "momentum": t.momentum,
                "weight_decay": t.weight_decay,
            }
            for t in experiment.tasks.order_by("name")
        ],
        "devices": [{"device": d.name, "backend": d.backend} for d in experiment.devices.order_by("name")],
        "rounds": experiment.rounds,
        "local_epochs": experiment.local_epochs,
        "partition_rule": experiment.partition_rule,
        "partition_params": experiment.partition_params,
        "dirichlet_alpha": experiment.dirichlet_alpha,
        "seed": experiment.seed,
        "lr_scaling": experiment.lr_scaling,
        "untrusted_predictor": experiment.untrusted_predictor,
        **aggregation_settings(experiment),
        "keep_device_weights": experiment.keep_device_weights,
        "keep_last_checkpoints": experiment.keep_last_checkpoints,
        "shards": [
            {"device": s.device.name, "task": s.task.name, "num_samples": s.num_samples, "label_counts": s.label_counts}
            for s in shards
        ],
        "created_at": experiment.created_at.isoformat(),
    }


def run_summaries(experiment: Experiment, runs: Iterable[Run]) -> Iterator[dict[str, Any]]:
    """One summary per run: strategy, status, whole-run metrics, speedups over its baseline
    (``temporal``) run (:func:`~controlplane.experiments.selectors.run_baselines`) and the final
    test accuracy per task."""
    runs = list(runs)
    baselines = selectors.run_baselines(experiment, runs)
    for run in runs:
        baseline = baselines[run.id]
        yield {
            "run": run.id,
            "strategy": run.strategy,
            "status": run.status,
            "simulated": run.simulated,
            "comparison": run.comparison_id,
            "repeat": run_repeat(run),
            "options": run.options,
            "created_at": run.created_at,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
            "raw_throughput_sps": run.raw_throughput_sps,
            "fair_throughput": run.fair_throughput,
            "fl_throughput_sps": run.fl_throughput_sps,
            **selectors.run_speedups(run, baseline),
            "warnings": run.warnings,
            "final_accuracy": selectors.run_final_accuracy(run),
            "error": run.error,
        }


def json_chunks(experiment: Experiment, runs: QuerySet[Run]) -> Iterator[str]:
    """``{"experiment": …, "runs": […], "rounds": […], "assignments": […]}`` as JSON text, a
    few rows per chunk (the rows are those of :func:`csv_chunks`, with ``null`` for missing
    values and ``flags`` as a list)."""
    yield '{"experiment": ' + json.dumps(experiment_summary(experiment)) + ',\n"runs": ['
    yield from _json_array(run_summaries(experiment, runs.order_by("id")))
    yield '],\n"rounds": ['
    yield from _json_array(round_rows(runs))
    yield '],\n"assignments": ['
    yield from _json_array(assignment_rows(runs))
    yield "]}\n"


def _json_array(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    batch: list[str] = []
    first = True
    for row in rows:
        batch.append(_json_row(row))
        if len(batch) == CHUNK_ROWS:
            yield ("" if first else ",\n") + ",\n".join(batch)
            first, batch = False, []
    if batch:
        yield ("" if first else ",\n") + ",\n".join(batch)
