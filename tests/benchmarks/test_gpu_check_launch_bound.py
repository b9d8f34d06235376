"""benchmarks/gpu_check.py: configurations bound by kernel launches rather than the GPU are flagged."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def check():
    return load_benchmark("gpu_check")


@pytest.mark.parametrize(
    "utils,busy",
    [
        ([], None),
        ([0, 0, 0], 0.0),
        ([0, 0, 90, 95, 100, 0], (90 + 95 + 100) / 3),  # start-up and reaping left out
        ([0, 30, 0, 40, 0], (30 + 0 + 40) / 3),  # idle samples between busy ones count
    ],
)
def test_busy_utilisation_is_the_mean_between_the_first_and_last_busy_sample(check, utils, busy):
    got = check.busy_utilisation(utils)

    assert got is None if busy is None else got == pytest.approx(busy)


def test_a_gpu_busy_less_than_half_the_time_is_launch_bound(check):
    assert check.LAUNCH_BOUND_UTIL_PERCENT == 50.0
    assert check.launch_bound(49.9) is True
    assert check.launch_bound(50.0) is False
    assert check.launch_bound(None) is None


def test_the_table_flags_a_launch_bound_row(check, capsys):
    class Args:
        backend, data = "cuda-mps", "equal"

    class Check:
        args = Args()
        report = {"host": {"device": {"accelerator": "NVIDIA H200"}, "cores": [0]}}

    row = {
        "strategy": "sharing",
        "partitioning": "mps",
        "status": "succeeded",
        "error": "",
        "tasks": [],
        "raw_sps": 100.0,
        "fair": 1.5,
        "raw_speedup": 1.2,
        "fair_speedup": 1.1,
        "gpu_util_mean_percent": 30.0,
        "gpu_util_busy_percent": 35.0,
        "launch_bound": True,
    }
    busy = {**row, "strategy": "isolation", "gpu_util_busy_percent": 90.0, "launch_bound": False}

    check.print_table(Check(), [{"name": "light", "strategies": [row, busy]}])

    lines = capsys.readouterr().out.splitlines()
    assert any("sharing" in line and "launch-bound (GPU busy 35 % while training)" in line for line in lines)
    assert not any("isolation" in line and "launch-bound" in line for line in lines)
