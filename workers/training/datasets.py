"""Data sets the tasks train on, by name: their splits, and selected samples as tensors.

The data sets themselves are records of :data:`workers.registry.datasets.DATASET_REGISTRY`
(built-ins ``digits``, ``cifar10``, ``npz``, ``imagefolder``,
:mod:`workers.registry.dataset_sources`; plug-ins from the ``mtfl.datasets`` entry-point group).
This module is what trainers and the evaluation call: :func:`load_splits` gives a data set's
arrays (read once per process), :func:`load_split` checks a split and indices against them and
returns the samples as fresh tensors. A task's sizes, input shape and classes come from the task
(checked when it was created, :func:`workers.training.plugin_check.check_task`); :func:`dataset_info`
remains for the two built-ins whose sizes are static, until its callers read the task's fields.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from workers.protocol.messages import DatasetRef
from workers.registry.dataset_sources import DatasetNotFoundError
from workers.registry.datasets import (
    CIFAR10_INFO,
    DATASET_REGISTRY,
    DIGITS_INFO,
    SPLITS,
    Dataset,
    DatasetInfo,
    Splits,
    root_fingerprint,
    split_arrays,
)
from workers.registry.splits import as_splits

if TYPE_CHECKING:
    import torch

__all__ = [
    "SPLITS",
    "DatasetInfo",
    "DatasetNotFoundError",
    "Split",
    "dataset_info",
    "load_split",
    "load_splits",
]

Split = Literal["train", "test"]

_STATIC_INFO: dict[str, DatasetInfo] = {info.name: info for info in (DIGITS_INFO, CIFAR10_INFO)}

_CACHE_SIZE = 4
"""Data sets :func:`load_splits` keeps per process (a trainer needs one; a test process a few)."""

_cache: OrderedDict[tuple[Any, ...], Splits] = OrderedDict()
_cache_lock = threading.Lock()


def dataset_info(name: str) -> DatasetInfo:
    """Return the static sizes of ``digits`` or ``cifar10`` without loading them (no torch).

    Other data sets' sizes follow from their files: a task carries them (checked at creation by
    :func:`workers.training.plugin_check.check_task`).

    Raises:
        workers.registry.UnknownEntryError: (a ``ValueError``) for an unknown name, naming the
            ``dataset`` field and listing the allowed ones.
        ValueError: a registered data set whose sizes are not static.
    """
    record = DATASET_REGISTRY.get(name, field="dataset")
    try:
        return _STATIC_INFO[record.name]
    except KeyError:
        raise ValueError(
            f"dataset: the sizes of {name!r} follow from its files; read them from the task "
            "(workers.training.plugin_check.check_task), not dataset_info"
        ) from None


def load_splits(ref: DatasetRef) -> Splits:
    """A data set's splits (:class:`~workers.registry.datasets.Splits`), read once per process.

    The result is kept per data set record, root and the root's modification times
    (:func:`~workers.registry.datasets.root_fingerprint`: a root rewritten on disk is read
    again), for the last few data sets used.

    Args:
        ref: the data set; ``ref.root`` its file or folder (required when the record
            ``needs_root``).

    Returns:
        The loader's four arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` as attributes
        (a loader may return a mapping with those keys or an object with those attributes:
        :func:`~workers.registry.splits.as_splits`), shared by every caller: do not modify them
        (:func:`load_split` copies).

    Raises:
        workers.registry.UnknownEntryError: an unknown data set (naming ``dataset``).
        DatasetNotFoundError: ``ref.root`` is unset for a data set that needs one, or the files
            are not there.
        workers.registry.splits.MissingArraysError: (a ``ValueError``) the loader's result lacks
            some of the four arrays, naming each.
        Exception: whatever a plug-in's loader raises.
    """
    record: Dataset = DATASET_REGISTRY.get(ref.name, field="dataset")
    if record.needs_root and not ref.root:
        raise DatasetNotFoundError(
            f"dataset_root is not set: {ref.name} is read from a local file or folder and nothing is downloaded"
        )
    key = (record, ref.root, root_fingerprint(ref.root))
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    splits = as_splits(record.splits(ref.root), ref.name)
    with _cache_lock:
        _cache[key] = splits
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return splits


def load_split(ref: DatasetRef, split: Split, indices: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a split (or some of its samples) as tensors.

    Args:
        ref: the data set; ``ref.root`` is its local file or folder (``cifar10``: the folder
            holding ``cifar-10-batches-py``; not used by ``digits``).
        split: ``"train"`` or ``"test"``.
        indices: optional int array of shape ``(n,)`` with positions in the split; only those
            samples are returned, in that order (saves memory on large data sets).

    Returns:
        ``(x, y)``: ``x`` float32 of shape ``(N, *input_shape)`` as the data set gives it
        (normalised); ``y`` int64 of shape ``(N,)``. ``N`` is the split size or
        ``len(indices)``. Fresh tensors the caller may modify.

    Raises:
        ValueError: for an unknown data set or split, indices out of range, or a split whose
            ``x`` and ``y`` disagree in length.
        DatasetNotFoundError: if the data set's files are not under ``ref.root``.
    """
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    x, y = split_arrays(load_splits(ref), split)
    size = len(y)
    if len(x) != size:
        raise ValueError(f"dataset {ref.name!r}: the {split} split has {len(x)} samples in x but {size} labels in y")
    if indices is None:
        selection = np.arange(size, dtype=np.int64)
    else:
        selection = np.asarray(indices, dtype=np.int64)
        if selection.ndim != 1:
            raise ValueError(f"indices must be 1-d, got shape {selection.shape}")
        if selection.size and (selection.min() < 0 or selection.max() >= size):
            raise ValueError(
                f"indices must lie in [0, {size}) for the {ref.name} {split} split, "
                f"got min {selection.min()} max {selection.max()}"
            )
    return torch.from_numpy(_fresh(x[selection], np.float32)), torch.from_numpy(_fresh(y[selection], np.int64))


def _fresh(values: Any, dtype: type[np.generic]) -> np.ndarray:
    """``values`` as a C-contiguous, writable array of ``dtype`` that nothing else holds: copied
    only when it is not one already (a fancy-indexed ndarray is a fresh copy)."""
    if (
        type(values) is np.ndarray
        and values.dtype == dtype
        and values.flags.owndata
        and values.flags.writeable
        and values.flags.c_contiguous
    ):
        return values
    return np.array(values, dtype=dtype, order="C", copy=True)
