"""The shape of a data set's data (issue 21 item 2): the four arrays every data set loader
returns (:class:`Splits`), what an array of samples must offer (:class:`SampleArray`), the
plain record of them (:class:`ArraySplits`) and :func:`as_splits`, which reads a loader's result
whether it is a mapping with the four keys or an object with the four attributes.

A module of its own, below both the built-in loaders (:mod:`workers.registry.dataset_sources`)
and the registry (:mod:`workers.registry.datasets`, which registers those loaders). NumPy only.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
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


class MissingArraysError(ValueError):
    """A data set loader's result lacks some of the four arrays (:data:`ARRAY_NAMES`).

    The message names the data set, what the loader returned and every missing key.
    """


def as_splits(result: object, dataset: str) -> Splits:
    """A loader's result as :class:`Splits`: a mapping with the keys :data:`ARRAY_NAMES`
    (``{"x_train": ..., "y_train": ..., "x_test": ..., "y_test": ...}``, the natural first try)
    becomes an :class:`ArraySplits`; an object with those four attributes is returned as it is.

    The attributes are looked up without calling them (:func:`inspect.getattr_static`), so a
    loader whose properties read a split on first use (``cifar10``'s) still reads nothing here.

    Args:
        result: what the data set's loader returned.
        dataset: the data set's name, for the error.

    Raises:
        MissingArraysError: a key (mapping) or attribute (object) is missing, naming each.
    """
    if isinstance(result, Mapping):
        missing = [name for name in ARRAY_NAMES if name not in result]
        if not missing:
            x_train, y_train, x_test, y_test = (result[name] for name in ARRAY_NAMES)
            return ArraySplits(x_train, y_train, x_test, y_test)
    else:
        missing = [name for name in ARRAY_NAMES if not _has_attribute(result, name)]
        if not missing:
            return result  # type: ignore[return-value]  # it has the four: the Splits protocol
    raise MissingArraysError(
        f"the splits {dataset!r} returned ({type(result).__name__}) have no {', '.join(missing)}: a loader "
        f"returns a mapping with the keys {', '.join(ARRAY_NAMES)}, or an object with those attributes"
    )


def _has_attribute(obj: object, name: str) -> bool:
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return hasattr(obj, name)  # a dynamic one (__getattr__): only now is it asked for
    return True
