"""Receivers of other apps' signals (connected in :meth:`.apps.ExperimentsConfig.ready`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from controlplane.conf import mtfl_setting
from controlplane.experiments import services

log = logging.getLogger(__name__)

_lock = threading.Lock()
_last_sweep = {"at": float("-inf")}


def liveness_on_heartbeat(**_kwargs: Any) -> None:
    """On an agent's heartbeat, run :func:`.services.runs_liveness_sweep` if this process has
    not for ``MTFL_ROUND_CHECK_S`` (agents beat every few seconds, one sweep is enough). A
    failure is logged, never raised: the heartbeat is recorded whatever happens here."""
    interval = float(mtfl_setting("ROUND_CHECK_S"))
    now = time.monotonic()
    with _lock:
        if now - _last_sweep["at"] < interval:
            return
        _last_sweep["at"] = now
    try:
        services.runs_liveness_sweep()
    except Exception:  # noqa: BLE001 - the next heartbeat tries again
        log.warning("the liveness sweep failed", exc_info=True)
