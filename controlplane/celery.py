"""The control plane's Celery app (queue ``control``), configured from Django settings.

Device agents run their own Django-free app (:mod:`workers.agent`) on the same broker; the two
address each other's tasks by the names in :mod:`workers.queues`.
"""

from __future__ import annotations

import os

from celery import Celery, signals

from workers.lifecycle import exit_with_parent, parent_died

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("mtfl-control")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
def _stop_with_the_mtfl_command(**_kwargs) -> None:
    # Started by `mtfl up`/`mtfl demo`: do not outlive it (see workers.lifecycle).
    exit_with_parent()


@signals.worker_shutdown.connect
def _stop_an_orphaned_embedded_broker(**_kwargs) -> None:
    # The command that started the embedded Redis died without stopping it (kill -9): the
    # control worker, stopping for the same reason, turns the Redis off on its way out.
    if parent_died():
        from controlplane.core.embedded import shutdown_embedded_broker

        shutdown_embedded_broker(app.conf.broker_url)


def use_broker(broker_url: str, result_backend: str) -> None:
    """Point the control app at another broker and result backend, in this process.

    The ``mtfl`` commands call this when they start (or stop) the embedded Redis after the app
    was configured. Celery caches the connection pool, the producer pool and the (thread-local)
    result backend on first use, so those caches are dropped here as well; otherwise messages
    would still go to the broker the app first talked to.
    """
    import threading

    app.conf.broker_url = broker_url
    app.conf.result_backend = result_backend
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    app._local = threading.local()
