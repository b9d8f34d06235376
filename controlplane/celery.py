"""The control plane's Celery app (queue ``control``), configured from Django settings.

Device agents run their own Django-free app (:mod:`workers.agent`) on the same broker; the two
address each other's tasks by the names in :mod:`workers.queues`.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("mtfl-control")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


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
