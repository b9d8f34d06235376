"""Reads of experiment state, including the metrics derived from it."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Prefetch, QuerySet

from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Comparison,
    Experiment,
    Round,
    Run,
    Shard,
    StandaloneThroughput,
    Task,
)
from controlplane.planning.metrics import speedup
from controlplane.planning.types import PlanningInput
from workers.messages import DatasetRef, OptimizerConfig, TaskRef


def task_ref(task: Task) -> TaskRef:
    """The worker-side description of a task (:class:`workers.messages.TaskRef`)."""
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
    )


def experiment_shards(experiment: Experiment) -> dict[tuple[int, int], Shard]:
    """``{(device_id, task_id): Shard}`` of an experiment."""
    return {(s.device_id, s.task_id): s for s in experiment.shards.all()}


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
    return {
        (s.device_id, s.task_id, s.batch_size): s.throughput_sps
        for s in StandaloneThroughput.objects.filter(run=run)
    }


def experiment_list() -> QuerySet[Experiment]:
    return Experiment.objects.prefetch_related("tasks", "devices").order_by("-id")


def comparison_list() -> QuerySet[Comparison]:
    return Comparison.objects.select_related("experiment").prefetch_related("runs").order_by("-id")


def run_list() -> QuerySet[Run]:
    return Run.objects.select_related("experiment").order_by("-id")


def round_list() -> QuerySet[Round]:
    return Round.objects.select_related("run").order_by("run_id", "index")


def assignment_list() -> QuerySet[Assignment]:
    return Assignment.objects.select_related("round", "device", "task").order_by("round_id", "device_id", "task_id")


def checkpoint_list() -> QuerySet[Checkpoint]:
    return Checkpoint.objects.select_related("round", "task").order_by("run_id", "task_id", "created_at")


def baseline_run(experiment: Experiment) -> Run | None:
    """The experiment's newest succeeded ``temporal`` run, the baseline of every speedup."""
    return (
        experiment.runs.filter(strategy="temporal", status=Run.Status.SUCCEEDED).order_by("-id").first()
    )


def run_speedups(run: Run, baseline: Run | None) -> dict[str, float | None]:
    """Raw and fair throughput speedups of a run over the ``temporal`` baseline."""
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
