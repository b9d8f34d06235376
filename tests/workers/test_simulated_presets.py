"""The simulated backend's device presets carry NVIDIA's data-sheet figures."""

from __future__ import annotations

import pytest

from workers.backends import simulated as sim

GIB = 1024**3

DATA_SHEETS = {
    # name: (fp32 FLOP/s, bytes/s, memory bytes, SMs, resident threads per SM)
    "titan-v": (14.9e12, 652.8e9, 12 * GIB, 80, 2048),
    "v100": (15.7e12, 900e9, 16 * GIB, 80, 2048),
    "a100-40gb": (19.5e12, 1555e9, 40 * GIB, 108, 2048),
    "a100-80gb": (19.5e12, 2039e9, 80 * GIB, 108, 2048),
    "h100-sxm": (67e12, 3350e9, 80 * GIB, 132, 2048),
    "h200": (67e12, 4800e9, 141 * GIB, 132, 2048),
    "t4": (8.1e12, 320e9, 15 * GIB, 40, 1024),
    "p100": (9.3e12, 732e9, 16 * GIB, 56, 2048),
    "k80": (4.37e12, 240e9, 12 * GIB, 13, 2048),  # one GK210 die of the two on a board
}


@pytest.mark.parametrize("name", sorted(DATA_SHEETS))
def test_each_preset_has_its_data_sheet_values(name):
    spec = sim.device_spec(name)

    assert spec.name == name
    assert (spec.peak_flops, spec.memory_bandwidth, spec.memory_bytes, spec.sms, spec.threads_per_sm) == DATA_SHEETS[
        name
    ]


def test_the_presets_are_those_listed_and_titan_v_stays_the_default(monkeypatch):
    monkeypatch.delenv(sim.ENV_DEVICE, raising=False)

    assert set(sim.DEVICE_PRESETS) == set(DATA_SHEETS)
    assert sim.DEFAULT_DEVICE == "titan-v"
    assert sim.device_from_env().name == "titan-v"


@pytest.mark.parametrize("name", ["v100", "h100-sxm", "h200"])
def test_a_new_preset_can_be_chosen_and_simulates(monkeypatch, name):
    monkeypatch.setenv(sim.ENV_DEVICE, name)
    device = sim.device_from_env()
    workload = sim.SimWorkload(flops_per_sample=1.7e9, activation_bytes_per_sample=3e6, param_bytes=45e6, layers=60)

    sps = sim.alone_throughput(workload, 128, device)

    assert device.name == name
    assert sps is not None and sps > sim.alone_throughput(workload, 128, sim.device_spec("titan-v"))
