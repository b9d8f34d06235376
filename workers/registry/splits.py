"""The shape of a data set's data (issue 21 item 2): the four arrays every data set loader
returns (:class:`Splits`), what an array of samples must offer (:class:`SampleArray`) and the
plain record of them (:class:`ArraySplits`).

A module of its own so that loaders (:mod:`workers.training.dataset_sources`) and the registry
(:mod:`workers.registry.datasets`, which imports the loaders when they are called) both depend on
it and not on each other. NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

SPLITS: tuple[str, ...] = ("train", "test")
"""The splits every data set has."""

ARRAY_NAMES: tuple[str, ...] = ("x_train", "y_train", "x_test", "y_test")
"""The four arrays of a data set's splits."""


@runtime_checkable
class SampleArray(Protocol):
    """What a data set's ``x`` must offer: NumPy's ``shape``, ``dtype``, ``len()``, and indexing
    by an int64 position array of shape ``(n,)`` returning an ``np.ndarray`` of shape
    ``(n, *shape[1:])`` (a fresh array the caller may modify). ``np.ndarray`` and ``np.memmap``
    are ones."""

    @property
    def shape(self) -> tuple[int, ...]:
        """``(N, *input_shape)``."""
        ...

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32."""
        ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...


class Splits(Protocol):
    """A data set's two splits, as a loader returns them (see the module docstring)."""

    @property
    def x_train(self) -> SampleArray:
        """float32 ``(N_train, *input_shape)``."""
        ...

    @property
    def y_train(self) -> np.ndarray:
        """integer labels ``(N_train,)``."""
        ...

    @property
    def x_test(self) -> SampleArray:
        """float32 ``(N_test, *input_shape)``."""
        ...

    @property
    def y_test(self) -> np.ndarray:
        """integer labels ``(N_test,)``."""
        ...


@dataclass(frozen=True)
class ArraySplits:
    """The plain :class:`Splits`: four arrays (or array-likes) as attributes."""

    x_train: SampleArray
    y_train: np.ndarray
    x_test: SampleArray
    y_test: np.ndarray

    def split(self, split: str) -> tuple[SampleArray, np.ndarray]:
        """``(x, y)`` of ``split`` (``"train"`` or ``"test"``); ``ValueError`` for another."""
        return split_arrays(self, split)


def split_arrays(splits: Splits, split: str) -> tuple[SampleArray, np.ndarray]:
    """``(x, y)`` of one split of any :class:`Splits`.

    Raises:
        ValueError: ``split`` is not one of :data:`SPLITS`.
    """
    if split == "train":
        return splits.x_train, splits.y_train
    if split == "test":
        return splits.x_test, splits.y_test
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
