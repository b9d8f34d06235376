"""The embedded stack's lifetime: one agent per device, and nothing left running when the
command that started the stack is hung up on or killed outright."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.integration.procs import embedded_env, free_port, mtfl, processes_of, start_up, wait_gone

pytestmark = pytest.mark.integration


@pytest.fixture
def up_with_agent(tmp_path):
    home = tmp_path / "home"
    up = start_up(home, "solo", free_port())
    yield home, up
    if up.poll() is None:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=60)
    wait_gone(home)


def test_a_second_agent_for_a_device_is_refused(up_with_agent, tmp_path):
    home, _ = up_with_agent
    env = embedded_env(home)  # finds the running stack's embedded broker by itself
    same_host = subprocess.run(mtfl("agent", "--device", "solo"), env=env, capture_output=True, text=True, timeout=60)
    assert same_host.returncode == 2
    assert "an agent for device 'solo' already runs with state dir" in same_host.stderr
    elsewhere = subprocess.run(
        mtfl("agent", "--device", "solo", "--state-dir", str(tmp_path / "other")),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert elsewhere.returncode == 2
    assert "is already serving device.solo: agent.solo@" in elsewhere.stderr


def test_hang_up_stops_the_whole_stack(up_with_agent):
    home, up = up_with_agent
    assert len(processes_of(home)) >= 4  # mtfl up, redis, control worker (and its pool), agent, web
    os.kill(up.pid, signal.SIGHUP)
    up.wait(timeout=60)  # a requested stop: it stops the stack and exits
    assert wait_gone(home) == []
    assert not (home / "broker_url").exists()


def test_killing_the_command_outright_stops_every_child_and_the_broker(up_with_agent):
    home, up = up_with_agent
    os.kill(up.pid, signal.SIGKILL)
    up.wait(timeout=10)
    left = wait_gone(home, timeout_s=60)
    assert left == [], [p.cmdline() for p in left]
