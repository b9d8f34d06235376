"""The core link probe: cross-core round trips read by a pinned ping-pong beside the trainers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.profiling import core_link_probe
from workers.profiling.core_link_probe import CoreLinkProbe, LinkReading, ring_pairs

_BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def _two_cores() -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:  # CI and the dev machines have 2; a 1-core box cannot have a link
        pytest.skip("needs 2 CPUs to probe the link between them")
    return cores[:2]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_ring_pairs_are_neighbours_closing_the_ring_beyond_two():
    assert ring_pairs([1, 0]) == [(0, 1)]
    assert ring_pairs([0, 1, 2, 3]) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert ring_pairs([5]) == [] and ring_pairs([]) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cores": [0]}, "at least 2 CPU ids"),
        ({"cores": [3, 3]}, "at least 2 CPU ids"),
        ({"cores": [0, 1], "period_s": 0}, "period_s must be > 0 seconds, got 0"),
        ({"cores": [0, 1], "round_trips": 4}, "round_trips must be >= 5, got 4"),
    ],
)
def test_bad_arguments_name_the_argument_and_its_range(kwargs, message):
    cores = kwargs.pop("cores")
    with pytest.raises(ValueError, match=message):
        CoreLinkProbe(cores, **kwargs)


def test_the_probe_command_refuses_one_core_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "workers.profiling.core_link_probe", "--cores", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "core_link_probe: cores must list at least 2 CPU ids to probe the link between them, got [0]"
    ]


def test_rtt_is_the_median_of_the_readings_of_the_tasks_pairs_in_the_window():
    probe = CoreLinkProbe([0, 1, 2])
    probe._readings = [
        LinkReading(1.0, 0, 1, 200.0),
        LinkReading(2.0, 1, 2, 900.0),
        LinkReading(3.0, 0, 1, 260.0),
        LinkReading(4.0, 0, 1, 240.0),
        LinkReading(9.0, 0, 1, 5000.0),
    ]
    assert probe.rtt_ns([0, 1], 0.0, 5.0) == 240.0  # (1, 2) is not the task's pair; t = 9 is outside
    assert probe.rtt_ns([0, 1, 2], 0.0, 5.0) == pytest.approx(250.0)
    assert probe.rtt_ns([1], 0.0, 5.0) is None  # one core: no link to wait on
    assert probe.rtt_ns([0, 1], 5.0, 8.0) is None  # no reading in the window


def test_probe_reads_round_trips_every_period_and_stops_with_its_helpers():
    cores = _two_cores()
    probe = CoreLinkProbe(cores, period_s=0.05)
    probe.start()
    try:
        time.sleep(1.2)
        pid = probe._proc.pid
        helpers = _children(pid)
    finally:
        probe.stop()
    readings = probe.readings()
    assert len(helpers) == 1  # one forked helper per core after the first
    assert len(readings) >= 10  # ~22 wake-ups in 1.1 s
    assert all((r.core_a, r.core_b) == tuple(cores) for r in readings)
    # A cache line's round trip: tens of ns natively, a few hundred with Python's loop; far
    # below a scheduler tick, which is what a missed echo would cost.
    assert all(20 < r.rtt_ns < 50_000 for r in readings)
    assert _wait_gone([pid, *helpers]) == []
    count = len(readings)
    time.sleep(0.2)
    assert len(probe.readings()) == count  # stopped means stopped


def test_probe_keeps_reading_beside_busy_processes_on_both_cores():
    cores = _two_cores()
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY, str(c)]) for c in cores for _ in range(2)]
    try:
        time.sleep(0.3)
        with CoreLinkProbe(cores, period_s=0.05) as probe:
            started = time.monotonic()
            # 1.5 s gives 15-30 readings on an idle host; beside another test process (pytest -n 2)
            # it can take longer, so wait for them rather than for a fixed time.
            while len(probe.readings()) < 10 and time.monotonic() - started < 30:
                time.sleep(0.1)
        ended = time.monotonic()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # Woken processes get the core quickly (CFS favours a sleeper), so most wake-ups read.
    assert len(probe.readings()) >= 10
    assert probe.rtt_ns(cores, started, ended) > 0


def test_probe_processes_exit_when_the_agent_that_started_them_is_killed(tmp_path):
    cores = _two_cores()
    pid_file = tmp_path / "probe.pid"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\n"
                f"sys.path.insert(0, {str(Path(core_link_probe.__file__).parents[1])!r})\n"
                "from workers.profiling.core_link_probe import CoreLinkProbe\n"
                f"p = CoreLinkProbe({cores!r}, period_s=0.05).start()\n"
                f"open({str(pid_file)!r}, 'w').write(str(p._proc.pid))\n"
                "time.sleep(60)\n"
            ),
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        probe_pid = int(pid_file.read_text())
        time.sleep(0.5)
        helpers = _children(probe_pid)
        assert helpers
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    assert _wait_gone([probe_pid, *helpers]) == []
