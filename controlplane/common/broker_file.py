"""Where a running embedded broker publishes its URL on this machine, and shutting one down.

:class:`controlplane.core.embedded.EmbeddedBroker` writes its ``redis+socket://`` URL to
``$MTFL_HOME/broker_url`` while it runs; other processes on the machine (``mtfl agent``,
``mtfl profile``, ``mtfl shell``, the control app's first connection) find it here. Imports
neither Celery nor the control app, and lives below both (in ``common``, not with the embedded
stack in ``core``, which imports the control app), so the app reads it without a loop.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)


def broker_url_file() -> Path:
    """``$MTFL_HOME/broker_url``: the URL of the embedded broker running on this machine."""
    return Path(settings.MTFL_HOME) / "broker_url"


def embedded_broker_url() -> str | None:
    """The URL of an embedded broker started by another ``mtfl`` command on this machine, if
    one is still running (its socket exists)."""
    path = broker_url_file()
    if not path.exists():
        return None
    url = path.read_text().strip()
    socket = url.removeprefix("redis+socket://").split("?")[0]
    return url if url.startswith("redis+socket://") and Path(socket).exists() else None


def shutdown_embedded_broker(url: str) -> bool:
    """Shut down the embedded Redis at ``url`` (saving its data), if it is one.

    Used when the command that started it died without stopping it.

    Returns:
        Whether a server was asked to shut down.
    """
    if not url.startswith("redis+socket://"):
        return False
    import redis  # deferred: only a control worker stopping an orphaned broker needs the client

    socket_path = url.removeprefix("redis+socket://").split("?")[0]
    try:
        redis.Redis(unix_socket_path=socket_path).shutdown(save=True)
    except redis.ConnectionError:
        pass  # shutting down closes the connection under the client: that is the success case
    except redis.RedisError as exc:
        log.warning("could not shut down the embedded Redis at %s: %s", socket_path, exc)
        return False
    if broker_url_file().exists() and broker_url_file().read_text().strip() == url:
        broker_url_file().unlink()
    return True
