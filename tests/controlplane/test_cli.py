"""The ``mtfl`` console script: bad input gives one clear line, never a traceback; ``mtfl plugins``
reports what this host and each online device have installed."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys

import pytest

from tests.controlplane.test_dashboard_plugins import installed_task_plugin  # noqa: F401 - a fixture


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
        (["up", "--backend", "nope"], "--backend 'nope' is unknown; allowed: cpu, simulated"),
        (["agent", "--device", "x"], "CELERY_BROKER_URL is not set and no embedded broker is running"),
        (["compare", "light mix", "--timeout", "0"], "--timeout=0 is out of range: allowed 10 to 604800"),
        (["compare", "light mix", "--pool", " "], "--pool is empty: give a pool's name or id (`mtfl pool list`)"),
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


# ------------------------------------------------------------------------------- mtfl plugins


def _plugins(*args: str) -> str:
    from django.core.management import call_command

    out = io.StringIO()
    call_command("plugins", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def declaring_devices(make_device):
    """dev-full declares what this host has; dev-old lacks the plug-in model and has another
    version of the plug-in data set and a partitioner this host lacks; dev-silent declares
    nothing (an older agent: mtfl-lab's built-ins assumed); dev-off is offline."""
    from controlplane.core.management.commands.plugins import host_declaration
    from controlplane.fleet.models import Device

    host = host_declaration()
    full, old, silent, off = (make_device(n) for n in ("dev-full", "dev-old", "dev-silent", "dev-off"))
    Device.objects.filter(pk=full.pk).update(plugins=host)
    older = {kind: dict(names) for kind, names in host.items()}
    del older["models"]["tiny_rows_mlp"]
    older["datasets"]["noise_rows"] = "fake-mtfl-task-plugin 0.1"
    older["partitioners"]["their_rule"] = "their-pkg 1.0"
    Device.objects.filter(pk=old.pk).update(plugins=older)
    Device.objects.filter(pk=silent.pk).update(plugins={})
    Device.objects.filter(pk=off.pk).update(last_heartbeat_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC), plugins=host)
    return host


@pytest.mark.django_db
@pytest.mark.usefixtures("installed_task_plugin")
def test_plugins_lists_this_host_the_failures_and_each_online_devices_gaps(declaring_devices):
    from workers.registry.models import MODEL_REGISTRY

    text = _plugins()

    lines = text.splitlines()
    row = next(line for line in lines if " tiny_rows_mlp " in line)
    assert row.split()[:2] == ["models", "tiny_rows_mlp"] and "fake-mtfl-task-plugin 0.2" in row
    assert MODEL_REGISTRY.get("tiny_rows_mlp").label in row
    assert any(line.split()[:2] == ["strategies", "temporal"] for line in lines)  # every kind of this host
    failed = [line for line in lines if "broken_net" in line]
    assert len(failed) == 1 and "mtfl.models broken_net (fake_mtfl_task_plugin_missing:build):" in failed[0]
    assert "ModuleNotFoundError" in failed[0]

    devices = text[text.index("Online devices") :]
    assert devices.startswith("Online devices (3; 1 more not online, not listed):") and "dev-off" not in devices
    full = devices[devices.index("dev-full") : devices.index("dev-old")]
    assert "lacks nothing this host has" in full
    old = devices[devices.index("dev-old") : devices.index("dev-silent")]
    assert "lacks: models: tiny_rows_mlp (fake-mtfl-task-plugin 0.2)" in old
    assert (
        "other versions: datasets: noise_rows (fake-mtfl-task-plugin 0.1 there, fake-mtfl-task-plugin 0.2 here)" in old
    )
    assert "not on this host: partitioners: their_rule (their-pkg 1.0)" in old
    silent = devices[devices.index("dev-silent") :]
    assert "declares nothing (an agent older than plug-in declarations): mtfl-lab's built-ins assumed" in silent
    assert "lacks: models: tiny_rows_mlp (fake-mtfl-task-plugin 0.2); datasets: noise_rows" in silent


@pytest.mark.django_db
@pytest.mark.usefixtures("installed_task_plugin")
def test_plugins_json_is_the_same_report_for_scripts(declaring_devices):
    report = json.loads(_plugins("--json"))

    models = {e["name"]: e for e in report["host"]["models"]}
    assert models["tiny_rows_mlp"]["source"] == "fake-mtfl-task-plugin 0.2"
    assert {f["name"] for f in report["failures"]} == {"broken_net"}
    devices = {d["name"]: d for d in report["devices"]}
    assert set(devices) == {"dev-full", "dev-old", "dev-silent"} and report["devices_not_online"] == 1
    assert devices["dev-full"]["lacks"] == {} and devices["dev-full"]["differs"] == {}
    assert devices["dev-old"]["lacks"] == {"models": {"tiny_rows_mlp": "fake-mtfl-task-plugin 0.2"}}
    assert devices["dev-old"]["differs"] == {
        "datasets": {"noise_rows": {"host": "fake-mtfl-task-plugin 0.2", "device": "fake-mtfl-task-plugin 0.1"}}
    }
    assert devices["dev-old"]["extra"] == {"partitioners": {"their_rule": "their-pkg 1.0"}}
    assert devices["dev-silent"]["declares_nothing"] is True
    assert devices["dev-silent"]["lacks"] == {
        kind: {name: "fake-mtfl-task-plugin 0.2"}
        for kind, name in (("models", "tiny_rows_mlp"), ("datasets", "noise_rows"), ("partitioners", "first_takes"))
    }
    assert report["devices_error"] is None


def test_plugins_on_a_new_home_lists_the_host_and_says_the_database_is_not_set_up(tmp_path):
    out = _mtfl("plugins", env_extra={"MTFL_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "Installed on this host" in out.stdout and "Traceback" not in out.stderr
    assert "Devices: cannot read devices from the database" in out.stdout and "mtfl migrate" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("Devices: cannot read")


def test_tables_keep_their_columns_when_the_output_is_redirected():
    """``mtfl compare > file``: rich lays a non-terminal out in 80 columns, which squeezed the
    comparison tables' intervals into ``…``; redirected output gets REDIRECTED_WIDTH instead,
    and a ``COLUMNS`` the user set still wins."""
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'controlplane.settings'); "
        "django.setup(); from controlplane.core.cli_support import console, REDIRECTED_WIDTH; "
        "print(console.width, REDIRECTED_WIDTH)"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    width, wanted = done.stdout.split()
    assert width == wanted == "200"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "COLUMNS": "132"}, timeout=120
    )
    assert done.stdout.split()[0] == "132", done.stderr
