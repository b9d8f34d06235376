"""The launch engine (workers/launch.py) with small stand-in processes: the barrier, a child's
death, deadlines, interrupts, protocol lines and reaping."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from workers import launch
from workers.launch import ProcessGroup, ProcessSpec

# One program, its behaviour chosen by its first argument.
CHILD = r"""
import sys, time
mode = sys.argv[1]
if mode == "early":
    print("no model here", file=sys.stderr)
    sys.exit(5)
if mode == "clean-early":
    sys.exit(0)
print("READY", flush=True)
line = sys.stdin.readline().strip()
if line != "GO":
    sys.exit(9)
print(f"went {time.monotonic()!r}", file=sys.stderr, flush=True)
if mode == "ok":
    sys.exit(0)
if mode == "crash":
    print("CUDA error: an illegal memory access", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    time.sleep(120)
if mode == "iter":
    print("ITER 1.0 2.0 8", flush=True)
    if sys.stdin.readline().strip() == "STOP":
        sys.exit(0)
    sys.exit(7)
"""


def _specs(tmp_path: Path, *modes: str) -> list[ProcessSpec]:
    return [
        ProcessSpec(
            command=[sys.executable, "-c", CHILD],
            args=[mode],
            env={"PATH": "/usr/bin:/bin"},
            stderr_path=tmp_path / f"{k}.stderr.log",
            label=f"{mode}-{k}",
            result_path=tmp_path / f"{k}.result.json",
        )
        for k, mode in enumerate(modes)
    ]


def _deadline(seconds: float = 120.0) -> float:
    return time.monotonic() + seconds


@pytest.fixture(autouse=True)
def _nothing_left():
    yield
    assert launch.live_children() == []
    launch.clear_cancel()
    launch.clear_shutdown()


def test_children_pass_the_barrier_together_and_exit_cleanly(tmp_path):
    stale = tmp_path / "0.result.json"
    stale.write_text("{}")
    with ProcessGroup(_specs(tmp_path, "ok", "ok", "ok")) as group:
        group.launch()
        assert len(launch.live_children()) == 3
        assert group.wait_ready(_deadline(), "ready_timeout_s")
        all_ready = time.monotonic()
        assert group.go()
        assert group.wait_exit(_deadline(), "trainer_timeout_s")

    assert [c.fate for c in group.children] == [None, None, None]
    assert [c.returncode for c in group.children] == [0, 0, 0]
    assert group.causes() == []
    assert not stale.exists()  # a stale result is never read as this run's
    # Every child waited at the barrier: none went on before all three had printed READY.
    went = [float(c.stderr_tail().split()[1]) for c in group.children]
    assert min(went) >= all_ready


def test_a_child_that_fails_gets_the_others_killed_and_is_named(tmp_path):
    with ProcessGroup(_specs(tmp_path, "crash", "hang"), where=" on this device") as group:
        group.launch()
        assert group.wait_ready(_deadline(), "ready_timeout_s") and group.go()
        assert not group.wait_exit(_deadline(), "trainer_timeout_s")

    crashed, hung = group.children
    assert crashed.fate == "failed" and crashed.returncode == 3
    assert "illegal memory access" in crashed.stderr_tail()
    assert hung.fate == "killed"
    assert hung.fate_detail == "killed because crash-0 failed on this device"
    assert hung.returncode == -9
    assert group.causes() == [crashed]


def test_exiting_before_ready_fails_even_with_code_zero(tmp_path):
    with ProcessGroup(_specs(tmp_path, "clean-early", "ok")) as group:
        group.launch()
        assert not group.wait_ready(_deadline(), "ready_timeout_s")

    early, ok = group.children
    assert early.fate == "failed" and early.returncode == 0
    assert early.fate_detail == "exited before READY, before its work was done"
    assert (ok.fate, ok.fate_detail) == ("killed", "killed because clean-early-0 failed")
    assert group.causes() == [early]


def test_deadline_times_out_the_children_still_running(tmp_path):
    with ProcessGroup(_specs(tmp_path, "hang", "ok")) as group:
        group.launch()
        assert group.wait_ready(_deadline(), "ready_timeout_s") and group.go()
        assert not group.wait_exit(time.monotonic() + 0.5, "trainer_timeout_s")

    hung, ok = group.children
    assert hung.fate == "timeout"
    assert hung.fate_detail == "timed out while training (trainer_timeout_s exceeded)"
    assert ok.fate is None and ok.returncode == 0


def test_cancellation_terminates_the_children_and_names_the_reason(tmp_path):
    with ProcessGroup(_specs(tmp_path, "hang", "hang")) as group:
        group.launch()
        assert group.wait_ready(_deadline(), "ready_timeout_s") and group.go()
        timer = threading.Timer(0.3, launch.request_cancel, args=("run 4 cancelled",))
        timer.start()
        assert not group.wait_exit(_deadline(), "trainer_timeout_s")
        timer.join()

    assert [(c.fate, c.fate_detail) for c in group.children] == [("cancelled", "run 4 cancelled")] * 2
    assert launch.cancel_requested() == "run 4 cancelled"


def test_shutdown_and_a_callers_interrupt(tmp_path):
    launch.request_shutdown()
    with ProcessGroup(_specs(tmp_path, "ok")) as group:
        group.launch()
        assert not group.wait_ready(_deadline(), "ready_timeout_s")
    assert (group.children[0].fate, group.children[0].fate_detail) == ("shutdown", "agent shutting down")
    launch.clear_shutdown()

    stop = threading.Event()
    with ProcessGroup(
        _specs(tmp_path, "hang"), interrupt=lambda: ("stopped", "sweep stopped") if stop.is_set() else None
    ) as group:
        group.launch()
        assert group.wait_ready(_deadline(), "config_timeout_s") and group.go(close=False)
        stop.set()
        assert group.wait_until(lambda now: False, _deadline(), "config_timeout_s") is None
    assert group.children[0].fate == "stopped" and group.causes() == group.children


def test_protocol_lines_reach_on_line_and_stop_ends_the_child(tmp_path):
    lines: list[tuple[str, list[str]]] = []
    with ProcessGroup(
        _specs(tmp_path, "iter"), on_line=lambda c, words: lines.append((c.label, words)), poll_s=0.01
    ) as group:
        group.launch()
        assert group.wait_ready(_deadline(), "config_timeout_s") and group.go(close=False)
        stop_at = group.wait_until(lambda now: bool(lines), _deadline(), "config_timeout_s")
        assert stop_at is not None and stop_at <= time.monotonic()
        group.broadcast("STOP", close=True)
        assert group.wait_exit(_deadline(), "config_timeout_s", phase="after STOP")

    assert lines == [("iter-0", ["ITER", "1.0", "2.0", "8"])]
    assert group.children[0].fate is None and group.children[0].returncode == 0


def test_a_child_exiting_while_it_should_train_has_failed(tmp_path):
    with ProcessGroup(_specs(tmp_path, "ok")) as group:
        group.launch()
        assert group.wait_ready(_deadline(), "config_timeout_s") and group.go()
        assert group.wait_until(lambda now: False, _deadline(), "config_timeout_s") is None

    assert group.children[0].fate == "failed"
    assert group.children[0].fate_detail == "exited while training, before its work was done"


def test_without_the_barrier_a_child_just_runs(tmp_path):
    with ProcessGroup(_specs(tmp_path, "early"), barrier=False) as group:
        group.launch()
        assert group.children[0].proc.stdin is None
        group.wait_exit(_deadline(), "trainer_timeout_s")

    assert group.children[0].fate == "failed" and group.children[0].returncode == 5
    assert group.children[0].stderr_tail() == "no model here"


def test_a_parent_failure_marks_the_children_without_a_fate(tmp_path):
    with ProcessGroup(_specs(tmp_path, "hang", "crash")) as group:
        group.launch()
        group.children[1].fate = "failed"
        group.fail_all("RuntimeError: disk full")

    assert [(c.fate, c.fate_detail) for c in group.children] == [("agent", "RuntimeError: disk full"), ("failed", "")]
    assert all(c.returncode is not None for c in group.children)
