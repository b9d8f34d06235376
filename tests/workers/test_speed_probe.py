"""The speed probe: readings of a core's speed in CPU time, not in wall time."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from workers.profiling.speed_probe import ProbeReading, SpeedProbe

_BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def _core() -> int:
    return min(os.sched_getaffinity(0))


def test_probe_reads_the_speed_of_its_core_only_while_running():
    core = _core()
    with SpeedProbe([core], period_s=0.02) as probe:
        time.sleep(0.4)
    stopped = time.monotonic()
    readings = probe.readings()
    assert len(readings) >= 5
    assert all(r.core == core and r.mips > 0 and r.at < stopped for r in readings)
    time.sleep(0.1)
    assert len(probe.readings()) == len(readings)  # stopped means stopped

    start, end = readings[0].at, readings[-1].at
    index = probe.speed_index([core], start, end)
    geometric_mean = math.exp(sum(math.log(r.mips) for r in readings) / len(readings))
    assert index == pytest.approx(geometric_mean)
    assert probe.speed_index(None, start, end) == pytest.approx(index)
    assert probe.speed_index([core], end + 1, end + 2) is None  # no reading in that window
    assert probe.speed_index([core + 1000], start, end) is None  # no reading on that core


def test_speed_index_is_the_geometric_mean_of_the_readings_in_the_window():
    probe = SpeedProbe([0, 1])
    probe._readings = [ProbeReading(1.0, 0, 2.0), ProbeReading(2.0, 1, 8.0), ProbeReading(3.0, 0, 100.0)]
    assert probe.speed_index(None, 0.5, 2.5) == pytest.approx(4.0)
    assert probe.speed_index([1], 0.0, 10.0) == pytest.approx(8.0)


def test_a_core_shared_with_busy_processes_reads_about_the_same_speed():
    # Wall-clock speed would fall to a third with two busy processes on the core; the probe
    # counts the loop's own CPU time, so sharing the core does not change its reading. Idle
    # and shared phases alternate so that a change of the host's speed hits both.
    core = _core()
    idle, shared = [], []
    for _ in range(3):
        with SpeedProbe([core], period_s=0.01) as probe:
            time.sleep(0.3)
        idle += [r.mips for r in probe.readings()]
        busy = [subprocess.Popen([sys.executable, "-c", _BUSY, str(core)]) for _ in range(2)]
        try:
            time.sleep(0.2)
            with SpeedProbe([core], period_s=0.01) as probe:
                time.sleep(0.6)
            shared += [r.mips for r in probe.readings()]
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
    mean = lambda values: math.exp(sum(map(math.log, values)) / len(values))  # noqa: E731
    assert len(shared) >= 5
    assert mean(shared) / mean(idle) > 0.6


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="cores"):
        SpeedProbe([])
    with pytest.raises(ValueError, match="period_s"):
        SpeedProbe([0], period_s=0)
    with pytest.raises(ValueError, match="loop"):
        SpeedProbe([0], loop=0)
