"""Workload features of models, computed once (torch, in the control worker) and cached."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from controlplane.celery import app
from controlplane.profiling.models import ModelWorkload
from workers.protocol.queues import CONTROL_QUEUE, TaskName

INPUT_SHAPE = [3, 32, 32]


def workload_get(*, architecture: str, num_classes: int) -> ModelWorkload | None:
    """The cached features of a model at the zoo's 3×32×32 input, or ``None`` if not computed."""
    return ModelWorkload.objects.filter(
        architecture=architecture, num_classes=num_classes, input_shape=INPUT_SHAPE
    ).first()


def workload_ensure(*, architecture: str, num_classes: int) -> ModelWorkload:
    """Return the cached features, computing them first if needed.

    This imports torch and runs the model on a batch of 2 (about a second for the zoo's models
    at 32×32): call it from the control worker or a command, never from a web request.
    """
    existing = workload_get(architecture=architecture, num_classes=num_classes)
    if existing is not None:
        return existing
    from workers.profiling.features import workload_features

    f = workload_features(architecture, num_classes, tuple(INPUT_SHAPE))
    try:
        with transaction.atomic():
            return ModelWorkload.objects.create(
                architecture=architecture,
                num_classes=num_classes,
                input_shape=INPUT_SHAPE,
                forward_flops_per_sample=f.forward_flops_per_sample,
                train_flops_per_sample=f.train_flops_per_sample,
                params=f.params,
                param_bytes=f.param_bytes,
                activation_bytes_per_sample=f.activation_bytes_per_sample,
            )
    except IntegrityError:  # computed concurrently by another worker: keep theirs
        return workload_get(architecture=architecture, num_classes=num_classes)


def workload_request(*, architecture: str, num_classes: int) -> None:
    """Have the control worker compute a model's features after this transaction commits
    (a no-op if they are cached)."""
    if workload_get(architecture=architecture, num_classes=num_classes) is not None:
        return
    transaction.on_commit(
        lambda: app.send_task(TaskName.TASK_FEATURES, args=[architecture, num_classes], queue=CONTROL_QUEUE)
    )
