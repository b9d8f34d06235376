"""Evaluating a global model on its task's test split, in the control worker."""

from __future__ import annotations

import gc
from pathlib import Path

from workers.protocol.messages import TaskRef


def model_evaluate(task: TaskRef, weights_path: Path | str) -> tuple[float, float]:
    """Test accuracy (0–1) and mean test loss of the weights at ``weights_path``.

    Calls :func:`workers.training.evaluate.evaluate` (torch is imported on first use, so a web process
    that never evaluates never loads it), then, once per process, keeps the garbage collector
    off the objects that import left behind (:func:`_freeze_long_lived`).

    Raises:
        FileNotFoundError, ValueError: as :func:`workers.training.evaluate.evaluate` (missing or
            mismatched weights, a bad batch size).
    """
    from workers.training.evaluate import evaluate

    result = evaluate(task, weights_path)
    _freeze_long_lived()
    return result


_FROZEN = False


def _freeze_long_lived() -> None:
    """Keep the garbage collector off the objects the control worker holds for its whole life.

    Evaluating a model imports torch and torchvision: some 400,000 objects that live as long
    as the process, which every full collection walked again; recording a round of 1,000
    devices set off several. After the first evaluation the garbage is collected once and
    everything left is moved to the permanent generation (``gc.freeze``, what long-lived Python
    servers do after start-up). A round also allocates hundreds of thousands of objects that
    live until it is recorded; with CPython's default thresholds (700, 10, 10) they went through
    hundreds of young collections and were promoted and scanned again, so the young generation
    is let grow to 20,000 objects first (``gc.set_threshold``). Objects made later are
    collected as before.
    """
    global _FROZEN
    if _FROZEN:
        return
    _FROZEN = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
