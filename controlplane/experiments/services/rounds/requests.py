"""A device's part of a round as the agent receives it (:class:`workers.protocol.messages.TrainRoundRequest`).

One builder, :func:`round_device_request`, makes every request: :func:`.dispatch.round_dispatch`
calls it for each device with what it loaded once for the whole round, and a retry
(:func:`round_device_request_load`) loads the same from the database for one device, so a
retried device trains exactly what its first attempt was sent (same assignments, shards,
global models and seeds) under its next ``attempt``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Checkpoint, Experiment, Round
from controlplane.experiments.selectors import ShardSpan
from controlplane.experiments.services.execution import task_execution
from controlplane.experiments.services.planning import round_partitioning
from controlplane.experiments.services.rounds.aggregate import task_trainer_options
from controlplane.fleet.models import Device
from controlplane.planning.lr_scaling import scaled_learning_rate
from workers.fl.artifacts import device_weights_key
from workers.protocol.messages import (
    AssignmentSpec,
    ExecutionOptions,
    ShardRef,
    TaskRef,
    TrainRoundRequest,
    round_idempotency_key,
)
from workers.registry.names import check_names


def shard_ref(experiment: Experiment, shard: ShardSpan) -> ShardRef:
    """The worker-side description of a shard: the positions a partitioner chose
    (``shard.indices``, encoded) when it has them, else ``shard.num_samples`` samples from
    position ``shard.offset`` of the permutation seeded by the experiment's seed."""
    return ShardRef(
        permutation_seed=experiment.seed, offset=shard.offset, count=shard.num_samples, indices=shard.indices
    )


class RequestedAssignment(NamedTuple):
    """One saved assignment of a device in a round, as its request carries it."""

    assignment_id: int
    task_id: int
    batch_size: int
    active_thread_percentage: int | None


def round_device_request(
    *,
    rnd: Round,
    experiment: Experiment,
    device: Device,
    partitioning: str,
    assignments: Iterable[RequestedAssignment],
    shards: Mapping[tuple[int, int], ShardSpan],
    latest: Mapping[int, Checkpoint],
    task_refs: Mapping[int, TaskRef],
    executions: Mapping[int, ExecutionOptions],
    warmup_iterations: int,
    attempt: int = 0,
    trainer_options: Mapping[int, dict[str, Any]] | None = None,
) -> TrainRoundRequest:
    """Build one device's part of round ``rnd`` for its ``attempt`` (0 first, then one more
    per retry).

    Args:
        rnd: the saved round (its id, index and run id are read).
        device: the device (``id``, ``name``, ``backend`` are read).
        partitioning: the run's plan's partitioning (``"mps"`` or ``"timeslice"``).
        assignments: the device's assignments in the order its trainers start.
        shards: ``{(device_id, task_id): ShardSpan}`` (:func:`.selectors.experiment_shards` with
            ``with_indices=True``).
        latest: ``{task_id: Checkpoint}``, the global models to start from
            (:func:`.selectors.latest_checkpoints`).
        task_refs: ``{task_id: TaskRef}``.
        executions: ``{task_id: ExecutionOptions}``, each task's own
            (:func:`..execution.task_execution`): every strategy trains a task the same way.
        warmup_iterations: untimed iterations before throughput is measured.
        trainer_options: ``{task_id: task_trainer_options(rnd.run, task_id)}`` when the caller
            builds many devices' requests (a round of 1,000 devices asked the registry 3,000
            times); ``None``: asked here.

    Each assignment's learning rate follows its batch size by the experiment's ``lr_scaling``
    (:func:`assignment_learning_rate`). Each task's seed is ``experiment.seed × 1000 + round
    index``; each output goes to the device's own artifact key
    (:func:`workers.fl.artifacts.device_weights_key`), the only key the round's recording accepts
    weights from.

    Each assignment also carries what its task's aggregator in the run (``rnd.run``, whose
    ``options`` may override the experiment's aggregator) asks of trainers
    (:func:`.aggregate.task_trainer_options`: the aggregator's name and ``client_options``, FedProx's ``mu``).

    Raises:
        KeyError: an assignment whose device–task pair has no shard, or a task with no
            checkpoint, task reference or execution options.
        workers.registry.base.UnknownEntryError, ValueError: a task's aggregator is no longer
            installed or no longer takes its stored parameters.
    """
    assignments = list(assignments)
    if trainer_options is None:
        trainer_options = {
            task_id: task_trainer_options(rnd.run, task_id) for task_id in {a.task_id for a in assignments}
        }
    specs = [
        _assignment_spec(a, rnd, experiment, device, shards, latest, task_refs, executions, trainer_options)
        for a in assignments
    ]
    # Names are checked as the request is built, inside the caller's transaction: an unknown one
    # rolls the round's writes back instead of failing in an on-commit send.
    return check_names(
        TrainRoundRequest(
            run_id=rnd.run_id,
            round_id=rnd.id,
            round_index=rnd.index,
            device=device.name,
            backend=device.backend,
            partitioning=partitioning,
            warmup_iterations=warmup_iterations,
            assignments=specs,
            attempt=attempt,
            idempotency_key=round_idempotency_key(rnd.id, device.name, attempt),
        )
    )


def _assignment_spec(
    a: RequestedAssignment,
    rnd: Round,
    experiment: Experiment,
    device: Device,
    shards: Mapping[tuple[int, int], ShardSpan],
    latest: Mapping[int, Checkpoint],
    task_refs: Mapping[int, TaskRef],
    executions: Mapping[int, ExecutionOptions],
    trainer_options: Mapping[int, dict[str, Any]],
) -> AssignmentSpec:
    """One assignment of a device's part of ``rnd``; the mappings are
    :func:`round_device_request`'s (``trainer_options`` given).

    Raises:
        KeyError: as :func:`round_device_request`.
    """
    return AssignmentSpec(
        assignment_id=a.assignment_id,
        task=task_refs[a.task_id],
        batch_size=a.batch_size,
        active_thread_percentage=a.active_thread_percentage,
        shard=shard_ref(experiment, shards[(device.id, a.task_id)]),
        local_epochs=experiment.local_epochs,
        global_weights=latest[a.task_id].artifact_path,
        output_weights=device_weights_key(rnd.run_id, rnd.index, device.name, a.task_id),
        seed=experiment.seed * 1000 + rnd.index,
        learning_rate=assignment_learning_rate(task_refs[a.task_id], a.batch_size, experiment.lr_scaling),
        execution=executions[a.task_id],
        **trainer_options[a.task_id],
    )


def assignment_learning_rate(task: TaskRef, batch_size: int, rule: str) -> float | None:
    """The learning rate an assignment of ``batch_size`` is sent: the task's, scaled by the
    experiment's rule relative to batch 128
    (:func:`controlplane.planning.lr_scaling.scaled_learning_rate`), or ``None`` (the trainer
    keeps ``task.optimizer.learning_rate``) under ``none`` or when scaling leaves it unchanged, so
    such requests are what they were before the rule existed."""
    if rule == "none":
        return None
    scaled = scaled_learning_rate(task.optimizer.learning_rate, batch_size, rule)
    return None if scaled == task.optimizer.learning_rate else scaled


def round_device_request_load(*, rnd: Round, device_id: int, attempt: int) -> TrainRoundRequest:
    """Rebuild a device's part of a saved round from the database, for ``attempt`` (a retry):
    the same request :func:`.dispatch.round_dispatch` sent, but for the new attempt.

    Raises:
        Device.DoesNotExist: no such device.
        controlplane.planning.types.PlanningError: the run's strategy can no longer plan.
    """
    run = rnd.run
    experiment = run.experiment
    device = Device.objects.get(id=device_id)
    rows = list(rnd.assignments.filter(device_id=device_id).select_related("task").order_by("task_id"))
    return round_device_request(
        rnd=rnd,
        experiment=experiment,
        device=device,
        partitioning=round_partitioning(rnd, device_id),
        assignments=[RequestedAssignment(a.id, a.task_id, a.batch_size, a.active_thread_percentage) for a in rows],
        shards=selectors.experiment_shards(experiment, with_indices=True),
        latest=selectors.latest_checkpoints(run),
        task_refs={a.task_id: selectors.task_ref(a.task) for a in rows},
        executions={a.task_id: task_execution(a.task) for a in rows},
        warmup_iterations=mtfl_setting("WARMUP_ITERATIONS"),
        attempt=attempt,
    )
