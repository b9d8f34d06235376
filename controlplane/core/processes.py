"""Child processes of the ``mtfl`` commands: the control worker, local agents, the web server.

Each child runs in its own process group (so its own children, e.g. trainer processes, are
stopped with it) and logs to ``$MTFL_HOME/logs/<name>.log``. :meth:`Children.stop_all` sends
SIGTERM, waits, then SIGKILLs; it runs on normal exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path


class Children:
    """The child processes of one ``mtfl`` command."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        atexit.register(self.stop_all)

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Child:
        """Start ``argv`` as a child named ``name`` with ``env`` added to this environment."""
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab", buffering=0)  # noqa: SIM115 - owned by the child's lifetime
        log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        process = subprocess.Popen(
            argv,
            env={**os.environ, **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log_file.close()
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` naming a child that exited, with the end of its log."""
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                tail = child.log_path.read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(
                    f"{child.name} exited with code {code}; last lines of {child.log_path}:\n" + "\n".join(tail)
                )

    def stop_all(self, timeout_s: float = 15.0) -> None:
        """Stop every child: SIGTERM to its process group, then SIGKILL after ``timeout_s``."""
        alive = [c for c in self.children if c.process.poll() is None]
        for child in alive:
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in alive:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait(timeout=5)
        # Trainers of a killed agent are in the agent's process group; make sure none is left.
        for child in self.children:
            _signal_group(child.process, signal.SIGKILL)
        self.children = []


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def python_argv(*args: str) -> list[str]:
    """``[python, *args]`` with this interpreter (children use the same environment)."""
    return [sys.executable, *args]
