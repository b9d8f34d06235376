"""The built-in data sets that read a researcher's own files (npz, imagefolder) and the
array-like that normalises CIFAR-10 per indexed sample, on real files written in tmp_path."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from workers.protocol.messages import DatasetRef
from workers.registry.dataset_sources import DatasetNotFoundError, NormalisedImages
from workers.registry.datasets import DATASET_REGISTRY, Dataset, imagefolder_loader
from workers.training.datasets import load_split, load_splits


def _arrays(n_train: int = 12, n_test: int = 5, shape: tuple[int, ...] = (20,), classes: int = 3):
    rng = np.random.default_rng(7)
    return {
        "x_train": rng.standard_normal((n_train, *shape)).astype(np.float32),
        "y_train": (np.arange(n_train) % classes).astype(np.int64),
        "x_test": rng.standard_normal((n_test, *shape)).astype(np.float32),
        "y_test": (np.arange(n_test) % classes).astype(np.int64),
    }


# --------------------------------------------------------------------------------------- npz


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_an_npz_file_gives_its_arrays(tmp_path, save):
    arrays = _arrays()
    path = tmp_path / "data.npz"
    save(path, **arrays)
    ref = DatasetRef(name="npz", root=str(path))

    x, y = load_split(ref, "train", np.array([4, 0]))
    x_test, y_test = load_split(ref, "test")

    assert np.array_equal(x.numpy(), arrays["x_train"][[4, 0]]) and y.tolist() == [1, 0]
    assert np.array_equal(x_test.numpy(), arrays["x_test"]) and np.array_equal(y_test.numpy(), arrays["y_test"])
    assert load_splits(ref) is load_splits(ref)  # read once per process


def test_an_npz_file_rewritten_on_disk_is_read_again(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, **_arrays())
    ref = DatasetRef(name="npz", root=str(path))
    first = load_splits(ref)

    np.savez(path, **_arrays(n_train=6))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    assert load_splits(ref) is not first and len(load_splits(ref).y_train) == 6


def test_an_npz_folder_is_memory_mapped_read_only(tmp_path):
    arrays = _arrays(shape=(1, 4, 4))
    for name, values in arrays.items():
        np.save(tmp_path / f"{name}.npy", values)
    ref = DatasetRef(name="npz", root=str(tmp_path))

    splits = load_splits(ref)
    x, y = load_split(ref, "train", np.array([2, 3]))

    assert isinstance(splits.x_train, np.memmap) and splits.x_train.mode == "r"
    assert not splits.x_train.flags.writeable
    assert np.array_equal(x.numpy(), arrays["x_train"][[2, 3]]) and y.tolist() == [2, 0]
    x += 1.0  # the tensor is a fresh copy: the mapped file is untouched
    assert np.array_equal(np.load(tmp_path / "x_train.npy"), arrays["x_train"])


def test_npz_files_that_are_missing_or_incomplete_name_what_is_missing(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_splits(DatasetRef(name="npz", root=str(tmp_path / "none.npz")))
    with pytest.raises(DatasetNotFoundError, match="dataset_root is not set: npz"):
        load_splits(DatasetRef(name="npz"))

    arrays = _arrays()
    for name in ("x_train", "y_train", "x_test"):
        np.save(tmp_path / f"{name}.npy", arrays[name])
    with pytest.raises(DatasetNotFoundError, match="lacks y_test.npy"):
        load_splits(DatasetRef(name="npz", root=str(tmp_path)))

    np.savez(tmp_path / "three.npz", **{k: v for k, v in arrays.items() if k != "y_train"})
    with pytest.raises(DatasetNotFoundError, match="lacks y_train"):
        load_splits(DatasetRef(name="npz", root=str(tmp_path / "three.npz")))

    with pytest.raises(ValueError, match="holds one array"):
        load_splits(DatasetRef(name="npz", root=str(tmp_path / "x_train.npy")))


def test_a_file_that_is_not_an_npz_archive_says_so(tmp_path):
    text = tmp_path / "x.npz"
    text.write_text("feature_1,feature_2,label\n0.5,1.5,0\n")
    with pytest.raises(ValueError, match=r"x.npz is not a .npz archive \(numpy.savez") as refused:
        load_splits(DatasetRef(name="npz", root=str(text)))
    assert "allow_pickle" not in str(refused.value)


def test_an_npz_file_of_python_objects_is_never_unpickled(tmp_path):
    arrays = _arrays()
    arrays["y_train"] = np.array([{"label": 1}] * 12, dtype=object)
    np.savez(tmp_path / "pickled.npz", **arrays)

    with pytest.raises(ValueError, match="not a readable .npz file"):
        load_splits(DatasetRef(name="npz", root=str(tmp_path / "pickled.npz")))


# ------------------------------------------------------------------------------- imagefolder


def _image(path, size, colour, mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, colour).save(path)


@pytest.fixture
def image_root(tmp_path):
    """train/{cat,dog} and test/{cat,dog} with PNGs of several sizes and modes."""
    root = tmp_path / "images"
    _image(root / "train" / "cat" / "a.png", (40, 20), (255, 0, 0))
    _image(root / "train" / "cat" / "b.png", (32, 32), 128, mode="L")  # grey: becomes 3 channels
    _image(root / "train" / "dog" / "c.png", (10, 10), (0, 0, 255, 255), mode="RGBA")
    _image(root / "train" / "dog" / "d.png", (64, 48), (0, 255, 0))
    _image(root / "test" / "dog" / "e.png", (16, 16), (0, 0, 255))
    return root


def test_imagefolder_gives_normalised_32px_rgb_with_train_class_numbers(image_root):
    ref = DatasetRef(name="imagefolder", root=str(image_root))

    x, y = load_split(ref, "train")
    x_test, y_test = load_split(ref, "test")

    assert x.shape == (4, 3, 32, 32) and x.dtype.is_floating_point and y.tolist() == [0, 0, 1, 1]
    # test/ holds only dog: numbered as in train/ (1), not as its own first folder (0)
    assert x_test.shape == (1, 3, 32, 32) and y_test.tolist() == [1]
    per_channel = x.permute(1, 0, 2, 3).reshape(3, -1)
    assert np.allclose(per_channel.mean(1).numpy(), 0, atol=1e-5)
    assert np.allclose(per_channel.std(1, unbiased=False).numpy(), 1, atol=1e-4)


def test_imagefolder_matches_torchvision_totensor_and_normalize(image_root):
    import torch
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    plain = ImageFolder(
        str(image_root / "train"), transform=transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])
    )
    raw = torch.stack([plain[i][0] for i in range(len(plain))])
    mean = raw.mean(dim=(0, 2, 3), dtype=torch.float64)
    std = raw.double().permute(1, 0, 2, 3).reshape(3, -1).std(1, unbiased=False)
    expected = transforms.Normalize(mean.tolist(), std.tolist())(raw)

    x, _ = load_split(DatasetRef(name="imagefolder", root=str(image_root)), "train")

    assert torch.allclose(x, expected, atol=1e-5)


def test_imagefolder_loader_makes_another_size(image_root):
    load = imagefolder_loader(8)
    DATASET_REGISTRY.register(Dataset("imagefolder8", "imagefolder8 — test", load, needs_root=True))
    try:
        x, _ = load_split(DatasetRef(name="imagefolder8", root=str(image_root)), "test")
    finally:
        DATASET_REGISTRY.unregister("imagefolder8")

    assert x.shape == (1, 3, 8, 8)
    assert load.input_shape == (3, 8, 8) and load.needs_root  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"size must be an integer in \[1, 4096\], got 0"):
        imagefolder_loader(0)


def test_imagefolder_without_its_folders_or_with_unknown_test_classes_is_refused(tmp_path, image_root):
    with pytest.raises(DatasetNotFoundError, match="lacks train/, test/"):
        load_splits(DatasetRef(name="imagefolder", root=str(tmp_path)))

    _image(image_root / "test" / "bird" / "f.png", (8, 8), (1, 2, 3))
    with pytest.raises(ValueError, match="class folders train/ lacks: bird"):
        load_split(DatasetRef(name="imagefolder", root=str(image_root)), "test")

    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    (empty / "test").mkdir()
    with pytest.raises(DatasetNotFoundError, match="train"):
        load_split(DatasetRef(name="imagefolder", root=str(empty)), "train")


# ----------------------------------------------------------------------------- cifar10's x


def test_normalised_images_match_the_torch_normalisation_for_indexed_samples():
    import torch

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, size=(6, 32, 32, 3), dtype=np.uint8)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    images = NormalisedImages(pixels, mean, std, channels_last=True)
    chosen = np.array([5, 1, 1])

    x = images[chosen]

    reference = torch.from_numpy(pixels[chosen]).permute(0, 3, 1, 2).float().div_(255.0)
    reference = (reference - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert images.shape == (6, 3, 32, 32) and images.dtype == np.float32 and len(images) == 6
    assert x.dtype == np.float32 and x.flags.c_contiguous and np.array_equal(x, reference.numpy())
    assert images[2].shape == (3, 32, 32) and np.array_equal(images[2], images[np.array([2])][0])
    assert images[1:3].shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match="mean and std need 3 values"):
        NormalisedImages(pixels, (0.5,), (0.5,), channels_last=True)


def test_the_root_fingerprint_sees_files_rewritten_in_place_and_images_added(tmp_path, image_root):
    from workers.registry.datasets import root_fingerprint

    def touch(path):
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    for name, values in _arrays().items():
        np.save(tmp_path / f"{name}.npy", values)
    before = root_fingerprint(str(tmp_path))
    touch(tmp_path / "y_train.npy")  # rewritten in place: the folder's own time does not move
    assert root_fingerprint(str(tmp_path)) != before

    before = root_fingerprint(str(image_root))
    _image(image_root / "train" / "dog" / "new.png", (8, 8), (9, 9, 9))
    touch(image_root / "train" / "dog")
    assert root_fingerprint(str(image_root)) != before
    assert root_fingerprint(None) is None and root_fingerprint(str(tmp_path / "none")) is None
