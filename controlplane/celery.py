"""The control plane's Celery app (queue ``control``), configured from Django settings.

Device agents run their own Django-free app (:mod:`workers.agent.app`) on the same broker; the two
address each other's tasks by the names in :mod:`workers.protocol.queues`.

The app never talks to a broker nobody configured: with ``CELERY_BROKER_URL`` unset it uses the
embedded broker an ``mtfl`` command runs on this machine (:mod:`controlplane.common.broker_file`),
and with none running its first connection raises :class:`BrokerNotConfigured` (one line)
instead of Celery's default ``amqp://guest@localhost//``, which on a host that runs RabbitMQ
would silently take the messages.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from celery import Celery, bootsteps, signals
from kombu import pools

from controlplane.common.broker_file import embedded_broker_url, shutdown_embedded_broker
from controlplane.common.gc_tuning import control_worker_gc
from workers.agent.broker_compat import patch_kombu_redis_restore
from workers.agent.lifecycle import exit_with_parent, parent_died
from workers.protocol.queues import CONTROL_QUEUE, TaskName

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# A control worker holds countdown messages (round watchdogs): without this, a broker restart
# stops it instead of reconnecting (see workers.agent.broker_compat).
patch_kombu_redis_restore()

log = logging.getLogger(__name__)


class BrokerNotConfigured(RuntimeError):
    """Work was about to be queued with no broker configured and no embedded broker running."""


NO_BROKER = (
    "no Celery broker: CELERY_BROKER_URL is not set and no embedded broker is running on this machine; "
    "start `mtfl up` (or `mtfl demo`) first, or set CELERY_BROKER_URL (e.g. redis://127.0.0.1:6379/0)"
)
"""The one line :class:`BrokerNotConfigured` says."""


class ControlCelery(Celery):
    """Celery, except that a connection with no broker URL never falls back to Celery's default
    (``amqp://guest@localhost//``).

    Every way the app reaches the broker — publishing a task or a chord, a worker consuming,
    ``control.revoke`` — asks for a connection through :meth:`connection_for_write`,
    :meth:`connection_for_read` or :meth:`connection`. When neither the call nor the
    configuration gives a URL, the embedded broker running on this machine is adopted (its URL
    from ``$MTFL_HOME/broker_url``, for the result backend too when none is set); with none
    running, :class:`BrokerNotConfigured` is raised before any connection is made.
    """

    def _broker_url_or_raise(self, url: str | None) -> None:
        if url or self.conf.broker_url:
            return
        embedded = embedded_broker_url()
        if not embedded:
            raise BrokerNotConfigured(NO_BROKER)
        log.info("CELERY_BROKER_URL is not set: using the embedded broker running on this machine (%s)", embedded)
        use_broker(embedded, self.conf.result_backend or embedded)

    def connection_for_write(self, url=None, **kwargs):
        """:meth:`celery.Celery.connection_for_write`; raises :class:`BrokerNotConfigured`
        (see the class)."""
        self._broker_url_or_raise(url or self.conf.broker_write_url)
        return super().connection_for_write(url, **kwargs)

    def connection_for_read(self, url=None, **kwargs):
        """:meth:`celery.Celery.connection_for_read`; raises :class:`BrokerNotConfigured`
        (see the class)."""
        self._broker_url_or_raise(url or self.conf.broker_read_url)
        return super().connection_for_read(url, **kwargs)

    def connection(self, hostname=None, *args, **kwargs):
        """:meth:`celery.Celery.connection`; raises :class:`BrokerNotConfigured` (see the
        class)."""
        self._broker_url_or_raise(hostname)
        return super().connection(hostname, *args, **kwargs)

    broker_connection = connection


app = ControlCelery("mtfl-control")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class ResumeRunsOnConnect(bootsteps.StartStopStep):
    """Each time a control worker's consumer (re)connects to the broker — at start, and after
    the broker restarted or the connection dropped — queue ``RUNS_RESUME``
    (:func:`controlplane.experiments.services.runs_resume`).

    Countdown messages (round watchdogs) a worker holds are dropped from its memory when its
    connection is lost, and Redis gives them back only after the visibility timeout (hours), so
    the runs in flight get their checks again from here. On the first connection the worker
    also passes its start time: aggregations it had claimed before it started were abandoned
    by its previous life and are redone.
    """

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs) -> None:
        super().__init__(parent, **kwargs)
        self.booted_at: float | None = time.time()

    def start(self, parent) -> None:
        queues = {q.name for q in getattr(parent.task_consumer, "queues", [])}
        if CONTROL_QUEUE not in queues:
            return  # not a control worker
        try:
            parent.app.send_task(
                TaskName.RUNS_RESUME,
                kwargs={"nodename": parent.hostname, "booted_at": self.booted_at},
                queue=CONTROL_QUEUE,
            )
        except Exception:  # noqa: BLE001 - the next (re)connection tries again
            log.warning("could not queue %s", TaskName.RUNS_RESUME, exc_info=True)
            return
        self.booted_at = None


app.steps["consumer"].add(ResumeRunsOnConnect)


@signals.worker_init.connect
def _stop_with_the_mtfl_command(**_kwargs) -> None:
    # Started by `mtfl up`/`mtfl demo`: do not outlive it (see workers.agent.lifecycle).
    exit_with_parent()


@signals.worker_process_init.connect
@signals.worker_ready.connect
def _tune_the_garbage_collector(**_kwargs) -> None:
    # Each process that runs control tasks (a pool child once forked; the worker itself with a
    # solo or thread pool): its start-up heap out of the full collections a round at scale
    # starts again and again (see controlplane.common.gc_tuning).
    control_worker_gc()


@signals.worker_shutdown.connect
def _stop_an_orphaned_embedded_broker(**_kwargs) -> None:
    # The command that started the embedded Redis died without stopping it (kill -9): the
    # control worker, stopping for the same reason, turns the Redis off on its way out.
    if parent_died() and app.conf.broker_url:
        shutdown_embedded_broker(app.conf.broker_url)


def use_broker(broker_url: str, result_backend: str) -> None:
    """Point the control app at another broker and result backend, in this process.

    The ``mtfl`` commands call this when they start (or stop) the embedded Redis after the app
    was configured. Celery caches the connection pool, the producer pool and the (thread-local)
    result backend on first use, so those caches are dropped here as well; otherwise messages
    would still go to the broker the app first talked to.
    """
    app.conf.broker_url = broker_url
    app.conf.result_backend = result_backend
    # app.pool and the producer pool live in kombu's process-wide registries, keyed by the
    # broker's address: closing them without removing them would hand the closed pools back the
    # next time this address is used ("Acquire on closed pool"). reset() closes and forgets all.
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    app._local = threading.local()
