"""The FL benchmarks' sized data set: CIFAR-10's size and shape, read by the built-in ``npz``
data set, and sparse on disk (the simulated backend needs sizes, not pixels)."""

from __future__ import annotations

import numpy as np

from benchmarks.fl_bench import PAPER_MIXES, sized_dataset
from workers.protocol.messages import DatasetRef
from workers.training.datasets import load_split


def test_the_sized_data_set_has_cifar10s_shape_and_costs_no_disk(tmp_path):
    folder = sized_dataset(tmp_path / "sized", train=5000, test=100)
    x, y = load_split(DatasetRef(name="npz", root=str(folder)), "train", np.arange(10))
    assert tuple(x.shape) == (10, 3, 32, 32) and str(x.dtype) == "torch.float32"
    labels = np.load(folder / "y_train.npy")
    assert len(labels) == 5000 and np.bincount(labels).tolist() == [500] * 10
    image_file = folder / "x_train.npy"
    assert image_file.stat().st_size >= 5000 * 3 * 32 * 32 * 4
    # Sparse: the zeros are holes, not written blocks (st_blocks counts 512-byte blocks).
    assert image_file.stat().st_blocks * 512 < image_file.stat().st_size / 10


def test_the_paper_mixes_are_three_zoo_models_each():
    from workers.registry.models import MODEL_REGISTRY

    assert set(PAPER_MIXES) == {"light", "mixed", "heavy"}
    for archs in PAPER_MIXES.values():
        assert len(archs) == 3 and all(a in MODEL_REGISTRY for a in archs)
