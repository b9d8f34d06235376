"""The embedded stack supervises its children (issue 34, item 8): a device agent SIGKILLed
mid-round is restarted as the same device, the round protocol fails that device for the round
it was in, and the later round trains on the restarted agent.

Real processes: the embedded broker, a Celery control worker and two ``simulated`` agents whose
rounds last about 6 s of real time (``MTFL_SIM_TIME_SCALE``), as in test_faults.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from controlplane.celery import app
from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Round, Run
from controlplane.fleet.models import Device
from tests.integration.test_faults import _experiment, fast_faults  # noqa: F401 - fast_faults is a fixture

pytestmark = pytest.mark.integration


def _supervise_until(stack: LocalStack, condition: Callable[[], object], timeout_s: float, what: str):
    """Poll ``condition`` while supervising the stack's children, as ``mtfl up`` does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.children.supervise()
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _answers_ping(worker: str) -> bool:
    replies = app.control.ping(timeout=1.0) or []
    return any(name.split("@")[0] == worker for reply in replies for name in reply)


def _agent_pid(device: str) -> int | None:
    return (Device.objects.get(name=device).inventory or {}).get("agent_pid")


def test_an_agent_killed_mid_round_is_restarted_and_trains_the_next_round(fast_faults):  # noqa: F811
    fast_faults.setenv("MTFL_SIM_TIME_SCALE", "90")  # rounds of about 6 s: long enough to be killed in
    names = ["sup-a", "sup-b"]
    lines: list[str] = []
    with LocalStack(agents=names, backend="simulated", log=lines.append) as stack:
        stack.wait_ready(timeout_s=180)
        run = services.run_create(experiment=_experiment(names, rounds=2), strategy="sharing")
        agent = next(c for c in stack.children.children if c.name == "agent-sup-b")
        killed = agent.process.pid
        _supervise_until(
            stack,
            lambda: Assignment.objects.filter(
                round__run=run, round__index=0, device__name="sup-b", status=Assignment.Status.RUNNING
            ).exists(),
            180,
            "round 0 to start on sup-b",
        )

        os.killpg(killed, signal.SIGKILL)  # the agent and whatever it started

        _supervise_until(stack, lambda: agent.process.pid != killed, 60, "the agent to be restarted")
        _supervise_until(stack, lambda: _answers_ping("agent.sup-b"), 120, "the restarted agent to answer a ping")
        _supervise_until(stack, lambda: _agent_pid("sup-b") == agent.process.pid, 60, "sup-b to re-register")
        run = run_wait(run, timeout_s=240, on_progress=lambda _: stack.children.supervise())
        stack.children.check_alive()  # nothing else died, and the agent stayed up

    assert any(
        line.startswith("agent-sup-b exited with code -9 (SIGKILL); restart 1 in 1 s; log: ") for line in lines
    ), lines
    assert agent.restarts == 1
    assert run.status == Run.Status.SUCCEEDED, run.error
    first, second = run.rounds.order_by("index")
    lost = Assignment.objects.get(round=first, device__name="sup-b")
    assert (first.status, lost.status) == (Round.Status.PARTIAL, Assignment.Status.FAILED), (first.error, lost.error)
    assert lost.error.startswith("agent lost"), lost.error
    assert second.status == Round.Status.SUCCEEDED, second.error
    assert Assignment.objects.get(round=second, device__name="sup-b").status == Assignment.Status.SUCCEEDED
    assert second.samples_trained == 400  # both devices, the restarted one included
