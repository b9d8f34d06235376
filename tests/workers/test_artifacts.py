from __future__ import annotations

import hashlib

import pytest

from workers.fl.artifacts import (
    ArtifactStore,
    LocalArtifactStore,
    device_weights_key,
    get_store,
    global_weights_key,
)

IMPLEMENTATIONS = [LocalArtifactStore]


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda cls: cls.__name__)
def any_store(request, tmp_path) -> ArtifactStore:
    return request.param(tmp_path / "store")


class TestArtifactStoreContract:
    """What every ArtifactStore implementation must do."""

    def test_write_bytes_stores_under_key_and_reports_sha256(self, any_store):
        digest = any_store.write_bytes("runs/1/x.bin", b"abc")

        assert any_store.exists("runs/1/x.bin")
        assert any_store.path("runs/1/x.bin").read_bytes() == b"abc"
        assert digest == hashlib.sha256(b"abc").hexdigest() == any_store.sha256("runs/1/x.bin")

    def test_put_file_copies_the_file(self, any_store, tmp_path):
        source = tmp_path / "src.bin"
        source.write_bytes(b"weights")

        digest = any_store.put_file("a/b.bin", source)

        assert any_store.path("a/b.bin").read_bytes() == b"weights"
        assert digest == hashlib.sha256(b"weights").hexdigest()

    @pytest.mark.parametrize("key", ["/etc/passwd", "../escape", "a/../../b", "a//b", "", "a\\b"])
    def test_invalid_keys_are_rejected(self, any_store, key):
        with pytest.raises(ValueError, match="artifact key"):
            any_store.path(key)

    def test_sha256_of_missing_key_names_the_key(self, any_store):
        assert not any_store.exists("nothing.bin")
        with pytest.raises(FileNotFoundError, match="nothing.bin"):
            any_store.sha256("nothing.bin")


def test_local_store_leaves_no_temporary_files(tmp_path):
    store = LocalArtifactStore(tmp_path)

    store.write_bytes("runs/1/x.bin", b"abc")
    store.put_file("runs/1/y.bin", store.path("runs/1/x.bin"))

    assert sorted(p.name for p in (tmp_path / "runs/1").iterdir()) == ["x.bin", "y.bin"]


def test_get_store_defaults_to_artifact_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_ROOT", str(tmp_path / "arts"))

    store = get_store()

    assert store.path("k") == (tmp_path / "arts").resolve() / "k"


def test_weight_keys_are_distinct_per_round_device_and_task():
    keys = {
        global_weights_key(1, 2, None),
        global_weights_key(1, 2, 0),
        global_weights_key(1, 3, 0),
        device_weights_key(1, 0, "dev-a", 2),
        device_weights_key(1, 0, "dev-b", 2),
        device_weights_key(1, 1, "dev-a", 2),
    }

    assert len(keys) == 6


def test_device_weights_key_rejects_bad_device_name():
    with pytest.raises(ValueError, match="device name"):
        device_weights_key(1, 0, "../x", 2)


def test_model_weights_round_trip_strict(tmp_path):
    import torch

    from workers.fl.artifacts import load_model_weights, save_model_weights
    from workers.training.zoo import build_model

    source = build_model("shufflenet_v2_x1_0", 10, 1)
    digest = save_model_weights(source, tmp_path / "w.safetensors")
    target = build_model("shufflenet_v2_x1_0", 10, 2)

    load_model_weights(target, tmp_path / "w.safetensors")

    assert len(digest) == 64
    for key, value in source.state_dict().items():
        assert torch.equal(value, target.state_dict()[key])


def test_load_model_weights_is_strict(tmp_path):
    from workers.fl.artifacts import load_model_weights, save_model_weights
    from workers.training.zoo import build_model

    save_model_weights(build_model("shufflenet_v2_x1_0", 10, 1), tmp_path / "w.safetensors")

    with pytest.raises(RuntimeError):
        load_model_weights(build_model("mobilenet_v3_small", 10, 1), tmp_path / "w.safetensors")
