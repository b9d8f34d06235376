"""Reads of experiment state, including the metrics derived from it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from django.db.models import Max, OuterRef, Prefetch, Q, QuerySet, Subquery

from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Comparison,
    DeviceTelemetry,
    Experiment,
    Round,
    Run,
    StandaloneThroughput,
    Task,
)
from controlplane.fleet.models import Device
from controlplane.planning.metrics import speedup
from controlplane.planning.strategies import baseline_strategy
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


def experiment_shards(experiment: Experiment, *, with_indices: bool = False) -> dict[tuple[int, int], ShardSpan]:
    """``{(device_id, task_id): ShardSpan}`` of an experiment (plain tuples, not model
    instances: every round reads all of them, 3,000 for 1,000 devices × 3 tasks).

    Args:
        with_indices: read each shard's encoded positions too (about 10 KB for 25,000 samples:
            what a request to a device carries); without, ``indices`` is ``None``.
    """
    if not with_indices:
        rows = experiment.shards.values_list("device_id", "task_id", "num_samples", "offset")
        return {(device_id, task_id): ShardSpan(n, offset) for device_id, task_id, n, offset in rows}
    full = experiment.shards.values_list("device_id", "task_id", "num_samples", "offset", "indices")
    return {(device_id, task_id): ShardSpan(n, offset, idx) for device_id, task_id, n, offset, idx in full}


def label_histograms(experiment: Experiment) -> list[dict]:
    """Every device's class histogram of every task of an experiment, for the API and the
    experiment page: ``[{"task", "task_name", "device", "device_name", "num_samples",
    "label_counts"}]`` ordered by task then device; ``label_counts`` holds ``num_classes``
    counts (empty for a shard saved before histograms were kept). One query."""
    rows = experiment.shards.order_by("task_id", "device__name").values_list(
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


def planning_input(experiment: Experiment) -> PlanningInput:
    """The planner's view of an experiment (devices and tasks ordered by id)."""
    shards = experiment_shards(experiment)
    return PlanningInput(
        device_ids=tuple(experiment.devices.order_by("id").values_list("id", flat=True)),
        task_ids=tuple(experiment.tasks.order_by("id").values_list("id", flat=True)),
        samples={key: s.num_samples for key, s in shards.items()},
        local_epochs=experiment.local_epochs,
    )


def latest_checkpoints(run: Run) -> dict[int, Checkpoint]:
    """The newest checkpoint of each task of a run: ``{task_id: Checkpoint}``."""
    latest: dict[int, Checkpoint] = {}
    for ckpt in run.checkpoints.order_by("created_at", "id"):
        latest[ckpt.task_id] = ckpt
    return latest


def standalone_table(run: Run) -> dict[tuple[int, int, int], float | None]:
    """``{(device_id, task_id, batch_size): P_alone}`` measured for a run."""
    rows = StandaloneThroughput.objects.filter(run=run).values_list(
        "device_id", "task_id", "batch_size", "throughput_sps"
    )
    return {(device_id, task_id, batch_size): p for device_id, task_id, batch_size, p in rows}


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


def run_telemetry(run: Run) -> QuerySet[DeviceTelemetry]:
    """Every GPU telemetry series of a run, by round then device (one query)."""
    return (
        DeviceTelemetry.objects.filter(round__run=run)
        .select_related("device", "round")
        .order_by("round__index", "device__name")
    )


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
    (``temporal``) run, so a comparison's figures stay what they were when another comparison
    of the experiment runs later (and are ``None`` when its baseline did not succeed); a run
    outside any comparison against the experiment's newest succeeded baseline run
    (:func:`baseline_run`). One query.
    """
    succeeded = list(
        experiment.runs.filter(strategy=baseline_strategy().name, status=Run.Status.SUCCEEDED).order_by("id")
    )
    newest = succeeded[-1] if succeeded else None
    by_comparison = {r.comparison_id: r for r in succeeded if r.comparison_id is not None}
    return {run.id: (by_comparison.get(run.comparison_id) if run.comparison_id is not None else newest) for run in runs}


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


def run_with_rounds(run_id: int) -> Run:
    """A run with its rounds, assignments and checkpoints prefetched (for the run page)."""
    return (
        Run.objects.select_related("experiment")
        .prefetch_related(
            Prefetch("rounds", queryset=Round.objects.order_by("index")),
            Prefetch(
                "rounds__assignments",
                queryset=Assignment.objects.select_related("device", "task").order_by("device_id", "task_id"),
            ),
            Prefetch("checkpoints", queryset=Checkpoint.objects.select_related("task", "round")),
        )
        .get(id=run_id)
    )
