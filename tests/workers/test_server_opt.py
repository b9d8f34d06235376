"""The server optimisers (FedAvgM, FedAdagrad, FedAdam, FedYogi) and FedProx's record, against
examples worked by hand from the papers' update equations.

The example every aggregator is checked on: one float64 tensor ``w`` of 2 values (float64, so the
expected numbers hold to 1e-12), BatchNorm's ``bn.running_var`` (float32) and
``bn.num_batches_tracked`` (int64).

- Round 1, zero state: ``W0 = [1, 2]``; device A ``[1.5, 1.0]`` with 3 samples, device B
  ``[0.5, 3.0]`` with 1: mean ``[(4.5 + 0.5)/4, (3 + 3)/4] = [1.25, 1.5]``, so the
  pseudo-gradient is ``Δ1 = mean − W0 = [0.25, −0.5]``.
- Round 2, the state carried: device A ``W1 + [0.5, 0.25]`` with 2 samples, device B all NaN
  with **0 samples** (weighs nothing), device C ``W1 + [0, −0.75]`` with 2: ``Δ2 = [0.25, −0.25]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.fl.fedavg import NoSamplesError, fedavg, load_state, save_state
from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext, proximal_client_term

W0 = np.array([1.0, 2.0])


def _device(w, running_var: float, tracked: int) -> dict[str, np.ndarray]:
    return {
        "w": np.asarray(w, dtype=np.float64),
        "bn.running_var": np.array([running_var], dtype=np.float32),
        "bn.num_batches_tracked": np.array(tracked, dtype=np.int64),
    }


def _round1_devices() -> list[tuple[dict[str, np.ndarray], int]]:
    return [(_device([1.5, 1.0], 1.0, 10), 3), (_device([0.5, 3.0], 3.0, 20), 1)]


def _round2_devices(w1: np.ndarray) -> list[tuple[dict[str, np.ndarray], int]]:
    return [
        (_device(w1 + [0.5, 0.25], 2.0, 30), 2),
        (_device([np.nan, np.nan], np.nan, 999), 0),
        (_device(w1 + [0.0, -0.75], 4.0, 41), 2),
    ]


def _aggregate(name, params, previous, devices, state=None):
    """One round through the registry, as the control plane runs it; returns (result, state)."""
    record = AGGREGATOR_REGISTRY.get(name)
    aggregation = record.start(
        AggregationContext(
            previous=lambda: dict(previous),
            options=record.check_params(params),
            state=lambda: dict(state or {}),
        )
    )
    for device_state, count in devices:
        aggregation.add(device_state, count)
    result = aggregation.result()
    return result, (aggregation.server_state() if record.stateful else {})


def _previous(w) -> dict[str, np.ndarray]:
    return _device(w, 5.0, 7)


# Hand-worked: η = 0.5, β = 0.9 (Hsu et al. 2019, §3: v ← βv + Δ, W ← W + ηv, v starts at 0).
#   round 1: v1 = Δ1 = [0.25, −0.5];                          W1 = W0 + 0.5 v1 = [1.125, 1.75]
#   round 2: v2 = 0.9 [0.25, −0.5] + [0.25, −0.25] = [0.475, −0.7]; W2 = W1 + 0.5 v2 = [1.3625, 1.4]
FEDAVGM = {
    "params": {"server_learning_rate": 0.5, "server_momentum": 0.9},
    "round1": {"momentum/w": [0.25, -0.5], "w": [1.125, 1.75]},
    "round2": {"momentum/w": [0.475, -0.7], "w": [1.3625, 1.4]},
}

# Hand-worked, Reddi et al. 2021 Algorithm 2 with η = 0.1, β1 = 0.5, β2 = 0.8, τ = 0.3, no bias
# correction, m_{−1} = 0, v_{−1} = τ² = 0.09:
#   m1 = 0.5·0 + 0.5 Δ1 = [0.125, −0.25];  m2 = 0.5 m1 + 0.5 Δ2 = [0.1875, −0.25]  (all three)
#   W_{t+1} = W_t + 0.1 m_t / (√v_t + 0.3)
ADAPTIVE = {
    # v1 = 0.09 + Δ1² = [0.1525, 0.34];  v2 = v1 + Δ2² = [0.215, 0.4025]
    "fedadagrad": {
        "params": {"server_learning_rate": 0.1, "beta1": 0.5, "tau": 0.3},
        "v1": [0.1525, 0.34],
        "v2": [0.215, 0.4025],
    },
    # v1 = 0.8·0.09 + 0.2 Δ1² = [0.0845, 0.122];  v2 = 0.8 v1 + 0.2 Δ2² = [0.0801, 0.1101]
    "fedadam": {
        "params": {"server_learning_rate": 0.1, "beta1": 0.5, "beta2": 0.8, "tau": 0.3},
        "v1": [0.0845, 0.122],
        "v2": [0.0801, 0.1101],
    },
    # v1 = 0.09 − 0.2 Δ1² sign(0.09 − Δ1²): [0.09 − 0.0125, 0.09 + 0.05] = [0.0775, 0.14] (both signs)
    # v2 = v1 − 0.2 Δ2² sign(v1 − Δ2²) = [0.0775 − 0.0125, 0.14 − 0.0125] = [0.065, 0.1275]
    "fedyogi": {
        "params": {"server_learning_rate": 0.1, "beta1": 0.5, "beta2": 0.8, "tau": 0.3},
        "v1": [0.0775, 0.14],
        "v2": [0.065, 0.1275],
    },
}
M1, M2 = [0.125, -0.25], [0.1875, -0.25]


def _adaptive_w(w, m, v, eta=0.1, tau=0.3) -> list[float]:
    return [w[i] + eta * m[i] / (math.sqrt(v[i]) + tau) for i in range(2)]


def _expected(name: str) -> tuple[dict, dict, dict]:
    if name == "fedavgm":
        return FEDAVGM["params"], FEDAVGM["round1"], FEDAVGM["round2"]
    case = ADAPTIVE[name]
    w1 = _adaptive_w(W0, M1, case["v1"])
    w2 = _adaptive_w(w1, M2, case["v2"])
    return (
        case["params"],
        {"m/w": M1, "v/w": case["v1"], "w": w1},
        {"m/w": M2, "v/w": case["v2"], "w": w2},
    )


SERVER_OPTIMISERS = ["fedavgm", "fedadagrad", "fedadam", "fedyogi"]


@pytest.mark.parametrize("name", SERVER_OPTIMISERS)
def test_server_optimiser_matches_the_hand_worked_rounds(name):
    params, round1, round2 = _expected(name)

    w1, state1 = _aggregate(name, params, _previous(W0), _round1_devices())
    w2, state2 = _aggregate(name, params, w1, _round2_devices(w1["w"]), state=state1)

    assert set(state1) == {key for key in round1 if key != "w"}
    for key, expected in round1.items():
        got = w1["w"] if key == "w" else state1[key]
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=f"round 1 {key}")
    for key, expected in round2.items():
        got = w2["w"] if key == "w" else state2[key]
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=f"round 2 {key}")


def test_hand_worked_adaptive_weights_are_these_numbers():
    # The formula helper above, pinned to literal values (FedAdam, round 1):
    # W1 = [1 + 0.1·0.125/(√0.0845 + 0.3), 2 − 0.1·0.25/(√0.122 + 0.3)]
    assert _adaptive_w(W0, M1, ADAPTIVE["fedadam"]["v1"]) == pytest.approx([1.0211617339, 1.9614961063], abs=1e-10)


@pytest.mark.parametrize("name", [*SERVER_OPTIMISERS, "fedprox"])
def test_integer_buffers_and_running_statistics_take_the_fedavg_result(name):
    params = _expected(name)[0] if name != "fedprox" else {}

    w1, state1 = _aggregate(name, params, _previous(W0), _round1_devices())
    devices2 = _round2_devices(w1["w"])
    w2, _ = _aggregate(name, params, w1, devices2, state=state1)

    for result, devices in ((w1, _round1_devices()), (w2, devices2)):
        reference = fedavg([d for d, _ in devices], [n for _, n in devices])
        for key in ("bn.num_batches_tracked", "bn.running_var"):
            assert result[key].dtype == reference[key].dtype
            assert np.array_equal(result[key], reference[key])
    # (10·3 + 20)/4 = 12.5 → 12 and (30·2 + 41·2)/4 = 35.5 → 36: halves to even, as FedAvg.
    assert w1["bn.num_batches_tracked"].dtype == np.int64 and int(w1["bn.num_batches_tracked"]) == 12
    assert int(w2["bn.num_batches_tracked"]) == 36
    assert not any(key.endswith(("running_var", "num_batches_tracked")) for key in state1)


def test_fedavgm_without_momentum_at_rate_one_is_fedavg():
    w1, _ = _aggregate(
        "fedavgm", {"server_learning_rate": 1.0, "server_momentum": 0.0}, _previous(W0), _round1_devices()
    )

    assert w1["w"].tolist() == [1.25, 1.5]


@pytest.mark.parametrize("name", SERVER_OPTIMISERS)
def test_float32_tensors_stay_float32_and_so_does_their_state(name):
    previous = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    devices = [({"w": np.array([1.5, 1.0], dtype=np.float32)}, 3), ({"w": np.array([0.5, 3.0], dtype=np.float32)}, 1)]

    result, state = _aggregate(name, {}, previous, devices)

    assert result["w"].dtype == np.float32
    assert state and all(value.dtype == np.float32 and value.shape == (2,) for value in state.values())


@pytest.mark.parametrize("name", SERVER_OPTIMISERS)
def test_server_state_round_trips_through_safetensors_with_its_dtypes(name, tmp_path):
    params = _expected(name)[0]
    w1, state1 = _aggregate(name, params, _previous(W0), _round1_devices())
    state1["extra/f32"] = np.array([0.5], dtype=np.float32)  # a float32 slot beside the float64 ones

    save_state(state1, tmp_path / "state.safetensors")
    save_state(w1, tmp_path / "w1.safetensors")
    loaded_state = load_state(tmp_path / "state.safetensors")
    loaded_w1 = load_state(tmp_path / "w1.safetensors")
    del loaded_state["extra/f32"], state1["extra/f32"]

    assert {k: v.dtype for k, v in loaded_w1.items()} == {k: v.dtype for k, v in w1.items()}
    assert all(np.array_equal(loaded_state[k], state1[k]) and loaded_state[k].dtype == state1[k].dtype for k in state1)
    from_disk, _ = _aggregate(name, params, loaded_w1, _round2_devices(loaded_w1["w"]), state=loaded_state)
    in_memory, _ = _aggregate(name, params, w1, _round2_devices(w1["w"]), state=state1)
    assert all(np.array_equal(from_disk[k], in_memory[k]) for k in in_memory)


def test_a_float32_state_round_trips_through_safetensors_as_float32(tmp_path):
    previous = {"w": np.array([1.0, 2.0], dtype=np.float32), "n": np.array(3, dtype=np.int64)}
    devices = [({"w": np.array([1.5, 1.0], dtype=np.float32), "n": np.array(4, dtype=np.int64)}, 1)]
    _, state = _aggregate("fedadam", {}, previous, devices)

    save_state(state, tmp_path / "state.safetensors")
    loaded = load_state(tmp_path / "state.safetensors")

    assert {k: v.dtype for k, v in loaded.items()} == {"m/w": np.float32, "v/w": np.float32}
    assert all(np.array_equal(loaded[k], state[k]) for k in state)


@pytest.mark.parametrize("name", SERVER_OPTIMISERS)
def test_every_device_without_samples_raises_no_samples_and_gives_no_state(name):
    record = AGGREGATOR_REGISTRY.get(name)
    aggregation = record.start(AggregationContext(previous=lambda: _previous(W0), options={}))
    aggregation.add(_device([1.5, 1.0], 1.0, 10), 0)
    aggregation.add(_device([0.5, 3.0], 3.0, 20), 0)

    with pytest.raises(NoSamplesError):
        aggregation.result()
    with pytest.raises(RuntimeError, match="only known after result"):
        aggregation.server_state()


def test_the_callers_state_is_not_changed_in_place():
    _, state1 = _aggregate("fedadam", ADAPTIVE["fedadam"]["params"], _previous(W0), _round1_devices())
    kept = {k: v.copy() for k, v in state1.items()}

    _aggregate("fedadam", ADAPTIVE["fedadam"]["params"], _previous(W0), _round1_devices(), state=state1)

    assert all(np.array_equal(state1[k], kept[k]) for k in kept)


@pytest.mark.parametrize(
    "name,state,match",
    [
        (
            "fedadam",
            {"m/w": np.zeros(3), "v/w": np.zeros(2)},
            r"'m/w' has shape \(3,\) but the model's tensor has \(2,\)",
        ),
        ("fedadam", {"m/w": np.zeros(2)}, r"server state has no 'v/w'"),
        ("fedyogi", {"m/w": np.zeros(2), "v/w": np.zeros(2), "m/old": np.zeros(2)}, r"'m/old' matches no optimised"),
        ("fedavgm", {"m/w": np.zeros(2), "v/w": np.zeros(2)}, r"'m/w' matches no optimised"),
        ("fedadagrad", {"m/w": np.zeros(2), "v/w": np.zeros(2), "m/bn.running_var": np.zeros(1)}, "m/bn.running_var"),
    ],
)
def test_a_server_state_that_does_not_match_the_model_is_refused_naming_the_key(name, state, match):
    with pytest.raises(ValueError, match=match):
        _aggregate(name, {}, _previous(W0), _round1_devices(), state=state)


def test_a_previous_model_that_does_not_match_the_devices_is_refused_naming_the_key():
    previous = _previous(W0)
    previous["w"] = np.array([1.0, 2.0, 3.0])

    with pytest.raises(ValueError, match=r"'w' has shape \(3,\) in the previous global model"):
        _aggregate("fedadam", {}, previous, _round1_devices())


REDDI_DEFAULTS = {"server_learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}


@pytest.mark.parametrize(
    "name,defaults",
    [
        ("fedavg", {}),
        ("fedavgm", {"server_learning_rate": 0.5, "server_momentum": 0.5}),
        ("fedadagrad", {"server_learning_rate": 0.01, "beta1": 0.0, "tau": 1e-3, "initial_v": "tau_squared"}),
        ("fedadam", {**REDDI_DEFAULTS, "bias_correction": False, "initial_v": "tau_squared"}),
        ("fedyogi", {**REDDI_DEFAULTS, "bias_correction": False, "initial_v": "tau_squared"}),
        ("fedprox", {"mu": 0.01}),
    ],
)
def test_check_params_fills_the_defaults(name, defaults):
    assert AGGREGATOR_REGISTRY.get(name).check_params({}) == defaults


def test_the_records_declare_what_the_control_plane_needs():
    for name in SERVER_OPTIMISERS:
        record = AGGREGATOR_REGISTRY.get(name)
        assert record.uses_previous and record.stateful and record.trainer_options is None
        assert record.client_term is None and record.assignment_options(record.check_params({})) == {}
    fedprox = AGGREGATOR_REGISTRY.get("fedprox")
    assert not fedprox.stateful and not fedprox.uses_previous
    assert fedprox.trainer_options(fedprox.check_params({"mu": 0.5})) == {"mu": 0.5}
    assert fedprox.client_term is proximal_client_term
    assert fedprox.assignment_options(fedprox.check_params({"mu": 0.5})) == {
        "aggregator": "fedprox",
        "client_options": {"mu": 0.5},
    }


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("fedadam", {"beta3": 0.5}, r"aggregation_params\.beta3: fedadam takes no parameter of that name; allowed: "),
        ("fedadagrad", {"beta2": 0.5}, r"aggregation_params\.beta2: .*allowed: server_learning_rate, beta1, tau"),
        ("fedadam", {"beta1": 1.0}, r"aggregation_params\.beta1 must be a number in \[0, 0\.999\], got 1\.0"),
        ("fedyogi", {"tau": 0}, r"aggregation_params\.tau must be a number in \(0, 1\], got 0"),
        ("fedavgm", {"server_learning_rate": 0.0}, r"aggregation_params\.server_learning_rate must be a number in \(0"),
        (
            "fedavgm",
            {"server_momentum": -0.1},
            r"aggregation_params\.server_momentum must be a number in \[0, 0\.999\]",
        ),
        (
            "fedadam",
            {"bias_correction": "maybe"},
            r"aggregation_params\.bias_correction must be true or false, got 'maybe'",
        ),
        ("fedyogi", {"bias_correction": 1}, r"aggregation_params\.bias_correction must be true or false, got 1"),
        (
            "fedadam",
            {"initial_v": "ones"},
            r"aggregation_params\.initial_v must be one of tau_squared, zero, got 'ones'",
        ),
        ("fedadagrad", {"initial_v": 0}, r"aggregation_params\.initial_v must be one of tau_squared, zero, got 0"),
        (
            "fedadagrad",
            {"bias_correction": True},
            r"aggregation_params\.bias_correction: fedadagrad takes no parameter of that name; "
            r"allowed: server_learning_rate, beta1, tau, initial_v",
        ),
        ("fedprox", {"mu": 1001}, r"aggregation_params\.mu must be a number in \[0, 1000\], got 1001"),
        ("fedprox", {"mu": "a lot"}, r"aggregation_params\.mu must be a number in \[0, 1000\]"),
    ],
)
def test_check_params_refuses_unknown_names_and_values_out_of_range(name, params, match):
    with pytest.raises(ValueError, match=match):
        AGGREGATOR_REGISTRY.get(name).check_params(params)


def test_fedprox_aggregates_exactly_as_fedavg():
    devices = _round1_devices()

    result, _ = _aggregate("fedprox", {"mu": 1.0}, _previous(W0), devices)

    reference = fedavg([d for d, _ in devices], [n for _, n in devices])
    assert all(np.array_equal(result[k], reference[k]) and result[k].dtype == reference[k].dtype for k in reference)


# --- the two conventions: Reddi et al. 2021 (the defaults, above) and Flower's -------------------
#
# The same example (η = 0.1, β1 = 0.5, β2 = 0.8, τ = 0.3, Δ1 = [0.25, −0.5], Δ2 = [0.25, −0.25], so
# m1 = [0.125, −0.25] and m2 = [0.1875, −0.25] as above), now from v_{−1} = 0 (initial_v=zero):
#   FedAdam:    v1 = 0.2 Δ1² = [0.0125, 0.05];  v2 = 0.8 v1 + 0.2 Δ2² = [0.0225, 0.0525]
#   FedYogi:    v1 = 0 − 0.2 Δ1² sign(0 − Δ1²) = [0.0125, 0.05];
#               v2 = v1 − 0.2 Δ2² sign(v1 − Δ2²) = v1 + 0.2·0.0625 (v1 < Δ2² = 0.0625) = [0.025, 0.0625]
#   FedAdagrad: v1 = Δ1² = [0.0625, 0.25];  v2 = v1 + Δ2² = [0.125, 0.3125]
# With bias_correction (FedAdam, FedYogi): η_t = η √(1 − β2^(t+1)) / (1 − β1^(t+1)):
#   η_1 = 0.1 √(1 − 0.64) / (1 − 0.25) = 0.1 · 0.6 / 0.75 = 0.08
#   η_2 = 0.1 √(1 − 0.512) / (1 − 0.125) = 0.1 √0.488 / 0.875 = 0.0798365...
ETA_1 = 0.08
ETA_2 = 0.1 * math.sqrt(0.488) / 0.875
ZERO_V = {
    "fedadam": ([0.0125, 0.05], [0.0225, 0.0525]),
    "fedyogi": ([0.0125, 0.05], [0.025, 0.0625]),
    "fedadagrad": ([0.0625, 0.25], [0.125, 0.3125]),
}
FLOWER = {"fedadam": True, "fedyogi": True, "fedadagrad": False}
"""Flower's convention per optimiser: initial_v zero, and bias correction where Flower applies
or this project allows it (FedAdam: Flower's; FedYogi: allowed here; FedAdagrad: none)."""


def _conventions_params(name: str, *, bias_correction: bool, initial_v: str) -> dict:
    params = {**ADAPTIVE[name]["params"], "initial_v": initial_v}
    if name != "fedadagrad":
        params["bias_correction"] = bias_correction
    return params


@pytest.mark.parametrize(
    "name,bias_correction",
    [(name, False) for name in FLOWER] + [(name, True) for name, takes in FLOWER.items() if takes],
)
def test_the_flower_conventions_match_the_hand_worked_rounds(name, bias_correction):
    params = _conventions_params(name, bias_correction=bias_correction, initial_v="zero")
    v1, v2 = ZERO_V[name]
    eta1, eta2 = (ETA_1, ETA_2) if bias_correction else (0.1, 0.1)

    w1, state1 = _aggregate(name, params, _previous(W0), _round1_devices())
    w2, state2 = _aggregate(name, params, w1, _round2_devices(w1["w"]), state=state1)

    expected_w1 = _adaptive_w(W0, M1, v1, eta=eta1)
    np.testing.assert_allclose(state1["m/w"], M1, rtol=1e-12)
    np.testing.assert_allclose(state1["v/w"], v1, rtol=1e-12)
    np.testing.assert_allclose(w1["w"], expected_w1, rtol=1e-12)
    np.testing.assert_allclose(state2["v/w"], v2, rtol=1e-12)
    np.testing.assert_allclose(w2["w"], _adaptive_w(w1["w"], M2, v2, eta=eta2), rtol=1e-12)
    assert (int(state1["t"]), int(state2["t"])) == (1, 2) if bias_correction else "t" not in state2


def test_flower_fedadam_hand_worked_weights_are_these_numbers():
    # Round 1 of FedAdam, Flower's conventions: W1 = W0 + 0.08 m1 / (√v1 + 0.3)
    #   = [1 + 0.08·0.125/(√0.0125 + 0.3), 2 − 0.08·0.25/(√0.05 + 0.3)]
    params = _conventions_params("fedadam", bias_correction=True, initial_v="zero")

    w1, _ = _aggregate("fedadam", params, _previous(W0), _round1_devices())

    assert w1["w"].tolist() == pytest.approx([1.0242834324, 1.9618033989], abs=1e-10)
    assert ETA_2 == pytest.approx(0.0798366, abs=1e-7)


def test_bias_correction_from_tau_squared_changes_only_the_rate():
    # The two parameters are independent: bias correction with v_{−1} = τ² keeps Reddi et al.'s v.
    params = _conventions_params("fedadam", bias_correction=True, initial_v="tau_squared")

    w1, state1 = _aggregate("fedadam", params, _previous(W0), _round1_devices())

    np.testing.assert_allclose(state1["v/w"], ADAPTIVE["fedadam"]["v1"], rtol=1e-12)
    np.testing.assert_allclose(w1["w"], _adaptive_w(W0, M1, ADAPTIVE["fedadam"]["v1"], eta=ETA_1), rtol=1e-12)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_the_defaults_are_reddi_et_al_as_before(name):
    # The parameters written out at their defaults give the numbers the records gave before they existed.
    written = _conventions_params(name, bias_correction=False, initial_v="tau_squared")
    _, round1, round2 = _expected(name)

    w1, state1 = _aggregate(name, written, _previous(W0), _round1_devices())
    w2, _ = _aggregate(name, written, w1, _round2_devices(w1["w"]), state=state1)

    assert set(state1) == {"m/w", "v/w"}
    np.testing.assert_allclose(w1["w"], round1["w"], rtol=1e-12)
    np.testing.assert_allclose(w2["w"], round2["w"], rtol=1e-12)


class FlowerFedOpt:
    """Flower 1.x's FedAdam / FedYogi / FedAdagrad ``aggregate_fit`` after the FedAvg mean
    (``flwr/server/strategy/fedadam.py``, ``fedyogi.py``, ``fedadagrad.py``), transcribed
    operation for operation: m and v from ``np.zeros_like``, FedAdam's ``eta_norm`` with
    ``server_round`` counting from 1, FedYogi and FedAdagrad without one."""

    def __init__(self, kind, weights, *, eta, beta_1, beta_2, tau):
        self.kind, self.current_weights = kind, [np.array(w, dtype=np.float64) for w in weights]
        self.eta, self.beta_1, self.beta_2, self.tau = eta, beta_1, beta_2, tau
        self.m_t, self.v_t = None, None

    def aggregate_fit(self, server_round, fedavg_weights_aggregate):
        delta_t = [x - y for x, y in zip(fedavg_weights_aggregate, self.current_weights, strict=True)]
        if not self.m_t:
            self.m_t = [np.zeros_like(x) for x in delta_t]
        self.m_t = [np.multiply(self.beta_1, x) + (1 - self.beta_1) * y for x, y in zip(self.m_t, delta_t, strict=True)]
        if not self.v_t:
            self.v_t = [np.zeros_like(x) for x in delta_t]
        if self.kind == "fedadam":
            self.v_t = [
                self.beta_2 * x + (1 - self.beta_2) * np.multiply(y, y) for x, y in zip(self.v_t, delta_t, strict=True)
            ]
            eta_norm = (
                self.eta
                * np.sqrt(1 - np.power(self.beta_2, server_round + 1.0))
                / (1 - np.power(self.beta_1, server_round + 1.0))
            )
        elif self.kind == "fedyogi":
            self.v_t = [
                x - (1.0 - self.beta_2) * np.multiply(y, y) * np.sign(x - np.multiply(y, y))
                for x, y in zip(self.v_t, delta_t, strict=True)
            ]
            eta_norm = self.eta
        else:
            self.v_t = [x + np.multiply(y, y) for x, y in zip(self.v_t, delta_t, strict=True)]
            eta_norm = self.eta
        self.current_weights = [
            x + eta_norm * y / (np.sqrt(z) + self.tau)
            for x, y, z in zip(self.current_weights, self.m_t, self.v_t, strict=True)
        ]
        return self.current_weights


@pytest.mark.parametrize(
    "name,params",
    [
        # Flower's FedAdam: bias correction on, v from 0 (its defaults η = 0.1, β1 = 0.9, β2 = 0.99).
        ("fedadam", {"server_learning_rate": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "bias_correction": True}),
        # Flower's FedYogi: no bias correction, v from 0.
        ("fedyogi", {"server_learning_rate": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "bias_correction": False}),
        # Flower's FedAdagrad: β1 fixed at 0, v from 0.
        ("fedadagrad", {"server_learning_rate": 0.1, "beta1": 0.0, "tau": 1e-3}),
    ],
)
def test_flower_conventions_reproduce_flowers_strategies_exactly(name, params):
    rng = np.random.default_rng(7)
    weights = {"w": rng.normal(size=5), "b": rng.normal(size=(2, 3))}
    flower = FlowerFedOpt(
        name,
        [weights["w"], weights["b"]],
        eta=params["server_learning_rate"],
        beta_1=params["beta1"],
        beta_2=params.get("beta2", 0.0),
        tau=params["tau"],
    )
    state: dict = {}
    for server_round in range(1, 6):  # Flower's server_round counts from 1
        # One device with every sample: the FedAvg mean is its model, bit for bit, in both.
        device = {key: value + rng.normal(scale=0.1, size=value.shape) for key, value in weights.items()}
        weights, state = _aggregate(name, {**params, "initial_v": "zero"}, weights, [(device, 1)], state=state)
        expected = flower.aggregate_fit(server_round, [device["w"], device["b"]])

        assert np.array_equal(weights["w"], expected[0]) and np.array_equal(weights["b"], expected[1]), server_round


@pytest.mark.parametrize("value,expected", [(True, True), ("true", True), ("FALSE", False), (False, False)])
def test_bias_correction_takes_json_booleans_and_the_words_a_command_line_sends(value, expected):
    assert AGGREGATOR_REGISTRY.get("fedadam").check_params({"bias_correction": value})["bias_correction"] is expected


def test_a_bias_corrected_state_without_its_step_count_is_refused():
    params = {"bias_correction": True}
    _, state = _aggregate("fedadam", {}, _previous(W0), _round1_devices())  # no "t": saved without correction

    with pytest.raises(ValueError, match=r"server state has no 't'"):
        _aggregate("fedadam", params, _previous(W0), _round1_devices(), state=state)
