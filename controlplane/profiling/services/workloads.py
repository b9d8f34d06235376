"""Workload features of models, computed once per (architecture, classes, input shape) (torch, in
the control worker) and cached."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction

from controlplane.celery import app
from controlplane.profiling.models import ModelWorkload
from workers.protocol.messages import DEFAULT_INPUT_SHAPE
from workers.protocol.queues import CONTROL_QUEUE, TaskName

INPUT_SHAPE = list(DEFAULT_INPUT_SHAPE)
"""The zoo's input shape, ``[3, 32, 32]``: the shape a workload is taken at unless one is given."""


def _shape(input_shape: Sequence[int] | None) -> list[int]:
    return [int(d) for d in input_shape] if input_shape else list(INPUT_SHAPE)


def workload_get(
    *, architecture: str, num_classes: int, input_shape: Sequence[int] | None = None
) -> ModelWorkload | None:
    """The cached features of a model at ``num_classes`` and ``input_shape`` (default the zoo's
    3×32×32), or ``None`` if not computed."""
    return ModelWorkload.objects.filter(
        architecture=architecture, num_classes=num_classes, input_shape=_shape(input_shape)
    ).first()


def workload_ensure(*, architecture: str, num_classes: int, input_shape: Sequence[int] | None = None) -> ModelWorkload:
    """Return the cached features, computing them first if needed.

    This imports torch and counts the model's FLOPs and operations per step at ``input_shape``
    (a second or two for the zoo's models at 32×32): call it from the control worker or a
    command, never from a web request. A row cached before operations were counted
    (``ops_per_step`` null) gets them now.
    """
    shape = _shape(input_shape)
    existing = workload_get(architecture=architecture, num_classes=num_classes, input_shape=shape)
    if existing is not None and existing.ops_per_step is not None:
        return existing
    # deferred: torch is imported only where features are computed (never in the web process)
    from workers.training.features import workload_features

    f = workload_features(architecture, num_classes, tuple(shape))
    if existing is not None:
        ModelWorkload.objects.filter(id=existing.id, ops_per_step__isnull=True).update(ops_per_step=f.ops_per_step)
        existing.refresh_from_db(fields=["ops_per_step"])
        return existing
    try:
        with transaction.atomic():
            return ModelWorkload.objects.create(
                architecture=architecture,
                num_classes=num_classes,
                input_shape=shape,
                forward_flops_per_sample=f.forward_flops_per_sample,
                train_flops_per_sample=f.train_flops_per_sample,
                params=f.params,
                param_bytes=f.param_bytes,
                activation_bytes_per_sample=f.activation_bytes_per_sample,
                ops_per_step=f.ops_per_step,
            )
    except IntegrityError:  # computed concurrently by another worker: keep theirs
        found = workload_get(architecture=architecture, num_classes=num_classes, input_shape=shape)
        assert found is not None
        return found


def workload_request(*, architecture: str, num_classes: int, input_shape: Sequence[int] | None = None) -> None:
    """Have the control worker compute a model's features at ``num_classes`` and ``input_shape``
    after this transaction commits (a no-op if they are cached, operations per step included)."""
    shape = _shape(input_shape)
    cached = workload_get(architecture=architecture, num_classes=num_classes, input_shape=shape)
    if cached is not None and cached.ops_per_step is not None:
        return
    transaction.on_commit(
        lambda: app.send_task(TaskName.TASK_FEATURES, args=[architecture, num_classes, shape], queue=CONTROL_QUEUE)
    )
