"""Reads that feed the dashboard: rows for the figure builders and the page tables.

Every page costs a fixed number of queries whatever the experiment's size (tests/controlplane/
test_query_counts.py), and reads only what its figures draw: sums and extremes per round and
device are computed by the database, per-assignment rows are read for the devices and rounds a
figure shows (:mod:`.figures` says which), as plain values rather than model instances.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import plotly.graph_objects as go
from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, Sum

from controlplane.common.jsonsafe import finite_or_none
from controlplane.dashboard import figures
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Checkpoint, DeviceTelemetry, Experiment, Round, Run, Task
from controlplane.planning import metrics
from controlplane.planning.strategies import STRATEGY_REGISTRY, baseline_strategy, compared_strategies
from controlplane.profiling.models import Predictor
from controlplane.profiling.selectors import predictor_history
from workers.registry.partitioners import PARTITIONER_REGISTRY


def figure_json(fig: go.Figure) -> dict[str, Any]:
    """A figure as plain JSON data (what ``Plotly.newPlot`` takes; plotly writes NaN and
    infinities as ``null``)."""
    return json.loads(fig.to_json())


def experiment_runs(experiment: Experiment) -> list[dict[str, Any]]:
    """Every run of an experiment with its metrics, speedups and final accuracy per task
    (three queries, however many runs)."""
    runs = list(experiment.runs.order_by("id"))
    baselines = selectors.run_baselines(experiment, runs)
    accuracy = selectors.runs_final_accuracy([run.id for run in runs])
    return [
        {"run": run, **selectors.run_speedups(run, baselines[run.id]), "accuracy": accuracy.get(run.id, {})}
        for run in runs
    ]


def experiment_figures(experiment: Experiment, runs: list[dict[str, Any]]) -> dict[str, dict]:
    """Speedup bars and accuracy-over-time curves.

    One bar pair per strategy: its newest succeeded run, except strategies whose plan comes
    from the request (``takes_plan``: ``manual``), whose runs are different plans and each get a
    bar ("manual (run 7)"). Strategies in registry order.
    """
    shown: dict[str, dict[str, Any]] = {}
    for row in runs:
        run = row["run"]
        if run.status == Run.Status.SUCCEEDED:
            own_plan = run.strategy in STRATEGY_REGISTRY and STRATEGY_REGISTRY.get(run.strategy).takes_plan
            shown[f"{run.strategy} (run {run.id})" if own_plan else run.strategy] = row
    bars = figures.speedup_bars(
        [
            {
                "label": label,
                "strategy": shown[label]["run"].strategy,
                "raw_speedup": shown[label]["raw_speedup"],
                "fair_speedup": shown[label]["fair_speedup"],
            }
            for label in sorted(
                shown, key=lambda label: (_strategy_rank(shown[label]["run"].strategy), shown[label]["run"].id)
            )
        ]
    )
    points: dict[tuple[int, str], list] = defaultdict(list)
    checkpoints = (
        Checkpoint.objects.filter(run__experiment=experiment)
        .order_by("run_id", "created_at", "id")
        .values_list("run_id", "task__name", "created_at", "test_accuracy")
    )
    for run_id, task, created_at, accuracy in checkpoints:
        points[(run_id, task)].append((created_at, accuracy))
    series = []
    for row in runs:
        run = row["run"]
        for (run_id, task), mine in points.items():
            if run_id == run.id:
                series.append(
                    {
                        "strategy": run.strategy,
                        "run": run.id,
                        "task": task,
                        "points": figures.seconds_since(run.started_at, mine),
                    }
                )
    return {"speedup": figure_json(bars), "accuracy": figure_json(figures.accuracy_over_time(series))}


def _strategy_rank(strategy: str) -> int:
    """A strategy's position in the registry (a name no longer registered goes last)."""
    names = STRATEGY_REGISTRY.names()
    return names.index(strategy) if strategy in names else len(names)


def compared_runs(experiment: Experiment) -> list[Run]:
    """The runs the comparison section shows: the newest comparison's runs, or else the newest
    run of each compared strategy that has a finished round, in strategy order."""
    comparison = experiment.comparisons.order_by("-id").first()
    if comparison is not None:
        runs = list(comparison.runs.all())
    else:
        newest: dict[str, Run] = {}
        compared = compared_strategies()
        for run in (
            experiment.runs.filter(strategy__in=compared, rounds__finished_at__isnull=False).distinct().order_by("id")
        ):
            newest[run.strategy] = run
        runs = list(newest.values())
    return sorted(runs, key=lambda r: (_strategy_rank(r.strategy), r.id))


def comparison_figures(experiment: Experiment, run_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison section: speedups inside each device and per round, round time split,
    predicted against measured throughput of planned assignments, final accuracy per task.

    ``run_rows`` is :func:`experiment_runs`' result (its final accuracies are reused). Three
    queries: per strategy, device and round the database counts, sums and finds the first start
    and last end of the assignments (:class:`~controlplane.planning.metrics.DeviceTotals`), from
    which :mod:`controlplane.planning.metrics` computes every number drawn; the planned
    assignments' predictions are read for the scatter.
    """
    runs = compared_runs(experiment)
    strategies = [r.strategy for r in runs]
    assignments = Assignment.objects.filter(round__run__in=runs)
    measured = Q(throughput_sps__isnull=False)
    timed = Q(started_at__isnull=False, finished_at__isnull=False)
    groups = (
        assignments.values("round__run__strategy", "device__name", "round__index")
        .annotate(
            tasks=Count("id"),
            failed_tasks=Count("id", filter=~Q(status=Assignment.Status.SUCCEEDED)),
            measured=Count("id", filter=measured),
            with_standalone=Count("id", filter=measured & Q(standalone_throughput_sps__gt=0)),
            raw=Sum("throughput_sps", filter=measured),
            fair=Sum(
                F("throughput_sps") / F("standalone_throughput_sps"),
                filter=measured & Q(standalone_throughput_sps__gt=0),
            ),
            samples=Sum("samples_trained"),
            first_start=Min("started_at", filter=timed),
            last_end=Max("finished_at", filter=timed),
        )
        .order_by()
    )
    totals: dict[tuple[str, int], dict[str, metrics.DeviceTotals]] = defaultdict(dict)
    for g in groups:
        totals[(g["round__run__strategy"], g["round__index"])][g["device__name"]] = metrics.DeviceTotals(
            tasks=g["tasks"],
            failed_tasks=g["failed_tasks"],
            measured=g["measured"],
            with_standalone=g["with_standalone"],
            raw_sps=g["raw"],
            fair=g["fair"],
            samples_trained=g["samples"] or 0,
            started_at=g["first_start"].timestamp() if g["first_start"] else None,
            finished_at=g["last_end"].timestamp() if g["last_end"] else None,
        )
    per_round = {key: metrics.round_metrics(devices) for key, devices in totals.items()}
    device_rounds = {(s, d, r): m for (s, r), rm in per_round.items() for d, m in rm.devices.items()}
    speedups = metrics.comparison_speedups(device_rounds, strategies, baseline=baseline_strategy().name)
    predicted = (
        assignments.filter(predicted_throughput_sps__isnull=False, throughput_sps__isnull=False)
        .order_by("round__run_id", "round__index", "device__name", "task_id")
        .values_list(
            "round__run__strategy",
            "device__name",
            "task__name",
            "round__index",
            "throughput_sps",
            "predicted_throughput_sps",
        )
    )
    by_strategy: dict[str, list[tuple]] = defaultdict(list)
    for row in predicted:
        by_strategy[row[0]].append(row)
    points = [
        {"strategy": s, "device": d, "task": t, "round_index": r, "throughput_sps": p, "predicted_throughput_sps": q}
        for rows in by_strategy.values()
        for s, d, t, r, p, q in figures.spread(rows, figures.MAX_MARKS)
    ]
    final = {row["run"].id: row["accuracy"] for row in run_rows}
    accuracy = [{"strategy": r.strategy, "accuracy": final.get(r.id, {})} for r in runs]
    return {
        "runs": runs,
        "figures": {
            "per_device": figure_json(figures.speedup_per_device(speedups, strategies)),
            "per_round": figure_json(figures.speedup_per_round(speedups, strategies)),
            "round_time": figure_json(figures.round_time_split(metrics.time_split(per_round), strategies)),
            "predicted": figure_json(figures.plan_predicted_vs_measured(points)),
            "final_accuracy": figure_json(figures.final_accuracy(accuracy, strategies)),
        },
    }


_ROW_COLUMNS = {  # row key: the Assignment lookup it is read from
    "round_index": "round__index",
    "device": "device__name",
    "task": "task__name",
    "batch_size": "batch_size",
    "active_thread_percentage": "active_thread_percentage",
    "samples": "samples",
    "throughput_sps": "throughput_sps",
    "standalone_throughput_sps": "standalone_throughput_sps",
    "train_loss": "train_loss",
    "started_at": "started_at",
    "finished_at": "finished_at",
    "status": "status",
    "error": "error",
    "peak_memory_bytes": "peak_memory_bytes",
    "mps_verified": "mps_verified",
}


def run_assignment_rows(
    run: Run, *, devices: list[str] | None = None, from_round: int | None = None
) -> list[dict[str, Any]]:
    """Assignments of a run as plain rows (one query), optionally only of some devices (by
    name) and from a round index on."""
    qs = Assignment.objects.filter(round__run=run)
    if devices is not None:
        qs = qs.filter(device__name__in=devices)
    if from_round is not None:
        qs = qs.filter(round__index__gte=from_round)
    keys = tuple(_ROW_COLUMNS)
    rows = qs.order_by("round__index", "device__name", "task_id").values_list(*_ROW_COLUMNS.values())
    return [dict(zip(keys, row, strict=True)) for row in rows]


def run_has_gpu_devices(run: Run) -> bool:
    """Whether any device of the run is served by a GPU backend (its page shows GPU telemetry)."""
    return run.experiment.devices.filter(backend__startswith="cuda").exists()


def run_telemetry_series(run: Run, *, devices: list[str] | None = None) -> list[dict[str, Any]]:
    """The run's GPU telemetry as :func:`figures.gpu_telemetry` rows (one query), optionally
    of some devices only (by name)."""
    qs = selectors.run_telemetry(run)
    if devices is not None:
        qs = qs.filter(device__name__in=devices)
    return [
        {
            "device": row.device.name,
            "round_index": row.round.index,
            "t": row.t,
            "gpu_util_percent": row.gpu_util_percent,
            "memory_used_bytes": row.memory_used_bytes,
            "memory_total_bytes": row.memory_total_bytes,
        }
        for row in qs
    ]


def run_figures(run: Run) -> dict[str, dict]:
    """Allocation plan per round, throughput per task per round, the timeline and, when a
    device of the run is a GPU, its NVML telemetry under the timeline.

    A fixed number of queries whatever the run's size: the round indices, the device names, the
    throughput summed per round and task by the database, the assignments of the devices and
    newest rounds the plan and the timeline draw, and, for GPU runs, the telemetry of the
    devices drawn.
    """
    round_indices = list(
        Round.objects.filter(run=run, assignments__isnull=False)
        .distinct()
        .order_by("index")
        .values_list("index", flat=True)
    )
    names = list(run.experiment.devices.order_by("name").values_list("name", flat=True))
    shown = figures.spread(names, figures.MAX_DEVICES)
    timeline_rounds = max(1, figures.MAX_MARKS // max(1, len(shown)))
    kept = round_indices[-max(timeline_rounds, figures.MAX_ROUNDS) :]
    rows = run_assignment_rows(
        run,
        devices=shown if len(shown) < len(names) else None,
        from_round=kept[0] if len(kept) < len(round_indices) else None,
    )
    # A task's throughput in a round: Σ_j P_ij over the devices that count (the one rule of
    # controlplane.planning.metrics: a device with an assignment that did not succeed adds nothing).
    failed_on_device = Assignment.objects.filter(
        round_id=OuterRef("round_id"), device_id=OuterRef("device_id")
    ).exclude(status=Assignment.Status.SUCCEEDED)
    totals = [
        {"round_index": r, "task": t, "throughput_sps": p}
        for r, t, p in Assignment.objects.filter(round__run=run, throughput_sps__isnull=False)
        .exclude(Exists(failed_on_device))
        .values("round__index", "task__name")
        .annotate(total=Sum("throughput_sps"))
        .order_by()
        .values_list("round__index", "task__name", "total")
    ]
    built = {
        "plan": figure_json(figures.allocation_plan(rows, round_indices=round_indices, devices_total=len(names))),
        "throughput": figure_json(figures.throughput_per_round(totals)),
        "timeline": figure_json(figures.timeline(rows, devices_total=len(names), rounds_total=len(round_indices))),
    }
    if run_has_gpu_devices(run):
        reporting = sorted(set(DeviceTelemetry.objects.filter(round__run=run).values_list("device__name", flat=True)))
        drawn = figures.spread(reporting, figures.TELEMETRY_DEVICES)
        built["gpu"] = figure_json(
            figures.gpu_telemetry(run_telemetry_series(run, devices=drawn if len(drawn) < len(reporting) else None))
        )
    return built


LIVE_ROUNDS = 100
"""Rounds the run page's table lists (the newest; the CSV download has them all)."""
LIVE_FLAGS = 5
"""Flags shown per round in the table (the rest counted)."""


def _flags_shown(flags: list) -> list:
    flags = list(flags or [])
    if len(flags) <= LIVE_FLAGS:
        return flags
    return [*flags[:LIVE_FLAGS], f"… and {len(flags) - LIVE_FLAGS:,} more (rounds CSV, or /api/rounds/)"]


def run_live(run: Run) -> dict[str, Any]:
    """What the run page polls: progress, round table rows (the newest :data:`LIVE_ROUNDS`)
    and (re)built figures."""
    progress = selectors.run_progress(run)
    newest = list(run.rounds.order_by("-index")[:LIVE_ROUNDS])
    rounds = [
        {
            "index": r.index,
            "status": r.status,
            "round_time_s": r.round_time_s,
            "wall_time_s": r.wall_time_s,
            "fl_throughput_sps": r.fl_throughput_sps,
            "raw_throughput_sps": r.raw_throughput_sps,
            "fair_throughput": r.fair_throughput,
            "error": r.error,
            "flags": _flags_shown(r.flags),
        }
        for r in reversed(newest)
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
    """Predicted-vs-measured scatter, error by mix size and by slice, and the learning curve of
    its class."""
    history = [
        {
            "version": p.version,
            "training_samples": p.training_samples,
            "heldout_rmsle": p.heldout_rmsle,
            "kept_family": p.kept_family,
        }
        for p in predictor_history(backend=predictor.backend, device_class=predictor.device_class)
    ]
    return {
        "scatter": figure_json(figures.predicted_vs_measured(predictor.heldout)),
        "by_mix": figure_json(figures.error_by_mix_size(predictor.metrics)),
        "by_slice": figure_json(figures.error_by_slice(predictor.metrics)),
        "learning": figure_json(figures.learning_curve(history)),
    }


def experiment_label_histograms(experiment: Experiment, tasks: list[Task]) -> list[dict[str, Any]]:
    """Per task of the experiment (in ``tasks``' order), its devices' class histograms:
    ``{"task": Task, "num_classes", "devices": [{"device", "num_samples", "label_counts"}, …]
    (by device name), "figure": label_histogram JSON, "table": whether the page lists the numbers
    (up to :data:`figures.MAX_DEVICES` devices; the CSV download has them all)}``.

    Rows come from :func:`controlplane.experiments.selectors.label_histograms` (the shards' stored
    histograms; no data set is read). ``num_classes`` is the task's, or the longest stored
    histogram if that is longer (a task whose classes were changed after partitioning).
    """
    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in selectors.label_histograms(experiment):
        rows[row["task"]].append(
            {
                "device": row["device_name"],
                "num_samples": row["num_samples"],
                "label_counts": list(row["label_counts"] or []),
            }
        )
    histograms = []
    for task in tasks:
        devices = sorted(rows.get(task.id, []), key=lambda r: r["device"])
        num_classes = max([task.num_classes, *(len(r["label_counts"]) for r in devices)])
        for r in devices:  # a recorded histogram has a count for every class
            if r["label_counts"]:
                r["label_counts"] += [0] * (num_classes - len(r["label_counts"]))
        histograms.append(
            {
                "task": task,
                "num_classes": num_classes,
                "classes": list(range(num_classes)),
                "devices": devices,
                "figure": figure_json(figures.label_histogram(task.name, devices, num_classes)),
                "table": len(devices) <= figures.MAX_DEVICES,
            }
        )
    return histograms


def partition_parameters(experiment: Experiment) -> list[dict[str, Any]]:
    """The experiment's partition parameters as ``{"name", "label", "value"}``, in the order its
    rule's record declares them (``label`` from its ``PartitionParameter``; the bare name for a
    parameter, or a rule, no longer registered). A legacy ``dirichlet_alpha`` without
    ``partition_params`` shows as ``alpha``."""
    params = dict(experiment.partition_params or {})
    if not params and experiment.dirichlet_alpha is not None:
        params = {"alpha": experiment.dirichlet_alpha}
    declared = []
    if experiment.partition_rule in PARTITIONER_REGISTRY:
        declared = list(PARTITIONER_REGISTRY.get(experiment.partition_rule).parameters)
    labels = {p.name: p.label for p in declared}
    order = [p.name for p in declared if p.name in params] + sorted(set(params) - set(labels))
    return [{"name": name, "label": labels.get(name, name), "value": params[name]} for name in order]


LABEL_CSV_COLUMNS = ("task", "device", "num_samples", "class", "samples")
"""The label histograms' CSV: one row per task, device and class."""


def label_histogram_csv_chunks(histograms: list[dict[str, Any]], *, chunk_rows: int = 5000) -> Iterator[str]:
    """:func:`experiment_label_histograms` as CSV text (a header line, then up to ``chunk_rows``
    rows per chunk): one row per task, device and class (``class`` ``0 … num_classes − 1``,
    ``samples`` of that class on the device, ``num_samples`` the device's total). A shard whose
    histogram is not recorded has one row with ``class`` empty and ``samples`` its total."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(LABEL_CSV_COLUMNS)
    n = 0
    for histogram in histograms:
        task = histogram["task"].name
        for row in histogram["devices"]:
            counts = row["label_counts"] or [None]
            for k, count in enumerate(counts):
                if count is None:
                    writer.writerow((task, row["device"], row["num_samples"], "", row["num_samples"]))
                else:
                    writer.writerow((task, row["device"], row["num_samples"], k, count))
                n += 1
                if n % chunk_rows == 0:
                    yield buffer.getvalue()
                    buffer.seek(0)
                    buffer.truncate()
    yield buffer.getvalue()
