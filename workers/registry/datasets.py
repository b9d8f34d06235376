"""The data set registry: what a task trains on, by the name stored on the task.

The contract (issue 21 item 2): a data set is a callable ``(root: str | None) -> splits`` whose
result holds the four arrays ``x_train``, ``y_train``, ``x_test``, ``y_test``, as the keys of a
mapping or the attributes of an object (:class:`Splits`; :func:`workers.registry.splits.as_splits`
reads either):

- ``x``: float32, shape ``(N, *input_shape)`` with 1 to 4 sample dimensions (an image
  ``(3, 32, 32)``, tabular features ``(20,)``), already normalised as the model should see it.
  A NumPy array, a memory-mapped one (``np.load(..., mmap_mode="r")``: a large set is then not
  copied per trainer) or any array-like with ``shape``, ``dtype``, ``len()`` and
  ``x[int64 index array] -> np.ndarray`` (:class:`SampleArray`), so a loader can keep compact
  data (CIFAR-10's uint8 pixels) and normalise only the samples asked for.
- ``y``: integer class labels of shape ``(N,)`` in ``[0, num_classes)`` (int64 preferred;
  :func:`workers.training.datasets.load_split` returns int64).

The task's ``input_shape`` (``x.shape[1:]``) and ``num_classes`` follow from the arrays;
:func:`workers.training.plugin_check.check_task` derives and checks them when a task is created.

A :class:`Dataset` record wraps such a callable. Built-ins
(:mod:`workers.registry.dataset_sources`): ``digits`` (scikit-learn's handwritten digits, shipped
with scikit-learn, so it works offline), ``cifar10`` (read from a local folder; nothing is ever
downloaded), and two that read a researcher's own files: ``npz`` (one ``.npz`` file with the four
arrays, or a folder of ``x_train.npy`` … memory-mapped) and ``imagefolder`` (torchvision's
``ImageFolder`` layout with ``train/`` and ``test/``, resized to 32×32, 3 channels;
:func:`imagefolder_loader` makes another size).

Plug-ins register in the ``mtfl.datasets`` entry-point group: the entry point names the callable
itself, wrapped into a :class:`Dataset` under the entry point's name (its label: the first
docstring line and the providing distribution). Optional attributes on the callable fill the
record's other fields: ``needs_root`` (bool), ``input_shape`` (tuple of ints) and
``num_classes`` (int), for forms that show them before anything is loaded.

Importing this module imports neither torch nor scikit-learn: the built-in loaders
(:mod:`workers.registry.dataset_sources`, below this module: the registry imports them, never the
other way) import them when called.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.registry.base import Registry, plugin_label
from workers.registry.dataset_sources import cifar10_splits, digits_splits, imagefolder_splits, npz_splits
from workers.registry.splits import ARRAY_NAMES, SPLITS, ArraySplits, SampleArray, Splits, split_arrays

__all__ = [
    "ARRAY_NAMES",
    "DATASET_REGISTRY",
    "SPLITS",
    "ArraySplits",
    "Dataset",
    "DatasetInfo",
    "SampleArray",
    "Splits",
    "SplitsLoader",
    "dataset_from_entry_point",
    "imagefolder_loader",
    "root_fingerprint",
    "split_arrays",
]


def root_fingerprint(root: str | None) -> tuple[int, ...] | None:
    """What changes when a data set's root changes on disk, for caches keyed by it.

    ``None`` for no root or a missing one; else the ``st_mtime_ns`` of the root, of each entry
    directly in it (a folder's ``x_train.npy`` rewritten in place changes no folder's time), and
    of the folders one level further down (an image added to ``train/<class>/``). Files deeper
    down, rewritten in place, are not seen.
    """
    if not root:
        return None
    path = Path(root).expanduser()
    try:
        times = [path.stat().st_mtime_ns]
        if path.is_dir():
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                times.append(entry.stat().st_mtime_ns)
                if entry.is_dir():
                    times.extend(
                        e.stat().st_mtime_ns for e in sorted(os.scandir(entry.path), key=lambda e: e.name) if e.is_dir()
                    )
    except OSError:
        return None
    return tuple(times)


SplitsLoader = Callable[[str | None], Splits]
"""``(root) -> splits``: ``root`` is the task's ``dataset_root`` (``None`` when unset). Raises
:class:`workers.registry.dataset_sources.DatasetNotFoundError` (a ``FileNotFoundError``) when the
files are not where ``root`` says; nothing is downloaded."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static sizes of a built-in data set whose files never vary (``digits``, ``cifar10``);
    :func:`workers.training.datasets.dataset_info` returns it until its callers take sizes from
    the task.

    Attributes:
        name: data set name (a :data:`DATASET_REGISTRY` name).
        num_classes: label values are ``0 .. num_classes - 1``.
        train_size: samples in the training split.
        test_size: samples in the test split.
        image_shape: the shape of one sample as the loader returns it.
    """

    name: str
    num_classes: int
    train_size: int
    test_size: int
    image_shape: tuple[int, ...] = (3, 32, 32)


@dataclass(frozen=True)
class Dataset:
    """A registered data set.

    Attributes:
        name: stored on a task and carried in messages (``"digits"``).
        label: one line for forms and docs.
        splits: the :data:`SplitsLoader`.
        needs_root: the data is read from the task's ``dataset_root`` (file or folder), which is
            then required.
        input_shape: the shape of one sample when known without loading (for forms); ``None``
            when it follows from the files.
        num_classes: the number of classes when known without loading; ``None`` when it follows
            from the labels.
    """

    name: str
    label: str
    splits: SplitsLoader
    needs_root: bool = False
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None


def dataset_from_entry_point(name: str, loader: Any, source: str) -> Dataset:
    """Wrap a plug-in's loader (an ``mtfl.datasets`` entry point's callable) into a :class:`Dataset`.

    The loader is not called. Its optional attributes ``needs_root``, ``input_shape`` and
    ``num_classes`` fill the record's fields of those names.

    Raises:
        ValueError: an optional attribute of the wrong type or range (naming it).
    """
    needs_root = getattr(loader, "needs_root", False)
    input_shape = getattr(loader, "input_shape", None)
    num_classes = getattr(loader, "num_classes", None)
    if not isinstance(needs_root, bool):
        raise ValueError(f"{name}.needs_root must be a bool, got {needs_root!r}")
    if input_shape is not None:
        input_shape = tuple(input_shape)
        if not 1 <= len(input_shape) <= 4 or not all(isinstance(d, int) and d >= 1 for d in input_shape):
            raise ValueError(f"{name}.input_shape must be 1 to 4 positive ints, got {input_shape!r}")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)):
        raise ValueError(f"{name}.num_classes must be an int >= 2, got {num_classes!r}")
    if num_classes is not None and num_classes < 2:
        raise ValueError(f"{name}.num_classes must be an int >= 2, got {num_classes!r}")
    return Dataset(name, plugin_label(name, loader, source), loader, needs_root, input_shape, num_classes)


DATASET_REGISTRY: Registry[Dataset] = Registry("dataset", "mtfl.datasets", Dataset, dataset_from_entry_point)
"""Every data set a task may train on; plug-ins register in the ``mtfl.datasets`` group."""


MAX_IMAGE_SIZE = 4096
"""The largest side :func:`imagefolder_loader` resizes to, in pixels."""


def imagefolder_loader(size: int) -> SplitsLoader:
    """A loader of torchvision ``ImageFolder`` data resized to ``size``×``size``, for a plug-in
    that registers another size than the built-in ``imagefolder``'s 32::

        # [project.entry-points."mtfl.datasets"]  imagefolder64 = "my_pkg:IMAGEFOLDER64"
        IMAGEFOLDER64 = imagefolder_loader(64)

    The loader reads ``root/train/<class>/*`` and ``root/test/<class>/*`` (3 channels, RGB),
    normalised per channel with the training split's mean and standard deviation
    (:func:`workers.registry.dataset_sources.imagefolder_splits`); it has ``needs_root = True``
    and ``input_shape = (3, size, size)`` for the registry.

    Raises:
        ValueError: ``size`` is not an integer in ``[1, MAX_IMAGE_SIZE]``.
    """
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_IMAGE_SIZE:
        raise ValueError(f"size must be an integer in [1, {MAX_IMAGE_SIZE}], got {size!r}")

    def load(root: str | None) -> Splits:
        return imagefolder_splits(root, size)

    load.__doc__ = f"images in torchvision's ImageFolder layout (train/, test/), resized to {size}×{size}"
    load.__name__ = f"imagefolder_{size}"
    load.needs_root = True  # type: ignore[attr-defined]
    load.input_shape = (3, size, size)  # type: ignore[attr-defined]
    return load


_DIGITS_SAMPLES = 1797
_DIGITS_TEST = 360  # ceil(0.2 * 1797): scikit-learn's rounding of test_size=0.2
DIGITS_INFO = DatasetInfo("digits", 10, _DIGITS_SAMPLES - _DIGITS_TEST, _DIGITS_TEST)
CIFAR10_INFO = DatasetInfo("cifar10", 10, 50_000, 10_000)

DATASET_REGISTRY.register(
    Dataset(
        "digits",
        "digits — scikit-learn's 8×8 handwritten digits at 32×32 (offline)",
        digits_splits,
        input_shape=(3, 32, 32),
        num_classes=10,
    )
)
DATASET_REGISTRY.register(
    Dataset(
        "cifar10",
        "cifar10 — CIFAR-10 from a local folder (never downloaded)",
        cifar10_splits,
        needs_root=True,
        input_shape=(3, 32, 32),
        num_classes=10,
    )
)
DATASET_REGISTRY.register(
    Dataset(
        "npz",
        "npz — your own arrays: a .npz file with x_train, y_train, x_test, y_test (or a folder of .npy files)",
        npz_splits,
        needs_root=True,
    )
)
DATASET_REGISTRY.register(
    Dataset(
        "imagefolder",
        "imagefolder — your own images: train/ and test/ class folders, resized to 32×32",
        imagefolder_loader(32),
        needs_root=True,
        input_shape=(3, 32, 32),
    )
)
