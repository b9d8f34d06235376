"""The model registry: which network a task trains, by the name stored on the task.

A :class:`Model` record builds a fresh, randomly initialised ``torch.nn.Module`` for a number of
classes and an input shape; :func:`workers.training.zoo.build_model` seeds the initialisation and is what
the trainers call. Built-ins are torchvision's unchanged architectures with ``weights=None``
(nothing is downloaded); they accept 3×32×32 inputs as they are, because the adaptive average
pooling before each classifier absorbs the small spatial size.

Plug-ins register in the ``mtfl.models`` entry-point group. The entry point names the builder
itself, a callable ``(num_classes: int, input_shape: tuple[int, ...]) -> torch.nn.Module``
(issue 21); the registry wraps it into a :class:`Model` under the entry point's name, labelled
with the first line of its docstring and the distribution that provides it. A :class:`Model`
record is accepted as the entry point's object too.

Importing this module imports neither torch nor torchvision: builders import them when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.registry.base import Registry, plugin_label

InputShape = tuple[int, ...]
"""The shape of one sample, 1 to 4 dimensions: ``(channels, height, width)`` for an image,
``(features,)`` for tabular data."""

ModelBuilder = Callable[[int, InputShape], Any]
"""``(num_classes, input_shape) -> torch.nn.Module`` in training mode, on CPU, float32, whose
output for an ``(N, *input_shape)`` input is ``N×num_classes`` logits. Raises ``ValueError`` for
an input shape it cannot take."""


@dataclass(frozen=True)
class Model:
    """A registered model architecture.

    Attributes:
        name: stored on a task and carried in messages (``"resnet18"``).
        label: one line for forms and docs.
        build: the :data:`ModelBuilder`; it draws its initial weights from torch's global RNG,
            which :func:`workers.training.zoo.build_model` seeds.
    """

    name: str
    label: str
    build: ModelBuilder


def model_from_entry_point(name: str, build: Any, source: str) -> Model:
    """Wrap a plug-in's builder (an ``mtfl.models`` entry point's callable) into a :class:`Model`.

    Args:
        name: the entry point's name, which becomes the architecture name.
        build: the loaded :data:`ModelBuilder`; it is not called here.
        source: ``"<distribution> <version>"`` of the package providing it.
    """
    return Model(name, plugin_label(name, build, source), build)


MODEL_REGISTRY: Registry[Model] = Registry("model", "mtfl.models", Model, model_from_entry_point)
"""Every model a task may use; plug-ins register in the ``mtfl.models`` entry-point group."""


def torchvision_builder(name: str) -> ModelBuilder:
    """A builder for ``torchvision.models.<name>(weights=None, num_classes=...)``.

    The builder refuses inputs that are not images of 3 channels, ``(3, height, width)``
    (``ValueError`` naming ``input_shape``); any height and width from 32 pixels up work with
    the built-in architectures.
    """

    def build(num_classes: int, input_shape: InputShape) -> Any:
        if len(input_shape) != 3:
            raise ValueError(f"input_shape: {name} takes images of shape (3, height, width), got {tuple(input_shape)}")
        if input_shape[0] != 3:
            raise ValueError(f"input_shape: {name} takes 3 input channels, got {input_shape[0]}")
        # deferred: torchvision (and torch) load only when a model is built
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    return build


for _name, _label in (
    ("resnet18", "ResNet-18 (He et al. 2016)"),
    ("resnet50", "ResNet-50 (He et al. 2016)"),
    ("resnet101", "ResNet-101 (He et al. 2016)"),
    ("vgg16", "VGG-16 (Simonyan and Zisserman 2015)"),
    ("mobilenet_v3_small", "MobileNetV3-Small (Howard et al. 2019)"),
    ("mobilenet_v3_large", "MobileNetV3-Large (Howard et al. 2019)"),
    ("shufflenet_v2_x1_0", "ShuffleNetV2 1.0× (Ma et al. 2018)"),
    ("densenet121", "DenseNet-121 (Huang et al. 2017)"),
):
    MODEL_REGISTRY.register(Model(_name, f"{_name} — {_label}", torchvision_builder(_name)))
