"""Aggregating a round: each task's device models become the next global model through the
aggregator registry (:data:`workers.registry.aggregators.AGGREGATOR_REGISTRY`), kept as the
round's checkpoint. Its evaluation on the test split is not on the round's path: the checkpoint
is saved with its test results pending and evaluated beside the next round
(:mod:`controlplane.experiments.services.evaluation`).

Each task uses the aggregator :func:`task_aggregation_choice` resolves: the experiment's override
for the task (``Experiment.task_aggregation``), else the run's (``Run.options["aggregation"]``, an
algorithm comparison on one experiment), else the experiment's.
A *stateful* aggregator (a server optimiser: FedAvgM's momentum, FedAdam's ``m`` and ``v``, Reddi
et al. 2021) gets back the server state it left after the task's previous aggregation, read from
the file the previous checkpoint names (``Checkpoint.server_state_path``), and its new state is
written beside the new global model (:func:`workers.fl.artifacts.server_state_key`). Nothing is
kept in memory between rounds: a control worker restarted between two rounds (or in the middle
of an aggregation, which is then redone) reads the same files and gives the same models.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.experiments.models import Assignment, Checkpoint, Experiment, Round, Run, Task
from workers.fl.artifacts import ArtifactStore, global_weights_key, server_state_key
from workers.fl.fedavg import NoSamplesError, load_state, save_state
from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext, Aggregator

DEFAULT_AGGREGATOR = "fedavg"
"""The aggregator of an experiment that names none (a name of
:data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY`)."""


def task_aggregation_choice(
    experiment: Experiment, run_options: Mapping[str, Any] | None, task_id: int
) -> tuple[str, Mapping[str, Any] | None]:
    """Which aggregator a task of a run is aggregated with, and its stored parameters
    (unchecked), in this order:

    1. the experiment's override for the task (``experiment.task_aggregation[str(task_id)]``);
    2. the run's override (``run_options["aggregation"]`` and ``["aggregation_params"]``): one
       experiment, several runs of different algorithms on the same devices, data and seed;
    3. the experiment's ``aggregation`` and ``aggregation_params`` (``fedavg`` when it names none).

    Pure (no registry, no database), so the pages can say which algorithm a run uses.
    """
    override = (experiment.task_aggregation or {}).get(str(task_id))
    if override:
        return override.get("aggregation") or experiment.aggregation, override.get("aggregation_params")
    if run_options and run_options.get("aggregation"):
        return str(run_options["aggregation"]), run_options.get("aggregation_params")
    return experiment.aggregation or DEFAULT_AGGREGATOR, experiment.aggregation_params


def task_aggregator(run: Run, task_id: int) -> tuple[Aggregator, dict[str, Any]]:
    """The aggregator a task of ``run`` is aggregated with (:func:`task_aggregation_choice`:
    the experiment's override for the task, else the run's, else the experiment's) and its
    checked options. The one resolution both the aggregation and the round requests (the
    trainer options, :func:`task_trainer_options`) use; ``run.experiment`` is read.

    The stored parameters are checked again (:meth:`Aggregator.check_params`), so every declared
    parameter is present even for an experiment stored before its aggregator declared it.

    Raises:
        workers.registry.base.UnknownEntryError: the aggregator is no longer installed.
        ValueError: a stored parameter its record no longer allows.
    """
    name, params = task_aggregation_choice(run.experiment, run.options, task_id)
    record = AGGREGATOR_REGISTRY.get(name, field="aggregation")
    return record, record.check_params(params)


def task_trainer_options(run: Run, task_id: int) -> dict[str, Any]:
    """What every device's trainer of the task must do for its aggregator in ``run``:
    ``{AssignmentSpec field: value}``, the record's :meth:`~workers.registry.aggregators.Aggregator.assignment_options`
    (FedProx: ``{"aggregator": "fedprox", "client_options": {"mu": mu}}``, Li et al. 2020), ``{}``
    for aggregators that ask nothing of trainers.

    Raises:
        as :func:`task_aggregator`.
    """
    record, options = task_aggregator(run, task_id)
    return record.assignment_options(options)


@dataclass(frozen=True)
class TaskAggregate:
    """One task's new global model, as :func:`task_model_aggregate` wrote (or kept) it.

    Attributes:
        artifact_path, sha256: the global model's key and hex SHA-256 (the previous one's when kept).
        server_state_path, server_state_sha256: the aggregator's server state after this round
            (``""`` for a stateless aggregator).
    """

    artifact_path: str
    sha256: str
    server_state_path: str = ""
    server_state_sha256: str = ""


def task_model_aggregate(
    *,
    store: ArtifactStore,
    contributions: Iterable[Assignment],
    previous: Checkpoint,
    key: str,
    aggregator: str = DEFAULT_AGGREGATOR,
    options: Mapping[str, Any] | None = None,
    state_key: str = "",
) -> TaskAggregate:
    """Aggregate one task's device models of a round and write the result under ``key``.

    With ``fedavg``: ``W ← Σ_j n_j W_j / Σ_j n_j``, ``n_j`` the device's shard size
    (McMahan et al. 2017). Weights files with the same SHA-256 hold the same tensors, so each
    distinct one is read once and added with the sum of its devices' samples; the aggregation
    holds one device model in memory at a time. When every device reports the previous global
    model unchanged (the ``simulated`` backend passes it through) and the aggregator neither
    reads the previous model (``uses_previous``) nor keeps a server state (``stateful``: its
    state moves even on a zero update, e.g. momentum), the result is that model: the previous
    file is kept and nothing is read or written.

    A stateful aggregator gets the server state ``previous`` names (``{}`` when it names none,
    or when another aggregator made it), and its new state (:meth:`server_state`, taken after
    :meth:`result`) is written under ``state_key``.

    Args:
        contributions: the task's assignments that succeeded (``weights_path``,
            ``weights_sha256`` and ``samples`` read), in device order.
        previous: the task's current global model.
        key: the artifact key of the new global model.
        aggregator: a name of :data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY`.
        options: the aggregator's options, checked (:func:`task_aggregator`).
        state_key: the artifact key of the new server state (required for a stateful aggregator).

    Returns:
        The new global model's key and SHA-256 (``previous``'s when kept), and the new server
        state's.

    Raises:
        NoSamplesError: every contribution has 0 samples (or there is none).
        workers.registry.base.UnknownEntryError: no aggregator of that name.
        FileNotFoundError, ValueError: a weights or server state file is missing or does not
            match the others; ``state_key`` empty for a stateful aggregator.
    """
    record = AGGREGATOR_REGISTRY.get(aggregator, field="aggregator")
    if record.stateful and not state_key:
        raise ValueError(f"aggregator {aggregator!r} keeps a server state: a state_key is required")
    contributions = list(contributions)
    if sum(a.samples for a in contributions) == 0:
        raise NoSamplesError("every device that trained this task holds 0 samples of it")
    groups: dict[str, list[Assignment]] = {}
    for a in contributions:
        groups.setdefault(a.weights_sha256 or f"path:{a.weights_path}", []).append(a)
    if (
        not record.uses_previous
        and not record.stateful
        and len(groups) == 1
        and contributions[0].weights_sha256
        and contributions[0].weights_sha256 == previous.sha256
    ):
        return TaskAggregate(previous.artifact_path, previous.sha256)
    aggregation = record.start(
        AggregationContext(
            previous=lambda: load_state(store.path(previous.artifact_path)),
            options=dict(options or {}),
            state=lambda: _previous_state(store, previous, record),
        )
    )
    for members in groups.values():
        aggregation.add(load_state(store.path(members[0].weights_path)), sum(a.samples for a in members))
    sha = save_state(aggregation.result(), store.path(key))
    if not record.stateful:
        return TaskAggregate(key, sha)
    state = aggregation.server_state()  # type: ignore[attr-defined]  # StatefulAggregation
    return TaskAggregate(key, sha, state_key, save_state(state, store.path(state_key)))


def _previous_state(store: ArtifactStore, previous: Checkpoint, record: Aggregator) -> dict[str, Any]:
    """The server state ``record`` left after the task's previous aggregation: the file
    ``previous`` names when the same aggregator made it, else ``{}`` (the first aggregation, or
    a stateless aggregator)."""
    if not record.stateful or not previous.server_state_path or previous.aggregation != record.name:
        return {}
    return load_state(store.path(previous.server_state_path))


def round_aggregate(
    *, rnd: Round, usable: Iterable[Assignment], latest: Mapping[int, Checkpoint], store: ArtifactStore
) -> tuple[list[Checkpoint], list[str]]:
    """The new global model of every task of ``rnd``'s run, its evaluation pending.

    Each task is aggregated with its aggregator (:func:`task_aggregator`); the checkpoint
    records which one, and a stateful one's server state
    (:func:`workers.fl.artifacts.server_state_key` of the round).

    Args:
        usable: the round's assignments that may enter the aggregate (succeeded, on devices
            whose whole round succeeded, with weights that passed their checks).
        latest: ``{task_id: Checkpoint}``, each task's current global model.

    Returns:
        ``(checkpoints, flags)``: one unsaved :class:`Checkpoint` per task of the experiment;
        a task no usable device trained keeps its previous model (``kept_previous``) and its
        server state (so an aggregator's state carries over rounds in which none of the task's
        devices trained), with a flag line saying so. A model identical to the previous one
        (same SHA-256) takes its test results when it has them (:func:`_same_model_results`);
        every other checkpoint's are pending, for
        :func:`controlplane.experiments.services.evaluation.checkpoints_evaluate`.

    Raises:
        FileNotFoundError, ValueError: as :func:`task_model_aggregate` and :func:`task_aggregator`.
    """
    run = rnd.run
    experiment = run.experiment
    contributions_of: dict[int, list[Assignment]] = defaultdict(list)
    for a in usable:
        contributions_of[a.task_id].append(a)
    checkpoints: list[Checkpoint] = []
    flags: list[str] = []
    for task in experiment.tasks.order_by("id"):
        previous = latest[task.id]
        record, options = task_aggregator(run, task.id)
        try:
            made = task_model_aggregate(
                store=store,
                contributions=contributions_of[task.id],
                previous=previous,
                key=global_weights_key(run.id, task.id, rnd.index),
                aggregator=record.name,
                options=options,
                state_key=server_state_key(run.id, task.id, rnd.index) if record.stateful else "",
            )
        except NoSamplesError:
            flags.append(
                f"task {task.name}: no device that succeeded trained it this round; the previous global model was kept"
            )
            checkpoints.append(_kept_previous(rnd, task, previous))
            continue
        if made.sha256 == previous.sha256:  # the same model: its test results are the previous ones
            results = _same_model_results(previous)
        else:
            results = {"evaluation_status": Checkpoint.Evaluation.PENDING}
        checkpoints.append(
            Checkpoint(
                run=run,
                task=task,
                round=rnd,
                artifact_path=made.artifact_path,
                sha256=made.sha256,
                **results,
                aggregation=record.name,
                server_state_path=made.server_state_path,
                server_state_sha256=made.server_state_sha256,
            )
        )
    return checkpoints, flags


def _kept_previous(rnd: Round, task: Task, previous: Checkpoint) -> Checkpoint:
    """The (unsaved) checkpoint of a task no usable device trained in ``rnd``: the ``previous``
    model, its test results (:func:`_same_model_results`), aggregator and server state."""
    return Checkpoint(
        run=rnd.run,
        task=task,
        round=rnd,
        artifact_path=previous.artifact_path,
        sha256=previous.sha256,
        **_same_model_results(previous),
        kept_previous=True,
        aggregation=previous.aggregation,
        server_state_path=previous.server_state_path,
        server_state_sha256=previous.server_state_sha256,
    )


def _same_model_results(previous: Checkpoint) -> dict[str, Any]:
    """The test results of a new checkpoint of the same model as ``previous`` (same SHA-256):
    ``previous``'s when it was evaluated, else pending (evaluated, or copied from it, once it is:
    :func:`controlplane.experiments.services.evaluation.checkpoints_evaluate`)."""
    if previous.evaluation_status != Checkpoint.Evaluation.DONE:
        return {"evaluation_status": Checkpoint.Evaluation.PENDING}
    return {
        "test_accuracy": previous.test_accuracy,
        "test_loss": previous.test_loss,
        "evaluation_status": Checkpoint.Evaluation.DONE,
        "evaluated_at": previous.evaluated_at,
    }
