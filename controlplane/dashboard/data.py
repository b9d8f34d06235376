"""Reads that feed the dashboard: rows for the figure builders and the page tables.

Every page costs a fixed number of queries whatever the experiment's size (tests/controlplane/
test_query_counts.py), and reads only what its figures draw: sums and extremes per round and
device are computed by the database, per-assignment rows are read for the devices and rounds a
figure shows (:mod:`.figures` says which), as plain values rather than model instances.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import plotly.graph_objects as go
from django.utils import timezone

from controlplane.common.jsonsafe import finite_or_none
from controlplane.dashboard import figures, run_charts
from controlplane.experiments import selectors
from controlplane.experiments.models import Experiment, Round, Run, Task
from controlplane.experiments.services.rounds.aggregate import task_aggregation_choice
from controlplane.fleet import selectors as fleet_selectors
from controlplane.lab import selectors as lab_selectors
from controlplane.planning import metrics
from controlplane.planning.metrics import format_estimate
from controlplane.planning.strategies import STRATEGY_REGISTRY, baseline_strategy, compared_strategies
from controlplane.profiling.models import Predictor
from controlplane.profiling.selectors import predictor_history
from controlplane.storage.exports import aggregation_settings
from workers.registry.partitioners import PARTITIONER_REGISTRY


def figure_json(fig: go.Figure) -> dict[str, Any]:
    """A figure as plain JSON data (what ``Plotly.newPlot`` takes; plotly writes NaN and
    infinities as ``null``)."""
    return json.loads(fig.to_json())


def experiment_runs(experiment: Experiment) -> list[dict[str, Any]]:
    """Every run of an experiment with its metrics, speedups and final accuracy per task
    (three queries, however many runs)."""
    runs = selectors.experiment_runs_in_order(experiment)
    baselines = selectors.run_baselines(experiment, runs)
    accuracy = selectors.runs_final_accuracy([run.id for run in runs])
    return [
        {"run": run, **selectors.run_speedups(run, baselines[run.id]), "accuracy": accuracy.get(run.id, {})}
        for run in runs
    ]


def experiment_figures(experiment: Experiment, runs: list[dict[str, Any]]) -> dict[str, dict]:
    """Speedup bars and the accuracy curves, against wall-clock time and per round.

    One bar pair per strategy: its newest succeeded run, except strategies whose plan comes
    from the request (``takes_plan``: ``manual``), whose runs are different plans and each get a
    bar ("manual (run 7)"). Strategies in registry order. When the runs differ in FL algorithm
    (runs with their own aggregator, ``Run.options["aggregation"]``), one bar pair per algorithm
    and strategy ("fedadam · sharing"), and the accuracy lines are labelled alike
    (:func:`figures.accuracy_labels`): each line's algorithm is the aggregator that made its
    task's checkpoints (``Checkpoint.aggregation``), or before its first round the one it will
    use (:func:`~controlplane.experiments.services.rounds.aggregate.task_aggregation_choice`).

    Two queries (the checkpoints, the task ids); each line keeps at most
    :data:`figures.MAX_POINTS` points.
    """
    algorithm_of = {
        row["run"].id: (row["run"].options or {}).get("aggregation") or experiment.aggregation for row in runs
    }
    by_algorithm = len(set(algorithm_of.values())) > 1
    shown: dict[str, dict[str, Any]] = {}
    for row in runs:
        run = row["run"]
        if run.status == Run.Status.SUCCEEDED:
            own_plan = run.strategy in STRATEGY_REGISTRY and STRATEGY_REGISTRY.get(run.strategy).takes_plan
            label = f"{run.strategy} (run {run.id})" if own_plan else run.strategy
            shown[f"{algorithm_of[run.id]} · {label}" if by_algorithm else label] = row
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
    series = _accuracy_series(experiment, runs)
    return {
        "speedup": figure_json(bars),
        "accuracy": figure_json(figures.accuracy_over_time(series)),
        "accuracy_rounds": figure_json(figures.accuracy_per_round(series)),
    }


def _accuracy_series(experiment: Experiment, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The accuracy curves' series (:func:`figures.accuracy_over_time`), one per run and task:
    each evaluated checkpoint's test accuracy against the wall-clock seconds since the run
    started (``points``), the FL round time so far (``round_clock``: the sum of the round times
    up to its round) and the rounds done (``rounds``: what the figures align runs on), and
    ``aside``: why the run stays out of its strategy's mean and band (:func:`_runs_aside`), or
    ``None``; two queries."""
    wall: dict[tuple[int, str], list] = defaultdict(list)
    per_round: dict[tuple[int, str], list] = defaultdict(list)
    round_clock: dict[tuple[int, str], list] = defaultdict(list)
    trained: dict[tuple[int, str], float] = defaultdict(float)
    made_by: dict[tuple[int, str], str] = {}
    for run_id, task, created_at, index, accuracy, aggregation, round_time_s in selectors.experiment_checkpoint_points(
        experiment
    ):
        # the FL round-time clock: the sum of the round times up to this checkpoint's round
        trained[(run_id, task)] += round_time_s or 0.0
        if accuracy is not None:  # one point per evaluated checkpoint on every clock alike
            wall[(run_id, task)].append((created_at, accuracy))
            per_round[(run_id, task)].append((0 if index is None else index + 1, accuracy))
            round_clock[(run_id, task)].append((trained[(run_id, task)], accuracy))
        if aggregation:  # the initial model's is empty
            made_by[(run_id, task)] = aggregation
    task_ids = selectors.experiment_task_ids(experiment)
    aside = _runs_aside(experiment, [row["run"] for row in runs])
    series = []
    for row in runs:
        run = row["run"]
        for (run_id, task), mine in wall.items():
            if run_id == run.id:
                algorithm = (
                    made_by.get((run_id, task))
                    or task_aggregation_choice(experiment, run.options, task_ids.get(task, -1))[0]
                )
                series.append(
                    {
                        "strategy": run.strategy,
                        "algorithm": algorithm,
                        "run": run.id,
                        "task": task,
                        "points": figures.seconds_since(run.started_at, mine),
                        "round_clock": round_clock[(run_id, task)],
                        "rounds": per_round[(run_id, task)],
                        "aside": aside[run.id],
                    }
                )
    return series


def _runs_aside(experiment: Experiment, runs: list[Run]) -> dict[int, str | None]:
    """Which runs the accuracy curves average, and why each other run stays out (drawn dotted
    beside them): ``{run id: None (in the mean) or the reason}``.

    With a comparison, the mean and band of a strategy are over the succeeded runs of the newest
    comparison that has runs (its repeats); every other run is set aside as ``"failed"``,
    ``"cancelled"``, ``"running"``, ``"pending"`` (its status), ``"one-off"`` (no comparison) or
    ``"earlier comparison"``. Without one, each strategy and FL algorithm has one line: its newest
    succeeded run (or, with none, its newest run), the others set aside by status or as
    ``"earlier run"``. No query: the runs carry their comparison.
    """
    latest = max((r.comparison_id for r in runs if r.comparison_id is not None), default=None)
    if latest is not None:
        kept = {r.id for r in runs if r.comparison_id == latest and r.status == Run.Status.SUCCEEDED}
    else:
        newest: dict[tuple[str, str], Run] = {}
        for run in sorted(runs, key=lambda r: (r.status == Run.Status.SUCCEEDED, r.id)):
            newest[(run.strategy, (run.options or {}).get("aggregation") or experiment.aggregation)] = run
        kept = {r.id for r in newest.values()}
    out: dict[int, str | None] = {}
    for run in runs:
        if run.id in kept:
            out[run.id] = None
        elif run.status != Run.Status.SUCCEEDED:
            out[run.id] = str(run.status)
        elif latest is None:
            out[run.id] = "earlier run"
        else:
            out[run.id] = "one-off" if run.comparison_id is None else "earlier comparison"
    return out


def _strategy_rank(strategy: str) -> int:
    """A strategy's position in the registry (a name no longer registered goes last)."""
    names = STRATEGY_REGISTRY.names()
    return names.index(strategy) if strategy in names else len(names)


def compared_runs(experiment: Experiment) -> list[Run]:
    """The runs the comparison section shows: the newest comparison's runs, or else the newest
    run of each compared strategy that has a finished round, in the order they ran (by id: a
    comparison's runs are created in the interleaved order they run in, ABC CBA ABC...)."""
    comparison = selectors.experiment_latest_comparison(experiment)
    if comparison is not None:
        runs = selectors.comparison_runs(comparison)
    else:
        runs = selectors.newest_finished_runs(experiment, compared_strategies())
    return sorted(runs, key=lambda r: r.id)


def comparison_figures(experiment: Experiment, run_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison section: speedups inside each device and per round, round time split,
    predicted against measured throughput of planned assignments, final accuracy per task.

    ``run_rows`` is :func:`experiment_runs`' result (its final accuracies are reused). Each
    device's metrics in each round are read as they were stored when the round was recorded
    (``Round.device_metrics``), not recomputed; :mod:`controlplane.planning.metrics` takes the
    speedups and the compute/idle split of them; the planned assignments' predictions are read
    for the scatter.
    """
    runs = compared_runs(experiment)
    strategies = sorted(dict.fromkeys(r.strategy for r in runs), key=_strategy_rank)
    # A comparison with repeats has a run per strategy and repeat: each repeat's speedups are
    # taken against its own baseline run, then averaged over repeats (with their interval).
    per_round = _stored_round_metrics(runs)
    repeats = sorted({k for _, k, _ in per_round})
    speedups, intervals, values = metrics.repeated_speedups(
        [
            metrics.comparison_speedups(
                {(s, d, r): m for (s, k, r), rm in per_round.items() if k == repeat for d, m in rm.devices.items()},
                strategies,
                baseline=baseline_strategy().name,
            )
            for repeat in repeats
        ]
    )
    # time_split averages over its rounds whatever their keys: every (repeat, round) one entry.
    split = metrics.time_split({(s, n): rm for n, ((s, _k, _r), rm) in enumerate(per_round.items())})
    points = _predicted_points(runs)
    final = {row["run"].id: row["accuracy"] for row in run_rows}
    accuracy = [{"strategy": r.strategy, "accuracy": final.get(r.id, {})} for r in runs]
    comparison = selectors.experiment_latest_comparison(experiment)
    report = selectors.comparison_report(comparison) if comparison is not None else None
    summary = {}
    if report is not None:
        summary = {
            "comparison_throughput": figure_json(figures.comparison_throughput(report)),
            "time_to_accuracy": figure_json(figures.time_to_accuracy(report)),
        }
    return {
        "runs": runs,
        "report": report,
        "figures": {
            **summary,
            "per_device": figure_json(
                figures.speedup_per_device(
                    speedups,
                    strategies,
                    intervals=intervals,
                    values=values,
                    note=metrics.small_n_note(len(repeats)),
                )
            ),
            "per_round": figure_json(figures.speedup_per_round(speedups, strategies)),
            "round_time": figure_json(figures.round_time_split(split, strategies)),
            "predicted": figure_json(figures.plan_predicted_vs_measured(points)),
            "final_accuracy": figure_json(
                figures.final_accuracy_estimates(report)
                if report is not None
                else figures.final_accuracy(accuracy, strategies)
            ),
        },
    }


def _stored_round_metrics(runs: list[Run]) -> dict[tuple[str, int, int], metrics.RoundMetrics]:
    """``{(strategy, repeat, round index): RoundMetrics}`` of the runs' rounds, as stored when
    each was recorded (a round not recorded yet has no device metrics, and no device of it
    counts); rounds with no assignment are left out."""
    return {
        (r.run.strategy, r.run.repeat, r.index): metrics.RoundMetrics.from_stored(r, r.device_metrics)
        for r in selectors.runs_recorded_rounds(runs)
    }


def _predicted_points(runs: list[Run]) -> list[dict[str, Any]]:
    """The predicted against measured throughput scatter's points: ``{"strategy", "device",
    "task", "round_index", "throughput_sps", "predicted_throughput_sps"}`` of the assignments
    with both, at most :data:`figures.MAX_MARKS` per strategy (:func:`figures.spread`)."""
    predicted = selectors.runs_predicted_and_measured(runs)
    by_strategy: dict[str, list[tuple]] = defaultdict(list)
    for row in predicted:
        by_strategy[row[0]].append(row)
    return [
        {"strategy": s, "device": d, "task": t, "round_index": r, "throughput_sps": p, "predicted_throughput_sps": q}
        for rows in by_strategy.values()
        for s, d, t, r, p, q in figures.spread(rows, figures.MAX_MARKS)
    ]


FIGURE_NAMES = {
    "raw_throughput_sps": "raw throughput",
    "fair_throughput": "fair throughput",
    "fl_throughput_sps": "FL throughput",
    **{figure: f"time to accuracy ({label})" for figure, label in metrics.CLOCKS.items()},
}


def report_table(report: dict[str, Any]) -> dict[str, Any]:
    """The experiment page's comparison table from :func:`~controlplane.experiments.selectors.comparison_report`:
    ``{"targets", "rows", "verdicts", "repeats", "clocks", "small_n_note"}`` as display strings
    (linear figures: mean ± half of the 95 % interval; log-scale ones: geometric mean [low,
    high]); each task has its time to accuracy on both clocks (``time``: FL round time,
    ``wall``: wall-clock from the run's start); ``alone_measured``: how many of a strategy's runs
    measured ``P_alone`` themselves (their wall clock includes it)."""
    rows = []
    for row in report["strategies"]:
        rows.append(
            {
                "strategy": row["strategy"],
                "runs": f"{row['succeeded']}/{len(row['runs'])}",
                "note": metrics.small_n_note(row["succeeded"]),
                "alone_measured": f"{len(row.get('alone_measured_runs') or [])}/{len(row['runs'])}",
                "raw": format_estimate(row["raw_throughput_sps"]),
                "fair": format_estimate(row["fair_throughput"], 3),
                "fl": format_estimate(row["fl_throughput_sps"]),
                "raw_speedup": format_estimate(row["raw_speedup"], 2, "×"),
                "fair_speedup": format_estimate(row["fair_speedup"], 2, "×"),
                "fl_speedup": format_estimate(row["fl_speedup"], 2, "×"),
                "tasks": [
                    {
                        "time": format_estimate(t["time_to_accuracy_s"]),
                        "wall": format_estimate(t["wall_time_to_accuracy_s"]),
                        "rounds": format_estimate(t["rounds_to_accuracy"]),
                        "reached": f"{t['reached']}/{row['succeeded']}",
                    }
                    for t in row["tasks"]
                ],
            }
        )
    verdicts = [
        {
            **v,
            "figure_name": FIGURE_NAMES.get(v["figure"], v["figure"])
            + (f" of {v['task_name']}" if v["task_name"] else ""),
            "difference_text": metrics.format_contrast(v["difference"]),
        }
        for v in report["verdicts"]
    ]
    return {
        "targets": report["targets"],
        "rows": rows,
        "verdicts": verdicts,
        "repeats": report["repeats"],
        "clocks": report["clocks"],
        "small_n_note": report["small_n_note"],
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
    keys = tuple(_ROW_COLUMNS)
    rows = selectors.run_assignment_values(run, tuple(_ROW_COLUMNS.values()), devices=devices, from_round=from_round)
    return [dict(zip(keys, row, strict=True)) for row in rows]


def run_has_gpu_devices(run: Run) -> bool:
    """Whether any device of the run is served by a GPU backend (its page shows GPU telemetry)."""
    return selectors.experiment_has_gpu_devices(run.experiment)


def run_telemetry_series(run: Run, *, devices: list[str] | None = None) -> list[dict[str, Any]]:
    """The run's GPU telemetry as :func:`figures.gpu_telemetry` rows (one query), optionally
    of some devices only (by name)."""
    qs = selectors.run_telemetry(run, devices=devices)
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

    A fixed number of queries whatever the run's size: the round indices, the device count,
    the newest round's participants, the names of the devices to draw from (the newest round's
    participants when the run samples its devices, else every device), the throughput summed
    per round and task by the database, the assignments of the devices and newest rounds the
    plan and the timeline draw, and, for GPU runs, the telemetry of the devices drawn.
    """
    round_indices = selectors.run_round_indices(run)
    devices_total = selectors.experiment_device_count(run.experiment_id)
    # A run that samples its devices (partial participation) draws the newest round's
    # participants: devices drawn from the whole federation would mostly not have trained.
    newest_participants = selectors.run_newest_participants(run)
    if newest_participants:
        names = sorted(fleet_selectors.device_names(newest_participants).values())
    else:
        names = selectors.experiment_device_names(run.experiment)
    shown = figures.spread(names, figures.MAX_DEVICES)
    timeline_rounds = max(1, figures.MAX_MARKS // max(1, len(shown)))
    kept = round_indices[-max(timeline_rounds, figures.MAX_ROUNDS) :]
    rows = run_assignment_rows(
        run,
        devices=shown if len(shown) < devices_total else None,
        from_round=kept[0] if len(kept) < len(round_indices) else None,
    )
    # A task's throughput in a round: Σ_j P_ij over the devices that count (the one rule of
    # controlplane.planning.metrics: a device with an assignment that did not succeed adds nothing).
    totals = [{"round_index": r, "task": t, "throughput_sps": p} for r, t, p in selectors.run_task_throughputs(run)]
    built = {
        "plan": figure_json(figures.allocation_plan(rows, round_indices=round_indices, devices_total=devices_total)),
        "throughput": figure_json(figures.throughput_per_round(totals)),
        "timeline": figure_json(figures.timeline(rows, devices_total=devices_total, rounds_total=len(round_indices))),
    }
    if run_has_gpu_devices(run):
        reporting = selectors.run_telemetry_device_names(run)
        drawn = figures.spread(reporting, figures.TELEMETRY_DEVICES)
        built["gpu"] = figure_json(
            figures.gpu_telemetry(run_telemetry_series(run, devices=drawn if len(drawn) < len(reporting) else None))
        )
    return built


DEVICES_PER_PAGE = 50
"""Devices the index lists per page (``?devices_page=N``; the API's ``/api/devices/`` pages too)."""
INDEX_DEVICE_NAMES = 5
"""Device names the index's experiments table shows per experiment (the rest counted)."""


class PageError(ValueError):
    """A page number outside the pages there are (the message names the field and the range)."""


def device_page(page: str | None) -> dict[str, Any]:
    """One page of the federation's devices for the index, by name, with each one's status
    (:func:`controlplane.fleet.selectors.device_effective_status`) and how many are online,
    offline or unknown: ``{"rows": [(Device, status)], "number", "pages", "total", "counts"}``.
    Five queries, however many devices.

    Args:
        page: ``devices_page`` as given (``None``: the first page).

    Raises:
        PageError: not an integer from 1 to the number of pages.
    """
    total = fleet_selectors.device_count()
    pages = max(1, math.ceil(total / DEVICES_PER_PAGE))
    try:
        number = 1 if page in (None, "") else int(page)
    except ValueError:
        number = 0
    if not 1 <= number <= pages:
        raise PageError(f"devices_page={page!r} is out of range: an integer from 1 to {pages}")
    start = (number - 1) * DEVICES_PER_PAGE
    shown = list(fleet_selectors.device_list()[start : start + DEVICES_PER_PAGE])
    counts = fleet_selectors.device_status_counts()
    return {
        "rows": [(d, fleet_selectors.device_effective_status(d)) for d in shown],
        "number": number,
        "pages": pages,
        "total": total,
        "first": start + 1 if shown else 0,
        "last": start + len(shown),
        "counts": counts,
    }


LIVE_ROUNDS = 100
"""Rounds the run page's table lists (the newest; the CSV download has them all)."""
PARTICIPANT_NAMES = 5
"""Participants named per round in the run page's table (the rest counted; ``/api/rounds/{id}/``
lists every participant's id). 100 rounds × 5 names: one query of at most 500 devices."""


def rounds_participation(rounds: list[dict[str, Any]], devices_total: int) -> dict[int, dict[str, Any]]:
    """Who took part in each round, bounded for the page: ``{round id: {"count", "of", "all",
    "names", "more"}}`` — ``count`` of the ``of`` devices trained (``all``: every device, the
    round has no sample), ``names`` the first :data:`PARTICIPANT_NAMES` participants (in id
    order) and ``more`` how many are not named. One query for the names of every round given.

    Args:
        rounds: ``{"id", "participants"}`` per round (``participants`` as stored: device ids or
            ``None``).
        devices_total: the experiment's devices.
    """
    named = {r["id"]: list(r["participants"][:PARTICIPANT_NAMES]) for r in rounds if r["participants"]}
    wanted = sorted({d for ids in named.values() for d in ids})
    names = fleet_selectors.device_names(wanted)
    out: dict[int, dict[str, Any]] = {}
    for r in rounds:
        ids = r["participants"]
        if ids is None:
            out[r["id"]] = {"count": devices_total, "of": devices_total, "all": True, "names": [], "more": 0}
            continue
        shown = [names.get(d, f"device {d}") for d in named.get(r["id"], [])]
        out[r["id"]] = {
            "count": len(ids),
            "of": devices_total,
            "all": False,
            "names": shown,
            "more": len(ids) - len(shown),
        }
    return out


LIVE_FLAGS = 5
"""Flags shown per round in the table (the rest counted)."""


def _flags_shown(flags: list) -> list:
    flags = list(flags or [])
    if len(flags) <= LIVE_FLAGS:
        return flags
    return [*flags[:LIVE_FLAGS], f"… and {len(flags) - LIVE_FLAGS:,} more (rounds CSV, or /api/rounds/)"]


PLAN_ROUNDS = 20
"""Rounds the run page's "Plan per round" lists (the newest; the assignments CSV has them all)."""
PLAN_DEVICES = 50
"""Devices listed per round there (the first by name)."""


def gain_percent(log_ratio: float | None) -> float | None:
    """A log ratio as a percentage change, ``100·(exp(g) − 1)`` (``None`` stays ``None``)."""
    return None if log_ratio is None else 100.0 * math.expm1(log_ratio)


def _decision_row(decision: dict[str, Any]) -> dict[str, Any]:
    gain, spread = decision.get("predicted_gain"), decision.get("uncertainty")
    gain_text = ""
    if gain is not None and math.isfinite(gain):
        gain_text = f"{gain_percent(gain):+.1f} %"
        if spread is not None and math.isfinite(spread):
            # the log standard deviation as a percentage: the factor exp(σ) − 1
            gain_text += f" ± {gain_percent(spread):.1f} %"
    return {"action": decision.get("action", ""), "reason": decision.get("reason", ""), "gain_text": gain_text}


def execution_text(mode: str, fallback: str, *, limit: int = 80) -> str:
    """How a trainer ran its steps, for a table cell: ``"graphs"``, ``"eager"``, ``"eager (graphs
    failed: <reason>)"`` with the reason cut to ``limit`` characters (the cell's title carries it
    whole), or ``""`` when the trainer did not report."""
    if fallback:
        reason = fallback if len(fallback) <= limit else fallback[: limit - 1] + "…"
        return f"{mode or 'eager'} (graphs failed: {reason})"
    return mode


def run_round_plans(run: Run) -> dict[str, Any]:
    """The run page's "Plan per round": for each of the newest :data:`PLAN_ROUNDS` rounds,
    the assignments (task, ``batch_size``, ``active_thread_percentage``, predicted and measured
    ``throughput_sps``, how the trainer ran: :func:`execution_text`) of at most
    :data:`PLAN_DEVICES` devices — a round of sampled devices
    (partial participation) its first participants by id, a round of every device the first
    devices by name — listed by name, and, when the round was replanned (``Round.replan``),
    each device's decision: action, reason and predicted gain ± its uncertainty in percent
    (:func:`gain_percent` of the stored log ratios).

    Six queries at most whatever the run's size.

    Returns:
        ``{"rounds": [{"index", "status", "predicted_round_time_s", "replanned" (bool), "note",
        "measured_rounds", "participants" (how many were drawn; None: every device), "devices":
        [{"device", "decision" (or None), "assignments": [...]}]}], "rounds_total",
        "devices_total", "devices_shown", "sampled" (a round shown drew participants)}``, newest
        round first.
    """
    rounds_total = selectors.run_round_count(run)
    rounds = selectors.run_newest_round_values(
        run, ("id", "index", "status", "predicted_round_time_s", "replan", "participants"), PLAN_ROUNDS
    )
    devices_total = selectors.experiment_device_count(run.experiment_id)
    listed = _plan_devices_listed(run, rounds)
    wanted = sorted({d for ids in listed.values() for d in ids})
    names = fleet_selectors.device_names(wanted)
    by_round = _plan_assignments(rounds, wanted)
    out = [_plan_round_row(r, by_round.get(r["id"], {}), listed[r["id"]], names) for r in rounds]
    return {
        "rounds": out,
        "rounds_total": rounds_total,
        "devices_total": devices_total,
        "devices_shown": min(PLAN_DEVICES, devices_total),
        "sampled": any(r["participants"] is not None for r in rounds),
    }


def _plan_devices_listed(run: Run, rounds: list[dict[str, Any]]) -> dict[int, list[int]]:
    """The device ids "Plan per round" lists per round id (at most :data:`PLAN_DEVICES`)."""
    # Each round lists its first PLAN_DEVICES participants (a sampled round), or the first
    # PLAN_DEVICES devices by name (a round of every device): never the whole federation.
    first_by_name = []
    if any(r["participants"] is None for r in rounds):
        first_by_name = selectors.experiment_first_device_ids(run.experiment, PLAN_DEVICES)
    return {
        r["id"]: (first_by_name if r["participants"] is None else list(r["participants"][:PLAN_DEVICES]))
        for r in rounds
    }


def _plan_assignments(rounds: list[dict[str, Any]], wanted: list[int]) -> dict[int, dict[int, list[dict[str, Any]]]]:
    """``{round id: {device id: [assignment row, ...]}}`` of the rounds' assignments on the
    ``wanted`` devices, by device then task name (see :func:`run_round_plans`)."""
    rows = selectors.rounds_plan_assignment_values([r["id"] for r in rounds], wanted)
    by_round: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for round_id, device_id, task, batch, share, predicted, measured, status, mode, fallback in rows:
        by_round[round_id][device_id].append(
            {
                "task": task,
                "batch_size": batch,
                "active_thread_percentage": share,
                "predicted_throughput_sps": finite_or_none(predicted),
                "throughput_sps": finite_or_none(measured),
                "status": status,
                "execution": execution_text(mode, fallback),
                "execution_fallback": fallback,
            }
        )
    return by_round


def _plan_round_row(
    r: dict[str, Any], assigned: Mapping[int, list[dict[str, Any]]], listed: list[int], names: Mapping[int, str]
) -> dict[str, Any]:
    """One round of "Plan per round" (see :func:`run_round_plans`): its ``listed`` devices with
    an assignment or a replanning decision, by name."""
    replan = r["replan"] if isinstance(r["replan"], dict) else None
    decisions = {
        d.get("device_id"): _decision_row(d) for d in (replan or {}).get("decisions", []) if isinstance(d, dict)
    }
    shown = sorted(((d, names.get(d, f"device {d}")) for d in listed), key=lambda pair: pair[1])
    return {
        "index": r["index"],
        "status": r["status"],
        "predicted_round_time_s": finite_or_none(r["predicted_round_time_s"]),
        "replanned": replan is not None,
        "note": (replan or {}).get("note", ""),
        "measured_rounds": (replan or {}).get("measured_rounds", []),
        "participants": None if r["participants"] is None else len(r["participants"]),
        "devices": [
            {"device": name, "decision": decisions.get(device_id), "assignments": assigned.get(device_id, [])}
            for device_id, name in shown
            if device_id in assigned or device_id in decisions
        ],
    }


def run_live(run: Run) -> dict[str, Any]:
    """What the run page polls: progress, round table rows (the newest :data:`LIVE_ROUNDS`)
    and (re)built figures."""
    progress = selectors.run_progress(run)
    newest = selectors.run_newest_rounds(run, LIVE_ROUNDS)
    participation = rounds_participation(
        [{"id": r.id, "participants": r.participants} for r in newest],
        selectors.experiment_device_count(run.experiment_id),
    )
    rounds = [
        {
            "id": r.id,
            "index": r.index,
            "status": r.status,
            "queue_s": r.queue_s,
            "round_time_s": r.round_time_s,
            "wall_time_s": r.wall_time_s,
            "fl_throughput_sps": r.fl_throughput_sps,
            "raw_throughput_sps": r.raw_throughput_sps,
            "fair_throughput": r.fair_throughput,
            "error": r.error,
            "flags": _flags_shown(r.flags),
            "participants": participation[r.id],
        }
        for r in reversed(newest)
    ]
    # JSON has no NaN/infinity: a stored non-finite throughput goes out as null (the page
    # parses this with JSON.parse, both polled and embedded with json_script; the figures
    # are already clean, see figure_json).
    # The lab queue is read only while a round of the run waits for its devices.
    queued = any(r.status == Round.Status.QUEUED for r in newest)
    learning = run_charts.run_learning(run)  # the learning curves first on the page, and as a table
    return {
        "progress": finite_or_none(progress),
        "rounds": finite_or_none(rounds),
        "figures": {"learning": figure_json(run_charts.learning_figure(learning)), **run_figures(run)},
        "learning": run_charts.learning_table(learning),
        "queue_banner": queue_banner(lab_selectors.run_queue_entry(run)) if queued else None,
    }


def _clock(value: dt.datetime | None, now: dt.datetime) -> str:
    """``13:41:05`` in the server's time zone, with ``(in 15 s)`` / ``(2 min ago)`` beside it."""
    if value is None:
        return "unknown"
    seconds = (value - now).total_seconds()
    span = abs(seconds)
    amount = f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min" if span < 7200 else f"{span / 3600:.1f} h"
    when = "now" if span < 1 else f"in {amount}" if seconds > 0 else f"{amount} ago"
    return f"{timezone.localtime(value):%H:%M:%S} ({when})"


def queue_banner(entry: dict[str, Any] | None, *, now: dt.datetime | None = None) -> str | None:
    """The run page's line for a waiting round (an entry of
    :func:`controlplane.lab.selectors.queue_state`'s ``waiting``): "queued: waiting for
    dev-a held by run 12 (alice) since 13:41:05 (20 s ago), estimated start 13:41:25 (in 15 s)";
    ``None`` without an entry."""
    if entry is None:
        return None
    now = now or timezone.now()
    blockers = entry["blockers"]
    more = entry["blockers_count"] - 1
    if not blockers:
        waiting = f"position {entry['position']} in the queue, its devices free at the next scheduling pass"
    elif blockers[0]["paused"]:
        reason = blockers[0].get("paused_reason")
        waiting = f"waiting for {blockers[0]['device']}, paused by a lab admin{f' ({reason})' if reason else ''}"
    elif blockers[0].get("profiling_sweep") and not blockers[0]["holder_run"]:
        b = blockers[0]
        waiting = (
            f"waiting for {b['device']}, being profiled (sweep {b['profiling_sweep']}) since {_clock(b['since'], now)}"
        )
    else:
        # the first blocker's holder, and every device it holds that the round waits for
        b = blockers[0]
        same = sorted(x["device"] for x in blockers if not x["paused"] and x["holder_run"] == b["holder_run"])
        more = entry["blockers_count"] - len(same)
        devices = same[0] if len(same) == 1 else f"{', '.join(same[:-1])} and {same[-1]}"
        owner = f" ({b['holder_owner']})" if b["holder_owner"] else ""
        waiting = f"waiting for {devices} held by run {b['holder_run']}{owner} since {_clock(b['since'], now)}"
    if more > 0:
        waiting += f" (and {more} more device{'s' if more > 1 else ''})"
    if entry["estimated_start"] is None:
        start = "no estimated start while a device it needs is paused"
    else:
        start = f"estimated start {_clock(entry['estimated_start'], now)}"
    return f"queued: {waiting}, {start}"


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


def experiment_label_histograms(
    experiment: Experiment, tasks: list[Task], *, devices_limit: int | None = None
) -> list[dict[str, Any]]:
    """Per task of the experiment (in ``tasks``' order), its devices' class histograms:
    ``{"task": Task, "num_classes", "devices": [{"device", "num_samples", "label_counts"}, …]
    (by device name), "devices_total": devices holding its data, "figure": label_histogram
    JSON, "table": whether the page lists the numbers (up to :data:`figures.MAX_DEVICES`
    devices; the CSV download has them all)}``.

    Rows come from :func:`controlplane.experiments.selectors.label_histograms` (the shards' stored
    histograms; no data set is read). ``num_classes`` is the task's, or the longest stored
    histogram if that is longer (a task whose classes were changed after partitioning).

    Args:
        devices_limit: for a page: when the experiment has more devices than this, read only
            the shards of that many devices spread evenly by name (what the figure draws) and
            count the rest in the database (a federation of 10,000 devices × 3 tasks holds
            30,000 shards); ``None``: every device (the CSV download).
    """
    drawn = None
    totals: dict[int, int] = {}
    if devices_limit is not None:
        # The same three queries for 2 devices or 10,000 (tests/controlplane/test_query_counts.py).
        names = selectors.experiment_device_ids_and_names(experiment)
        if len(names) > devices_limit:
            drawn = [device_id for device_id, _name in figures.spread(names, devices_limit)]
        totals = selectors.experiment_shard_counts(experiment)
    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in selectors.label_histograms(experiment, device_ids=drawn):
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
        total = totals.get(task.id, len(devices))
        histograms.append(
            {
                "task": task,
                "num_classes": num_classes,
                "classes": list(range(num_classes)),
                "devices": devices,
                "devices_total": total,
                "figure": figure_json(figures.label_histogram(task.name, devices, num_classes, devices_total=total)),
                "table": total <= figures.MAX_DEVICES,
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


def experiment_aggregation(experiment: Experiment) -> dict[str, Any]:
    """The experiment's FL algorithm for its page: ``{"aggregation", "params": [(name, value)],
    "overrides": [{"task", "aggregation", "params"}], "participation": str}``, overrides by task
    name (:func:`controlplane.storage.exports.aggregation_settings`), participation in words
    (``"every device, every round"``, ``"5 devices per round, drawn uniform"``)."""
    settings = aggregation_settings(experiment)
    if settings["clients_per_round"] is not None:
        n = settings["clients_per_round"]
        participation = f"{n} device{'s' if n != 1 else ''} per round, drawn {settings['client_sampling']}"
    elif settings["client_fraction"] is not None:
        participation = f"{settings['client_fraction']:g} of the devices per round, drawn {settings['client_sampling']}"
    else:
        participation = "every device, every round"
    return {
        "aggregation": settings["aggregation"],
        "params": sorted((settings["aggregation_params"] or {}).items()),
        "overrides": [
            {
                "task": task,
                "aggregation": entry.get("aggregation", ""),
                "params": sorted((entry.get("aggregation_params") or {}).items()),
            }
            for task, entry in settings["task_aggregation"].items()
        ],
        "participation": participation,
    }


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
