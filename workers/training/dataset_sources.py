"""The built-in data sets' files: scikit-learn's digits and CIFAR-10 from a local folder.

These are the loaders behind the ``digits`` and ``cifar10`` records of
:mod:`workers.registry.datasets`; callers load through :func:`workers.training.datasets.load_split`.

``digits``: scikit-learn's handwritten digits (1,797 8×8 images, 10 classes). Pixels 0..16 are
scaled to [0, 1], resized to 32×32 (bilinear), replicated to 3 channels and normalised with the
training split's mean and standard deviation. The train/test split is fixed: stratified 80/20 by
``sklearn.model_selection.train_test_split(test_size=0.2, stratify=y, random_state=0)``,
1,437 / 360 samples.

``cifar10``: read from the task's root folder by ``torchvision.datasets.CIFAR10(download=False)``
(50,000 / 10,000 samples), normalised with the usual per-channel training-set statistics.
Nothing is ever downloaded.

torch, torchvision and scikit-learn are imported inside the functions.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workers.agent import config
from workers.fl.artifacts import atomic_write_path

if TYPE_CHECKING:
    import torch

_CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_CIFAR10_FOLDER = "cifar-10-batches-py"

DIGITS_CACHE_VERSION = 1
"""Version of the resized digits arrays cached under ``$MTFL_HOME/cache/``; bump it when
their computation changes."""


class DatasetNotFoundError(FileNotFoundError):
    """A data set's files are not where the task says; nothing is downloaded."""


def load_digits(split: str, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected digits samples of ``split`` (``"train"`` or ``"test"``), normalised.

    Args:
        split: ``"train"`` or ``"test"``.
        indices: int64 positions in the split, shape ``(n,)``, already range-checked.

    Returns:
        ``x`` float32 ``n×3×32×32`` and ``y`` int64 ``(n,)`` with values 0-9.
    """
    images, labels, mean, std = _digits_split(split)
    import torch

    x = torch.from_numpy(images[indices]).expand(-1, 3, -1, -1)
    return _normalise(x, mean, std), torch.from_numpy(labels[indices].astype(np.int64))


def load_cifar10(root: str | None, split: str, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected CIFAR-10 samples of ``split`` read from ``root``, normalised.

    Only the selected samples are converted to float, so a shard is normalised without
    materialising the whole 600 MB float split.

    Args:
        root: the folder holding ``cifar-10-batches-py``.
        split: ``"train"`` or ``"test"``.
        indices: int64 positions in the split, shape ``(n,)``, already range-checked.

    Returns:
        ``x`` float32 ``n×3×32×32`` and ``y`` int64 ``(n,)`` with values 0-9.

    Raises:
        DatasetNotFoundError: ``root`` is unset, missing, or lacks the files.
    """
    images, labels = _cifar10_split(str(_cifar10_root(root)), split)
    import torch

    # uint8 NHWC → float NCHW in [0, 1], only for the selected samples.
    x = torch.from_numpy(images[indices]).permute(0, 3, 1, 2).float().div_(255.0)
    return _normalise(x, _CIFAR10_MEAN, _CIFAR10_STD), torch.from_numpy(labels[indices].astype(np.int64))


def _normalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    import torch

    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return ((x - mean_t) / std_t).contiguous()


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
    with atomic_write_path(cache) as tmp, open(tmp, "wb") as handle:
        np.savez(
            handle,
            train_x=arrays["train"][0],
            train_y=arrays["train"][1],
            test_x=arrays["test"][0],
            test_y=arrays["test"][1],
        )
    return arrays


def _build_digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    positions = np.arange(len(digits.target))
    train_pos, test_pos = train_test_split(positions, test_size=0.2, stratify=digits.target, random_state=0)
    arrays = {}
    for split, chosen in (("train", train_pos), ("test", test_pos)):
        small = torch.from_numpy(digits.images[chosen].astype(np.float32) / 16.0).unsqueeze(1)
        big = F.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
        arrays[split] = (big.numpy(), digits.target[chosen].astype(np.int64))
    return arrays


def _digits_split(split: str) -> tuple[np.ndarray, np.ndarray, tuple[float, ...], tuple[float, ...]]:
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
            f"cifar10 files under {Path(root) / _CIFAR10_FOLDER} are missing or corrupt ({exc}); nothing is downloaded"
        ) from exc
    return np.asarray(data.data), np.asarray(data.targets, dtype=np.int64)
