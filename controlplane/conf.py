"""App settings for mtfl-lab, read from ``settings.MTFL`` with defaults (DRF's APISettings pattern)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # A round's deadline: DEADLINE_FACTOR × its predicted round time, or ROUND_DEADLINE_S when
    # there is no prediction; never below ROUND_DEADLINE_FLOOR_S (process start-up, data loading).
    "ROUND_DEADLINE_S": 1800.0,
    "DEADLINE_FACTOR": 3.0,
    "ROUND_DEADLINE_FLOOR_S": 120.0,
    # How often the round watchdog looks at a running round (results, lost agents, retries).
    "ROUND_CHECK_S": 30.0,
    "WARMUP_ITERATIONS": 2,
    "STANDALONE_TIMED_ITERATIONS": 5,
    # How old a cached P_alone (controlplane.experiments.services.standalone_cache) may be and
    # still stand in for a measurement, in seconds; 0 turns the cache off (every run measures).
    "STANDALONE_CACHE_MAX_AGE_S": 7 * 24 * 3600.0,
    "HEARTBEAT_OFFLINE_S": 60.0,
    "BASELINE_BATCH_SIZE": 128,
    "CIFAR10_ROOT": "",
    # Largest weights file an agent may upload (bytes); bigger uploads are refused with 413.
    "MAX_ARTIFACT_BYTES": 4 * 1024**3,
    # A device's predictor with a held-out RMSLE above this is untrusted (controlplane.planning.guard).
    "PREDICTOR_MAX_RMSLE": 0.2,
    # A round's assignment with fewer timed iterations than this never becomes a profile sample.
    "MIN_TIMED_ITERATIONS": 3,
    # The lab scheduler (controlplane.lab.services): which waiting round gets free
    # devices, fifo (arrival) or fair (least weighted device-seconds in the last FAIR_WINDOW_S).
    "SCHEDULER_POLICY": "fair",
    "FAIR_WINDOW_S": 3600.0,
    # Storage lifecycle: global checkpoints kept per run and task (the last N rounds', the best
    # and the initial model); a round refuses to start below MIN_FREE_BYTES free in ARTIFACT_ROOT.
    "KEEP_LAST_CHECKPOINTS": 3,
    "MIN_FREE_BYTES": 1024**3,
}


def mtfl_setting(name: str) -> Any:
    """Return ``settings.MTFL[name]``, or its default.

    Raises:
        KeyError: for a name that is not an mtfl-lab setting.
    """
    if name not in DEFAULTS:
        raise KeyError(f"unknown mtfl-lab setting {name!r}; known: {sorted(DEFAULTS)}")
    return getattr(settings, "MTFL", {}).get(name, DEFAULTS[name])
