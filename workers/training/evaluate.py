"""Evaluate a task's model on the data set's fixed test split (torch imported lazily).

The control worker evaluates a new global model of every task after every round, beside the
next round's training. Building the model and turning the test split into tensors cost more
than the forward passes on small data sets, so a process keeps both between calls
(:func:`evaluate` with ``cached=True``): the last :data:`MODEL_CACHE_SIZE` models, keyed by
architecture, classes and input shape, into which each call loads its weights; and the last
:data:`TEST_DATA_CACHE_SIZE` test splits as tensors, keyed by data set and its root's state on
disk (:func:`workers.registry.datasets.root_fingerprint`), shared by the models of tasks on the
same data. A weights file holds the whole state dict (``strict=True``), so a reused model gives
the same numbers as a freshly built one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.fl.artifacts import load_model_weights
from workers.protocol.messages import TaskRef
from workers.registry.datasets import root_fingerprint
from workers.training.datasets import load_split
from workers.training.zoo import build_model

if TYPE_CHECKING:
    import torch

MODEL_CACHE_SIZE = 4
"""Models a process keeps for evaluation (a run's tasks; the least recently used goes first)."""

TEST_DATA_CACHE_SIZE = 2
"""Test splits, as tensors, a process keeps for evaluation (CIFAR-10's is 123 MB)."""


@dataclass
class EvaluatorCacheInfo:
    """What the evaluation caches of this process did since the last :func:`evaluator_cache_clear`.

    Attributes:
        model_builds: models built (a miss of the model cache, or an uncached call).
        model_reuses: calls that loaded their weights into a kept model.
        data_loads: test splits turned into tensors and checked.
        data_reuses: calls that used kept test tensors.
    """

    model_builds: int = 0
    model_reuses: int = 0
    data_loads: int = 0
    data_reuses: int = 0


_models: OrderedDict[tuple[Any, ...], torch.nn.Module] = OrderedDict()
_test_data: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, int, int]] = OrderedDict()
_info = EvaluatorCacheInfo()
# One evaluation at a time per process: a kept model holds one set of weights at a time.
_lock = threading.Lock()


def evaluator_cache_info() -> EvaluatorCacheInfo:
    """A copy of this process's evaluation cache counters (:class:`EvaluatorCacheInfo`)."""
    with _lock:
        return EvaluatorCacheInfo(**vars(_info))


def evaluator_cache_clear() -> None:
    """Drop every kept model and test split and reset the counters."""
    global _info
    with _lock:
        _models.clear()
        _test_data.clear()
        _info = EvaluatorCacheInfo()


def evaluate(
    task: TaskRef, weights_path: Path | str, batch_size: int = 256, *, cached: bool = True
) -> tuple[float, float]:
    """Return the accuracy and mean cross-entropy of weights on the task's test split.

    The model is built by :func:`workers.training.zoo.build_model` at the task's classes and
    input shape, the weights loaded with ``strict=True`` and run in eval mode (BatchNorm uses its
    running statistics) without gradients, over the whole test split as the data set gives it
    (:func:`workers.training.datasets.load_split`, its size taken from the loaded split).

    Args:
        task: the task (architecture, classes, input shape, data set).
        weights_path: safetensors state dict of the model.
        batch_size: test samples per forward pass, ``>= 1`` (memory only; results do not
            depend on it beyond float rounding).
        cached: reuse this process's model of the same architecture, classes and input shape
            and its test tensors of the same data set, and keep them for the next call (module
            docstring); ``False`` builds and loads everything afresh and keeps nothing. Both
            give the same numbers.

    Returns:
        ``(accuracy, loss)``: accuracy in ``[0, 1]`` (fraction of test samples whose arg-max
        logit is the label) and the mean cross-entropy in nats per sample.

    Raises:
        ValueError: if ``batch_size < 1``, the test split is empty, its samples are not of
            ``task.input_shape`` or a label is not in ``[0, task.num_classes)``.
        FileNotFoundError: if ``weights_path`` does not exist.
        RuntimeError: if the weights do not match the architecture.
        workers.training.datasets.DatasetNotFoundError: if the data set's files are missing.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch
    import torch.nn.functional as F

    with _lock:
        x, y = _test_tensors(task, cached)
        model_key = (task.architecture, task.num_classes, tuple(task.input_shape))
        model = _model(task, model_key, cached)
        try:
            load_model_weights(model, weights_path)
        except BaseException:
            # A failed strict load may have copied some tensors in: never reuse that model.
            _models.pop(model_key, None)
            raise
        model.eval()
        correct = 0
        loss_sum = 0.0
        with torch.inference_mode():
            for start in range(0, len(y), batch_size):
                logits = model(x[start : start + batch_size])
                labels = y[start : start + batch_size]
                loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(dim=1) == labels).sum())
        return correct / len(y), loss_sum / len(y)


def _model(task: TaskRef, key: tuple[Any, ...], cached: bool) -> torch.nn.Module:
    """The kept model of ``key`` (moved to the newest), else a new one (kept when ``cached``,
    the least recently used dropped beyond :data:`MODEL_CACHE_SIZE`). Its weights are whatever
    the last call loaded: the caller loads its own, all of them."""
    if cached and key in _models:
        _models.move_to_end(key)
        _info.model_reuses += 1
        return _models[key]
    model = build_model(task.architecture, task.num_classes, 0, task.input_shape)
    _info.model_builds += 1
    if cached:
        _models[key] = model
        while len(_models) > MODEL_CACHE_SIZE:
            _models.popitem(last=False)
    return model


def _test_tensors(task: TaskRef, cached: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's test split as ``(x, y)`` tensors, checked against ``task.input_shape`` and
    ``task.num_classes`` (its label range is kept with it): the
    kept ones of its data set when ``cached`` (the key includes the root's state on disk, so a
    data set rewritten there is read again), else loaded afresh. Callers must not modify them.

    Raises:
        ValueError: the split is empty, its samples are not of ``task.input_shape`` or a label
            is not in ``[0, task.num_classes)``.
    """
    key = (task.dataset.name, task.dataset.root, root_fingerprint(task.dataset.root))
    entry = _test_data.get(key) if cached else None
    if entry is not None:
        _test_data.move_to_end(key)
        _info.data_reuses += 1
    else:
        x, y = load_split(task.dataset, "test")
        _info.data_loads += 1
        if len(y) == 0:
            raise ValueError(f"the {task.dataset.name} data set's test split is empty: nothing to evaluate")
        entry = (x, y, int(y.min()), int(y.max()))
        if cached:
            _test_data[key] = entry
            while len(_test_data) > TEST_DATA_CACHE_SIZE:
                _test_data.popitem(last=False)
    x, y, low, high = entry
    if tuple(x.shape[1:]) != tuple(task.input_shape):
        raise ValueError(
            f"task.input_shape={tuple(task.input_shape)} but the {task.dataset.name} data set's test samples "
            f"have shape {tuple(x.shape[1:])}"
        )
    if low < 0 or high >= task.num_classes:
        raise ValueError(
            f"task.num_classes={task.num_classes} but the {task.dataset.name} test split has labels from "
            f"{low} to {high}: labels must lie in [0, {task.num_classes})"
        )
    return x, y
