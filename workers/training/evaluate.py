"""Evaluate a task's model on the data set's fixed test split (torch imported lazily)."""

from __future__ import annotations

from pathlib import Path

from workers.protocol.messages import TaskRef


def evaluate(task: TaskRef, weights_path: Path | str, batch_size: int = 256) -> tuple[float, float]:
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
    import torch
    import torch.nn.functional as F

    from workers.fl.artifacts import load_model_weights
    from workers.training.datasets import load_split
    from workers.training.zoo import build_model

    model = build_model(task.architecture, task.num_classes, 0, task.input_shape)
    load_model_weights(model, weights_path)
    model.eval()
    x, y = load_split(task.dataset, "test")
    if len(y) == 0:
        raise ValueError(f"the {task.dataset.name} data set's test split is empty: nothing to evaluate")
    if tuple(x.shape[1:]) != tuple(task.input_shape):
        raise ValueError(
            f"task.input_shape={tuple(task.input_shape)} but the {task.dataset.name} data set's test samples "
            f"have shape {tuple(x.shape[1:])}"
        )
    if int(y.min()) < 0 or int(y.max()) >= task.num_classes:
        raise ValueError(
            f"task.num_classes={task.num_classes} but the {task.dataset.name} test split has labels from "
            f"{int(y.min())} to {int(y.max())}: labels must lie in [0, {task.num_classes})"
        )
    correct = 0
    loss_sum = 0.0
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            logits = model(x[start : start + batch_size])
            labels = y[start : start + batch_size]
            loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(dim=1) == labels).sum())
    return correct / len(y), loss_sum / len(y)
