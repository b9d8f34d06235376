"""Fixtures shared by the control plane's FL-algorithm tests (test_aggregation_resume.py,
test_run_aggregation.py, test_fl_settings.py)."""

from __future__ import annotations

import pytest

from tests.controlplane import stateful_aggregator


@pytest.fixture
def two_tasks(make_device, make_task):
    """dev-a holds 30 samples of t-mobilenet and none of t-shufflenet; dev-b 10 and 20."""
    devices = [make_device("dev-a"), make_device("dev-b")]
    tasks = [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")]
    counts = [
        {"device": devices[0].id, "task": tasks[0].id, "num_samples": 30},
        {"device": devices[1].id, "task": tasks[0].id, "num_samples": 10},
        {"device": devices[1].id, "task": tasks[1].id, "num_samples": 20},
    ]
    return devices, tasks, counts


@pytest.fixture
def momentum():
    """The test's stateful aggregator, registered for the test only."""
    with stateful_aggregator.registered() as record:
        yield record
