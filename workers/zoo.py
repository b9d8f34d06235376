"""The model zoo: the paper's DNNs, built by torchvision with random (seeded) weights.

Models are torchvision's unchanged architectures with ``weights=None`` (nothing is downloaded)
and ``num_classes`` outputs. They accept 3×32×32 inputs (CIFAR-10 size) as they are: the
adaptive average pooling before each classifier absorbs the small spatial size. torch is
imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from workers.messages import ARCHITECTURES

if TYPE_CHECKING:
    import torch

_MAX_SEED = 2**63 - 1


def _check(architecture: str, num_classes: int, seed: int) -> None:
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"architecture {architecture!r} is unknown; allowed: {', '.join(ARCHITECTURES)}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, 2**63 - 1], got {seed!r}")


def build_model(architecture: str, num_classes: int, seed: int) -> torch.nn.Module:
    """Build a torchvision model with seeded random initialisation.

    The initialisation runs under ``torch.manual_seed(seed)`` inside
    ``torch.random.fork_rng``, so the same arguments give bit-identical weights and the caller's
    global RNG state is left untouched.

    Args:
        architecture: one of :data:`workers.messages.ARCHITECTURES` (the torchvision builder
            name, e.g. ``"resnet18"``).
        num_classes: outputs of the classifier, ``>= 2``.
        seed: initialisation seed in ``[0, 2**63 - 1]``.

    Returns:
        The model in training mode, on CPU, float32. Input ``N×3×32×32`` (or larger), output
        logits ``N×num_classes``.

    Raises:
        ValueError: for an unknown architecture (listing the allowed ones), ``num_classes < 2``
            or a seed out of range.
    """
    _check(architecture, num_classes, seed)
    import torch
    import torchvision

    builder = getattr(torchvision.models, architecture)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = builder(weights=None, num_classes=num_classes)
    return model


def write_initial_weights(architecture: str, num_classes: int, seed: int, path: Path | str) -> str:
    """Build the seeded initial model and write its state dict as safetensors.

    Args:
        architecture: as in :func:`build_model`.
        num_classes: as in :func:`build_model`.
        seed: as in :func:`build_model`.
        path: destination file (written atomically; parent folders created).

    Returns:
        The file's hex SHA-256.

    Raises:
        ValueError: as :func:`build_model`.
    """
    from workers.artifacts import save_model_weights

    return save_model_weights(build_model(architecture, num_classes, seed), path)
