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
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import QuerySet

from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Experiment, Round, Run

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

TABLES = ("rounds", "assignments")


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


def table_rows(table: str, runs: QuerySet[Run]) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` (``rounds`` or ``assignments``) of ``runs``.

    Raises:
        ValueError: an unknown table.
    """
    if table == "rounds":
        return round_rows(runs)
    if table == "assignments":
        return assignment_rows(runs)
    raise ValueError(f"unknown table {table!r}; allowed: {', '.join(TABLES)}")


def table_columns(table: str) -> list[str]:
    """The column names of ``table``, in order."""
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
            "repeat": run.repeat,
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
