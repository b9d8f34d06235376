"""The lab deployment: docker-compose.yml, .env.example, the Dockerfile and its entry point.

CI starts no Docker engine (deploy/compose_check.sh builds, starts and exercises the stack on a
real one, outside CI: docs/deployment.md). Here ``docker-compose config`` (Debian's
docker-compose package, which `.ci/run` installs and also runs by itself) validates the file
with a ``.env`` made from ``.env.example``, the rest reads the files, and the entry point runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
CONTROLPLANE_SERVICES = ("web", "worker", "flower")
AGENT_SERVICES = ("agent", "agent-cpu")
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
            "--profile",
            "cpu",
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

    assert set(services) == {"postgres", "redis", "web", "worker", "flower", "agent", "agent-cpu"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_two_images_by_role_each_built_by_one_service_of_a_profile():
    """The control-plane image is built by web alone (worker and flower run it); the agent image by
    each agent service, of which one profile is usually active."""
    services = _compose()["services"]

    assert services["web"]["build"]["target"] == "controlplane" and services["web"]["build"]["context"] == "."
    assert "build" not in services["worker"] and "build" not in services["flower"]
    assert len({services[name]["image"] for name in CONTROLPLANE_SERVICES}) == 1
    assert {services[name]["build"]["target"] for name in AGENT_SERVICES} == {"agent"}
    assert len({services[name]["image"] for name in AGENT_SERVICES}) == 1
    assert services["web"]["image"] != services["agent"]["image"]
    assert {services[name]["profiles"][0] for name in AGENT_SERVICES} == {"gpu", "cpu"}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM torch AS agent$", dockerfile, flags=re.MULTILINE)
    assert re.search(r"^FROM torch AS controlplane$", dockerfile, flags=re.MULTILINE)


def test_the_base_images_are_build_arguments_defaulting_to_the_pinned_majors():
    services = _compose()["services"]
    env = ENV_EXAMPLE.read_text()

    assert services["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16}"
    assert services["redis"]["image"] == "${REDIS_IMAGE:-redis:7}"
    assert services["web"]["build"]["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.11-slim}"
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in (REPO / "Dockerfile").read_text()
    for line in ("POSTGRES_IMAGE=postgres:16", "REDIS_IMAGE=redis:7", "PYTHON_IMAGE=python:3.11-slim"):
        assert re.search(rf"^{re.escape(line)}$", env, flags=re.MULTILINE), line


def test_the_control_plane_takes_its_own_torch_index_and_the_dockerfile_exposes_no_port():
    services = _compose()["services"]
    dockerfile = (REPO / "Dockerfile").read_text()

    assert services["web"]["build"]["args"]["TORCH_INDEX_URL"] == "${CONTROLPLANE_TORCH_INDEX_URL:-}"
    assert services["agent"]["build"]["args"]["TORCH_INDEX_URL"] == "${AGENT_TORCH_INDEX_URL:-}"
    # One stage installs torch, from the index of the image being built; both images start from it.
    install = re.findall(r"^RUN pip install \$\{TORCH_INDEX_URL", dockerfile, flags=re.MULTILINE)
    assert len(install) == 1 and dockerfile.index("FROM base AS torch") < dockerfile.index(install[0])
    assert "EXPOSE" not in dockerfile


def test_published_ports_leave_the_hosts_own_redis_and_postgres_alone():
    services = _compose()["services"]

    assert services["redis"]["ports"] == ["${REDIS_PUBLISH:-127.0.0.1:16379}:6379"]
    assert "ports" not in services["postgres"]
    assert re.search(r"^REDIS_PUBLISH=127\.0\.0\.1:16379$", ENV_EXAMPLE.read_text(), flags=re.MULTILINE)
    published = [p for service in services.values() for p in service.get("ports", [])]
    defaults = [re.fullmatch(r"\$\{\w+:-([^}]*)\}:\d+", p).group(1) for p in published]
    assert not {d.rsplit(":", 1)[-1] for d in defaults} & {"6379", "5432"}, defaults


def test_flower_starts_after_the_worker_is_healthy():
    flower = _compose()["services"]["flower"]

    assert flower["depends_on"] == {"worker": {"condition": "service_healthy"}}


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
    assert command[0] == "mtfl-agent" and command[command.index("--backend") + 1] == "cuda-mps"
    assert agent["runtime"] == "nvidia" and agent["ipc"] == "host" and agent["init"] is True
    (device,) = agent["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    state_dir = env["MTFL_AGENT_STATE_DIR"]
    assert command[command.index("--state-dir") + 1] == state_dir
    for variable in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        assert env[variable].startswith(state_dir + "/"), variable
        assert env[variable] in mounts, f"{variable} is not a volume"
    assert state_dir in mounts
    assert "MTFL_ENV" not in env  # the agent needs no Django secrets


def test_the_cpu_agent_trains_on_the_cpu_without_the_nvidia_runtime():
    services = _compose()["services"]
    cpu, gpu = services["agent-cpu"], services["agent"]
    mounts = {target: source for source, target in map(_mount, cpu["volumes"])}

    command = cpu["command"]
    assert command[0] == "mtfl-agent" and command[command.index("--backend") + 1] == "cpu"
    assert command[command.index("--device") + 1] == "${MTFL_CPU_AGENT_DEVICE:-cpu-0}"
    assert "runtime" not in cpu and "deploy" not in cpu and "ipc" not in cpu
    state_dir = cpu["environment"]["MTFL_AGENT_STATE_DIR"]
    # Its own state folder (its device lock), the shared weights and data sets.
    assert mounts[state_dir] != {t: s for s, t in map(_mount, gpu["volumes"])}[state_dir]
    assert mounts["/var/lib/mtfl/artifacts"] == "artifacts" and mounts["/var/lib/mtfl/datasets"] == "datasets"
    shared = {k: v for k, v in gpu["environment"].items() if not k.startswith(("CUDA_", "NVIDIA_", "MTFL_MPS"))}
    assert cpu["environment"] == shared


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


def test_the_images_install_their_extras_and_the_control_plane_collects_static_files():
    dockerfile = (REPO / "Dockerfile").read_text()
    agent_stage, controlplane_stage = dockerfile.split("FROM torch AS agent")[1].split("FROM torch AS controlplane")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    assert 'pip install -e ".[agent]"' in agent_stage and '".[deploy]"' not in agent_stage
    assert 'pip install -e ".[deploy]"' in controlplane_stage
    assert "mtfl collectstatic --noinput" in controlplane_stage and "STATIC_ROOT=" in dockerfile
    # the web app and control worker need the control plane on top of the servers
    assert "mtfl-lab[controlplane]" in extras["deploy"]
    assert {re.split(r"[<>=\[]", dep)[0] for dep in extras["deploy"]} == {"mtfl-lab", "gunicorn", "flower"}
    assert extras["agent"] == []  # the agent image gets no Django
    assert ".env" in (REPO / ".dockerignore").read_text().split()


def test_both_images_install_the_plugins_named_in_the_env_file():
    """``MTFL_PLUGINS`` (pip specifiers) is read from .env by compose for every build, so a rebuild
    from a shell that never set it keeps the plug-ins; both images install them after mtfl-lab."""
    dockerfile = (REPO / "Dockerfile").read_text()
    services = _compose()["services"]

    for name in ("web", *AGENT_SERVICES):
        assert services[name]["build"]["args"]["MTFL_PLUGINS"] == "${MTFL_PLUGINS:-}", name
    assert re.search(r"^MTFL_PLUGINS=$", ENV_EXAMPLE.read_text(), flags=re.MULTILINE)
    assert "COPY examples ./examples" in dockerfile.split("FROM torch AS ")[0]
    for stage in dockerfile.split("FROM torch AS ")[1:]:
        assert 'ARG MTFL_PLUGINS=""' in stage
        install = stage.index('if [ -n "$MTFL_PLUGINS" ]; then pip install $MTFL_PLUGINS')
        assert stage.index('pip install -e ".[') < install
    assert (REPO / "examples" / "custom-task" / "pyproject.toml").exists()
    assert "examples" not in (REPO / ".dockerignore").read_text().split()


def _entrypoint(tmp_path: Path, *argv: str, user: str) -> subprocess.CompletedProcess:
    """deploy/entrypoint.sh with its app user renamed to ``user`` (this machine has no ``mtfl``)."""
    script = tmp_path / "entrypoint.sh"
    source = (REPO / "deploy" / "entrypoint.sh").read_text()
    assert "\napp_user=mtfl\n" in source
    script.write_text(source.replace("\napp_user=mtfl\n", f"\napp_user={user}\n"))
    env = {**os.environ, "MTFL_WRITABLE_DIRS": str(tmp_path / "store")}
    return subprocess.run(["sh", str(script), *argv], capture_output=True, text=True, timeout=30, env=env)


@pytest.fixture
def open_tmp():
    """A temporary folder others may enter (pytest's own are root's alone, mode 0700)."""
    with tempfile.TemporaryDirectory(prefix="mtfl-entrypoint-") as path:
        os.chmod(path, 0o755)
        yield Path(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="the entry point's root path needs root (CI runs as root)")
def test_the_entrypoint_hands_a_root_owned_host_folder_to_the_app_user_then_drops_root(open_tmp):
    store = open_tmp / "store"
    (store / "runs").mkdir(parents=True)
    (store / "runs" / "w.safetensors").write_bytes(b"x")
    nobody = "nobody"

    out = _entrypoint(open_tmp, "sh", "-c", f"id -un; touch {store}/new && echo $HOME", user=nobody)

    assert out.returncode == 0, out.stderr
    home = subprocess.check_output(["getent", "passwd", nobody], text=True).split(":")[5]
    assert out.stdout.split() == [nobody, home]
    assert f"giving {store} to {nobody}" in out.stderr
    owners = {p.stat().st_uid for p in [store, *store.rglob("*")]}
    assert owners == {int(subprocess.check_output(["id", "-u", nobody]))}
    again = _entrypoint(open_tmp, "true", user=nobody)
    assert again.returncode == 0 and "giving" not in again.stderr  # nothing left to hand over


@pytest.mark.skipif(os.geteuid() != 0, reason="the entry point's root path needs root (CI runs as root)")
def test_the_entrypoint_changes_a_link_never_what_it_points_to(open_tmp):
    store, outside = open_tmp / "store", open_tmp / "outside"
    store.mkdir()
    outside.write_text("the image's own file")
    (store / "link").symlink_to(outside)
    nobody = int(subprocess.check_output(["id", "-u", "nobody"]))

    first = _entrypoint(open_tmp, "true", user="nobody")
    again = _entrypoint(open_tmp, "true", user="nobody")

    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert outside.stat().st_uid == 0  # the target is untouched
    assert (store / "link").lstat().st_uid == nobody
    assert "giving" not in again.stderr  # the link itself was handed over: nothing to do again
