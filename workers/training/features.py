"""Workload features of a model: the per-sample ``F_i`` of docs/DESIGN.md §1.

:func:`workload_features` counts, for one registered architecture (a zoo model or a plug-in) at
one input shape (an image ``(C, H, W)``, a feature vector ``(F,)``, any 1 to 4 dimensions):

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
- **Operations per training step** (issue 31 item 3, the host launch term): the aten operations
  one steady training step dispatches below autograd — forward, cross-entropy, backward and an
  SGD step (momentum 0.9, weight decay, the trainer's default optimizer) — counted with a
  :class:`torch.utils._python_dispatch.TorchDispatchMode` on the same batch-2 model, after one
  untimed step has created the momentum buffers. The optimizer runs **per parameter**
  (``foreach=False``: about four operations per parameter tensor; a ``foreach`` step would issue
  a handful for all of them). Pure aliasing operations (``op.is_view``: ``detach``, ``view``,
  ``t``, …) are left out: they launch no kernel and allocate nothing. Composite operations are
  seen decomposed, as the GPU runs them (``linear`` is ``t`` + ``addmm``). At 32×32 with 10
  classes this gives resnet18 435, mobilenet_v3_large 1,218, shufflenet_v2_x1_0 1,187,
  against 480, 1,281 and 1,397 operations counted per step on an H200 (issue 31). The count
  does not depend on the batch size.

Where it runs (issue 21 item 1): on torch's **meta device** (shapes only: no arithmetic, no
weight initialisation; VGG16 at 224×224 takes 0.1 s) when the model allows it, else on the
**CPU** with random inputs (standard normal, seed 0) and seeded weights. A model falls back to
the CPU when anything on the meta device fails: a forward that reads values (``.item()``,
``.tolist()``, ``bool(tensor)`` in Python control flow) or an operator without a meta kernel.
The counts are the same on both devices for a model whose work does not depend on values.

torch is imported inside the functions.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from math import prod
from typing import TYPE_CHECKING, Any

from workers.protocol.messages import WorkloadFeatures
from workers.registry.models import MODEL_REGISTRY
from workers.training.zoo import build_model

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_BATCH = 2
_MAX_DIMENSIONS = 4
_MAX_SIDE = 65_536  # as the wire's InputShapeField


def check_input_shape(input_shape: Any) -> tuple[int, ...]:
    """Return ``input_shape`` as a tuple if it is the shape of one sample.

    Raises:
        ValueError: naming ``input_shape``, unless it is 1 to 4 integers in ``[1, 65536]``.
    """
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    if (
        not 1 <= len(shape) <= _MAX_DIMENSIONS
        or any(isinstance(v, bool) or not isinstance(v, int) for v in shape)
        or not all(1 <= side <= _MAX_SIDE for side in shape)
    ):
        raise ValueError(
            f"input_shape must be 1 to {_MAX_DIMENSIONS} integers in [1, {_MAX_SIDE}] "
            f"(e.g. (3, 32, 32) or (20,)), got {input_shape!r}"
        )
    return shape


def workload_features(
    architecture: str, num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32)
) -> WorkloadFeatures:
    """Measure a registered model's per-sample workload (see the module docstring for the method).

    Results are cached per ``(architecture, num_classes, input_shape)``. The model runs on
    torch's meta device when it allows it (a fraction of a second even for VGG16 at 224×224),
    else on the CPU with a batch of 2 random samples.

    Args:
        architecture: a :data:`~workers.registry.models.MODEL_REGISTRY` name.
        num_classes: classifier outputs, ``>= 2``.
        input_shape: the shape of one sample, 1 to 4 dimensions (``(3, 32, 32)``, ``(20,)``).

    Returns:
        The features: FLOPs per sample (2 per multiply-add; published GMACs are
        ``forward_flops_per_sample / 2e9``), parameters and their float32 bytes, activation
        bytes per sample, operations one training step dispatches (``ops_per_step``).

    Raises:
        ValueError: for an unknown architecture (listing the allowed ones), ``num_classes < 2``,
            an input shape that is not 1 to 4 positive integers, or a model that cannot take
            the shape (naming ``input_shape``: its builder refused it, its forward failed on the
            CPU as well, or its output is not ``(batch, num_classes)``).
    """
    return _measure(*_check(architecture, num_classes, input_shape))[0]


def leaf_module_count(architecture: str, num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32)) -> int:
    """Count the model's leaf modules (convolutions, norms, activations, …), each launching
    about one kernel per pass; computed and cached with :func:`workload_features`.

    Raises:
        ValueError: as :func:`workload_features`.
    """
    return _measure(*_check(architecture, num_classes, input_shape))[1]


def training_ops_per_step(architecture: str, num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32)) -> int:
    """Count the operations one training step of the model dispatches: forward, cross-entropy,
    backward and a per-parameter SGD step (see the module docstring for what is counted and the
    H200 reference counts). Each costs the host roughly 20 µs on an eager GPU loop, so
    ``ops_per_step × host seconds per op`` is a step's host launch time. Independent of the batch
    size; computed and cached with :func:`workload_features`.

    Raises:
        ValueError: as :func:`workload_features`.
    """
    ops = _measure(*_check(architecture, num_classes, input_shape))[0].ops_per_step
    assert ops is not None  # _count always fills it
    return ops


def _check(architecture: str, num_classes: int, input_shape: Any) -> tuple[str, int, tuple[int, ...]]:
    MODEL_REGISTRY.check(architecture, field="architecture")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return architecture, num_classes, check_input_shape(input_shape)


@functools.lru_cache(maxsize=64)
def _measure(architecture: str, num_classes: int, input_shape: tuple[int, ...]) -> tuple[WorkloadFeatures, int]:
    try:
        return _count(architecture, num_classes, input_shape, "meta")
    except _Refused as exc:
        raise exc.error from None
    except Exception as exc:  # any failure on meta: values read in forward, an op without a meta kernel
        log.info(
            "workload features of %s at %s: the meta device failed (%s: %s); counting on the CPU",
            architecture,
            input_shape,
            type(exc).__name__,
            exc,
        )
    try:
        return _count(architecture, num_classes, input_shape, "cpu")
    except _Refused as exc:
        raise exc.error from None
    except Exception as exc:
        raise ValueError(
            f"input_shape: {architecture} failed to train on a batch of shape {(_BATCH, *input_shape)} "
            f"with {num_classes} classes: {type(exc).__name__}: {exc}"
        ) from exc


class _Refused(Exception):
    """A definite refusal, the same on any device: the builder raised ``ValueError`` (a shape it
    cannot take) or the outputs are not ``(batch, num_classes)``. No point retrying on the CPU."""

    def __init__(self, error: ValueError) -> None:
        super().__init__(str(error))
        self.error = error


def _count(
    architecture: str, num_classes: int, input_shape: tuple[int, ...], device_name: str
) -> tuple[WorkloadFeatures, int]:
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    # On the meta device shapes alone decide FLOPs and saved-tensor sizes: no arithmetic, no
    # weight initialisation, no oneDNN warm-up, and the numbers are identical to a CPU run.
    device = torch.device(device_name)
    try:
        with device:
            model = build_model(architecture, num_classes, 0, input_shape)
    except ValueError as exc:
        raise _Refused(exc) from exc
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
    if device.type == "meta":
        x = torch.empty(_BATCH, *input_shape, device=device)
        y = torch.zeros(_BATCH, dtype=torch.long, device=device)
    else:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(_BATCH, *input_shape, generator=generator)
        y = torch.randint(0, num_classes, (_BATCH,), generator=generator)
    with FlopCounterMode(display=False, custom_mapping=custom) as forward_counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logits = model(x)
            if tuple(logits.shape) != (_BATCH, num_classes):
                raise _Refused(
                    ValueError(
                        f"input_shape: {architecture} gave outputs of shape {tuple(logits.shape)} for a batch of "
                        f"shape {(_BATCH, *input_shape)}; expected ({_BATCH}, {num_classes}) logits"
                    )
                )
            loss = F.cross_entropy(logits, y)
    with FlopCounterMode(display=False, custom_mapping=custom) as backward_counter:
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    forward = forward_counter.get_total_flops()
    backward = backward_counter.get_total_flops()
    ops_per_step = _steady_step_ops(model, x, y)
    features = WorkloadFeatures(
        architecture=architecture,
        num_classes=num_classes,
        input_shape=input_shape,
        forward_flops_per_sample=forward / _BATCH,
        train_flops_per_sample=(forward + backward) / _BATCH,
        params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=sum(saved.values()) / _BATCH,
        ops_per_step=ops_per_step,
    )
    layers = sum(1 for module in model.modules() if next(module.children(), None) is None)
    return features, layers


def _steady_step_ops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Operations (non-view aten calls) of one SGD training step of ``model`` on ``(x, y)``,
    counted on the second step: the first creates the momentum buffers (a ``clone`` per
    parameter instead of the steady ``mul_`` + ``add_``). ``model`` has gradients from one
    backward already."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves the mode unannotated
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.ops = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            if not func.is_view:  # aliases launch no kernel and allocate nothing
                self.ops += 1
            return func(*args, **(kwargs or {}))

    # the trainer's default optimizer (OptimizerConfig), per parameter as the CPU runs it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, foreach=False)
    optimizer.step()
    counter = OpCounter()
    with counter:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
    return counter.ops


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
    conv_spatial = (x_shape if transposed else grad_out_shape)[2:]
    forward = 2 * x_shape[0] * prod(conv_spatial) * prod(w_shape)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))
