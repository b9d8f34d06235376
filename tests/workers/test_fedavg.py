from __future__ import annotations

import numpy as np
import pytest

from workers.fl.fedavg import NoSamplesError, fedavg, load_state, save_state


def _state(weight: float, steps: int) -> dict[str, np.ndarray]:
    return {
        "conv.weight": np.full((2, 3), weight, dtype=np.float32),
        "bn.running_mean": np.full((3,), weight, dtype=np.float32),
        "bn.num_batches_tracked": np.array(steps, dtype=np.int64),
    }


def test_fedavg_weights_by_sample_counts():
    result = fedavg([_state(1.0, 0), _state(4.0, 0)], [30, 10])

    # (30·1 + 10·4) / 40 = 1.75
    np.testing.assert_allclose(result["conv.weight"], np.full((2, 3), 1.75))
    np.testing.assert_allclose(result["bn.running_mean"], np.full((3,), 1.75))


def test_fedavg_keeps_integer_buffers_integer():
    result = fedavg([_state(0.0, 10), _state(0.0, 13)], [1, 2])

    tracked = result["bn.num_batches_tracked"]
    assert tracked.dtype == np.int64
    assert tracked.shape == ()
    assert int(tracked) == 12  # (10 + 2·13) / 3 = 12


def test_fedavg_keeps_float_dtypes():
    result = fedavg([_state(1.0, 0), _state(2.0, 0)], [1, 1])

    assert result["conv.weight"].dtype == np.float32


def test_zero_sample_device_gets_weight_zero_even_with_nan():
    poisoned = _state(float("nan"), 999)

    result = fedavg([_state(2.0, 5), poisoned], [8, 0])

    np.testing.assert_array_equal(result["conv.weight"], np.full((2, 3), 2.0, np.float32))
    assert int(result["bn.num_batches_tracked"]) == 5


def test_all_zero_counts_raise_no_samples_error():
    with pytest.raises(NoSamplesError):
        fedavg([_state(1.0, 0), _state(2.0, 0)], [0, 0])


def test_negative_count_is_rejected():
    with pytest.raises(ValueError, match=r"sample_counts\[1\]"):
        fedavg([_state(1.0, 0), _state(2.0, 0)], [1, -1])


def test_result_does_not_depend_on_order():
    rng = np.random.default_rng(0)
    states = [{"w": rng.normal(size=(50, 7)).astype(np.float32)} for _ in range(5)]
    counts = [3, 17, 0, 250, 9]
    order = [3, 0, 4, 2, 1]

    forward = fedavg(states, counts)
    shuffled = fedavg([states[i] for i in order], [counts[i] for i in order])

    np.testing.assert_allclose(forward["w"], shuffled["w"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "mutate,key",
    [
        (lambda s: s.pop("bn.running_mean"), "keys"),
        (lambda s: s.update({"conv.weight": np.zeros((3, 2), np.float32)}), "conv.weight"),
        (lambda s: s.update({"conv.weight": np.zeros((2, 3), np.float64)}), "conv.weight"),
    ],
)
def test_mismatched_states_are_rejected_naming_the_key(mutate, key):
    other = _state(1.0, 0)
    mutate(other)

    with pytest.raises(ValueError, match=key):
        fedavg([_state(1.0, 0), other], [1, 1])


def test_save_and_load_state_round_trip_keeps_0d_tensors(tmp_path):
    state = _state(1.5, 7)

    digest = save_state(state, tmp_path / "s.safetensors")
    loaded = load_state(tmp_path / "s.safetensors")

    assert len(digest) == 64
    assert loaded["bn.num_batches_tracked"].shape == ()
    np.testing.assert_array_equal(loaded["conv.weight"], state["conv.weight"])


@pytest.mark.parametrize("architecture", ["resnet18", "mobilenet_v3_small", "vgg16"])
def test_fedavg_of_real_models_loads_strict_into_a_model(tmp_path, architecture):
    import torch

    from workers.fl.artifacts import load_model_weights, save_model_weights
    from workers.training.zoo import build_model

    paths = [tmp_path / "device-1.safetensors", tmp_path / "device-2.safetensors"]
    save_model_weights(build_model(architecture, 10, 1), paths[0])
    # The second model receives the average: building a third VGG16 (138 M parameters)
    # would only slow the suite down.
    target = build_model(architecture, 10, 2)
    save_model_weights(target, paths[1])
    states = [load_state(p) for p in paths]

    averaged = fedavg(states, [100, 300])
    save_state(averaged, tmp_path / "global.safetensors")
    load_model_weights(target, tmp_path / "global.safetensors")

    loaded = target.state_dict()
    key = min(
        (k for k, v in averaged.items() if v.dtype == np.float32 and v.ndim > 1), key=lambda k: averaged[k].size
    )  # small, so checking it stays fast
    expected = (100 * states[0][key].astype(np.float64) + 300 * states[1][key]) / 400
    np.testing.assert_allclose(loaded[key].numpy(), expected, rtol=1e-6, atol=1e-7)
    integer_keys = [k for k, v in loaded.items() if not v.is_floating_point()]
    assert all(loaded[k].dtype == torch.int64 and loaded[k].shape == () for k in integer_keys)
    assert bool(integer_keys) == (architecture != "vgg16")  # VGG16 has no BatchNorm
