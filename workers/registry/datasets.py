"""The data set registry: what a task trains on, by the name stored on the task.

A :class:`Dataset` record gives the data set's sizes without loading it (:class:`DatasetInfo`)
and a loader that returns selected samples of a split as normalised tensors;
:func:`workers.training.datasets.load_split` checks the split and the indices and calls it. Built-ins
(:mod:`workers.training.dataset_sources`): ``digits`` (scikit-learn's handwritten digits, shipped with
scikit-learn, so it works offline) and ``cifar10`` (read from a local folder; nothing is ever
downloaded). Plug-ins register in the ``mtfl.datasets`` entry-point group.

Importing this module imports neither torch nor scikit-learn: loaders import them when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from workers.registry.base import Registry

SPLITS: tuple[str, ...] = ("train", "test")
"""The splits every data set has."""


@dataclass(frozen=True)
class DatasetInfo:
    """Sizes and shapes of a data set.

    Attributes:
        name: data set name (a :data:`DATASET_REGISTRY` name).
        num_classes: label values are ``0 .. num_classes - 1``.
        train_size: samples in the training split.
        test_size: samples in the test split.
        image_shape: ``(channels, height, width)`` of one sample as the loader returns it.
    """

    name: str
    num_classes: int
    train_size: int
    test_size: int
    image_shape: tuple[int, int, int] = (3, 32, 32)


DatasetLoader = Callable[[str | None, str, np.ndarray], tuple[Any, Any]]
"""``(root, split, indices) -> (x, y)``: ``root`` is the task's local folder (``None`` when
unset), ``split`` one of :data:`SPLITS`, ``indices`` an int64 array of shape ``(n,)`` of positions
already checked to lie in the split. Returns ``x`` float32 ``n×C×H×W`` (the info's
``image_shape``), normalised, and ``y`` int64 ``(n,)`` in ``[0, num_classes)``: fresh tensors
the caller may modify. Raises :class:`workers.training.dataset_sources.DatasetNotFoundError` when the
files are not where ``root`` says."""


@dataclass(frozen=True)
class Dataset:
    """A registered data set.

    Attributes:
        name: stored on a task and carried in messages (``"digits"``).
        label: one line for forms and docs.
        info: its sizes, known without loading it.
        load: the :data:`DatasetLoader`.
        needs_root: the data is read from the task's ``dataset_root`` folder.
    """

    name: str
    label: str
    info: DatasetInfo
    load: DatasetLoader
    needs_root: bool = False


DATASET_REGISTRY: Registry[Dataset] = Registry("dataset", "mtfl.datasets", Dataset)
"""Every data set a task may train on; plug-ins register in the ``mtfl.datasets`` group."""


def _load_digits(root: str | None, split: str, indices: np.ndarray) -> tuple[Any, Any]:
    from workers.training.dataset_sources import load_digits

    return load_digits(split, indices)


def _load_cifar10(root: str | None, split: str, indices: np.ndarray) -> tuple[Any, Any]:
    from workers.training.dataset_sources import load_cifar10

    return load_cifar10(root, split, indices)


_DIGITS_SAMPLES = 1797
_DIGITS_TEST = 360  # ceil(0.2 * 1797): scikit-learn's rounding of test_size=0.2

DATASET_REGISTRY.register(
    Dataset(
        "digits",
        "digits — scikit-learn's 8×8 handwritten digits at 32×32 (offline)",
        DatasetInfo("digits", 10, _DIGITS_SAMPLES - _DIGITS_TEST, _DIGITS_TEST),
        _load_digits,
    )
)
DATASET_REGISTRY.register(
    Dataset(
        "cifar10",
        "cifar10 — CIFAR-10 from a local folder (never downloaded)",
        DatasetInfo("cifar10", 10, 50_000, 10_000),
        _load_cifar10,
        needs_root=True,
    )
)
