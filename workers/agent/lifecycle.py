"""Process lifetime: children of an ``mtfl`` command stop when that command dies.

The ``mtfl`` commands (``demo``, ``up``) start the control worker, local agents and the web
server as children in their own sessions, so a terminal's Ctrl-C reaches only the command,
which then stops them in order. If the command itself dies without that chance (``kill -9``,
an out-of-memory kill), the children must not run on serving a stack nobody controls: a child
started with ``MTFL_PARENT_PID`` asks the kernel for SIGTERM when its parent exits
(``prctl(PR_SET_PDEATHSIG)`` on Linux; elsewhere a thread polls the parent pid).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

PARENT_PID_ENV = "MTFL_PARENT_PID"
_PR_SET_PDEATHSIG = 1
_POLL_S = 2.0

logger = logging.getLogger(__name__)
_PARENT: int | None = None


def exit_with_parent() -> bool:
    """If ``MTFL_PARENT_PID`` is set, arrange for SIGTERM to this process when that parent
    exits (and send it now if the parent is already gone).

    The variable is removed from the environment, so this process's own children (trainers,
    pool workers) do not inherit it: their parent is this process, not the command.

    Returns:
        Whether a parent is being watched.
    """
    global _PARENT
    raw = os.environ.pop(PARENT_PID_ENV, "")
    if not raw:
        return False
    try:
        parent = int(raw)
    except ValueError:
        logger.warning("%s=%r is not a pid; not watching the parent", PARENT_PID_ENV, raw)
        return False
    _PARENT = parent
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0:
            # The parent may have died before prctl took effect: then nobody will signal us.
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
            return True
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="mtfl-parent-watch").start()
    return True


def parent_died() -> bool:
    """Whether this process was watching an ``mtfl`` command that has since exited."""
    return _PARENT is not None and os.getppid() != _PARENT


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        threading.Event().wait(_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
