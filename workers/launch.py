"""The one trainer launch engine: spawn → barrier → watch → collect → kill.

Every process that trains on a device goes through here: a round's trainers and a standalone
measurement (``python -m workers.training.trainer``, :mod:`workers.backends.base`) and a profiling
configuration's profilers (``python -m workers.training.profiler``, :mod:`workers.profiling.sweep`, which
``benchmarks/gpu_check.py`` also uses to measure the strategies' plans). A caller describes its
processes as :class:`ProcessSpec` records, hands them to a :class:`ProcessGroup` and drives it::

    with ProcessGroup(specs) as group:      # leaving the block kills and reaps what is left
        group.launch()                      # one OS process per spec
        if group.wait_ready(deadline, "ready_timeout_s") and group.go():
            group.wait_exit(deadline, "trainer_timeout_s")
    # each Child now has a fate (None = fine) and its returncode; the caller reads its results

The facts of docs/DESIGN.md §2 this module keeps:

- one OS process per task, started with :class:`subprocess.Popen` (a new interpreter), never
  ``fork``/``multiprocessing`` from the agent: the agent may have initialised CUDA state a forked
  child would inherit broken, and Celery prefork children are daemonic and may not start
  ``multiprocessing`` children. The one exception is a caller-supplied ``launcher`` (the
  profilers' :class:`workers.forkserver.ForkServerPool`), whose server process imported torch
  but never initialised CUDA or a thread pool. A launcher may also hand the work to a process
  that outlives the dispatch (the agent's warm trainers, :class:`workers.warm.TrainerPool`): it
  then returns a :class:`ReusableProcess` that "exits" when its job is done, and
  :meth:`ProcessGroup.close` releases it instead of reaping it;
- the start barrier: each process prints ``READY`` on stdout once loaded and blocks until it
  reads ``GO`` on stdin; GO goes to all only when all are ready, so they really overlap;
- a dispatch fails as a whole: when one process dies, times out or the dispatch is interrupted,
  every other one is killed (under MPS one client's fatal fault reaches every client of the GPU
  anyway, and the MPS server refuses new clients until they have all exited).

The agent-wide state lives here too, because the watch loop reads it: the live children (for the
SIGTERM hook, :func:`terminate_children`), the shutdown flag (:func:`request_shutdown`) and the
control plane's cancellation of the device task in progress (:func:`request_cancel`).

Fates a child can end with (``Child.fate``): ``None`` (nothing went wrong that the parent saw),
``"failed"`` (it exited with a non-zero code, or exited before its work was done, or could not be
sent GO), ``"killed"`` (killed because another child failed), ``"timeout"``, an interrupt's fate
(``"shutdown"``, ``"cancelled"``, or the caller's, e.g. ``"stopped"``), ``"agent"`` (the parent
itself failed: :meth:`ProcessGroup.fail_all`). This module imports neither torch nor Django.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, Self, runtime_checkable

logger = logging.getLogger(__name__)

READY_LINE = "READY"
"""What a process prints on stdout when it is loaded and waits at the start barrier."""
GO_LINE = "GO"
"""What the parent writes to every process's stdin once all are ready."""
JOB_LINE = "JOB"
"""What starts a job line to a warm trainer (``JOB {json}``, :func:`workers.training.trainer.serve`)."""
DONE_LINE = "DONE"
"""What a warm trainer prints on stdout after a job (``DONE <exit code>``), instead of exiting."""

POLL_S = 0.05
"""Default seconds between two looks at the children while waiting."""

STDERR_TAIL_CHARS = 1500
"""How much of a failed child's stderr its error quotes."""

FATES_CAUSING: frozenset[str] = frozenset({"failed", "timeout", "agent", "shutdown", "cancelled", "stopped"})
"""Fates that make a dispatch fail on their own (``"killed"`` is a consequence, not a cause)."""


# ------------------------------------------------------------------------ agent-wide state

# Live children of this agent, by pid, for the shutdown hook. An RLock because the hook runs in
# a signal handler on the main thread, which may already hold it.
_CHILDREN: dict[int, ChildProcess] = {}
_CHILDREN_LOCK = threading.RLock()
_SHUTDOWN = threading.Event()
# The control plane cancelled the device task in progress (run cancelled, straggler past the
# round's deadline, superseded attempt): set by the agent's watcher thread, cleared before each
# task. The reason is what the killed children's results say.
_CANCEL = threading.Event()
_CANCEL_REASON: list[str] = [""]


class ChildProcess(Protocol):
    """What the engine needs of a started process: the part of :class:`subprocess.Popen`
    that :class:`workers.forkserver.ForkedProcess` also has."""

    @property
    def pid(self) -> int:
        """The process id."""

    @property
    def stdin(self) -> IO[bytes] | None:
        """Its stdin pipe, or ``None`` without the barrier."""

    @property
    def stdout(self) -> IO[bytes] | None:
        """Its stdout pipe, or ``None`` without the barrier."""

    @property
    def returncode(self) -> int | None:
        """What :meth:`poll` last saw."""

    def poll(self) -> int | None:
        """The exit code (``-N`` for signal ``N``), or ``None`` while it runs."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit and return the exit code; raises
        :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""

    def send_signal(self, signum: int) -> None:
        """Send it signal ``signum`` (nothing once it has exited)."""

    def kill(self) -> None:
        """Send it SIGKILL."""


@runtime_checkable
class ReusableProcess(Protocol):
    """A started process that outlives its dispatch (a warm trainer's job,
    :class:`workers.warm.WarmJob`): :meth:`ProcessGroup.close` hands it back with
    :meth:`release` instead of considering it gone once reaped."""

    def release(self, keep: bool) -> None:
        """The dispatch is over: keep the process for another one if ``keep`` (the dispatch
        succeeded as far as the group saw) and its job ended well, else end it."""


class Launcher(Protocol):
    """Starts a process some other way than a new interpreter (the profilers' fork servers,
    :class:`workers.forkserver.ForkServerPool`). ``spawn`` runs ``module.main(argv)`` with
    ``env`` and stdin/stdout pipes when ``pipes``; it raises on failure (the dispatch then
    fails with fate ``"agent"``)."""

    def spawn(
        self, module: str, argv: Sequence[str], *, env: Mapping[str, str], stderr_path: Path, pipes: bool = True
    ) -> ChildProcess:
        """Start a process running ``module.main(argv)``; return it, running."""


def request_shutdown() -> None:
    """Mark the agent as shutting down and terminate every live child (the SIGTERM hook).

    Safe to call from a signal handler. A dispatch in progress then fails with "agent shutting
    down"; later ones are refused the same way.
    """
    _SHUTDOWN.set()
    terminate_children()


def shutdown_requested() -> bool:
    """Return whether :func:`request_shutdown` was called."""
    return _SHUTDOWN.is_set()


def clear_shutdown() -> None:
    """Forget :func:`request_shutdown` (an embedded agent that serves again; tests)."""
    _SHUTDOWN.clear()


def request_cancel(reason: str) -> int:
    """Cancel the device task in progress: mark it cancelled with ``reason`` and terminate every
    live child; return how many were signalled.

    The round (or standalone measurement) then fails with ``reason`` instead of running on;
    unlike :func:`request_shutdown` the agent keeps serving. Safe from any thread.
    """
    _CANCEL_REASON[0] = reason or "cancelled by the control plane"
    _CANCEL.set()
    return terminate_children()


def cancel_requested() -> str | None:
    """The reason given to :func:`request_cancel` for the task in progress, or ``None``."""
    return _CANCEL_REASON[0] if _CANCEL.is_set() else None


def clear_cancel() -> None:
    """Forget a cancellation (the agent calls this before each device task)."""
    _CANCEL.clear()
    _CANCEL_REASON[0] = ""


def live_children() -> list[ChildProcess]:
    """The children started by the engine and not yet reaped, in start order."""
    with _CHILDREN_LOCK:
        return list(_CHILDREN.values())


def terminate_children() -> int:
    """Send SIGTERM to every live child of this agent; return how many were signalled."""
    count = 0
    for proc in live_children():
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                count += 1
            except ProcessLookupError:
                pass
    return count


def agent_interrupt() -> tuple[str, str] | None:
    """The default interrupt of a :class:`ProcessGroup`: ``("shutdown", "agent shutting
    down")`` after :func:`request_shutdown`, ``("cancelled", reason)`` after
    :func:`request_cancel`, else ``None``."""
    if shutdown_requested():
        return "shutdown", "agent shutting down"
    reason = cancel_requested()
    return ("cancelled", reason) if reason is not None else None


def stderr_tail(path: Path, limit: int = STDERR_TAIL_CHARS) -> str:
    """The last ``limit`` characters of a child's stderr log, stripped; ``""`` if unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


# ------------------------------------------------------------------------------ the group


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start.

    Attributes:
        command: the program, e.g. ``[sys.executable, "-m", "workers.training.trainer", "train"]``;
            ``args`` are appended.
        args: its arguments (spec and result paths).
        env: its whole environment.
        stderr_path: where its stderr goes (truncated at start).
        label: how errors name it (``"task 3 (cifar-resnet)"``).
        module: the module whose ``main(argv)`` a ``launcher`` runs instead of ``command``
            (``argv`` = everything after ``-m module`` in ``command``, then ``args``); ``None``
            if the process can only be started as ``command``.
        result_path: removed before the start, so a stale result is never read.
    """

    command: Sequence[str]
    args: Sequence[str]
    env: Mapping[str, str]
    stderr_path: Path
    label: str
    module: str | None = None
    result_path: Path | None = None


@dataclass
class Child:
    """One started process of a :class:`ProcessGroup` and what the parent learned about it."""

    spec: ProcessSpec
    proc: ChildProcess | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    fate: str | None = None
    fate_detail: str = ""

    @property
    def label(self) -> str:
        """The spec's label."""
        return self.spec.label

    @property
    def returncode(self) -> int | None:
        """Its exit code (``-N`` for signal ``N``), or ``None`` while it runs or if it never started."""
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self) -> str:
        """The tail of its stderr log (:func:`stderr_tail`)."""
        return stderr_tail(self.spec.stderr_path)


class ProcessGroup:
    """The processes of one dispatch (a round, a standalone measurement, a profiling
    configuration), started, held at the barrier, watched and reaped together.

    Args:
        specs: the processes, in order (``children`` keeps it).
        barrier: give each process stdin/stdout pipes and the READY/GO protocol; ``False`` starts
            it with ``/dev/null`` for both (a standalone measurement).
        interrupt: polled while waiting; a ``(fate, detail)`` it returns ends the wait and marks
            every child still running, or exited with a non-zero code, with it. Default
            :func:`agent_interrupt` (shutdown, cancellation).
        on_line: called from the reader thread with ``(child, words)`` for every stdout line but
            ``READY`` (the profilers' ``ITER`` lines).
        launcher: starts the processes of specs with a ``module`` (fork servers) instead of
            ``Popen``.
        where: appended to a killed child's "killed because ... failed" (``" on this device"``).
        poll_s: seconds between looks at the children.
        before_kill: called by :meth:`close` with the pids of the children still running, just
            before they are killed (``cuda-mps``: the MPS daemon's ``terminate_client``); what
            it raises is logged, and the children are killed regardless.
    """

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        *,
        barrier: bool = True,
        interrupt: Callable[[], tuple[str, str] | None] = agent_interrupt,
        on_line: Callable[[Child, list[str]], None] | None = None,
        launcher: Launcher | None = None,
        where: str = "",
        poll_s: float = POLL_S,
        before_kill: Callable[[list[int]], object] | None = None,
    ) -> None:
        self.children = [Child(spec) for spec in specs]
        self.before_kill = before_kill
        self.barrier = barrier
        self.interrupt = interrupt
        self.on_line = on_line
        self.launcher = launcher
        self.where = where
        self.poll_s = poll_s

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- start

    def launch(self) -> None:
        """Start every process (in order); its stdout reader too, with the barrier.

        Raises:
            OSError: a process could not be started (the ones started so far are tracked and
                :meth:`close` reaps them).
            Exception: whatever the ``launcher`` raises.
        """
        for child in self.children:
            self._start(child)

    def _start(self, child: Child) -> None:
        spec = child.spec
        if spec.result_path is not None:
            spec.result_path.unlink(missing_ok=True)
        if self.launcher is not None and spec.module is not None:
            head = list(spec.command)
            argv = head[head.index(spec.module) + 1 :] if spec.module in head else []
            proc: ChildProcess = self.launcher.spawn(
                spec.module, [*argv, *spec.args], env=spec.env, stderr_path=spec.stderr_path, pipes=self.barrier
            )
        else:
            pipe = subprocess.PIPE if self.barrier else subprocess.DEVNULL
            with open(spec.stderr_path, "wb") as stderr:
                proc = subprocess.Popen(
                    [*spec.command, *spec.args],
                    stdin=pipe,
                    stdout=pipe,
                    stderr=stderr,
                    env=dict(spec.env),
                    close_fds=True,
                )
        child.proc = proc
        with _CHILDREN_LOCK:
            _CHILDREN[proc.pid] = proc
        if self.barrier:
            child.reader = threading.Thread(
                target=self._read, args=(child,), daemon=True, name=f"child-{proc.pid}-stdout"
            )
            child.reader.start()

    def _read(self, child: Child) -> None:
        """Read a child's stdout until EOF: READY sets ``ready``, other lines go to ``on_line``."""
        assert child.proc is not None and child.proc.stdout is not None
        for raw in child.proc.stdout:
            words = raw.decode("utf-8", errors="replace").split()
            if words == [READY_LINE]:
                child.ready.set()
            elif words and self.on_line is not None:
                try:
                    self.on_line(child, words)
                except Exception:  # noqa: BLE001 - a bad line must not end the reader
                    logger.warning(
                        "child %s wrote a line its parent could not read: %r", child.proc.pid, raw, exc_info=True
                    )

    # -- barrier

    def wait_ready(self, deadline: float, limit: str) -> bool:
        """Wait until every child printed READY; ``False`` if the dispatch was given up (a child
        exited, the interrupt, or ``deadline`` (monotonic seconds) passed: fate ``"timeout"``,
        detail naming ``limit``, the setting that was exceeded)."""
        while not all(c.ready.is_set() for c in self.children):
            if self._abort(deadline, limit, "before READY", exit_ok=False):
                return False
            time.sleep(self.poll_s)
        return True

    def go(self, *, close: bool = True) -> bool:
        """Send GO to every child (and close its stdin unless ``close`` is false, for a protocol
        that sends more lines later). A child that cannot be sent GO fails and the others are
        marked killed; returns ``False`` then."""
        for child in self.children:
            try:
                self._write(child, GO_LINE, close=close)
            except (OSError, ValueError) as exc:
                child.fate, child.fate_detail = "failed", f"could not send {GO_LINE}: {exc}"
                self._mark_killed([child])
                return False
        return True

    def broadcast(self, line: str, *, close: bool = False) -> None:
        """Write ``line`` to every child's stdin; a child that cannot be written to has exited,
        which the next wait notices."""
        for child in self.children:
            try:
                self._write(child, line, close=close)
            except (OSError, ValueError):
                pass

    @staticmethod
    def _write(child: Child, line: str, *, close: bool) -> None:
        assert child.proc is not None and child.proc.stdin is not None
        child.proc.stdin.write(f"{line}\n".encode())
        child.proc.stdin.flush()
        if close:
            child.proc.stdin.close()

    # -- watch

    def wait_until(
        self, done: Callable[[float], bool], deadline: float, limit: str, *, phase: str = "while training"
    ) -> float | None:
        """Poll ``done(now)`` (``now``: monotonic seconds) while every child trains; return
        ``now`` once it holds, or ``None`` if the dispatch was given up first. Here a child
        that exits, even with code 0, has failed: it was to train until told to stop."""
        while True:
            if self._abort(deadline, limit, phase, exit_ok=False):
                return None
            now = time.monotonic()
            if done(now):
                return now
            time.sleep(self.poll_s)

    def wait_exit(self, deadline: float, limit: str, *, phase: str = "while training") -> bool:
        """Wait for every child to exit; ``False`` if the dispatch was given up first (a child
        failed, the interrupt, the deadline). Children that exited with a non-zero code are
        marked ``"failed"`` either way, unless the interrupt holds: its hook may have
        terminated them all before this loop looked."""
        finished = True
        while any(c.running for c in self.children):
            if self._abort(deadline, limit, phase, exit_ok=True):
                finished = False
                break
            time.sleep(self.poll_s)
        if finished and self._interrupted():
            return False
        for child in self.children:
            if child.fate is None and child.proc is not None and child.returncode not in (0, None):
                child.fate = "failed"
        return finished

    def _abort(self, deadline: float, limit: str, phase: str, *, exit_ok: bool) -> bool:
        """Decide whether the dispatch must stop now, and mark why. True = stop."""
        if self._interrupted():
            return True
        exited = [
            c for c in self.children if c.proc is not None and not c.running and (c.returncode != 0 or not exit_ok)
        ]
        if exited:
            for child in exited:
                child.fate = "failed"
                if child.returncode == 0:
                    child.fate_detail = f"exited {phase}, before its work was done"
            self._mark_killed(exited)
            return True
        if time.monotonic() > deadline:
            for child in self.children:
                if child.running:
                    child.fate, child.fate_detail = "timeout", f"timed out {phase} ({limit} exceeded)"
            return True
        return False

    def _interrupted(self) -> bool:
        """Whether the interrupt holds; if so, mark the children it ended."""
        interrupted = self.interrupt()
        if interrupted is None:
            return False
        fate, detail = interrupted
        for child in self.children:
            # A child the interrupt's hook already terminated counts as interrupted, not failed.
            if child.proc is not None and (child.running or child.returncode != 0):
                child.fate, child.fate_detail = fate, detail
        return True

    def _mark_killed(self, culprits: Sequence[Child]) -> None:
        names = ", ".join(c.label for c in culprits)
        for child in self.children:
            if child.fate is None and child.running:
                child.fate, child.fate_detail = "killed", f"killed because {names} failed{self.where}"

    def fail_all(self, detail: str) -> None:
        """Mark every child without a fate as ``"agent"`` (the parent failed while driving them)."""
        for child in self.children:
            if child.fate is None:
                child.fate, child.fate_detail = "agent", detail

    # -- collect

    def causes(self) -> list[Child]:
        """The children whose fate fails the dispatch on its own (:data:`FATES_CAUSING`)."""
        return [c for c in self.children if c.fate in FATES_CAUSING]

    def close(self) -> None:
        """Kill (SIGKILL) and reap every child (after ``before_kill`` for those still running),
        close its pipes, join its reader, stop tracking it. Idempotent.

        A :class:`ReusableProcess` (a warm trainer's job) that finished is released instead:
        kept for the next dispatch only when no child of this one has a fate, so a failed
        dispatch leaves no process behind, as with cold ones."""
        keep = all(c.fate is None for c in self.children)
        running = [c.proc.pid for c in self.children if c.proc is not None and c.proc.poll() is None]
        if running and self.before_kill is not None:
            try:
                self.before_kill(running)
            except Exception:  # noqa: BLE001 - a courtesy before SIGKILL; the kill must happen
                logger.warning("before_kill hook failed for pids %s", running, exc_info=True)
        for child in self.children:
            proc = child.proc
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass  # the pipe's reader is dead; nothing left to flush
            if child.reader is not None:
                child.reader.join(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
            with _CHILDREN_LOCK:
                _CHILDREN.pop(proc.pid, None)
            if isinstance(proc, ReusableProcess):
                proc.release(keep)
