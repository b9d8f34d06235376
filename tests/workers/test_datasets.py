from __future__ import annotations

import numpy as np
import pytest

from workers.protocol.messages import DatasetRef
from workers.registry.datasets import DATASET_REGISTRY, ArraySplits, Dataset
from workers.training.datasets import DatasetNotFoundError, dataset_info, load_split, load_splits

DIGITS = DatasetRef(name="digits")


def test_digits_splits_have_fixed_sizes_shapes_and_labels():
    import torch

    info = dataset_info("digits")
    x_train, y_train = load_split(DIGITS, "train")
    x_test, y_test = load_split(DIGITS, "test")

    assert (info.train_size, info.test_size) == (1437, 360)
    assert x_train.shape == (1437, 3, 32, 32) and x_test.shape == (360, 3, 32, 32)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    assert set(y_train.tolist()) == set(range(10)) == set(y_test.tolist())
    assert abs(float(x_train.mean())) < 1e-3 and abs(float(x_train.std()) - 1) < 1e-3


def test_digits_split_is_fixed_and_disjoint():
    from sklearn.datasets import load_digits

    x1, _ = load_split(DIGITS, "test")
    x2, _ = load_split(DIGITS, "test")
    x_train, _ = load_split(DIGITS, "train")

    assert np.array_equal(x1.numpy(), x2.numpy())
    train_rows = {row.tobytes() for row in x_train[:, 0].numpy()}
    test_rows = {row.tobytes() for row in x1[:, 0].numpy()}
    # sklearn's digits contain no exact duplicate images across... but allow none to be shared
    # unless the raw data set itself holds duplicates.
    raw = load_digits().images.reshape(1797, -1)
    raw_duplicates = len(raw) - len({r.tobytes() for r in raw})
    assert len(train_rows & test_rows) <= raw_duplicates


def test_load_split_selects_indices_in_order():
    x_all, y_all = load_split(DIGITS, "train")

    x, y = load_split(DIGITS, "train", np.array([5, 2, 5]))

    assert x.shape == (3, 3, 32, 32)
    assert y.tolist() == [y_all[5], y_all[2], y_all[5]]
    assert np.array_equal(x[1].numpy(), x_all[2].numpy())


def test_indices_out_of_range_are_rejected():
    with pytest.raises(ValueError, match="1437"):
        load_split(DIGITS, "train", np.array([1437]))


def test_cifar10_missing_folder_names_the_path_and_never_downloads(tmp_path):
    root = tmp_path / "no-cifar"

    with pytest.raises(DatasetNotFoundError, match="no-cifar") as error:
        load_split(DatasetRef(name="cifar10", root=str(root)), "train")

    assert "nothing is downloaded" in str(error.value)
    assert isinstance(error.value, FileNotFoundError)
    assert not root.exists()


def test_cifar10_without_a_root_is_refused_naming_dataset_root():
    with pytest.raises(DatasetNotFoundError, match="dataset_root is not set: cifar10"):
        load_split(DatasetRef(name="cifar10"), "test")


def test_cifar10_info_needs_no_files():
    assert dataset_info("cifar10").train_size == 50_000


def test_sizes_of_a_dataset_read_from_files_come_from_the_task_not_dataset_info():
    with pytest.raises(ValueError, match="the sizes of 'npz' follow from its files"):
        dataset_info("npz")


def test_digits_numbers_are_those_of_the_previous_loader():
    """The contract's arrays give bit-identical tensors to the torch normalisation they replace."""
    import torch

    from workers.registry.dataset_sources import _digits_arrays

    arrays = _digits_arrays()
    mean, std = float(arrays["train"][0].mean()), float(arrays["train"][0].std())
    for split in ("train", "test"):
        x = torch.from_numpy(arrays[split][0]).expand(-1, 3, -1, -1)
        before = (x - torch.full((1, 3, 1, 1), mean)) / torch.full((1, 3, 1, 1), std)
        after, y = load_split(DIGITS, split)
        assert torch.equal(after, before) and np.array_equal(y.numpy(), arrays[split][1])


def test_splits_are_loaded_once_and_load_split_hands_out_fresh_tensors():
    splits = load_splits(DIGITS)
    assert load_splits(DIGITS) is splits
    assert splits.x_train.shape == (1437, 3, 32, 32) and splits.x_train.dtype == np.float32
    assert splits.y_test.dtype == np.int64 and splits.y_test.shape == (360,)

    x, y = load_split(DIGITS, "test", np.array([0, 1]))
    x += 100.0
    y[:] = -1
    again, labels = load_split(DIGITS, "test", np.array([0, 1]))
    assert float(again.max()) < 100.0 and labels.min() >= 0


def test_a_split_whose_x_and_y_disagree_in_length_is_refused():
    x = np.zeros((4, 2), dtype=np.float32)
    labels = np.array([0, 1, 0], dtype=np.int64)
    DATASET_REGISTRY.register(Dataset("uneven", "uneven — test", lambda root: ArraySplits(x, labels, x, labels)))
    try:
        with pytest.raises(ValueError, match="train split has 4 samples in x but 3 labels in y"):
            load_split(DatasetRef(name="uneven"), "train")
    finally:
        DATASET_REGISTRY.unregister("uneven")


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        load_split(DIGITS, "validation")  # type: ignore[arg-type]


def test_unknown_dataset_is_rejected():
    with pytest.raises(ValueError, match="digits"):
        dataset_info("mnist")
