"""The control app's broker switch (controlplane.celery.use_broker), used by the ``mtfl``
commands when they start or stop the embedded Redis within one process."""

from __future__ import annotations

from controlplane.celery import app, use_broker


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
