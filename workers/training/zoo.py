"""The model zoo: models of :data:`workers.registry.models.MODEL_REGISTRY`, built with random
(seeded) weights for a number of classes and an input shape.

The built-ins are the paper's DNNs, torchvision's unchanged architectures with ``weights=None``
(nothing is downloaded) and ``num_classes`` outputs, for images ``(3, H, W)``; plug-ins come from
the ``mtfl.models`` entry-point group and may take any input shape of 1 to 4 dimensions (a
feature vector ``(20,)``). torch is imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from workers.fl.artifacts import save_model_weights
from workers.registry.models import MODEL_REGISTRY, InputShape, Model

if TYPE_CHECKING:
    import torch

_MAX_SEED = 2**63 - 1


def _check(architecture: str, num_classes: int, seed: int) -> Model:
    record = MODEL_REGISTRY.get(architecture, field="architecture")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, 2**63 - 1], got {seed!r}")
    return record


def build_model(
    architecture: str, num_classes: int, seed: int, input_shape: InputShape = (3, 32, 32)
) -> torch.nn.Module:
    """Build a registered model with seeded random initialisation.

    The initialisation runs under ``torch.manual_seed(seed)`` inside
    ``torch.random.fork_rng``, so the same arguments give bit-identical weights and the caller's
    global RNG state is left untouched.

    Args:
        architecture: a :data:`~workers.registry.models.MODEL_REGISTRY` name (the built-ins are
            torchvision builder names, e.g. ``"resnet18"``).
        num_classes: outputs of the classifier, ``>= 2``.
        seed: initialisation seed in ``[0, 2**63 - 1]``.
        input_shape: the shape of one sample the model will see, 1 to 4 dimensions (an image
            ``(channels, height, width)``, a feature vector ``(features,)``).

    Returns:
        The model in training mode, on CPU (or the device of an enclosing ``torch.device``
        context), float32. Input ``(N, *input_shape)`` (the built-ins take ``N×3×32×32`` or
        larger), output logits ``N×num_classes``.

    Raises:
        ValueError: for an unknown architecture (naming the ``architecture`` field and listing
            the allowed ones), ``num_classes < 2``, a seed out of range, or an input shape the
            model cannot take.
    """
    record = _check(architecture, num_classes, seed)
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # tuple(): a shape read from JSON arrives as a list; the builders take a tuple.
        model: torch.nn.Module = record.build(num_classes, cast(InputShape, tuple(input_shape)))
    return model


def write_initial_weights(
    architecture: str,
    num_classes: int,
    seed: int,
    path: Path | str,
    input_shape: InputShape = (3, 32, 32),
) -> str:
    """Build the seeded initial model and write its state dict as safetensors.

    Args:
        architecture: as in :func:`build_model`.
        num_classes: as in :func:`build_model`.
        seed: as in :func:`build_model`.
        path: destination file (written atomically; parent folders created).
        input_shape: as in :func:`build_model` (a plug-in's layer sizes may follow from it).

    Returns:
        The file's hex SHA-256.

    Raises:
        ValueError: as :func:`build_model`.
    """
    return save_model_weights(build_model(architecture, num_classes, seed, input_shape), path)
