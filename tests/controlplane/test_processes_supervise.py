"""``Children.supervise``: children that exit are restarted with back-off and the supervisor
gives up on one that keeps crashing (issue 34, item 8). Real child processes; the back-off is
shrunk to milliseconds, and the healthy-run reset is driven by a clock the test moves."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import pytest

from controlplane.core.processes import Children, RestartPolicy

FAST = RestartPolicy(first_backoff_s=0.01, max_backoff_s=0.04, crash_limit=3, window_s=300, healthy_after_s=60)
"""Restarts within milliseconds, so a test sees a whole crash loop in about a second."""

EXIT_3 = [sys.executable, "-c", "import sys; print('bad config'); sys.exit(3)"]
SLEEP = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(600)"]


def _eventually(condition: Callable[[], object], what: str, timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def children(tmp_path):
    lines: list[str] = []
    made = Children(tmp_path / "logs", log=lines.append, policy=FAST)
    made.lines = lines  # type: ignore[attr-defined]
    yield made
    made.stop_all(timeout_s=5)


def test_backoff_doubles_from_the_first_wait_and_stops_at_the_cap():
    policy = RestartPolicy(first_backoff_s=1, max_backoff_s=30)

    assert [policy.backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_a_child_that_keeps_crashing_is_restarted_until_the_limit_then_named_in_the_error(children):
    child = children.start("broken", EXIT_3)

    def supervise_until_it_gives_up():
        try:
            children.supervise()
        except RuntimeError as exc:
            return exc
        return None

    error = _eventually(supervise_until_it_gives_up, "the supervisor giving up")

    assert str(error).startswith("broken exited with code 3, 4 times within 300 s (more than 3)")
    assert "bad config" in str(error)  # the end of its log
    assert child.restarts == 3
    assert [line.split("; log:")[0] for line in children.lines if "exited" in line] == [
        "broken exited with code 3; restart 1 in 0.01 s",
        "broken exited with code 3; restart 2 in 0.02 s",
        "broken exited with code 3; restart 3 in 0.04 s",
    ]
    log = child.log_path.read_text()
    assert log.count("=== ") == 4 and log.count("\nbad config\n") == 4  # one header per start, appended


def test_a_child_killed_once_comes_back_with_a_new_pid_and_runs_on(children):
    child = children.start("agent-x", SLEEP)
    first_pid = child.process.pid
    _eventually(lambda: "serving" in child.log_path.read_text(), "the child to start")

    os.killpg(first_pid, signal.SIGKILL)
    _eventually(lambda: children.supervise() or child.process.pid != first_pid, "the restart")
    _eventually(lambda: child.log_path.read_text().count("serving") == 2, "the restarted child to serve")
    for _ in range(5):
        children.supervise()

    assert child.process.poll() is None and child.restarts == 1
    assert children.lines[0] == (f"agent-x exited with code -9 (SIGKILL); restart 1 in 0.01 s; log: {child.log_path}")
    assert children.lines[1] == f"agent-x restarted (pid {child.process.pid})"
    children.check_alive()  # alive again, as far as a fail-fast caller can tell


def test_a_child_that_ran_long_enough_starts_its_backoff_over(tmp_path):
    now = [0.0]
    lines: list[str] = []
    children = Children(tmp_path / "logs", log=lines.append, policy=FAST, clock=lambda: now[0])
    try:
        child = children.start("web", SLEEP)
        for _ in range(2):  # two quick crashes: the back-off doubles
            pid = child.process.pid
            os.killpg(pid, signal.SIGKILL)
            child.process.wait(timeout=30)
            children.supervise()
            now[0] += 1.0
            children.supervise()
            assert child.process.pid != pid
        now[0] += FAST.healthy_after_s  # then a long healthy run
        os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait(timeout=30)
        children.supervise()
    finally:
        children.stop_all(timeout_s=5)

    delays = [line.split(" in ")[1].split(";")[0] for line in lines if "exited" in line]
    assert delays == ["0.01 s", "0.02 s", "0.01 s"]


def test_check_alive_still_fails_fast_on_an_exit(children):
    child = children.start("control-worker", EXIT_3)
    child.process.wait(timeout=30)

    with pytest.raises(RuntimeError, match=r"(?s)^control-worker exited with code 3; last lines of .*\nbad config$"):
        children.check_alive()
    assert children.lines == []  # nothing restarted
