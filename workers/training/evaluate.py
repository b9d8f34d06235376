"""Evaluate a task's model on the data set's fixed test split (torch imported lazily)."""

from __future__ import annotations

from pathlib import Path

from workers.protocol.messages import TaskRef


def evaluate(task: TaskRef, weights_path: Path | str, batch_size: int = 256) -> tuple[float, float]:
    """Return the accuracy and mean cross-entropy of weights on the task's test split.

    The model is built by :func:`workers.training.zoo.build_model`, the weights loaded with
    ``strict=True`` and run in eval mode (BatchNorm uses its running statistics) without
    gradients.

    Args:
        task: the task (architecture, classes, data set).
        weights_path: safetensors state dict of the model.
        batch_size: test samples per forward pass, ``>= 1`` (memory only; results do not
            depend on it beyond float rounding).

    Returns:
        ``(accuracy, loss)``: accuracy in ``[0, 1]`` (fraction of test samples whose arg-max
        logit is the label) and the mean cross-entropy in nats per sample.

    Raises:
        ValueError: if ``batch_size < 1``.
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

    model = build_model(task.architecture, task.num_classes, 0)
    load_model_weights(model, weights_path)
    model.eval()
    x, y = load_split(task.dataset, "test")
    correct = 0
    loss_sum = 0.0
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            logits = model(x[start : start + batch_size])
            labels = y[start : start + batch_size]
            loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(dim=1) == labels).sum())
    return correct / len(y), loss_sum / len(y)
