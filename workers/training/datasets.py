"""Data sets the tasks train on, by name: sizes without loading, and splits as tensors.

The data sets themselves are records of :data:`workers.registry.datasets.DATASET_REGISTRY`
(built-ins: ``digits`` and ``cifar10``, :mod:`workers.training.dataset_sources`; plug-ins from the
``mtfl.datasets`` entry-point group). This module is what trainers and the control plane call:
:func:`dataset_info` does not import torch; :func:`load_split` checks the split and the indices
and hands them to the data set's loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from workers.protocol.messages import DatasetRef
from workers.registry.datasets import DATASET_REGISTRY, SPLITS, DatasetInfo
from workers.training.dataset_sources import DatasetNotFoundError

if TYPE_CHECKING:
    import torch

__all__ = ["SPLITS", "DatasetInfo", "DatasetNotFoundError", "Split", "dataset_info", "load_split"]

Split = Literal["train", "test"]


def dataset_info(name: str) -> DatasetInfo:
    """Return the sizes of a data set without loading it (no torch).

    Raises:
        workers.registry.UnknownEntryError: (a ``ValueError``) for an unknown name, naming the
            ``dataset`` field and listing the allowed ones.
    """
    return DATASET_REGISTRY.get(name, field="dataset").info


def load_split(ref: DatasetRef, split: Split, indices: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a split (or some of its samples) as normalised tensors.

    Args:
        ref: the data set; ``ref.root`` is its local folder (``cifar10``: the folder holding
            ``cifar-10-batches-py``; not used by ``digits``).
        split: ``"train"`` or ``"test"``.
        indices: optional int array of shape ``(n,)`` with positions in the split; only those
            samples are returned, in that order (saves memory on large data sets).

    Returns:
        ``(x, y)``: ``x`` float32 of shape ``N×C×H×W`` (the data set's ``image_shape``),
        normalised per channel; ``y`` int64 of shape ``(N,)`` with values in
        ``[0, num_classes)``. ``N`` is the split size or ``len(indices)``. Fresh tensors the
        caller may modify.

    Raises:
        ValueError: for an unknown data set or split, or indices out of range.
        DatasetNotFoundError: if the data set's files are not under ``ref.root``.
    """
    record = DATASET_REGISTRY.get(ref.name, field="dataset")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    size = record.info.train_size if split == "train" else record.info.test_size
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
    return record.load(ref.root, split, selection)
