"""Workload features of a model: the per-sample ``F_i`` of docs/DESIGN.md §1.

:func:`workload_features` counts, for one zoo architecture at one input shape:

- **FLOPs** with :class:`torch.utils.flop_counter.FlopCounterMode` (a multiply-add is 2 FLOPs;
  matrix products and convolutions only, element-wise work is not counted) on a batch of 2 in
  training mode, divided by 2. Batch 2 because BatchNorm cannot normalise a single sample whose
  feature map is 1×1; the counted ops are linear in the batch, so the division is exact.
  ``train_flops_per_sample`` is the forward plus the backward of the cross-entropy loss (no
  optimizer step). torch's formula for ``aten.convolution_backward`` ignores ``groups`` in the
  weight-gradient term, which overcounts depthwise convolutions by their channel count
  (MobileNetV3-Small's backward came out at 19× its forward); :func:`_conv_backward_flop`
  replaces it with the grouped count, making backward ≈ 2× forward for every architecture.
- **Parameters**: ``params`` counts the elements of ``model.parameters()`` (buffers such as
  BatchNorm running statistics are not parameters); ``param_bytes`` their bytes.
- **Activation bytes per sample**: the bytes of the tensors autograd saves for backward during
  the same batch-2 forward, seen through :func:`torch.autograd.graph.saved_tensors_hooks`.
  Several saved tensors can share one storage (views, an output saved by two consumers), so
  each distinct storage is counted once, at its full size; storages of parameters are excluded
  (they are ``param_bytes``). The input batch counts when a layer saves it (the first
  convolution does). Per-channel statistics BatchNorm saves do not grow with the batch and are
  negligible next to feature maps. This is the memory training holds beyond the weights,
  gradients and optimizer state, the part that scales with the batch size.

torch is imported inside the functions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from workers.protocol.messages import WorkloadFeatures
from workers.registry.models import MODEL_REGISTRY

_BATCH = 2
_MIN_SIDE = 32  # VGG16's five 2×2 poolings need at least 32 pixels per side
_MAX_SIDE = 1024


def _check_input_shape(input_shape: Any) -> tuple[int, int, int]:
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    if (
        len(shape) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) for v in shape)
        or shape[0] != 3
        or not all(_MIN_SIDE <= side <= _MAX_SIDE for side in shape[1:])
    ):
        raise ValueError(
            f"input_shape must be (3, height, width) with height and width integers in "
            f"[{_MIN_SIDE}, {_MAX_SIDE}] pixels, got {input_shape!r}"
        )
    return shape


def workload_features(
    architecture: str, num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32)
) -> WorkloadFeatures:
    """Measure a zoo model's per-sample workload (see the module docstring for the method).

    Results are cached per ``(architecture, num_classes, input_shape)``. The model runs on
    torch's meta device (shapes only), so even VGG16 at 224×224 takes a fraction of a second.

    Args:
        architecture: a :data:`~workers.registry.models.MODEL_REGISTRY` name.
        num_classes: classifier outputs, ``>= 2``.
        input_shape: ``(channels, height, width)`` of one sample; channels must be 3 and both
            sides in ``[32, 1024]`` pixels.

    Returns:
        The features: FLOPs per sample (2 per multiply-add; published GMACs are
        ``forward_flops_per_sample / 2e9``), parameters and their float32 bytes, activation
        bytes per sample.

    Raises:
        ValueError: for an unknown architecture (listing the allowed ones), ``num_classes < 2``
            or an input shape out of range.
    """
    MODEL_REGISTRY.check(architecture, field="architecture")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return _measure(architecture, num_classes, _check_input_shape(input_shape))


@functools.lru_cache(maxsize=64)
def _measure(architecture: str, num_classes: int, input_shape: tuple[int, int, int]) -> WorkloadFeatures:
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from workers.training.zoo import build_model

    # Shapes alone decide FLOPs and saved-tensor sizes, so the model runs on the meta device:
    # no arithmetic, no weight initialisation, no oneDNN warm-up (VGG16 at 224×224 takes
    # 0.1 s instead of seconds), and the numbers are identical to a CPU run.
    with torch.device("meta"):
        model = build_model(architecture, num_classes, 0, input_shape)
    model.train()
    params = list(model.parameters())
    # A storage's identity is its StorageImpl address (``_cdata``): views of one storage share
    # it, and unlike ``data_ptr()`` it is distinct on the meta device, which has no memory.
    param_storages = {p.untyped_storage()._cdata for p in params}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in param_storages:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    custom = {torch.ops.aten.convolution_backward: _conv_backward_flop}
    x = torch.empty(_BATCH, *input_shape, device="meta")
    y = torch.zeros(_BATCH, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False, custom_mapping=custom) as forward_counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = F.cross_entropy(model(x), y)
    with FlopCounterMode(display=False, custom_mapping=custom) as backward_counter:
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    forward = forward_counter.get_total_flops()
    backward = backward_counter.get_total_flops()
    return WorkloadFeatures(
        architecture=architecture,
        num_classes=num_classes,
        input_shape=input_shape,
        forward_flops_per_sample=forward / _BATCH,
        train_flops_per_sample=(forward + backward) / _BATCH,
        params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=sum(saved.values()) / _BATCH,
    )


def _conv_backward_flop(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: list[bool],
    out_shape: Any,
    **_: Any,
) -> int:
    """FLOPs of ``aten.convolution_backward`` with grouped convolutions counted right.

    Each requested gradient costs as many multiply-adds as the forward convolution
    (input gradient: a transposed convolution of ``grad_out`` with the weight; weight gradient:
    a correlation of the input with ``grad_out``). torch's formula gets the input-gradient term
    right but computes the weight-gradient term as if ``groups == 1``, ``groups`` times too
    much; here both terms are the forward count,
    ``2 · N · prod(conv spatial) · C_out · (C_in / groups) · prod(kernel)``
    (``w_shape = (C_out, C_in / groups, *kernel)``; the spatial size is the output's, or the
    input's for a transposed convolution).
    """
    from math import prod

    conv_spatial = (x_shape if transposed else grad_out_shape)[2:]
    forward = 2 * x_shape[0] * prod(conv_spatial) * prod(w_shape)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))
