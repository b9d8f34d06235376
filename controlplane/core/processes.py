"""Child processes of the ``mtfl`` commands: the control worker, local agents, the web server.

Each child runs in its own process group (so its own children, e.g. trainer processes, are
stopped with it) and logs to ``$MTFL_HOME/logs/<name>.log``. :meth:`Children.stop_all` sends
SIGTERM, waits, then SIGKILLs; it runs on normal exit, on Ctrl-C and on SIGTERM.

Two ways to watch them: :meth:`Children.check_alive` fails fast on any exit (short, bounded
waits such as start-up, and tests), :meth:`Children.supervise` restarts a child that exited with
exponential back-off, as the lab's compose restart policy does, and gives up only when one keeps
crashing (:class:`RestartPolicy`).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

RESTART_BACKOFF_FIRST_S = 1.0
"""Wait before the first restart: long enough that a child killed together with something it
needs (the broker restarting) does not spin, short enough that an agent is back before the round
watchdog's heartbeat limit takes its device for lost in the next round."""

RESTART_BACKOFF_MAX_S = 30.0
"""Cap of the doubling wait: a crash loop costs at most one start every 30 s while it lasts."""

CRASH_LIMIT = 5
"""More exits than this within :data:`CRASH_WINDOW_S` and the stack stops: a child that cannot
stay up (a broken installation, a port taken) is an error to show, not a loop to hide."""

CRASH_WINDOW_S = 300.0
"""The window of :data:`CRASH_LIMIT`: with back-off 1+2+4+8+16 s, five quick crashes take about
half a minute, well inside it, while an agent killed now and then over hours never reaches it."""

HEALTHY_AFTER_S = 60.0
"""A child that ran this long since its last start is taken as healthy again: its next restart
waits :data:`RESTART_BACKOFF_FIRST_S` again (its exits still count towards the crash limit)."""


@dataclass(frozen=True)
class RestartPolicy:
    """How :meth:`Children.supervise` restarts: the module's constants unless a test shrinks them.

    Attributes:
        first_backoff_s: seconds before the first restart of a streak; doubled at each exit.
        max_backoff_s: the most seconds between an exit and its restart.
        crash_limit: exits of one child allowed within ``window_s``; one more stops everything.
        window_s: seconds over which exits are counted.
        healthy_after_s: seconds of running after which the back-off starts over.
    """

    first_backoff_s: float = RESTART_BACKOFF_FIRST_S
    max_backoff_s: float = RESTART_BACKOFF_MAX_S
    crash_limit: int = CRASH_LIMIT
    window_s: float = CRASH_WINDOW_S
    healthy_after_s: float = HEALTHY_AFTER_S

    def backoff_s(self, streak: int) -> float:
        """Seconds to wait before restarting after the ``streak``-th exit in a row (1-based)
        without a healthy run between: ``first · 2^(streak-1)``, capped at ``max_backoff_s``."""
        return float(min(self.max_backoff_s, self.first_backoff_s * 2 ** max(0, streak - 1)))


@dataclass
class Child:
    """One child process and what it takes to start it again.

    Attributes:
        name: its name in messages and its log file's stem.
        process: the process now (replaced on restart).
        log_path: the log it appends to, a ``=== <time> <argv>`` header per start.
        argv, env: its command line and whole environment, as first started.
        started_at: the supervisor's clock at its latest start, seconds.
        restarts: how many times it was restarted.
        streak: exits in a row without a healthy run between (the back-off's exponent).
        exits: the supervisor's clock at its recent exits, within the crash window.
        restart_at: when a restart is due (the supervisor's clock), ``None`` while it runs.
    """

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    restarts: int = 0
    streak: int = 0
    exits: list[float] = field(default_factory=list)
    restart_at: float | None = None


class Children:
    """The child processes of one ``mtfl`` command.

    Args:
        log_dir: where each child's ``<name>.log`` goes (created).
        log: a callable taking one line of text, for what :meth:`supervise` does.
        policy: back-off and crash limit of :meth:`supervise`.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        log: Callable[[str], None] = print,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.children: list[Child] = []
        atexit.register(self.stop_all)

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Child:
        """Start ``argv`` as a child named ``name`` with ``env`` added to this environment."""
        child_env = {**os.environ, **(env or {})}
        log_path = self.log_dir / f"{name}.log"
        child = Child(name, _spawn(argv, child_env, log_path), log_path, list(argv), child_env, self.clock())
        self.children.append(child)
        return child

    def check_alive(self) -> None:
        """Fail fast: raise ``RuntimeError`` naming a child that exited, with the end of its log.

        For short, bounded waits (start-up, where a child that exits before it was ever ready is
        a broken configuration, not a crash to retry) and for tests; a long-running command
        calls :meth:`supervise` instead.
        """
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                raise RuntimeError(f"{child.name} exited with code {_describe(code)}; {_tail(child.log_path)}")

    def supervise(self) -> None:
        """Restart the children that exited, each after its back-off; call it every second or so.

        A child found exited gets its process group SIGKILLed (its trainers go with it), a
        line through ``log`` (exit code, signal, restart number, log path) and a restart due
        ``policy.backoff_s(streak)`` seconds later, made by a later call once due. Its log is
        appended to, a new header marking the restart. A child that ran ``healthy_after_s``
        since its last start begins a new streak (the shortest back-off).

        Raises:
            RuntimeError: a child exited more than ``policy.crash_limit`` times within
                ``policy.window_s`` seconds (naming it, the count, the window and the end of its
                log), or could not be started again.
        """
        now = self.clock()
        for child in list(self.children):
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child)
                continue
            code = child.process.poll()
            if code is not None:
                self._schedule_restart(child, code, now)

    def _schedule_restart(self, child: Child, code: int, now: float) -> None:
        policy = self.policy
        # What the dead child started in its group (trainers) must not outlive it: the restarted
        # one starts its own, and would compete with orphans for the same cores or GPU.
        _signal_group(child.process, signal.SIGKILL)
        child.exits = [t for t in child.exits if now - t <= policy.window_s] + [now]
        if len(child.exits) > policy.crash_limit:
            raise RuntimeError(
                f"{child.name} exited with code {_describe(code)}, {len(child.exits)} times within "
                f"{policy.window_s:g} s (more than {policy.crash_limit}): not restarting it again; "
                f"{_tail(child.log_path)}"
            )
        child.streak = 1 if now - child.started_at >= policy.healthy_after_s else child.streak + 1
        delay = policy.backoff_s(child.streak)
        child.restart_at = now + delay
        child.restarts += 1
        self.log(
            f"{child.name} exited with code {_describe(code)}; restart {child.restarts} in {delay:g} s; log: {child.log_path}"
        )

    def _restart(self, child: Child) -> None:
        try:
            child.process = _spawn(child.argv, child.env, child.log_path)
        except OSError as exc:
            raise RuntimeError(f"{child.name} could not be restarted: {exc}") from exc
        child.started_at = self.clock()
        child.restart_at = None
        self.log(f"{child.name} restarted (pid {child.process.pid})")

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


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, appending its output to ``log_path`` after a
    ``=== <time> <argv>`` header."""
    log_file = open(log_path, "ab", buffering=0)  # noqa: SIM115 - handed to the child, closed here after
    try:
        log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        return subprocess.Popen(
            argv,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log_file.close()


def _describe(code: int) -> str:
    """An exit code, with the signal's name when the child was killed by one (``-9 (SIGKILL)``)."""
    if code >= 0:
        return str(code)
    try:
        return f"{code} ({signal.Signals(-code).name})"
    except ValueError:
        return str(code)


def _tail(log_path: Path, lines: int = 15) -> str:
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"its log {log_path} cannot be read: {exc.strerror}"
    return f"last lines of {log_path}:\n" + "\n".join(tail)


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def python_argv(*args: str) -> list[str]:
    """``[python, *args]`` with this interpreter (children use the same environment)."""
    return [sys.executable, *args]
