"""Reads of experiment state, including the metrics derived from it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from django.db.models import (
    Count,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)

from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Comparison,
    DeviceTelemetry,
    Experiment,
    Round,
    Run,
    Shard,
    StandaloneThroughput,
    Task,
)
from controlplane.fleet.models import Device
from controlplane.planning import metrics
from controlplane.planning.data_gaps import data_gap_warnings, data_gaps
from controlplane.planning.metrics import speedup
from controlplane.planning.strategies import STRATEGY_REGISTRY, baseline_strategy
from controlplane.planning.types import PlanningInput
from workers.protocol.messages import DEFAULT_INPUT_SHAPE, DatasetRef, OptimizerConfig, TaskRef


def task_ref(task: Task) -> TaskRef:
    """The worker-side description of a task (:class:`workers.protocol.messages.TaskRef`)."""
    return TaskRef(
        task_id=task.id,
        name=task.name,
        architecture=task.architecture,
        num_classes=task.num_classes,
        dataset=DatasetRef(name=task.dataset, root=task.dataset_root or None),
        optimizer=OptimizerConfig(
            name=task.optimizer,
            learning_rate=task.learning_rate,
            momentum=task.momentum,
            weight_decay=task.weight_decay,
        ),
        input_shape=tuple(task.input_shape or DEFAULT_INPUT_SHAPE),
    )


class ShardSpan(NamedTuple):
    """Where a device's shard of a task lies (see :class:`Shard`): ``|D_ij|``, the window's
    offset, and the chosen positions (encoded) when a partitioner chose them."""

    num_samples: int
    offset: int
    indices: str | None = None


DEVICE_FILTER_LIMIT = 500
"""Up to this many device ids a read filters by them in SQL (``device_id IN (...)``); a longer
list (a sample of most of a federation) reads every row and filters in Python: one bound
parameter per id would run into SQLite's limit on them, and saves little there."""


def _of_devices(rows: Iterable[tuple], device_ids: Collection[int] | None) -> Iterable[tuple]:
    """The rows (device id first) of ``device_ids`` only (all of them when ``None``)."""
    if device_ids is None:
        return rows
    wanted = set(device_ids)
    return (row for row in rows if row[0] in wanted)


def device_filtered(queryset: QuerySet, device_ids: Collection[int] | None) -> QuerySet:
    """``queryset`` (of a model with a ``device`` foreign key) filtered to ``device_ids`` in SQL
    when that list is short (see :data:`DEVICE_FILTER_LIMIT`); the caller keeps only the rows of
    ``device_ids`` as well (a longer list is not filtered here)."""
    if device_ids is not None and len(device_ids) <= DEVICE_FILTER_LIMIT:
        return queryset.filter(device_id__in=list(device_ids))
    return queryset


def experiment_devices(
    experiment: Experiment, *, device_ids: Collection[int] | None = None, fields: Iterable[str] | None = None
) -> list[Device]:
    """The experiment's devices in id order, of ``device_ids`` only when given (a round's
    participants), with only ``fields`` loaded when given (a device's inventory is JSON; 10,000
    of them are megabytes)."""
    queryset = experiment.devices.order_by("id")
    if fields is not None:
        queryset = queryset.only(*fields)
    if device_ids is not None and len(device_ids) <= DEVICE_FILTER_LIMIT:
        queryset = queryset.filter(id__in=list(device_ids))
    if device_ids is None:
        return list(queryset)
    wanted = set(device_ids)
    return [d for d in queryset if d.id in wanted]


def experiment_shards(
    experiment: Experiment, *, with_indices: bool = False, device_ids: Collection[int] | None = None
) -> dict[tuple[int, int], ShardSpan]:
    """``{(device_id, task_id): ShardSpan}`` of an experiment (plain tuples, not model
    instances: a round of 1,000 devices × 3 tasks reads 3,000 of them).

    Args:
        with_indices: read each shard's encoded positions too (about 10 KB for 25,000 samples:
            what a request to a device carries); without, ``indices`` is ``None``.
        device_ids: only these devices' shards (a round's participants: 300 rows for 100 of
            10,000 devices × 3 tasks, not 30,000); ``None``: every device's.
    """
    shards = device_filtered(experiment.shards.all(), device_ids)
    if not with_indices:
        rows = shards.values_list("device_id", "task_id", "num_samples", "offset")
        return {
            (device_id, task_id): ShardSpan(n, offset)
            for device_id, task_id, n, offset in _of_devices(rows, device_ids)
        }
    full = shards.values_list("device_id", "task_id", "num_samples", "offset", "indices")
    return {
        (device_id, task_id): ShardSpan(n, offset, idx)
        for device_id, task_id, n, offset, idx in _of_devices(full, device_ids)
    }


def label_histograms(experiment: Experiment, *, device_ids: Collection[int] | None = None) -> list[dict]:
    """Every device's class histogram of every task of an experiment, for the API and the
    experiment page: ``[{"task", "task_name", "device", "device_name", "num_samples",
    "label_counts"}]`` ordered by task then device; ``label_counts`` holds ``num_classes``
    counts (empty for a shard saved before histograms were kept). One query.

    Args:
        device_ids: only these devices' shards (the few a page draws; at most
            :data:`DEVICE_FILTER_LIMIT` of them are filtered in SQL); ``None``: every device's.
    """
    shards = device_filtered(experiment.shards.all(), device_ids)
    if device_ids is not None and len(device_ids) > DEVICE_FILTER_LIMIT:
        wanted = set(device_ids)
        return [row for row in label_histograms(experiment) if row["device"] in wanted]
    rows = shards.order_by("task_id", "device__name").values_list(
        "task_id", "task__name", "device_id", "device__name", "num_samples", "label_counts"
    )
    return [
        {
            "task": task_id,
            "task_name": task_name,
            "device": device_id,
            "device_name": device_name,
            "num_samples": n,
            "label_counts": list(counts or []),
        }
        for task_id, task_name, device_id, device_name, n, counts in rows
    ]


def planning_input(experiment: Experiment, *, device_ids: Collection[int] | None = None) -> PlanningInput:
    """The planner's view of an experiment (devices and tasks ordered by id).

    Args:
        device_ids: plan only these devices (a round's participants, see
            :func:`controlplane.experiments.services.participation.round_participants`): the
            shards of the others are not read, so planning a round of 100 sampled devices costs
            the same in a federation of 100 or of 10,000; ``None``: every device.
    """
    shards = experiment_shards(experiment, device_ids=device_ids)
    if device_ids is None:
        devices = tuple(experiment.devices.order_by("id").values_list("id", flat=True))
    else:
        devices = tuple(sorted(set(device_ids)))
    return PlanningInput(
        device_ids=devices,
        task_ids=tuple(experiment.tasks.order_by("id").values_list("id", flat=True)),
        samples={key: s.num_samples for key, s in shards.items()},
        local_epochs=experiment.local_epochs,
    )


def latest_checkpoints(run: Run) -> dict[int, Checkpoint]:
    """The newest checkpoint of each task of a run: ``{task_id: Checkpoint}`` (one query, one row
    per task, however many rounds the run has had)."""
    newest = run.checkpoints.order_by().values("task_id").annotate(last=Max("id")).values("last")
    return {ckpt.task_id: ckpt for ckpt in Checkpoint.objects.filter(id__in=newest)}


def standalone_table(
    run: Run, *, device_ids: Collection[int] | None = None
) -> dict[tuple[int, int, int], float | None]:
    """``{(device_id, task_id, batch_size): P_alone}`` measured for a run, of ``device_ids`` only
    when given (a round's participants)."""
    rows = device_filtered(StandaloneThroughput.objects.filter(run=run), device_ids).values_list(
        "device_id", "task_id", "batch_size", "throughput_sps"
    )
    return {(device_id, task_id, batch_size): p for device_id, task_id, batch_size, p in _of_devices(rows, device_ids)}


def visible_experiment_ids(user) -> QuerySet | None:
    """Ids of the experiments ``user`` may see: those they own or collaborate on.

    Returns ``None`` for a superuser (every experiment, including those created from the
    command line without an owner). An anonymous user sees nothing. The result is a subquery,
    so filtering with it stays one SQL statement however many experiments there are.
    """
    if getattr(user, "is_superuser", False):
        return None
    if user is None or not user.is_authenticated:
        return Experiment.objects.none().values("id")
    shared = Experiment.collaborators.through.objects.filter(user_id=user.pk).values("experiment_id")
    return Experiment.objects.filter(Q(owner_id=user.pk) | Q(id__in=shared)).values("id")


def _visible(queryset: QuerySet, user, experiment_path: str, everyone: bool) -> QuerySet:
    if everyone:
        return queryset
    ids = visible_experiment_ids(user)
    return queryset if ids is None else queryset.filter(**{f"{experiment_path}__in": ids})


def can_manage_experiment(user, experiment: Experiment) -> bool:
    """Whether ``user`` may change who else sees the experiment: its owner or a superuser."""
    return bool(getattr(user, "is_superuser", False) or (experiment.owner_id and experiment.owner_id == user.pk))


def experiment_list(*, user=None, everyone: bool = False) -> QuerySet[Experiment]:
    """Experiments ``user`` may see (``everyone=True``: all, for the command line and workers).

    Everything below an experiment (its runs, rounds, assignments, checkpoints, comparisons) is
    visible exactly when the experiment is: the other ``*_list`` selectors filter the same way.
    """
    queryset = Experiment.objects.select_related("owner").prefetch_related("tasks", "devices", "collaborators")
    return _visible(queryset, user, "id", everyone).order_by("-id")


def comparison_list(*, user=None, everyone: bool = False) -> QuerySet[Comparison]:
    queryset = Comparison.objects.select_related("experiment").prefetch_related("runs")
    return _visible(queryset, user, "experiment_id", everyone).order_by("-id")


def run_list(*, user=None, everyone: bool = False) -> QuerySet[Run]:
    return _visible(Run.objects.select_related("experiment"), user, "experiment_id", everyone).order_by("-id")


# The three lists below hold up to every row of every run (10,000 rounds, 100,000 assignments):
# they are filtered on their own indexed column against a subquery of the visible runs or rounds
# (not through joins up to the experiment), so the database walks the index their ordering
# follows and stops at the page's last row instead of sorting every visible row; and of the
# rows joined on, only what the API shows is read (not a round's flags or a device's
# inventory: JSON, large at scale).


def _visible_runs(user, everyone: bool) -> QuerySet | None:
    ids = None if everyone else visible_experiment_ids(user)
    return None if ids is None else Run.objects.filter(experiment_id__in=ids).values("id")


def round_list(*, user=None, everyone: bool = False) -> QuerySet[Round]:
    queryset = Round.objects.all()
    runs = _visible_runs(user, everyone)
    if runs is not None:
        queryset = queryset.filter(run_id__in=runs)
    return queryset.order_by("run_id", "index")


def assignment_list(*, user=None, everyone: bool = False) -> QuerySet[Assignment]:
    # The related values the API shows come as annotations on one Assignment per row, not as
    # three related instances each (building those was a third of a page's time); as subqueries
    # on primary keys, not joins, so that the page's COUNT(*), which drops unused annotations,
    # counts the assignments alone.
    def related(model, column: str, key: str) -> Subquery:
        return Subquery(model.objects.filter(pk=OuterRef(key)).values(column)[:1])

    queryset = Assignment.objects.annotate(
        run=related(Round, "run_id", "round_id"),
        round_index=related(Round, "index", "round_id"),
        device_name=related(Device, "name", "device_id"),
        task_name=related(Task, "name", "task_id"),
    )
    runs = _visible_runs(user, everyone)
    if runs is not None:
        queryset = queryset.filter(round_id__in=Round.objects.filter(run_id__in=runs).values("id"))
    return queryset.order_by("round_id", "device_id", "task_id")


def checkpoint_list(*, user=None, everyone: bool = False) -> QuerySet[Checkpoint]:
    own = [f.name for f in Checkpoint._meta.concrete_fields]
    queryset = Checkpoint.objects.select_related("round", "task").only(*own, "round__index", "task__name")
    runs = _visible_runs(user, everyone)
    if runs is not None:
        queryset = queryset.filter(run_id__in=runs)
    return queryset.order_by("run_id", "task_id", "created_at")


def round_telemetry(rnd: Round) -> QuerySet[DeviceTelemetry]:
    """The GPU telemetry series of a round, one row per device that sent one."""
    return DeviceTelemetry.objects.filter(round=rnd).select_related("device").order_by("device__name")


def run_telemetry(run: Run, *, devices: list[str] | None = None) -> QuerySet[DeviceTelemetry]:
    """Every GPU telemetry series of a run (``devices``: of those devices only, by name), by round
    then device (one query)."""
    qs = DeviceTelemetry.objects.filter(round__run=run)
    if devices is not None:
        qs = qs.filter(device__name__in=devices)
    return qs.select_related("device", "round").order_by("round__index", "device__name")


def baseline_run(experiment: Experiment) -> Run | None:
    """The experiment's newest succeeded run of the baseline strategy
    (:func:`~controlplane.planning.strategies.baseline_strategy`, ``temporal``), the baseline of
    every speedup."""
    return (
        experiment.runs.filter(strategy=baseline_strategy().name, status=Run.Status.SUCCEEDED).order_by("-id").first()
    )


def run_baselines(experiment: Experiment, runs: Iterable[Run]) -> dict[int, Run | None]:
    """The baseline run each run's speedups are taken against, ``{run id: run or None}``.

    A run of a comparison is measured against that comparison's own succeeded baseline
    (``temporal``) run of the same repeat, so a comparison's figures stay what they were when
    another comparison of the experiment runs later (and are ``None`` when its baseline did not
    succeed); a run
    outside any comparison against the experiment's newest succeeded baseline run
    (:func:`baseline_run`). One query.
    """
    succeeded = list(
        experiment.runs.filter(strategy=baseline_strategy().name, status=Run.Status.SUCCEEDED).order_by("id")
    )
    newest = succeeded[-1] if succeeded else None
    by_repeat = {(r.comparison_id, r.repeat): r for r in succeeded if r.comparison_id is not None}
    return {
        run.id: (by_repeat.get((run.comparison_id, run.repeat)) if run.comparison_id is not None else newest)
        for run in runs
    }


def run_speedups(run: Run, baseline: Run | None) -> dict[str, float | None]:
    """Raw and fair throughput speedups of a run over its baseline run (:func:`run_baselines`)."""
    return {
        "raw_speedup": speedup(run.raw_throughput_sps, baseline.raw_throughput_sps if baseline else None),
        "fair_speedup": speedup(run.fair_throughput, baseline.fair_throughput if baseline else None),
    }


def run_final_accuracy(run: Run) -> dict[str, float | None]:
    """``{task name: test accuracy of its newest checkpoint after a round}`` (the initial
    model's accuracy is not a result of the run, so a run without a finished round has none)."""
    out: dict[str, float | None] = {}
    for ckpt in run.checkpoints.filter(round__isnull=False).select_related("task").order_by("created_at", "id"):
        out[ckpt.task.name] = ckpt.test_accuracy
    return out


def runs_final_accuracy(run_ids: list[int]) -> dict[int, dict[str, float | None]]:
    """:func:`run_final_accuracy` of many runs in one query: ``{run_id: {task name:
    accuracy}}`` (a run without a finished round is left out)."""
    newest = (
        Checkpoint.objects.filter(run_id__in=run_ids, round__isnull=False)
        .values("run_id", "task_id")
        .annotate(last=Max("id"))
        .values("last")
    )
    out: dict[int, dict[str, float | None]] = defaultdict(dict)
    rows = Checkpoint.objects.filter(id__in=newest).order_by("run_id", "task__name")
    for run_id, task, accuracy in rows.values_list("run_id", "task__name", "test_accuracy"):
        out[run_id][task] = accuracy
    return dict(out)


def run_progress(run: Run) -> dict:
    """How far a run is: rounds done of the experiment's rounds, and the current round's
    assignments done of its total (for the progress bar and the live dashboard)."""
    total_rounds = run.experiment.rounds
    rounds = list(run.rounds.order_by("index"))
    done_statuses = {Round.Status.SUCCEEDED, Round.Status.PARTIAL, Round.Status.FAILED, Round.Status.CANCELLED}
    rounds_done = sum(1 for r in rounds if r.status in done_statuses)
    current = next((r for r in rounds if r.status not in done_statuses), None)
    current_info = None
    if current is not None:
        counts = defaultdict(int)
        for status in current.assignments.values_list("status", flat=True):
            counts[status] += 1
        total = sum(counts.values())
        finished = counts[Assignment.Status.SUCCEEDED] + counts[Assignment.Status.FAILED]
        current_info = {
            "index": current.index,
            "status": current.status,
            "assignments_total": total,
            "assignments_finished": finished,
            "assignments_running": counts[Assignment.Status.RUNNING],
            "started_at": current.started_at.isoformat() if current.started_at else None,
        }
    phase = run.status
    if run.status == Run.Status.RUNNING and not rounds:
        phase = "measuring standalone throughput"
    fraction = rounds_done / total_rounds if total_rounds else 0.0
    if current_info and current_info["assignments_total"]:
        fraction += current_info["assignments_finished"] / current_info["assignments_total"] / total_rounds
    if run.status == Run.Status.SUCCEEDED:
        fraction = 1.0
    return {
        "run": run.id,
        "status": run.status,
        "phase": phase,
        "rounds_total": total_rounds,
        "rounds_done": rounds_done,
        "rounds_failed": sum(1 for r in rounds if r.status == Round.Status.FAILED),
        "current_round": current_info,
        "fraction": min(1.0, fraction),
    }


# ------------------------------------------------------------------------------ comparison report

RUN_FIGURES = ("raw_throughput_sps", "fair_throughput", "fl_throughput_sps")
"""A run's whole-run figures a comparison reports (higher is better)."""

SPEEDUP_FIGURES = {
    "raw_speedup": "raw_throughput_sps",
    "fair_speedup": "fair_throughput",
    "fl_speedup": "fl_throughput_sps",
}
"""Each speedup a comparison reports → the figure it is a ratio of (over the same repeat's baseline run)."""

TASK_FIGURES = ("time_to_accuracy_s", "wall_time_to_accuracy_s", "rounds_to_accuracy", "samples_to_accuracy")
"""A run's figures per task a comparison reports, besides the final accuracy (lower is better):
time to accuracy on both clocks (:data:`~controlplane.planning.metrics.CLOCKS`), rounds and
samples to it."""

LINEAR_FIGURES = {"final_accuracy": (0.0, 1.0)}
"""Figures summarised on the linear scale, with the range their interval is clipped to; every
other figure is positive and summarised on the log scale (:mod:`controlplane.planning.metrics`)."""


def figure_estimate(values: Iterable[float | None], figure: str) -> metrics.Estimate:
    """A comparison figure over repeats on its scale (:data:`LINEAR_FIGURES`; the log scale
    otherwise)."""
    if figure in LINEAR_FIGURES:
        return metrics.estimate(values, scale="linear", bounds=LINEAR_FIGURES[figure])
    return metrics.estimate(values, scale="log")


def runs_accuracy_points(run_ids: list[int]) -> dict[int, dict[int, list[metrics.AccuracyPoint]]]:
    """Every task's test accuracy per round against round time, wall-clock time since the run's
    start and samples, for time to accuracy on both clocks: ``{run id: {task id:
    [AccuracyPoint, ...] in round order}}``. A round's elapsed time is its ``finished_at``
    (aggregation done) less its run's ``started_at``. A task's points are the run's rounds that
    have its checkpoint (every round that ended, failed ones included: they keep the previous
    model). Three queries.
    """
    rounds: dict[int, dict[int, tuple[float | None, float | None]]] = defaultdict(dict)
    for run_id, index, round_time_s, finished_at, run_started_at in (
        Round.objects.filter(run_id__in=run_ids)
        .order_by("run_id", "index")
        .values_list("run_id", "index", "round_time_s", "finished_at", "run__started_at")
    ):
        elapsed = (finished_at - run_started_at).total_seconds() if finished_at and run_started_at else None
        rounds[run_id][index] = (round_time_s, elapsed)
    samples: dict[tuple[int, int, int], int] = {}
    for row in (
        Assignment.objects.filter(round__run_id__in=run_ids, status=Assignment.Status.SUCCEEDED)
        .values("round__run_id", "round__index", "task_id")
        .annotate(n=Sum("samples_trained"))
        .order_by()
    ):
        samples[(row["round__run_id"], row["round__index"], row["task_id"])] = row["n"] or 0
    accuracy: dict[tuple[int, int], dict[int, float | None]] = defaultdict(dict)
    for run_id, task_id, index, test_accuracy in (
        Checkpoint.objects.filter(run_id__in=run_ids, round__isnull=False)
        .order_by("run_id", "task_id", "round__index", "id")
        .values_list("run_id", "task_id", "round__index", "test_accuracy")
    ):
        accuracy[(run_id, task_id)][index] = test_accuracy
    out: dict[int, dict[int, list[metrics.AccuracyPoint]]] = defaultdict(dict)
    for (run_id, task_id), by_round in accuracy.items():
        times = rounds.get(run_id, {})
        out[run_id][task_id] = [
            metrics.AccuracyPoint(
                round_index=index,
                round_time_s=times.get(index, (None, None))[0],
                elapsed_s=times.get(index, (None, None))[1],
                samples_trained=samples.get((run_id, index, task_id), 0),
                test_accuracy=by_round.get(index),
            )
            for index in sorted(set(times) | set(by_round))
        ]
    return dict(out)


def _last_accuracy(points: list[metrics.AccuracyPoint]) -> float | None:
    """The newest test accuracy among a task's points (its final accuracy once the run ended)."""
    return next((p.test_accuracy for p in reversed(points) if p.test_accuracy is not None), None)


def _reached(points: list[metrics.AccuracyPoint], target: float | None) -> metrics.TimeToAccuracy | None:
    return None if target is None or not points else metrics.time_to_accuracy(points, target)


def _comparison_targets(
    comparison: Comparison,
    tasks: list[Task],
    succeeded: list[Run],
    points: dict[int, dict[int, list[metrics.AccuracyPoint]]],
) -> list[dict[str, Any]]:
    """:func:`comparison_report`'s ``targets``: the comparison's given target of each task, else
    the lowest final accuracy of its succeeded runs."""

    def final(run: Run) -> dict[str, float | None]:
        mine = points.get(run.id, {})
        return {t.name: _last_accuracy(mine.get(t.id, [])) for t in tasks}

    lowest = metrics.lowest_final_accuracy(final(r) for r in succeeded)
    given = {str(k): float(v) for k, v in (comparison.targets or {}).items()}
    targets = []
    for t in tasks:
        if str(t.id) in given:
            targets.append({"task": t.id, "task_name": t.name, "target": given[str(t.id)], "source": "given"})
        else:
            targets.append(
                {"task": t.id, "task_name": t.name, "target": lowest.get(t.name), "source": "lowest final accuracy"}
            )
    return targets


def _with_alone_sources(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` annotated with how their ``P_alone`` came (in the same query): ``alone_measured``,
    the measurements the run asked its devices for (its wall clock includes them: before round 0
    and before a round with new batch sizes), and ``alone_cached``, the ones it took from the
    cross-run cache (:mod:`controlplane.experiments.services.standalone_cache`), which cost it no
    time. Which runs measure depends on the order they ran: the first run of a device, workload
    and batch size pays, the others do not (never cached on ``simulated``)."""
    by_source = {
        "alone_measured": StandaloneThroughput.Source.MEASURED,
        "alone_cached": StandaloneThroughput.Source.CACHE,
    }
    return runs.annotate(
        **{
            name: Count("standalone_throughputs", filter=Q(standalone_throughputs__source=source))
            for name, source in by_source.items()
        }
    )


def _run_row(
    run: Run,
    baseline: Run | None,
    tasks: list[Task],
    points: dict[int, list[metrics.AccuracyPoint]],
    target_of: dict[int, float | None],
) -> dict[str, Any]:
    """One entry of :func:`comparison_report`'s ``runs``; ``points`` are the run's, per task."""
    row: dict[str, Any] = {"run": run.id, "strategy": run.strategy, "repeat": run.repeat, "status": run.status}
    row["alone_measured"] = getattr(run, "alone_measured", None)
    row["alone_cached"] = getattr(run, "alone_cached", None)
    for figure in RUN_FIGURES:
        row[figure] = getattr(run, figure)
    for name, figure in SPEEDUP_FIGURES.items():
        row[name] = speedup(getattr(run, figure), getattr(baseline, figure) if baseline else None)
    row["tasks"] = []
    for t in tasks:
        mine = points.get(t.id, [])
        reached = _reached(mine, target_of[t.id])
        row["tasks"].append(
            {
                "task": t.id,
                "task_name": t.name,
                "final_accuracy": _last_accuracy(mine),
                "time_to_accuracy_s": reached.time_s if reached else None,
                "wall_time_to_accuracy_s": reached.wall_time_s if reached else None,
                "rounds_to_accuracy": reached.rounds if reached else None,
                "samples_to_accuracy": reached.samples if reached else None,
            }
        )
    return row


def _figure_values(
    run_rows: list[dict[str, Any]], strategy: str, figure: str, task: int | None = None
) -> list[float | None]:
    """A figure of ``strategy``'s succeeded runs, one value per run (of ``task`` when given)."""
    out = []
    for row in run_rows:
        if row["strategy"] != strategy or row["status"] != Run.Status.SUCCEEDED:
            continue
        if task is None:
            out.append(row[figure])
        else:
            out.append(next(x[figure] for x in row["tasks"] if x["task"] == task))
    return out


def _strategy_row(strategy: str, run_rows: list[dict[str, Any]], tasks: list[Task]) -> dict[str, Any]:
    """One entry of :func:`comparison_report`'s ``strategies``: each figure's estimate over the
    strategy's succeeded runs, overall and per task."""
    mine = [r for r in run_rows if r["strategy"] == strategy]
    entry: dict[str, Any] = {
        "strategy": strategy,
        "runs": [r["run"] for r in mine],
        "succeeded": sum(r["status"] == Run.Status.SUCCEEDED for r in mine),
        # the wall clock of these runs includes measuring P_alone; the others took it from the cache
        "alone_measured_runs": [r["run"] for r in mine if r["alone_measured"]],
    }
    for figure in (*RUN_FIGURES, *SPEEDUP_FIGURES):
        entry[figure] = figure_estimate(_figure_values(run_rows, strategy, figure), figure).as_dict()
    entry["tasks"] = []
    for t in tasks:
        per_task: dict[str, Any] = {"task": t.id, "task_name": t.name}
        for figure in ("final_accuracy", *TASK_FIGURES):
            per_task[figure] = figure_estimate(_figure_values(run_rows, strategy, figure, t.id), figure).as_dict()
        per_task["reached"] = sum(v is not None for v in _figure_values(run_rows, strategy, "time_to_accuracy_s", t.id))
        entry["tasks"].append(per_task)
    return entry


def comparison_report(comparison: Comparison) -> dict[str, Any]:
    """Everything a comparison measured, as the API, the experiment page and ``mtfl compare``
    show it (plain JSON values; :mod:`controlplane.planning.metrics` has every definition).

    Returns:
        ``{"comparison", "repeats", "baseline", "confidence", "targets", "strategies", "runs",
        "clocks", "small_n_note", "verdicts"}``:

        * ``targets``: per task of the experiment ``{"task", "task_name", "target", "source"}``,
          ``source`` ``"given"`` (the comparison's ``targets``) or ``"lowest final accuracy"``
          (:func:`~controlplane.planning.metrics.lowest_final_accuracy` over its succeeded runs;
          ``target`` null until one has a final accuracy);
        * ``runs``: per run in start order (the interleaved order they ran in) ``{"run",
          "strategy", "repeat", "status", "alone_measured", "alone_cached", figures of
          :data:`RUN_FIGURES` and :data:`SPEEDUP_FIGURES`, "tasks": [{"task", "task_name",
          "final_accuracy", figures of :data:`TASK_FIGURES` (null: not reached)}]}``:
          ``alone_measured`` the ``P_alone`` measurements the run made itself (its wall clock
          includes their time), ``alone_cached`` the ones it took from the cache
          (:func:`_with_alone_sources`);
        * ``strategies``: per strategy in the comparison's order, each figure over its
          succeeded runs (one per repeat) as ``{"mean", "low", "high", "n", "values",
          "scale"}`` (:func:`figure_estimate`: geometric mean and log-scale interval for the
          positive figures, linear for accuracies; ``values`` each repeat's value; no interval
          below two repeats), per task too, with ``reached``: how many of its succeeded runs
          reached the target; ``alone_measured_runs``: its runs that measured ``P_alone``
          themselves (their wall clock includes it, the others' does not);
        * ``clocks``: ``{figure: label}`` of the two times to accuracy
          (:data:`~controlplane.planning.metrics.CLOCKS`): ``time_to_accuracy_s`` on the FL
          round-time clock, ``wall_time_to_accuracy_s`` wall-clock from the run's start;
        * ``small_n_note``: ``"n = 2: interval wide"`` (or ``"n = 1: no interval"``) when a
          strategy with succeeded runs has fewer than three, else ``""`` (a strategy with none
          has no figures and does not hide the note);
        * ``verdicts``: for each planned strategy (``needs_predictor``: ``vres_greedy``,
          ``vres_sync``) and each figure (per task for times to accuracy, on both clocks),
          ``{"strategy", "figure", "task_name", "against", "verdict", "difference"}``: against
          the best baseline strategy by mean (higher throughput, lower time), ``verdict`` one of
          :data:`~controlplane.planning.metrics.VERDICTS`, ``difference`` the contrast
          (:meth:`~controlplane.planning.metrics.Contrast.as_dict`: ``{"mean", "low", "high",
          "kind", "method", "n"}``, ``kind`` ``"ratio"`` candidate / reference on the log scale,
          ``method`` ``"paired t"`` over repeats paired by index or ``"Welch"``) or null.

    Eight queries, however many runs and rounds.
    """
    experiment = comparison.experiment
    runs = list(_with_alone_sources(comparison.runs.order_by("id")))
    tasks = list(experiment.tasks.order_by("id"))
    baselines = run_baselines(experiment, runs)
    points = runs_accuracy_points([r.id for r in runs])
    succeeded = [r for r in runs if r.status == Run.Status.SUCCEEDED]
    targets = _comparison_targets(comparison, tasks, succeeded, points)
    target_of = {row["task"]: row["target"] for row in targets}
    run_rows = [_run_row(run, baselines.get(run.id), tasks, points.get(run.id, {}), target_of) for run in runs]
    strategies = list(comparison.strategies)
    strategy_rows = [_strategy_row(s, run_rows, tasks) for s in strategies]
    return {
        "comparison": comparison.id,
        "repeats": comparison.repeats,
        "baseline": baseline_strategy().name,
        "confidence": metrics.CONFIDENCE,
        "targets": targets,
        "strategies": strategy_rows,
        "runs": run_rows,
        "clocks": dict(metrics.CLOCKS),
        "small_n_note": _small_n_note(strategy_rows),
        "verdicts": _verdicts(strategies, tasks, run_rows),
    }


def _small_n_note(strategy_rows: list[dict[str, Any]]) -> str:
    """:func:`comparison_report`'s note: that of the fewest succeeded runs among the strategies
    with any. A strategy with none has no figure to qualify (its row shows none), so it must not
    hide the note the others' two repeats need (``small_n_note(0)`` is empty)."""
    counts = [row["succeeded"] for row in strategy_rows if row["succeeded"] > 0]
    return metrics.small_n_note(min(counts, default=0))


def _by_repeat(run_rows: list[dict[str, Any]], strategy: str, figure: str, task: int | None) -> dict[int, Any]:
    """A figure of ``strategy``'s succeeded runs by repeat (of ``task`` when given): what pairs
    a strategy's repeat ``k`` with the reference's repeat ``k``."""
    out = {}
    for row in run_rows:
        if row["strategy"] == strategy and row["status"] == Run.Status.SUCCEEDED:
            out[row["repeat"]] = (
                row[figure] if task is None else next(x[figure] for x in row["tasks"] if x["task"] == task)
            )
    return out


def _verdicts(strategies: list[str], tasks: list[Task], run_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`comparison_report`'s verdicts: each planned strategy against the best baseline
    strategy (by mean) of each figure, repeat ``k`` paired with repeat ``k`` (the paired
    t-interval on the log scale; Welch's where fewer than two repeats pair up)."""
    registered_ = {s: STRATEGY_REGISTRY.get(s) for s in strategies if s in STRATEGY_REGISTRY}
    candidates = [s for s, r in registered_.items() if r.needs_predictor]
    references = [s for s, r in registered_.items() if not r.needs_predictor and not r.takes_plan]
    checks: list[tuple[str, int | None, str | None, bool]] = [(f, None, None, True) for f in RUN_FIGURES]
    checks += [(clock, t.id, t.name, False) for t in tasks for clock in metrics.CLOCKS]
    out = []
    for figure, task, task_name, higher in checks:
        reference_of = {s: _by_repeat(run_rows, s, figure, task) for s in references}
        means = {s: figure_estimate(v.values(), figure).mean for s, v in reference_of.items()}
        ranked = [s for s in references if means[s] is not None]
        if not ranked:
            continue
        best = max(ranked, key=lambda s: means[s]) if higher else min(ranked, key=lambda s: means[s])
        for s in candidates:
            mine = _by_repeat(run_rows, s, figure, task)
            repeats = sorted(set(mine) | set(reference_of[best]))
            pair = [mine.get(k) for k in repeats], [reference_of[best].get(k) for k in repeats]
            scale = "linear" if figure in LINEAR_FIGURES else "log"
            found = metrics.contrast(*pair, scale=scale, paired=True)
            out.append(
                {
                    "strategy": s,
                    "figure": figure,
                    "task_name": task_name,
                    "against": best,
                    "verdict": metrics.verdict(*pair, higher_is_better=higher, scale=scale, paired=True),
                    "difference": None if found is None else found.as_dict(),
                }
            )
    return out


# --- what the dashboard's pages read -----------------------------------------------------------------


def experiment_index_list(*, user, device_names: int) -> list[Experiment]:
    """The index page's experiments ``user`` may see, newest first, each with its tasks and runs
    prefetched, ``device_count`` (its devices, counted in the database) and ``first_devices``
    (at most ``device_names`` of them, by name, id and name loaded only): a federation of
    10,000 devices is counted and its first few named, never all listed."""
    return list(
        experiment_list(user=user)
        .prefetch_related(None)
        .prefetch_related(
            "tasks",
            "runs",
            Prefetch(
                "devices",
                queryset=Device.objects.order_by("name").only("id", "name")[:device_names],
                to_attr="first_devices",
            ),
        )
        .annotate(device_count=Count("devices", distinct=True))
    )


def experiment_page_list(*, user) -> QuerySet[Experiment]:
    """Experiments ``user`` may see with their owner joined and nothing prefetched: an
    experiment's page reads what it shows (aggregated or bounded), never every device or shard."""
    return experiment_list(user=user).prefetch_related(None).select_related("owner")


def experiment_tasks(experiment: Experiment) -> list[Task]:
    """The experiment's tasks, by id."""
    return list(experiment.tasks.order_by("id"))


def experiment_latest_comparison(experiment: Experiment) -> Comparison | None:
    """The experiment's newest comparison, or ``None``."""
    return experiment.comparisons.order_by("-id").first()


def experiment_collaborator_names(experiment: Experiment) -> list[str]:
    """The user names of the experiment's collaborators, sorted."""
    return sorted(u.username for u in experiment.collaborators.all())


def experiment_runs_all(experiment: Experiment) -> QuerySet[Run]:
    """Every run of the experiment (what its exports stream)."""
    return experiment.runs.all()


def run_only(run: Run) -> QuerySet[Run]:
    """A queryset of ``run`` alone (what a run's exports stream)."""
    return Run.objects.filter(pk=run.pk)


def run_page_list(*, user) -> QuerySet[Run]:
    """Runs ``user`` may see, with their comparison joined (a run's page says whether it runs)."""
    return run_list(user=user).select_related("comparison")


def visible_run_ids(*, user, run_ids: Collection[int]) -> set[int]:
    """Those of ``run_ids`` whose run ``user`` may see."""
    return set(run_list(user=user).filter(id__in=run_ids).values_list("id", flat=True))


def task_list() -> QuerySet[Task]:
    """Every task of the lab's catalogue, by name, with its owner joined."""
    return Task.objects.select_related("owner").order_by("name")


def task_experiment_list(*, user, task: Task) -> QuerySet[Experiment]:
    """Experiments ``user`` may see that train ``task``."""
    return experiment_list(user=user).filter(tasks=task)


def runs_speedups(runs: Iterable[Run]) -> dict[int, dict[str, float | None]]:
    """Each of ``runs``' :func:`run_speedups` by run id, every run of an experiment read at once
    for its baselines (:func:`run_baselines`): a page of runs costs one query per experiment."""
    baselines: dict[int, dict[int, Run | None]] = {}
    out: dict[int, dict[str, float | None]] = {}
    for run in runs:
        if run.experiment_id not in baselines:
            baselines[run.experiment_id] = run_baselines(run.experiment, run.experiment.runs.all())
        out[run.id] = run_speedups(run, baselines[run.experiment_id].get(run.id))
    return out


# --- what the dashboard's figures and tables read (controlplane.dashboard.data) -----------------------


def experiment_runs_in_order(experiment: Experiment) -> list[Run]:
    """Every run of the experiment, by id."""
    return list(experiment.runs.order_by("id"))


def experiment_checkpoint_points(experiment: Experiment) -> QuerySet:
    """Every checkpoint of the experiment's runs as ``(run id, task name, created_at, round index
    or None, test accuracy, aggregation, its round's FL round time or None)``, by run and time
    (one query)."""
    return (
        Checkpoint.objects.filter(run__experiment=experiment)
        .order_by("run_id", "created_at", "id")
        .values_list(
            "run_id", "task__name", "created_at", "round__index", "test_accuracy", "aggregation", "round__round_time_s"
        )
    )


def experiment_task_ids(experiment: Experiment) -> dict[str, int]:
    """The experiment's task ids by task name."""
    return dict(experiment.tasks.values_list("name", "id"))


def comparison_runs(comparison: Comparison) -> list[Run]:
    """The comparison's runs."""
    return list(comparison.runs.all())


def newest_finished_runs(experiment: Experiment, strategies: Collection[str]) -> list[Run]:
    """The newest run of each of ``strategies`` on the experiment that has a finished round."""
    newest: dict[str, Run] = {}
    for run in (
        experiment.runs.filter(strategy__in=strategies, rounds__finished_at__isnull=False).distinct().order_by("id")
    ):
        newest[run.strategy] = run
    return list(newest.values())


def run_assignment_values(
    run: Run, columns: tuple[str, ...], *, devices: list[str] | None = None, from_round: int | None = None
) -> QuerySet:
    """The run's assignments as tuples of ``columns`` (by round, device name and task), optionally
    only of some devices (by name) and from a round index on (one query)."""
    qs = Assignment.objects.filter(round__run=run)
    if devices is not None:
        qs = qs.filter(device__name__in=devices)
    if from_round is not None:
        qs = qs.filter(round__index__gte=from_round)
    return qs.order_by("round__index", "device__name", "task_id").values_list(*columns)


def experiment_has_gpu_devices(experiment: Experiment) -> bool:
    """Whether any device of the experiment is served by a GPU backend."""
    return experiment.devices.filter(backend__startswith="cuda").exists()


def run_round_indices(run: Run) -> list[int]:
    """The indices of the run's rounds that have assignments, in order."""
    return list(
        Round.objects.filter(run=run, assignments__isnull=False)
        .distinct()
        .order_by("index")
        .values_list("index", flat=True)
    )


def run_newest_participants(run: Run) -> list[int] | None:
    """The device ids of the run's newest round's participants (``None``: every device, or no round)."""
    return run.rounds.order_by("-index").values_list("participants", flat=True).first()


def experiment_device_names(experiment: Experiment) -> list[str]:
    """The names of the experiment's devices, sorted."""
    return list(experiment.devices.order_by("name").values_list("name", flat=True))


def experiment_device_ids_and_names(experiment: Experiment) -> list[tuple[int, str]]:
    """``(id, name)`` of the experiment's devices, by name."""
    return list(experiment.devices.order_by("name").values_list("id", "name"))


def experiment_device_count(experiment_id: int) -> int:
    """How many devices an experiment has (one ``COUNT`` on the membership table)."""
    return Experiment.devices.through.objects.filter(experiment_id=experiment_id).count()


def experiment_shard_counts(experiment: Experiment) -> dict[int, int]:
    """How many shards (devices holding its data) each task of the experiment has, by task id."""
    return dict(experiment.shards.values("task_id").annotate(n=Count("id")).order_by().values_list("task_id", "n"))


def run_task_throughputs(run: Run) -> list[tuple[int, str, float]]:
    """``(round index, task name, Σ_j P_ij)`` per round and task of the run, summed by the database
    over the devices that count (the one rule of :mod:`controlplane.planning.metrics`: a device
    with an assignment that did not succeed adds nothing)."""
    failed_on_device = Assignment.objects.filter(
        round_id=OuterRef("round_id"), device_id=OuterRef("device_id")
    ).exclude(status=Assignment.Status.SUCCEEDED)
    return list(
        Assignment.objects.filter(round__run=run, throughput_sps__isnull=False)
        .exclude(Exists(failed_on_device))
        .values("round__index", "task__name")
        .annotate(total=Sum("throughput_sps"))
        .order_by()
        .values_list("round__index", "task__name", "total")
    )


def run_telemetry_device_names(run: Run) -> list[str]:
    """The names of the devices that reported GPU telemetry in the run, sorted."""
    return sorted(set(DeviceTelemetry.objects.filter(round__run=run).values_list("device__name", flat=True)))


def runs_recorded_rounds(runs: list[Run]) -> QuerySet[Round]:
    """The runs' rounds that have assignments, with their run's strategy and repeat and the round's
    stored metrics only (``Round.device_metrics``...), by run and index (one query)."""
    return (
        Round.objects.filter(run__in=runs)
        .filter(Exists(Assignment.objects.filter(round=OuterRef("pk"))))
        .select_related("run")
        .only(
            "index",
            "run__strategy",
            "run__repeat",
            "round_time_s",
            "samples_trained",
            "fl_throughput_sps",
            "raw_throughput_sps",
            "fair_throughput",
            "device_metrics",
        )
        .order_by("run_id", "index")
    )


def runs_predicted_and_measured(runs: list[Run]) -> QuerySet:
    """``(strategy, device name, task name, round index, throughput_sps, predicted_throughput_sps)``
    of the runs' assignments that have both throughputs, by run, round, device and task (one query)."""
    return (
        Assignment.objects.filter(round__run__in=runs)
        .filter(predicted_throughput_sps__isnull=False, throughput_sps__isnull=False)
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


def run_round_count(run: Run) -> int:
    """How many rounds the run has."""
    return run.rounds.count()


def run_newest_round_values(run: Run, fields: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
    """The run's newest ``limit`` rounds as ``{field: value}`` of ``fields``, newest first."""
    return list(run.rounds.order_by("-index").values(*fields)[:limit])


def run_newest_rounds(run: Run, limit: int) -> list[Round]:
    """The run's newest ``limit`` rounds, newest first."""
    return list(run.rounds.order_by("-index")[:limit])


def experiment_first_device_ids(experiment: Experiment, limit: int) -> list[int]:
    """The ids of the experiment's first ``limit`` devices by name."""
    return list(experiment.devices.order_by("name").values_list("id", flat=True)[:limit])


def rounds_plan_assignment_values(round_ids: list[int], device_ids: list[int]) -> QuerySet:
    """``(round id, device id, task name, batch size, share, predicted and measured throughput,
    status, execution mode and fallback)`` of the rounds' assignments on ``device_ids``, by round,
    device name and task name (one query)."""
    return (
        Assignment.objects.filter(round_id__in=round_ids, device_id__in=device_ids)
        .order_by("round_id", "device__name", "task__name")
        .values_list(
            "round_id",
            "device_id",
            "task__name",
            "batch_size",
            "active_thread_percentage",
            "predicted_throughput_sps",
            "throughput_sps",
            "status",
            "execution_mode",
            "execution_fallback",
        )
    )


def run_checkpoint_metrics(run: Run) -> QuerySet:
    """Every global checkpoint of the run as ``(task name, round index or None (the initial
    model), test accuracy, test loss, evaluation status, kept_previous)``, by task and creation
    (one query). Accuracy is a fraction in [0, 1]; loss the mean test cross-entropy."""
    return (
        Checkpoint.objects.filter(run=run)
        .order_by("task__name", "created_at", "id")
        .values_list("task__name", "round__index", "test_accuracy", "test_loss", "evaluation_status", "kept_previous")
    )


TRAIN_LOSS_X_SAMPLES = ExpressionWrapper(F("train_loss") * F("samples_trained"), output_field=FloatField())
"""An assignment's ``n_ij·L_ij``: summed over a round's devices and divided by their samples it
gives the task's sample-weighted training loss (:func:`run_task_train_losses`, the tidy
``metrics`` export); ``NULL`` where no loss was reported, which ``Sum`` leaves out."""


def run_task_train_losses(run: Run) -> list[tuple[int, str, float, int]]:
    """``(round index, task name, training loss, devices)`` per round and task of the run: the
    mean of the devices' ``Assignment.train_loss`` (each the last local epoch's mean
    cross-entropy) weighted by the samples each trained, ``Σ_j n_ij·L_ij / Σ_j n_ij``, over the
    succeeded assignments that reported one, computed by the database (one query). Rounds of the
    ``simulated`` backend, which reports no loss, have no row."""
    rows = (
        Assignment.objects.filter(
            round__run=run, status=Assignment.Status.SUCCEEDED, train_loss__isnull=False, samples_trained__gt=0
        )
        .values("round__index", "task__name")
        .annotate(loss_x_n=Sum(TRAIN_LOSS_X_SAMPLES), n=Sum("samples_trained"), devices=Count("id"))
        .order_by("round__index", "task__name")
        .values_list("round__index", "task__name", "loss_x_n", "n", "devices")
    )
    return [(index, task, float(loss_x_n) / n, devices) for index, task, loss_x_n, n, devices in rows if n]


def experiments_data_warnings(experiment_ids: Collection[int]) -> dict[int, list[str]]:
    """What each experiment's partition leaves without data, by experiment id
    (:func:`controlplane.planning.data_gaps.data_gap_warnings`: each device holding 0 samples of
    a task, the devices holding none of any task); an experiment without shards gets ``[]``. One
    query over the experiments' shards."""
    shards: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for experiment_id, device, task, n in (
        Shard.objects.filter(experiment_id__in=experiment_ids)
        .order_by()
        .values_list("experiment_id", "device__name", "task__name", "num_samples")
    ):
        shards[experiment_id].append((device, task, n))
    return {e: data_gap_warnings(data_gaps(shards[e])) for e in experiment_ids}


def experiment_data_warnings(experiment: Experiment) -> list[str]:
    """:func:`experiments_data_warnings` of one experiment (one query)."""
    return experiments_data_warnings([experiment.id])[experiment.id]
