"""Aggregating a round: each task's device models become the next global model through the
aggregator registry (:data:`workers.registry.aggregators.AGGREGATOR_REGISTRY`), which is then evaluated
and kept as the round's checkpoint."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Checkpoint, Round
from controlplane.experiments.services.evaluation import model_evaluate
from workers.fl.artifacts import ArtifactStore, global_weights_key
from workers.fl.fedavg import NoSamplesError, load_state, save_state
from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext

DEFAULT_AGGREGATOR = "fedavg"
"""The aggregator every run uses (a name of :data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY`)."""


def task_model_aggregate(
    *,
    store: ArtifactStore,
    contributions: Iterable[Assignment],
    previous: Checkpoint,
    key: str,
    aggregator: str = DEFAULT_AGGREGATOR,
    options: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """Aggregate one task's device models of a round and write the result under ``key``.

    With ``fedavg``: ``W ← Σ_j n_j W_j / Σ_j n_j``, ``n_j`` the device's shard size
    (McMahan et al. 2017). Weights files with the same SHA-256 hold the same tensors, so each
    distinct one is read once and added with the sum of its devices' samples; the aggregation
    holds one device model in memory at a time. When every device reports the previous global
    model unchanged (the ``simulated`` backend passes it through) and the aggregator does not
    read the previous model (``uses_previous``), the result is that model: the previous file is
    kept and nothing is read or written.

    Args:
        contributions: the task's assignments that succeeded (``weights_path``,
            ``weights_sha256`` and ``samples`` read), in device order.
        previous: the task's current global model.
        key: the artifact key of the new global model.
        aggregator: a name of :data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY`.
        options: the aggregator's options (plain JSON).

    Returns:
        ``(artifact key, hex SHA-256)`` of the new global model (``previous``'s when kept).

    Raises:
        NoSamplesError: every contribution has 0 samples (or there is none).
        workers.registry.base.UnknownEntryError: no aggregator of that name.
        FileNotFoundError, ValueError: a weights file is missing or does not match the others.
    """
    record = AGGREGATOR_REGISTRY.get(aggregator, field="aggregator")
    contributions = list(contributions)
    if sum(a.samples for a in contributions) == 0:
        raise NoSamplesError("every device that trained this task holds 0 samples of it")
    groups: dict[str, list[Assignment]] = {}
    for a in contributions:
        groups.setdefault(a.weights_sha256 or f"path:{a.weights_path}", []).append(a)
    if (
        not record.uses_previous
        and len(groups) == 1
        and contributions[0].weights_sha256
        and contributions[0].weights_sha256 == previous.sha256
    ):
        return previous.artifact_path, previous.sha256
    aggregation = record.start(
        AggregationContext(previous=lambda: load_state(store.path(previous.artifact_path)), options=dict(options or {}))
    )
    for members in groups.values():
        aggregation.add(load_state(store.path(members[0].weights_path)), sum(a.samples for a in members))
    return key, save_state(aggregation.result(), store.path(key))


def round_models_aggregate(
    *, rnd: Round, usable: Iterable[Assignment], latest: Mapping[int, Checkpoint], store: ArtifactStore
) -> tuple[list[Checkpoint], list[str]]:
    """The new global model of every task of ``rnd``'s run, evaluated on its test split.

    Args:
        usable: the round's assignments that may enter the aggregate (succeeded, on devices
            whose whole round succeeded, with weights that passed their checks).
        latest: ``{task_id: Checkpoint}``, each task's current global model.

    Returns:
        ``(checkpoints, flags)``: one unsaved :class:`Checkpoint` per task of the experiment;
        a task no usable device trained keeps its previous model (``kept_previous``), with a
        flag line saying so. A model identical to the previous one (same SHA-256) keeps its
        test results instead of being evaluated again.

    Raises:
        FileNotFoundError, ValueError: as :func:`task_model_aggregate`.
    """
    run = rnd.run
    contributions_of: dict[int, list[Assignment]] = defaultdict(list)
    for a in usable:
        contributions_of[a.task_id].append(a)
    checkpoints: list[Checkpoint] = []
    flags: list[str] = []
    for task in run.experiment.tasks.order_by("id"):
        previous = latest[task.id]
        try:
            path, sha = task_model_aggregate(
                store=store,
                contributions=contributions_of[task.id],
                previous=previous,
                key=global_weights_key(run.id, task.id, rnd.index),
            )
        except NoSamplesError:
            flags.append(
                f"task {task.name}: no device that succeeded trained it this round; the previous global model was kept"
            )
            checkpoints.append(
                Checkpoint(
                    run=run,
                    task=task,
                    round=rnd,
                    artifact_path=previous.artifact_path,
                    sha256=previous.sha256,
                    test_accuracy=previous.test_accuracy,
                    test_loss=previous.test_loss,
                    kept_previous=True,
                )
            )
            continue
        if sha == previous.sha256:  # the same model: its test results are the previous ones
            accuracy, loss = previous.test_accuracy, previous.test_loss
        else:
            accuracy, loss = model_evaluate(selectors.task_ref(task), store.path(path))
        checkpoints.append(
            Checkpoint(
                run=run, task=task, round=rnd, artifact_path=path, sha256=sha, test_accuracy=accuracy, test_loss=loss
            )
        )
    return checkpoints, flags
