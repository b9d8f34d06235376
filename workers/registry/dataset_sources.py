"""The built-in data sets' files: digits, CIFAR-10, a researcher's own ``.npz`` arrays and image folders.

These are the loaders behind the built-in records of :mod:`workers.registry.datasets`, each a
``(root) -> splits`` callable of the data set contract (x float32 ``(N, *input_shape)``, y int64
``(N,)``); callers load through :func:`workers.training.datasets.load_split`. Every loader keeps
what it read for the life of the process (a trainer loads its split once per round; a file that
changes on disk is read again, its modification time being part of the key).

``digits``: scikit-learn's handwritten digits (1,797 8×8 images, 10 classes). Pixels 0..16 are
scaled to [0, 1], resized to 32×32 (bilinear), replicated to 3 channels and normalised with the
training split's mean and standard deviation. The train/test split is fixed: stratified 80/20 by
``sklearn.model_selection.train_test_split(test_size=0.2, stratify=y, random_state=0)``,
1,437 / 360 samples. Plain float32 arrays (17 MB).

``cifar10``: read from the task's root folder by ``torchvision.datasets.CIFAR10(download=False)``
(50,000 / 10,000 samples), normalised with the usual per-channel training-set statistics. The
pixels stay uint8 (150 MB); :class:`NormalisedImages` converts only the samples indexed, so a
shard never materialises the 600 MB float split. Nothing is ever downloaded.

``npz``: ``root`` is a ``.npz`` file holding ``x_train``, ``y_train``, ``x_test``, ``y_test``
(read into memory; ``np.savez`` and ``np.savez_compressed`` files alike), or a folder holding
``x_train.npy``, ``y_train.npy``, ``x_test.npy``, ``y_test.npy``, memory-mapped read-only
(``np.load(mmap_mode="r")``) so trainers on one host share the page cache instead of a copy each.
The arrays are returned as stored: :func:`workers.training.plugin_check.check_task` checks their dtypes
and shapes.

``imagefolder``: ``root/train/<class>/<image>`` and ``root/test/<class>/<image>`` (torchvision's
``ImageFolder`` layout, classes numbered by sorted training folder names), each image converted
to RGB, resized to ``size``×``size`` and kept as uint8; normalised per channel with the training
split's mean and (population) standard deviation, i.e. ``ToTensor`` followed by ``Normalize``.

torch, torchvision and scikit-learn are imported inside the functions.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workers import config
from workers.fl.artifacts import atomic_write_path
from workers.registry.splits import ARRAY_NAMES, ArraySplits, SampleArray

_CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_CIFAR10_FOLDER = "cifar-10-batches-py"

DIGITS_CACHE_VERSION = 1
"""Version of the resized digits arrays cached under ``$MTFL_HOME/cache/``; bump it when
their computation changes."""

_STATS_CHUNK = 4096
"""Images per chunk when computing per-channel statistics (bounds the float64 temporaries)."""


class DatasetNotFoundError(FileNotFoundError):
    """A data set's files are not where the task says; nothing is downloaded."""


class NormalisedImages:
    """uint8 images, normalised to float32 ``N×C×H×W`` only for the samples indexed.

    ``x[indices]`` returns ``((pixels[indices] / 255) - mean) / std`` per channel, in float32,
    channels first: the same numbers as torchvision's ``ToTensor`` then ``Normalize``.

    Args:
        pixels: uint8 array ``N×H×W×C`` (``channels_last``) or ``N×C×H×W``.
        mean: per-channel mean of the ``[0, 1]``-scaled pixels, ``C`` values.
        std: per-channel standard deviation, ``C`` positive values.
        channels_last: the layout of ``pixels``.

    Raises:
        ValueError: ``pixels`` is not a 4-d uint8 array, or ``mean``/``std`` do not have one
            value per channel (std > 0).
    """

    def __init__(
        self, pixels: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], *, channels_last: bool
    ) -> None:
        if pixels.ndim != 4 or pixels.dtype != np.uint8:
            raise ValueError(f"pixels must be a 4-d uint8 array, got {pixels.dtype} of shape {pixels.shape}")
        n, a, b, c = pixels.shape
        channels = c if channels_last else a
        if len(mean) != channels or len(std) != channels or min(std) <= 0:
            raise ValueError(f"mean and std need {channels} values (std > 0), got {mean} and {std}")
        self._pixels = pixels
        self._channels_last = channels_last
        self._mean = np.asarray(mean, dtype=np.float32).reshape(1, channels, 1, 1)
        self._std = np.asarray(std, dtype=np.float32).reshape(1, channels, 1, 1)
        self.shape: tuple[int, ...] = (n, c, a, b) if channels_last else (n, a, b, c)
        self.dtype: np.dtype[Any] = np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        """4."""
        return 4

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        """Normalised float32 samples: ``(n, C, H, W)`` for an index array or slice, ``(C, H, W)``
        for one integer position. A fresh array."""
        single = isinstance(index, int | np.integer)
        chosen = self._pixels[index]
        batch = chosen[None] if single else chosen
        x = batch.astype(np.float32) / np.float32(255.0)
        if self._channels_last:
            x = x.transpose(0, 3, 1, 2)
        out = np.ascontiguousarray((x - self._mean) / self._std, dtype=np.float32)
        return out[0] if single else out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # np.asarray(x): the whole split, normalised (what a small data set's caller may want).
        out = self[np.arange(len(self))]
        return out if dtype is None else out.astype(dtype)


class LazySplits:
    """:class:`~workers.registry.datasets.Splits` whose splits are read on first access: a
    trainer reads only the training split, the evaluation only the test split.

    Args:
        read: ``split -> (x, y)`` for ``"train"`` and ``"test"``; called at most once per split.
    """

    def __init__(self, read: Callable[[str], tuple[SampleArray, np.ndarray]]) -> None:
        self._read = read
        self._loaded: dict[str, tuple[SampleArray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def _split(self, split: str) -> tuple[SampleArray, np.ndarray]:
        with self._lock:
            if split not in self._loaded:
                self._loaded[split] = self._read(split)
            return self._loaded[split]

    @property
    def x_train(self) -> SampleArray:
        """float32 ``(N_train, *input_shape)``."""
        return self._split("train")[0]

    @property
    def y_train(self) -> np.ndarray:
        """int64 ``(N_train,)``."""
        return self._split("train")[1]

    @property
    def x_test(self) -> SampleArray:
        """float32 ``(N_test, *input_shape)``."""
        return self._split("test")[0]

    @property
    def y_test(self) -> np.ndarray:
        """int64 ``(N_test,)``."""
        return self._split("test")[1]


def _mtime_ns(path: Path) -> int:
    return path.stat().st_mtime_ns


def _existing(root: str | None, dataset: str, what: str) -> Path:
    """``root`` as a path that exists, else :class:`DatasetNotFoundError` naming it."""
    if not root:
        raise DatasetNotFoundError(f"dataset_root is not set: {dataset} is read from {what} and nothing is downloaded")
    path = Path(root).expanduser()
    if not path.exists():
        raise DatasetNotFoundError(f"{dataset} not found: {path} does not exist (expected {what})")
    return path


# ------------------------------------------------------------------------------------ digits


def digits_splits(root: str | None = None) -> ArraySplits:
    """The ``digits`` data set (``root`` is not used): float32 ``N×3×32×32`` normalised arrays,
    1,437 training and 360 test samples, int64 labels 0-9 (see the module docstring)."""
    return _digits_normalised()


@functools.lru_cache(maxsize=1)
def digits_labels() -> tuple[np.ndarray, np.ndarray]:
    """The ``digits`` labels, ``(train, test)`` int64 arrays of shapes ``(1437,)`` and ``(360,)``,
    in the order :func:`digits_splits` gives the samples, from scikit-learn alone (no torch,
    no images resized): the same stratified split as :func:`_build_digits_arrays`."""
    # deferred: scikit-learn loads only when the digits' labels are read
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    train_pos, test_pos = _digits_split_positions(target, train_test_split)
    return target[train_pos].astype(np.int64), target[test_pos].astype(np.int64)


def _digits_split_positions(target: np.ndarray, train_test_split: Callable[..., Any]) -> tuple[np.ndarray, np.ndarray]:
    """The fixed 80/20 stratified split of the digits' positions (``random_state=0``)."""
    positions = np.arange(len(target))
    train_pos, test_pos = train_test_split(positions, test_size=0.2, stratify=target, random_state=0)
    return train_pos, test_pos


@functools.lru_cache(maxsize=1)
def _digits_normalised() -> ArraySplits:
    arrays = _digits_arrays()
    train_images = arrays["train"][0]
    # Channels are copies of one grey image, so one mean/std serves all three.
    mean, std = np.float32(train_images.mean()), np.float32(train_images.std())
    out = {}
    for split in ("train", "test"):
        images, labels = arrays[split]
        x = np.broadcast_to(images, (len(images), 3, *images.shape[2:]))
        out[split] = (np.ascontiguousarray((x - mean) / std, dtype=np.float32), labels.astype(np.int64))
    for x, _ in out.values():
        x.flags.writeable = False  # shared by every caller of the process; load_split copies
    return ArraySplits(out["train"][0], out["train"][1], out["test"][0], out["test"][1])


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
    # deferred: torch and scikit-learn load only when the digits are first built
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_pos, test_pos = _digits_split_positions(digits.target, train_test_split)
    arrays = {}
    for split, chosen in (("train", train_pos), ("test", test_pos)):
        small = torch.from_numpy(digits.images[chosen].astype(np.float32) / 16.0).unsqueeze(1)
        big = F.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
        arrays[split] = (big.numpy(), digits.target[chosen].astype(np.int64))
    return arrays


# ----------------------------------------------------------------------------------- cifar10


def cifar10_splits(root: str | None) -> LazySplits:
    """CIFAR-10 from ``root`` (the folder holding ``cifar-10-batches-py``): x a
    :class:`NormalisedImages` of shape ``N×3×32×32``, y int64 0-9; 50,000 / 10,000 samples.

    Raises:
        DatasetNotFoundError: ``root`` is unset, missing, or lacks the files (when a split is
            first read, for corrupt batches).
    """
    path = _cifar10_root(root)
    return _cifar10_splits(str(path.resolve()), _mtime_ns(path / _CIFAR10_FOLDER))


@functools.lru_cache(maxsize=2)
def _cifar10_splits(root: str, mtime_ns: int) -> LazySplits:
    def read(split: str) -> tuple[SampleArray, np.ndarray]:
        images, labels = _cifar10_split(root, split)
        return NormalisedImages(images, _CIFAR10_MEAN, _CIFAR10_STD, channels_last=True), labels

    return LazySplits(read)


def _cifar10_root(root: str | None) -> Path:
    if not root:
        raise DatasetNotFoundError(
            "dataset_root is not set: cifar10 is read from a local folder holding "
            f"{_CIFAR10_FOLDER}/ and nothing is downloaded"
        )
    path = Path(root).expanduser()
    if not (path / _CIFAR10_FOLDER).is_dir():
        raise DatasetNotFoundError(
            f"cifar10 not found: {path / _CIFAR10_FOLDER} does not exist "
            "(put the extracted CIFAR-10 python batches there; nothing is downloaded)"
        )
    return path


def _cifar10_split(root: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return CIFAR-10 images (uint8 N×32×32×3) and labels (int64 N) from ``root``."""
    # deferred: torchvision loads only when CIFAR-10 is read
    from torchvision.datasets import CIFAR10

    try:
        data = CIFAR10(root, train=(split == "train"), download=False)
    except RuntimeError as exc:
        # torchvision reports missing or corrupt batches as a bare RuntimeError.
        raise DatasetNotFoundError(
            f"cifar10 files under {Path(root) / _CIFAR10_FOLDER} are missing or corrupt ({exc}); nothing is downloaded"
        ) from exc
    return np.asarray(data.data), np.asarray(data.targets, dtype=np.int64)


# --------------------------------------------------------------------------------------- npz


def npz_splits(root: str | None) -> ArraySplits:
    """A researcher's arrays: ``root`` is a ``.npz`` file with ``x_train``, ``y_train``,
    ``x_test``, ``y_test``, or a folder with those four ``.npy`` files (memory-mapped,
    read-only). The arrays are returned as stored (see the module docstring).

    Raises:
        DatasetNotFoundError: ``root`` is unset or missing, the folder lacks one of the files, or
            the ``.npz`` file one of the arrays.
        ValueError: a file NumPy cannot read (not an ``.npy``/``.npz``, or holding Python
            objects, which are never unpickled).
    """
    path = _existing(root, "npz", "a .npz file or a folder of x_train.npy, y_train.npy, x_test.npy, y_test.npy")
    resolved = path.resolve()
    if resolved.is_dir():
        files = [resolved / f"{name}.npy" for name in ARRAY_NAMES]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise DatasetNotFoundError(f"npz folder {path} lacks {', '.join(missing)}")
        return _npz_folder(str(resolved), tuple(_mtime_ns(f) for f in files))
    return _npz_file(str(resolved), _mtime_ns(resolved))


_ZIP_MAGIC = b"PK\x03\x04"
"""How every ``.npz`` file begins (it is a zip archive; ``numpy.savez`` writes one)."""


@functools.lru_cache(maxsize=4)
def _npz_file(path: str, mtime_ns: int) -> ArraySplits:
    with open(path, "rb") as handle:
        head = handle.read(6)
    if not head.startswith(_ZIP_MAGIC) and head != b"\x93NUMPY":
        # np.load would take any other file for a pickle and suggest allow_pickle=True: wrong
        # advice for a text file, and arrays are never unpickled here.
        raise ValueError(f"{path} is not a .npz archive (numpy.savez / savez_compressed write one)")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path} is not a readable .npz file: {exc}") from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds one array, not a .npz file with {', '.join(ARRAY_NAMES)}")
    with data:
        missing = [name for name in ARRAY_NAMES if name not in data.files]
        if missing:
            raise DatasetNotFoundError(
                f"npz file {path} lacks {', '.join(missing)} (it has {', '.join(data.files) or 'no arrays'})"
            )
        try:
            arrays = {name: data[name] for name in ARRAY_NAMES}
        except (OSError, EOFError, ValueError) as exc:  # a truncated or corrupt member
            raise ValueError(f"{path} is not a readable .npz file: {exc}") from exc
    return ArraySplits(arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"])


@functools.lru_cache(maxsize=4)
def _npz_folder(path: str, mtimes_ns: tuple[int, ...]) -> ArraySplits:
    arrays = {}
    for name in ARRAY_NAMES:
        file = Path(path) / f"{name}.npy"
        try:
            arrays[name] = np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{file} is not a readable .npy file: {exc}") from exc
    return ArraySplits(arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"])


# ------------------------------------------------------------------------------- imagefolder


def imagefolder_splits(root: str | None, size: int = 32) -> LazySplits:
    """Images in torchvision's ``ImageFolder`` layout under ``root/train`` and ``root/test``,
    RGB, resized to ``size``×``size``: x a :class:`NormalisedImages` of shape ``N×3×size×size``
    normalised with the training split's per-channel mean and standard deviation, y int64 class
    indices (classes numbered by the sorted folder names of ``train/``).

    Raises:
        DatasetNotFoundError: ``root`` is unset or missing, lacks ``train/`` or ``test/``, or a
            split holds no class folder with an image (when the split is first read).
        ValueError: ``test/`` has a class folder ``train/`` lacks.
    """
    path = _existing(root, "imagefolder", "a folder with train/ and test/ class folders")
    folders = [path / "train", path / "test"]
    missing = [f.name + "/" for f in folders if not f.is_dir()]
    if missing:
        raise DatasetNotFoundError(f"imagefolder {path} lacks {', '.join(missing)} (class folders of images)")
    return _imagefolder_splits(str(path.resolve()), size, tuple(_mtime_ns(f) for f in folders))


@functools.lru_cache(maxsize=2)
def _imagefolder_splits(root: str, size: int, mtimes_ns: tuple[int, ...]) -> LazySplits:
    @functools.cache
    def train() -> tuple[np.ndarray, np.ndarray, tuple[str, ...], tuple[float, ...], tuple[float, ...]]:
        pixels, labels, classes = _imagefolder_decoded(root, size, "train", None)
        return pixels, labels, classes, *_channel_stats(pixels)

    def read(split: str) -> tuple[SampleArray, np.ndarray]:
        # The test split is normalised with the training split's statistics, as a model
        # trained on the training split expects.
        pixels, labels, classes, mean, std = train()
        if split == "test":
            pixels, labels, _ = _imagefolder_decoded(root, size, "test", classes)
        return NormalisedImages(pixels, mean, std, channels_last=False), labels

    return LazySplits(read)


def _imagefolder_decoded(
    root: str, size: int, split: str, train_classes: tuple[str, ...] | None
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Decode one split: uint8 ``N×3×size×size``, int64 labels, the split's class names."""
    # deferred: torchvision loads only when an image folder is read
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    folder = Path(root) / split
    transform = transforms.Compose([transforms.Resize((size, size)), transforms.PILToTensor()])
    try:
        data = ImageFolder(str(folder), transform=transform)
    except FileNotFoundError as exc:
        raise DatasetNotFoundError(f"imagefolder {folder}: {exc}") from exc
    labels = np.asarray(data.targets, dtype=np.int64)
    if train_classes is not None:
        unknown = sorted(set(data.classes) - set(train_classes))
        if unknown:
            raise ValueError(
                f"imagefolder {folder} has class folders train/ lacks: {', '.join(unknown)} "
                "(classes are numbered by the training folders)"
            )
        renumber = np.array([train_classes.index(c) for c in data.classes], dtype=np.int64)
        labels = renumber[labels]
    pixels = np.empty((len(data), 3, size, size), dtype=np.uint8)
    for i in range(len(data)):
        image, _ = data[i]  # the default loader converts every image to RGB
        pixels[i] = image.numpy()
    return pixels, labels, tuple(data.classes)


def _channel_stats(pixels: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population standard deviation of ``pixels / 255`` (uint8 N×C×H×W),
    accumulated in float64 over chunks; a constant channel gets std 1 (nothing to scale)."""
    channels = pixels.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, len(pixels), _STATS_CHUNK):
        chunk = pixels[start : start + _STATS_CHUNK].astype(np.float64) / 255.0
        total += chunk.sum(axis=(0, 2, 3))
        squares += np.square(chunk).sum(axis=(0, 2, 3))
    count = len(pixels) * pixels.shape[2] * pixels.shape[3]
    mean = total / count
    variance = np.maximum(squares / count - mean**2, 0.0)
    std = [math.sqrt(v) if v > 1e-12 else 1.0 for v in variance]
    return tuple(float(m) for m in mean), tuple(std)
