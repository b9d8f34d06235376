"""The ``mtfl`` console script: bad input gives one clear line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _mtfl(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    # The embedded defaults of a fresh MTFL_HOME: its own SQLite file, not the suite's database.
    env = {
        k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL"}
    }
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["demo", "--rounds", "0"], "--rounds=0 is out of range: allowed 1 to 1000"),
        (["demo", "--alpha", "abc"], "--alpha must be a number in (0, 1000]"),
        (["demo", "--architectures", "alexnet"], "--architectures: 'alexnet' is not allowed; allowed: resnet18"),
        (["demo", "--strategies", "fastest"], "'fastest' is not allowed; allowed: temporal, isolation, sharing"),
        (["demo", "--samples", "1"], "--samples=1 is out of range: allowed 2 to 1437"),
        (["demo", "--samples", "99999"], "--samples=99999 is out of range: allowed 2 to 1437"),
        (["demo", "--architectures", ""], "--architectures is empty"),
        (["demo", "--architectures", "resnet18,resnet18"], "--architectures lists 'resnet18' more than once"),
        (["demo", "--strategies", ""], "--strategies is empty"),
        (["demo", "--alpha", "inf"], "--alpha=inf is out of range: allowed (0, 1000]"),
        (["demo", "--addr", "bogus"], "--addr 'bogus' must be host:port"),
        (["demo", "--addr", "127.0.0.1:99999"], "--addr port=99999 is out of range: allowed 1 to 65535"),
        (["up", "--agents", "Bad Name"], "'Bad Name' is not a valid device name"),
        (["up", "--agents", "a,a"], "--agents lists 'a' more than once"),
        (["agent", "--device", "x"], "CELERY_BROKER_URL is not set and no embedded broker is running"),
        (["compare", "light mix", "--timeout", "0"], "--timeout=0 is out of range: allowed 10 to 604800"),
        (["compare", "light mix"], "cannot read experiments from the database (no such table"),
        (
            ["compare", "light mix", "--objective", "fastest"],
            "--objective='fastest' is not allowed; allowed: raw, fair",
        ),
        (["fit-predictor", "--families", "svm"], "--families: 'svm' is not allowed; allowed: baseline, random_forest"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args, message, tmp_path):
    out = _mtfl(*args, env_extra={"MTFL_HOME": str(tmp_path)})
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_agent_with_an_invalid_device_name_says_so(tmp_path):
    out = _mtfl(
        "agent",
        "--device",
        "Bad Name",
        env_extra={"MTFL_HOME": str(tmp_path), "CELERY_BROKER_URL": "redis://127.0.0.1:1/0"},
    )
    assert out.returncode != 0
    assert "Bad Name" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--heartbeat-s", "inf"], "--heartbeat-s=inf is out of range: allowed (0, 3600] seconds"),
        (["--state-dir", "/proc/forbidden"], "--state-dir '/proc/forbidden' is not usable"),
    ],
)
def test_agent_options_are_checked_before_it_starts(args, message, tmp_path):
    out = _mtfl(
        "agent",
        "--device",
        "dev-a",
        *args,
        env_extra={"MTFL_HOME": str(tmp_path), "CELERY_BROKER_URL": "redis://127.0.0.1:1/0"},
    )
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("mtfl agent:")


def test_demo_refuses_a_busy_address_before_starting_anything(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _mtfl("demo", "--addr", f"127.0.0.1:{port}", env_extra={"MTFL_HOME": str(tmp_path)})
    assert out.returncode != 0 and "cannot be served" in out.stderr
    assert not (tmp_path / "logs").exists()  # nothing was started
