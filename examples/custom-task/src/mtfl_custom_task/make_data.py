"""Write a tabular classification data set for mtfl-lab's built-in ``npz`` data set.

    python -m mtfl_custom_task.make_data OUT.npz [--train 3000] [--test 1000] [--seed 0]

The file holds ``x_train`` ``(train, 20)`` float32, ``y_train`` ``(train,)`` int64, ``x_test``
``(test, 20)`` float32 and ``y_test`` ``(test,)`` int64 with labels in ``[0, 4)``: a task with
``"dataset": "npz", "dataset_root": "<OUT.npz>"`` trains on it, its input shape ``(20,)`` and its
four classes following from the arrays.

The samples are scikit-learn's ``make_classification`` (Guyon 2003's MADELON design: each class is
a Gaussian cluster around a vertex of a hypercube in the informative features, plus linear
combinations of them and noise features), the same for the same seed. Features are standardised
with the training split's mean and standard deviation, so the test split is scaled exactly as the
model saw its training data.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

FEATURES = 20
"""Features per sample: 8 informative, 4 redundant (combinations of them), 8 noise."""
CLASSES = 4
CLASS_SEPARATION = 1.5
"""``make_classification``'s ``class_sep``: the hypercube's half side; 1.5 keeps the classes
learnable by a small model in a few federated rounds (logistic regression reaches about 0.95
on the test split of seed 0)."""


def make_tabular(*, train_size: int = 3000, test_size: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """The four arrays of the data set.

    Args:
        train_size: training samples, 40 to 1,000,000 (at least 10 per class).
        test_size: test samples, 4 to 1,000,000.
        seed: the generator's seed; the same seed gives the same arrays.

    Returns:
        ``x_train`` ``(train_size, 20)`` float32, ``y_train`` ``(train_size,)`` int64, ``x_test``
        ``(test_size, 20)`` float32, ``y_test`` ``(test_size,)`` int64, labels in ``[0, 4)``.

    Raises:
        ValueError: a size or the seed out of range (the message names it).
    """
    for name, value, low in (("train_size", train_size, 10 * CLASSES), ("test_size", test_size, CLASSES)):
        if not isinstance(value, int) or not low <= value <= 1_000_000:
            raise ValueError(f"{name}={value!r} is out of range: allowed {low} to 1000000")
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} is out of range: allowed 0 to {2**32 - 1}")
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=train_size + test_size,
        n_features=FEATURES,
        n_informative=8,
        n_redundant=4,
        n_classes=CLASSES,
        n_clusters_per_class=1,
        class_sep=CLASS_SEPARATION,
        shuffle=True,
        random_state=seed,
    )
    x_train, x_test = x[:train_size], x[train_size:]
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0)
    std[std == 0] = 1.0  # a constant feature stays 0 instead of dividing by zero
    return {
        "x_train": ((x_train - mean) / std).astype(np.float32),
        "y_train": y[:train_size].astype(np.int64),
        "x_test": ((x_test - mean) / std).astype(np.float32),
        "y_test": y[train_size:].astype(np.int64),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: write the arrays to ``OUT.npz`` and print one line about them."""
    parser = argparse.ArgumentParser(prog="python -m mtfl_custom_task.make_data", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the .npz file to write (its folder must exist)")
    parser.add_argument("--train", type=int, default=3000, help="training samples (default 3000)")
    parser.add_argument("--test", type=int, default=1000, help="test samples (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    args = parser.parse_args(argv)
    if args.out.suffix != ".npz":
        parser.error(f"out: {str(args.out)!r} must end in .npz (numpy.savez would add it)")
    if not args.out.parent.is_dir():
        parser.error(f"out: folder {str(args.out.parent)!r} does not exist")
    try:
        arrays = make_tabular(train_size=args.train, test_size=args.test, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    np.savez(args.out, **arrays)
    counts = np.bincount(arrays["y_train"], minlength=CLASSES).tolist()
    print(
        f"wrote {args.out}: {args.train} train / {args.test} test samples, {FEATURES} features, "
        f"{CLASSES} classes (train per class: {counts})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
