"""Reads that feed the dashboard: rows for the figure builders and the page tables."""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go

from controlplane.common.jsonsafe import finite_or_none
from controlplane.dashboard import figures
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Experiment, Run
from controlplane.planning.strategies import COMPARED, STRATEGIES
from controlplane.profiling.models import Predictor
from controlplane.profiling.selectors import predictor_history


def figure_json(fig: go.Figure) -> dict[str, Any]:
    """A figure as plain JSON data (what ``Plotly.newPlot`` takes; plotly writes NaN and
    infinities as ``null``)."""
    return json.loads(fig.to_json())


def experiment_runs(experiment: Experiment) -> list[dict[str, Any]]:
    """Every run of an experiment with its metrics, speedups and final accuracy per task."""
    baseline = selectors.baseline_run(experiment)
    rows = []
    for run in experiment.runs.order_by("id"):
        rows.append(
            {
                "run": run,
                **selectors.run_speedups(run, baseline),
                "accuracy": selectors.run_final_accuracy(run),
            }
        )
    return rows


def experiment_figures(experiment: Experiment, runs: list[dict[str, Any]]) -> dict[str, dict]:
    """Speedup bars and accuracy-over-time curves.

    One bar pair per strategy: its newest succeeded run, except ``manual``, whose runs are
    different plans and each get a bar ("manual (run 7)").
    """
    shown: dict[str, dict[str, Any]] = {}
    for row in runs:
        run = row["run"]
        if run.status == Run.Status.SUCCEEDED:
            shown[f"manual (run {run.id})" if run.strategy == "manual" else run.strategy] = row
    order = sorted(shown, key=lambda label: (STRATEGIES.index(shown[label]["run"].strategy), shown[label]["run"].id))
    bars = figures.speedup_bars(
        [{"label": label, "raw_speedup": shown[label]["raw_speedup"], "fair_speedup": shown[label]["fair_speedup"]}
         for label in order]
    )
    series = []
    for row in runs:
        run = row["run"]
        by_task: dict[str, list] = {}
        for ckpt in run.checkpoints.select_related("task").order_by("created_at", "id"):
            by_task.setdefault(ckpt.task.name, []).append((ckpt.created_at, ckpt.test_accuracy))
        for task, points in by_task.items():
            series.append(
                {"strategy": run.strategy, "run": run.id, "task": task,
                 "points": figures.seconds_since(run.started_at, points)}
            )
    return {"speedup": figure_json(bars), "accuracy": figure_json(figures.accuracy_over_time(series))}


def compared_runs(experiment: Experiment) -> list[Run]:
    """The runs the comparison section shows: the newest comparison's runs, or else the newest
    run of each compared strategy that has a finished round, in strategy order."""
    comparison = experiment.comparisons.order_by("-id").first()
    if comparison is not None:
        runs = list(comparison.runs.all())
    else:
        newest: dict[str, Run] = {}
        for run in experiment.runs.filter(strategy__in=COMPARED, rounds__finished_at__isnull=False).distinct().order_by("id"):
            newest[run.strategy] = run
        runs = list(newest.values())
    return sorted(runs, key=lambda r: (COMPARED.index(r.strategy) if r.strategy in COMPARED else len(COMPARED), r.id))


def comparison_figures(experiment: Experiment, run_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison section: speedups inside each device and per round, round time split,
    predicted against measured throughput of planned assignments, final accuracy per task.

    ``run_rows`` is :func:`experiment_runs`' result (its final accuracies are reused).
    """
    runs = compared_runs(experiment)
    strategies = [r.strategy for r in runs]
    rows = []
    qs = (Assignment.objects.filter(round__run__in=runs).select_related("round__run", "device", "task")
          .order_by("round__run_id", "round__index", "device__name", "task_id"))
    for a in qs:
        rows.append({
            "strategy": a.round.run.strategy, "round_index": a.round.index, "device": a.device.name,
            "task": a.task.name, "throughput_sps": a.throughput_sps,
            "predicted_throughput_sps": a.predicted_throughput_sps,
            "standalone_throughput_sps": a.standalone_throughput_sps,
            "started_at": a.started_at, "finished_at": a.finished_at,
        })
    final = {row["run"].id: row["accuracy"] for row in run_rows}
    accuracy = [{"strategy": r.strategy, "accuracy": final[r.id]} for r in runs]
    speedups = figures.comparison_speedups(rows, strategies)
    return {
        "runs": runs,
        "figures": {
            "per_device": figure_json(figures.speedup_per_device(speedups, strategies)),
            "per_round": figure_json(figures.speedup_per_round(speedups, strategies)),
            "round_time": figure_json(figures.round_time_split(rows, strategies)),
            "predicted": figure_json(figures.plan_predicted_vs_measured(rows)),
            "final_accuracy": figure_json(figures.final_accuracy(accuracy, strategies)),
        },
    }


def run_assignment_rows(run: Run) -> list[dict[str, Any]]:
    """Every assignment of a run as a plain row (one query)."""
    qs = (
        Assignment.objects.filter(round__run=run)
        .select_related("round", "device", "task")
        .order_by("round__index", "device__name", "task_id")
    )
    return [
        {
            "round_index": a.round.index,
            "device": a.device.name,
            "task": a.task.name,
            "batch_size": a.batch_size,
            "active_thread_percentage": a.active_thread_percentage,
            "samples": a.samples,
            "throughput_sps": a.throughput_sps,
            "standalone_throughput_sps": a.standalone_throughput_sps,
            "train_loss": a.train_loss,
            "started_at": a.started_at,
            "finished_at": a.finished_at,
            "status": a.status,
            "error": a.error,
            "peak_memory_bytes": a.peak_memory_bytes,
            "mps_verified": a.mps_verified,
        }
        for a in qs
    ]


def run_has_gpu_devices(run: Run) -> bool:
    """Whether any device of the run is served by a GPU backend (its page shows GPU telemetry)."""
    return run.experiment.devices.filter(backend__startswith="cuda").exists()


def run_telemetry_series(run: Run) -> list[dict[str, Any]]:
    """The run's GPU telemetry as :func:`figures.gpu_telemetry` rows (one query)."""
    return [
        {"device": row.device.name, "round_index": row.round.index, "t": row.t,
         "gpu_util_percent": row.gpu_util_percent, "memory_used_bytes": row.memory_used_bytes,
         "memory_total_bytes": row.memory_total_bytes}
        for row in selectors.run_telemetry(run)
    ]


def run_figures(run: Run) -> dict[str, dict]:
    """Allocation plan per round, throughput per task per round, the timeline and, when a
    device of the run is a GPU, its NVML telemetry under the timeline."""
    rows = run_assignment_rows(run)
    round_indices = sorted({r["round_index"] for r in rows})
    built = {
        "plan": figure_json(figures.allocation_plan(rows, round_indices=round_indices)),
        "throughput": figure_json(figures.throughput_per_round(rows)),
        "timeline": figure_json(figures.timeline(rows)),
    }
    if run_has_gpu_devices(run):
        built["gpu"] = figure_json(figures.gpu_telemetry(run_telemetry_series(run)))
    return built


def run_live(run: Run) -> dict[str, Any]:
    """What the run page polls: progress, round table rows and (re)built figures."""
    progress = selectors.run_progress(run)
    rounds = [
        {
            "index": r.index, "status": r.status, "round_time_s": r.round_time_s, "wall_time_s": r.wall_time_s,
            "fl_throughput_sps": r.fl_throughput_sps, "raw_throughput_sps": r.raw_throughput_sps,
            "fair_throughput": r.fair_throughput, "error": r.error, "flags": r.flags,
        }
        for r in run.rounds.order_by("index")
    ]
    # JSON has no NaN/infinity: a stored non-finite throughput goes out as null (the page
    # parses this with JSON.parse, both polled and embedded with json_script; the figures
    # are already clean, see figure_json).
    return {"progress": finite_or_none(progress), "rounds": finite_or_none(rounds), "figures": run_figures(run)}


def predictor_families(predictor: Predictor) -> list[dict[str, Any]]:
    """The metrics table: every family compared, best first."""
    rows = [{"family": family, "kept": family == predictor.kept_family, **m} for family, m in predictor.metrics.items()]
    return sorted(rows, key=lambda r: r["rmsle"])


def predictor_figures(predictor: Predictor) -> dict[str, dict]:
    """Predicted-vs-measured scatter, error by mix size, and the learning curve of its class."""
    history = [
        {"version": p.version, "training_samples": p.training_samples, "heldout_rmsle": p.heldout_rmsle,
         "kept_family": p.kept_family}
        for p in predictor_history(backend=predictor.backend, device_class=predictor.device_class)
    ]
    return {
        "scatter": figure_json(figures.predicted_vs_measured(predictor.heldout)),
        "by_mix": figure_json(figures.error_by_mix_size(predictor.metrics)),
        "learning": figure_json(figures.learning_curve(history)),
    }
