"""The lab deployment: docker-compose.yml, .env.example and the Dockerfile.

No Docker engine runs here, so nothing is started: ``docker-compose config`` (Debian's
docker-compose package, which `.ci/run` installs and also runs by itself) validates the file
with a ``.env`` made from ``.env.example``, and the rest reads the files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
APP_SERVICES = ("web", "worker", "flower", "agent")
_NAME = r"[A-Z][A-Z0-9_]*"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env_example(*, commented: bool) -> set[str]:
    """Names assigned in .env.example (``NAME=``), with ``# NAME=`` lines too when ``commented``."""
    prefix = r"(?:#\s*)?" if commented else ""
    return set(re.findall(rf"^{prefix}({_NAME})=", ENV_EXAMPLE.read_text(), flags=re.MULTILINE))


def _mount(volume: str) -> tuple[str, str]:
    """``(source, target)`` of a short volume syntax entry; a ``${VAR:-default}`` source gives its
    default."""
    match = re.fullmatch(r"(\$\{\w+:-([^}]*)\}|[^:]+):([^:]+)(?::\w+)?", volume)
    assert match, volume
    return match.group(2) if match.group(2) is not None else match.group(1), match.group(3)


def _compose_config(env_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``docker-compose config -q`` of the repository's file with ``env_text`` as its .env (kept
    outside the checkout), the variables it reads removed from this process's environment."""
    (tmp_path / ".env").write_text(env_text)
    interpolated = set(re.findall(rf"\$\{{({_NAME})", COMPOSE.read_text()))
    env = {k: v for k, v in os.environ.items() if k not in interpolated}
    return subprocess.run(
        [
            "docker-compose",
            "--env-file",
            str(tmp_path / ".env"),
            "--profile",
            "gpu",
            "-f",
            str(COMPOSE),
            "config",
            "-q",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


_needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (.ci/run installs it and runs the same check itself)",
)


@_needs_compose
def test_docker_compose_config_accepts_the_file_with_the_example_env(tmp_path):
    out = _compose_config(ENV_EXAMPLE.read_text(), tmp_path)

    assert out.returncode == 0, out.stderr


@_needs_compose
def test_docker_compose_config_names_a_missing_required_variable(tmp_path):
    env_text = "\n".join(line for line in ENV_EXAMPLE.read_text().splitlines() if not line.startswith("SECRET_KEY="))

    out = _compose_config(env_text, tmp_path)

    assert out.returncode != 0
    assert "set SECRET_KEY in .env" in out.stderr


def test_every_service_has_a_healthcheck():
    services = _compose()["services"]

    assert set(services) == {"postgres", "redis", "web", "worker", "flower", "agent"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_web_worker_flower_and_agent_run_one_image_built_from_the_dockerfile():
    services = _compose()["services"]

    assert {services[name]["build"]["context"] for name in APP_SERVICES} == {"."}
    assert len({services[name]["image"] for name in APP_SERVICES}) == 1
    assert (REPO / "Dockerfile").exists()


def test_the_images_of_the_servers_are_the_pinned_majors():
    services = _compose()["services"]

    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"] == "redis:7"


def test_web_migrates_then_serves_with_gunicorn_and_the_worker_serves_the_control_queue():
    services = _compose()["services"]
    web = " ".join(services["web"]["command"])
    worker = services["worker"]["command"]

    assert web.index("mtfl migrate --noinput") < web.index("exec gunicorn controlplane.wsgi:application")
    assert worker[:4] == ["celery", "-A", "controlplane.celery:app", "worker"]
    assert worker[worker.index("-Q") + 1] == "control"
    assert services["worker"]["depends_on"]["web"]["condition"] == "service_healthy"  # after the migrations
    for name in ("web", "worker", "flower"):
        assert services[name]["environment"]["MTFL_ENV"] == "production"


def test_the_agent_is_a_gpu_agent_with_its_mps_directories_as_volumes():
    agent = _compose()["services"]["agent"]
    env = agent["environment"]
    mounts = {target: source for source, target in map(_mount, agent["volumes"])}

    command = agent["command"]
    assert command[:2] == ["mtfl", "agent"] and command[command.index("--backend") + 1] == "cuda-mps"
    assert agent["runtime"] == "nvidia" and agent["ipc"] == "host"
    (device,) = agent["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    state_dir = env["MTFL_AGENT_STATE_DIR"]
    assert command[command.index("--state-dir") + 1] == state_dir
    for variable in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        assert env[variable].startswith(state_dir + "/"), variable
        assert env[variable] in mounts, f"{variable} is not a volume"
    assert state_dir in mounts
    assert "MTFL_ENV" not in env  # the agent needs no Django secrets


def test_every_named_volume_is_declared():
    compose = _compose()
    declared = set(compose["volumes"])
    used = set()
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source, _ = _mount(volume)
            if not source.startswith(("/", ".")):
                used.add(source)

    assert used <= declared, f"undeclared volumes: {sorted(used - declared)}"
    assert {"postgres-data", "redis-data", "artifacts"} <= used


def test_env_example_defines_every_variable_the_compose_file_interpolates():
    interpolated = set(re.findall(rf"\$\{{({_NAME})", COMPOSE.read_text()))

    missing = interpolated - _env_example(commented=False)

    assert not missing, f"docker-compose.yml reads {sorted(missing)}, which .env.example does not define"


# Variables a process sets for its own children, not configuration a deployment gives.
SET_FOR_CHILDREN = {
    "MTFL_TRAINER_DEVICE",  # the GPU backends tell each trainer process to train on cuda
    "MTFL_PARENT_PID",  # `mtfl up`/`mtfl demo` tell their children whom to outlive
}


def _variables_the_code_reads() -> set[str]:
    """Every variable controlplane/settings.py reads, and every ``MTFL_*`` name the worker side
    declares as a module constant (``ENV_GPU = "MTFL_AGENT_GPU"``), less :data:`SET_FOR_CHILDREN`."""
    settings = (REPO / "controlplane" / "settings.py").read_text()
    names = set(re.findall(rf'(?:env\.\w+|_strict_bool)\(\s*"({_NAME})"', settings))
    names |= set(re.findall(rf'os\.environ\.get\(\s*"({_NAME})"', (REPO / "workers" / "config.py").read_text()))
    for path in (REPO / "workers").rglob("*.py"):
        names |= set(re.findall(r'^\w+\s*=\s*"(MTFL_[A-Z0-9_]+)"', path.read_text(), flags=re.MULTILINE))
    return names - SET_FOR_CHILDREN


def test_env_example_lists_every_variable_the_services_read():
    read = _variables_the_code_reads()

    missing = read - _env_example(commented=True)

    assert {"SECRET_KEY", "DATABASE_URL", "ALLOWED_HOSTS", "MTFL_AGENT_STATE_DIR"} <= read  # the scan works
    assert not missing, f"the code reads {sorted(missing)}, which .env.example does not list"


def test_env_example_placeholders_are_what_production_settings_refuse():
    from controlplane import settings

    text = ENV_EXAMPLE.read_text()

    assert re.search(rf"^SECRET_KEY={settings.PLACEHOLDER}$", text, flags=re.MULTILINE)
    assert re.search(rf"^POSTGRES_PASSWORD=.*{settings.PLACEHOLDER}", text, flags=re.MULTILINE)
    assert re.search(rf"^REDIS_PASSWORD=.*{settings.PLACEHOLDER}", text, flags=re.MULTILINE)


def test_the_image_collects_static_files_and_installs_the_deploy_extra():
    dockerfile = (REPO / "Dockerfile").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    assert "mtfl collectstatic --noinput" in dockerfile and "STATIC_ROOT=" in dockerfile
    assert 'pip install -e ".[deploy]"' in dockerfile
    # the web app and control worker need the control plane on top of the servers
    assert "mtfl-lab[controlplane]" in extras["deploy"]
    assert {re.split(r"[<>=\[]", dep)[0] for dep in extras["deploy"]} == {"mtfl-lab", "gunicorn", "flower"}
    assert ".env" in (REPO / ".dockerignore").read_text().split()


def test_the_image_installs_the_plugins_named_at_build_time_for_every_service():
    """``MTFL_PLUGINS`` (pip specifiers) is a build argument every app service's image gets, installed
    after mtfl-lab and before the unprivileged user takes over; the example is in the build context."""
    dockerfile = (REPO / "Dockerfile").read_text()
    services = _compose()["services"]

    assert {tuple(services[name]["build"]["args"]) for name in APP_SERVICES} == {("MTFL_PLUGINS",)}
    assert 'ARG MTFL_PLUGINS=""' in dockerfile and "COPY examples ./examples" in dockerfile
    install = dockerfile.index('if [ -n "$MTFL_PLUGINS" ]; then pip install $MTFL_PLUGINS')
    assert dockerfile.index('pip install -e ".[deploy]"') < install < dockerfile.index("USER mtfl")
    assert (REPO / "examples" / "custom-task" / "pyproject.toml").exists()
    assert "examples" not in (REPO / ".dockerignore").read_text().split()
