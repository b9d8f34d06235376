"""The models' entry points (group ``mtfl.models``): ``tabular_mlp`` and ``tabular_mlp_wide``, the
same residual MLP at two sizes (23 times apart in training FLOPs per sample), so that an
experiment with both shows ``flops_share`` giving them different shares.

mtfl-lab calls a builder with a task's number of classes and its input shape (the
shape of one sample of the task's data set: ``(20,)`` for the data of
:mod:`mtfl_custom_task.make_data`), in every process that builds the model: the task check at
creation, the trainers on each agent, the profiler, and the control worker that evaluates global
models. torch is imported only when a model is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mtfl_custom_task.tabular_mlp import TabularMLP

SIZES: dict[str, tuple[int, int]] = {"tabular_mlp": (64, 2), "tabular_mlp_wide": (256, 3)}
"""Hidden width ``d`` and number of residual blocks of each registered model."""


def build_tabular_mlp(num_classes: int, input_shape: tuple[int, ...]) -> TabularMLP:
    """Residual MLP on feature vectors, width 64, 2 blocks (Gorishniy et al. 2021).

    The first line is the model's label in mtfl-lab's forms; see :func:`_build` for the rest.
    """
    return _build("tabular_mlp", num_classes, input_shape)


def build_tabular_mlp_wide(num_classes: int, input_shape: tuple[int, ...]) -> TabularMLP:
    """Residual MLP on feature vectors, width 256, 3 blocks (Gorishniy et al. 2021).

    The first line is the model's label in mtfl-lab's forms; see :func:`_build` for the rest.
    """
    return _build("tabular_mlp_wide", num_classes, input_shape)


def _build(name: str, num_classes: int, input_shape: tuple[int, ...]) -> TabularMLP:
    """A freshly initialised :class:`~mtfl_custom_task.tabular_mlp.TabularMLP` of the size of ``name``.

    Args:
        num_classes: classes of the task, at least 2; the output is ``(N, num_classes)`` logits.
        input_shape: the shape of one sample, ``(F,)`` with ``F >= 1`` features: the model takes
            ``(N, F)`` float32 batches.

    Raises:
        ValueError: ``input_shape`` is not one positive dimension (images, say, are refused, with
            the shape given), or ``num_classes`` is below 2.
    """
    shape = tuple(input_shape)
    if len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 1:
        raise ValueError(
            f"input_shape: {name} takes one feature dimension (F,) with F >= 1, got {shape!r}; "
            "flatten or choose another model for images"
        )
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} is out of range: {name} needs at least 2")
    from mtfl_custom_task.tabular_mlp import TabularMLP

    width, depth = SIZES[name]
    return TabularMLP(in_features=shape[0], num_classes=num_classes, width=width, depth=depth)
