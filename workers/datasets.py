"""Data sets the tasks train on, as normalised 3×32×32 float tensors.

``digits``: scikit-learn's handwritten digits (1,797 8×8 images, 10 classes, shipped with
scikit-learn, so it works offline). Pixels 0..16 are scaled to [0, 1], resized to 32×32
(bilinear), replicated to 3 channels and normalised with the training split's mean and standard
deviation. The train/test split is fixed: stratified 80/20 by
``sklearn.model_selection.train_test_split(test_size=0.2, stratify=y, random_state=0)``,
1,437 / 360 samples.

``cifar10``: read from ``DatasetRef.root`` by ``torchvision.datasets.CIFAR10(download=False)``
(50,000 / 10,000 samples), normalised with the usual per-channel training-set statistics.
Nothing is ever downloaded.

:func:`dataset_info` does not import torch; :func:`load_split` does, inside the function.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from workers import config
from workers.artifacts import atomic_write_path
from workers.messages import DATASETS, DatasetRef

if TYPE_CHECKING:
    import torch

Split = Literal["train", "test"]
SPLITS: tuple[str, ...] = ("train", "test")

_DIGITS_SAMPLES = 1797
_DIGITS_TEST = 360  # ceil(0.2 * 1797), sklearn's rounding of test_size=0.2
_CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_CIFAR10_FOLDER = "cifar-10-batches-py"


class DatasetNotFoundError(FileNotFoundError):
    """A data set's files are not where the task says; nothing is downloaded."""


@dataclass(frozen=True)
class DatasetInfo:
    """Sizes and shapes of a data set.

    Attributes:
        name: data set name (:data:`workers.messages.DATASETS`).
        num_classes: label values are ``0 .. num_classes - 1``.
        train_size: samples in the training split.
        test_size: samples in the test split.
        image_shape: ``(channels, height, width)`` of one sample as :func:`load_split` returns it.
    """

    name: str
    num_classes: int
    train_size: int
    test_size: int
    image_shape: tuple[int, int, int] = (3, 32, 32)


_INFO = {
    "digits": DatasetInfo("digits", 10, _DIGITS_SAMPLES - _DIGITS_TEST, _DIGITS_TEST),
    "cifar10": DatasetInfo("cifar10", 10, 50_000, 10_000),
}


def dataset_info(name: str) -> DatasetInfo:
    """Return the sizes of a data set without loading it (no torch).

    Raises:
        ValueError: for an unknown name, listing the allowed ones.
    """
    if name not in _INFO:
        raise ValueError(f"dataset {name!r} is unknown; allowed: {', '.join(DATASETS)}")
    return _INFO[name]


def load_split(
    ref: DatasetRef, split: Split, indices: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a split (or some of its samples) as normalised tensors.

    Args:
        ref: the data set; ``ref.root`` is the folder holding ``cifar-10-batches-py`` for
            ``cifar10`` and is not used for ``digits``.
        split: ``"train"`` or ``"test"``.
        indices: optional int array of shape ``(n,)`` with positions in the split; only those
            samples are returned, in that order (saves memory: a CIFAR-10 shard is normalised
            without materialising the whole 600 MB float split).

    Returns:
        ``(x, y)``: ``x`` float32 of shape ``N×3×32×32``, normalised per channel; ``y`` int64
        of shape ``(N,)`` with values in ``[0, num_classes)``. ``N`` is the split size or
        ``len(indices)``. Fresh tensors the caller may modify.

    Raises:
        ValueError: for an unknown data set or split, or indices out of range.
        DatasetNotFoundError: if ``cifar10``'s ``root`` is unset, missing, or lacks the files.
    """
    info = dataset_info(ref.name)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    import torch

    size = info.train_size if split == "train" else info.test_size
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
    if ref.name == "digits":
        images, labels, mean, std = _digits_split(split)
        x = torch.from_numpy(images[selection]).expand(-1, 3, -1, -1)
    else:
        root = _cifar10_root(ref.root)
        images, labels = _cifar10_split(str(root), split)
        mean, std = _CIFAR10_MEAN, _CIFAR10_STD
        # uint8 NHWC → float NCHW in [0, 1], only for the selected samples.
        x = torch.from_numpy(images[selection]).permute(0, 3, 1, 2).float().div_(255.0)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    x = ((x - mean_t) / std_t).contiguous()
    y = torch.from_numpy(labels[selection].astype(np.int64))
    return x, y


DIGITS_CACHE_VERSION = 1


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return ``{"train"|"test": (images float32 N×1×32×32 in [0, 1], labels int64 N)}``.

    The resized arrays are cached in ``$MTFL_HOME/cache/`` (3 MB): every trainer process of
    every round needs them, and building them imports scikit-learn and resizes 1797 images,
    about a second of start-up per trainer on one core.
    """
    cache = config.mtfl_home() / "cache" / f"digits-32px-v{DIGITS_CACHE_VERSION}.npz"
    if cache.is_file():
        with np.load(cache) as data:
            return {split: (data[f"{split}_x"], data[f"{split}_y"]) for split in ("train", "test")}
    arrays = _build_digits_arrays()
    columns = {f"{split}_{name}": value for split, pair in arrays.items() for name, value in zip("xy", pair, strict=True)}
    with atomic_write_path(cache) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **columns)
    return arrays


def _build_digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    positions = np.arange(len(digits.target))
    train_pos, test_pos = train_test_split(
        positions, test_size=0.2, stratify=digits.target, random_state=0
    )
    arrays = {}
    for split, chosen in (("train", train_pos), ("test", test_pos)):
        small = torch.from_numpy(digits.images[chosen].astype(np.float32) / 16.0).unsqueeze(1)
        big = F.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
        arrays[split] = (big.numpy(), digits.target[chosen].astype(np.int64))
    return arrays


def _digits_split(split: str) -> tuple[np.ndarray, np.ndarray, tuple, tuple]:
    """Return digits images, labels and the training split's per-channel mean and std."""
    arrays = _digits_arrays()
    train_images = arrays["train"][0]
    # Channels are copies of one grey image, so one mean/std serves all three.
    mean, std = float(train_images.mean()), float(train_images.std())
    images, labels = arrays[split]
    return images, labels, (mean,) * 3, (std,) * 3


def _cifar10_root(root: str | None) -> Path:
    if not root:
        raise DatasetNotFoundError(
            "dataset.root is not set: cifar10 is read from a local folder holding "
            f"{_CIFAR10_FOLDER}/ and nothing is downloaded"
        )
    path = Path(root).expanduser()
    if not (path / _CIFAR10_FOLDER).is_dir():
        raise DatasetNotFoundError(
            f"cifar10 not found: {path / _CIFAR10_FOLDER} does not exist "
            "(put the extracted CIFAR-10 python batches there; nothing is downloaded)"
        )
    return path


@functools.lru_cache(maxsize=2)
def _cifar10_split(root: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return CIFAR-10 images (uint8 N×32×32×3) and labels (int64 N) from ``root``."""
    from torchvision.datasets import CIFAR10

    try:
        data = CIFAR10(root, train=(split == "train"), download=False)
    except RuntimeError as exc:
        # torchvision reports missing or corrupt batches as a bare RuntimeError.
        raise DatasetNotFoundError(
            f"cifar10 files under {Path(root) / _CIFAR10_FOLDER} are missing or corrupt "
            f"({exc}); nothing is downloaded"
        ) from exc
    return np.asarray(data.data), np.asarray(data.targets, dtype=np.int64)
