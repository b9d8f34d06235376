"""A workaround for kombu's Redis transport losing a worker when the broker restarts.

When the connection to Redis drops, Celery's consumer collects the broken connection and then
closes it; closing a channel that still holds unacknowledged messages (a countdown task waiting
for its time, a late-acked task running) tries to put them back through a client whose
connection info is already gone, and the ``AttributeError`` this raises (kombu 5.7,
``Channel._connparams``: ``'NoneType' object has no attribute 'hostname'``) is not a
connection error: it escapes the reconnect loop and stops the worker ("Unrecoverable error").

:func:`patch_kombu_redis_restore` makes that one step log and go on instead. The messages are
not lost: they stay in Redis's set of unacknowledged messages and Redis hands them out again
after the visibility timeout (``MTFL_BROKER_VISIBILITY_TIMEOUT_S``); the control plane does not
wait for that (its workers re-check every running round when they reconnect,
:class:`controlplane.celery.ResumeRunsOnConnect`). Imports neither Django nor torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_PATCHED = False


def patch_kombu_redis_restore() -> bool:
    """Make kombu's Redis ``QoS.restore_unacked`` survive a connection that is already gone.

    Idempotent. Returns whether the patch is (now) in place (``False`` without kombu's Redis
    transport, e.g. the ``redis`` package missing).
    """
    global _PATCHED
    if _PATCHED:
        return True
    try:
        # deferred: kombu's Redis transport is optional; without it there is nothing to patch
        from kombu.transport import redis as kombu_redis
    except ImportError:  # no redis client: nothing to patch
        return False
    # kombu leaves restore_unacked unannotated; it takes an optional client and returns nothing useful.
    original: Callable[[kombu_redis.QoS, object], object] = kombu_redis.QoS.restore_unacked

    def restore_unacked(self: kombu_redis.QoS, client: object = None) -> object:
        try:
            return original(self, client)
        except AttributeError as exc:
            logger.warning(
                "could not put %d unacknowledged message(s) back after the broker connection was lost (%s); Redis "
                "delivers them again after the visibility timeout",
                len(self._delivered),
                exc,
            )
            self._delivered.clear()
            return []

    restore_unacked.__wrapped__ = original  # type: ignore[attr-defined]
    kombu_redis.QoS.restore_unacked = restore_unacked  # type: ignore[method-assign]  # the patch itself
    _PATCHED = True
    return True
