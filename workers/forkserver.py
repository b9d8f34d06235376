"""A fork server for profiler processes: torch imported once per sweep, not once per process.

A profiling sweep (:mod:`workers.profiling.sweep`) starts one process per task of every
configuration it measures, a few hundred processes per sweep. A new Python interpreter spends
3–5 s of CPU importing torch and torchvision before it can train (torchvision alone pulls in
``torch._dynamo``), and 1–3 s tearing them down, which a sweep's budget would pay for instead of
measurements. A child forked from a server that has already imported them reaches ``READY`` in
the time it takes to build its model.

Why this module rather than the standard library's ``multiprocessing`` forkserver with
``set_forkserver_preload`` (the same idea), measured on a 2-core host, a ``mobilenet_v3_small``
profiler at batch 8, median of 5 spawns from ``spawn`` to ``READY``: a new interpreter 28 s
(the host was loaded), this server 0.70 s, the standard library's 0.68 s after its first spawn
(which waits 57 s for the preload). Start-up is the same; what decides:

- the standard library keeps one fork server per parent process, with the parent's environment
  at the time it started. What libraries read once, when they are loaded, is the server's for
  every child: OpenMP's wait policy (``OMP_WAIT_POLICY``, read when torch is imported) and
  glibc's ``MALLOC_*`` settings. The ``cpu`` backend gives trainers that share cores
  ``OMP_WAIT_POLICY=PASSIVE`` and lone trainers OpenMP's default (:mod:`workers.backends.cpu`:
  spinning workers starve a co-located trainer, passive ones slow a lone one), so a sweep needs
  a server per such environment: :class:`ForkServerPool`;
- a daemonic process may not start ``multiprocessing`` children: tried from a Celery prefork
  (billiard) pool worker, ``Process.start()`` raises ``AssertionError: daemonic processes are not
  allowed to have children``. This server is started with :class:`subprocess.Popen`, which works
  from any process;
- the profilers' protocol is lines on stdin and stdout (:mod:`workers.training.profiler`), which a
  ``multiprocessing`` child does not get (its stdin is ``/dev/null``); here the spawn request
  carries the child's three standard streams.

:class:`ForkServer` starts ``python -m workers.forkserver`` once; it imports
:data:`PRELOAD` and then, on request, ``fork()``\\s a child that runs a module's
``main(argv)`` with the standard streams and environment it was sent, and ``_exit``\\s with
its return value. The child starts in about 0.1 s, with torch already imported.

Why forking is safe here: the server is single-threaded when it forks (it checks, and
refuses to serve otherwise), it never runs a torch operator (so OpenMP has started no thread
pool) and never initialises CUDA (a CUDA context does not survive ``fork``); every child
creates its thread pool and device context itself. What a library reads from the
environment once, when it is loaded, is the server's: OpenMP's wait policy
(``OMP_WAIT_POLICY``), glibc's ``MALLOC_*`` settings. So :class:`ForkServerPool` keeps one
server per such environment and sends each child to the server whose environment matches its
own in everything but :data:`LATE_ENV`, the variables read after the fork (thread counts,
which the child sets with ``torch.set_num_threads``; CUDA's, read when the child creates its
context).

The child is a grandchild of the agent, so the agent sees it through :class:`ForkedProcess`,
which answers like :class:`subprocess.Popen` (``pid``, ``stdin``, ``stdout``, ``poll``,
``wait``, ``send_signal``, ``kill``, ``returncode``): exits are reported by the server, which
reaps its children, and signals go through it, so a pid is never signalled after it was
reaped. Nothing outlives the agent: a server whose socket to the agent closes kills its
children and exits, and every child dies with its server (``PR_SET_PDEATHSIG``).

Messages: JSON, one per datagram, on a ``SOCK_SEQPACKET`` Unix socket pair; a spawn request
carries the child's stdin, stdout and stderr descriptors (``SCM_RIGHTS``). Linux only (the
``cpu`` backend pins cores with ``sched_setaffinity`` anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import io
import itertools
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Self

PRELOAD: tuple[str, ...] = (
    "torch",
    "torchvision",
    "workers.training.zoo",
    "workers.training.trainer",
    "workers.training.profiler",
)
"""Modules every server imports before it serves: what a profiler process spends its start on."""

LATE_ENV: frozenset[str] = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "MTFL_TRAINER_DEVICE",
    }
)
"""Environment variables a forked child may set for itself: read after the fork (thread counts
are applied by the child with ``torch.set_num_threads``; CUDA reads its variables when the
child creates its context). Any other difference in environment needs another server."""

START_TIMEOUT_S = 180.0
"""How long :meth:`ForkServer.start` waits for the server's imports (several seconds on an idle
2-core machine, much longer on a loaded one)."""

_SPAWN_TIMEOUT_S = 30.0
_MAX_MESSAGE = 1 << 20
_PR_SET_PDEATHSIG = 1


class ForkServerError(RuntimeError):
    """The fork server could not start, died, or could not start a child (the message says
    which, with the server's stderr where it has one)."""


def server_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What a server's environment must share with a child's: every variable but :data:`LATE_ENV`."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in LATE_ENV))


# ----------------------------------------------------------------------------------- the agent


class ForkedProcess:
    """A child of a :class:`ForkServer`, as the agent sees it: the parts of
    :class:`subprocess.Popen` that the launch engine uses (:class:`workers.launch.ChildProcess`).

    ``stdin`` is a binary writer, ``stdout`` a binary reader (``None`` where the spawn did not
    ask for a pipe). ``returncode`` is ``None`` while the child runs, its exit code once the
    server reaped it, ``-N`` if signal ``N`` ended it (as ``Popen``).
    """

    def __init__(self, server: ForkServer, pid: int, stdin: BinaryIO | None, stdout: BinaryIO | None) -> None:
        self._server = server
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        """The exit code, or ``None`` while the child runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit; return its exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None  # set before the event
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Have the server send ``signum`` to the child, unless it has already exited."""
        if self.returncode is None:
            self._server._signal(self.pid, int(signum))

    def terminate(self) -> None:
        """SIGTERM (as :meth:`subprocess.Popen.terminate`)."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL (as :meth:`subprocess.Popen.kill`)."""
        self.send_signal(signal.SIGKILL)


@dataclass
class _Pending:
    """A spawn request waiting for the server's answer: the child, or why there is none."""

    event: threading.Event = field(default_factory=threading.Event)
    process: ForkedProcess | None = None
    error: str | None = None


class ForkServer:
    """One fork server process (see the module docstring).

    Args:
        env: the server's environment, which every child it forks inherits and then updates
            with its own; children must agree with it outside :data:`LATE_ENV`
            (:func:`server_key`).
        preload: modules to import before serving.
        stderr_path: the server's stderr (its import errors), or ``None`` for the agent's.

    Use :meth:`start`, then :meth:`spawn`; :meth:`close` kills what is left.
    """

    def __init__(
        self, env: Mapping[str, str], *, preload: Sequence[str] = PRELOAD, stderr_path: Path | None = None
    ) -> None:
        self.env = dict(env)
        self.preload = tuple(preload)
        self.stderr_path = stderr_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        # Re-entrant: the agent's SIGTERM handler signals children (terminate_children) and may
        # run in the main thread while it is inside a send; one datagram is one syscall, so a
        # nested send never splits another.
        self._send_lock = threading.RLock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._state = threading.Condition()
        self._ready = False
        self._dead: str | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """The server process's pid (``None`` before :meth:`start`)."""
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the server is up and answering."""
        return self._ready and self._dead is None

    def start(self, timeout: float = START_TIMEOUT_S) -> ForkServer:
        """Start the server and wait until it has imported :attr:`preload`; returns ``self``.

        Raises:
            ForkServerError: it exited, failed to import, or was not ready within ``timeout``
                seconds (its stderr tail quoted).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self.env)
        # numpy's OpenBLAS starts a thread pool when imported; the server must not have threads.
        env["OPENBLAS_NUM_THREADS"] = "1"
        stderr = open(self.stderr_path, "ab") if self.stderr_path is not None else None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "workers.forkserver", str(theirs.fileno()), *self.preload],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
        finally:
            theirs.close()
            if stderr is not None:
                stderr.close()
        self._sock = ours
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"forkserver-{self._proc.pid}")
        self._reader.start()
        deadline = time.monotonic() + timeout
        with self._state:
            while not self._ready and self._dead is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._state.wait(min(left, 0.5))
        if not self._ready:
            reason = self._dead or f"not ready after {timeout:g} s"
            self.close()
            raise ForkServerError(f"fork server did not start: {reason}{self._stderr_tail()}")
        return self

    def spawn(
        self,
        module: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stderr_path: Path,
        pipes: bool = True,
        cwd: str | None = None,
    ) -> ForkedProcess:
        """Fork a child that runs ``module.main(list(argv))`` and exits with what it returns.

        Args:
            module: importable module with a ``main(argv) -> int`` function (imported in the
                child, so a module outside :attr:`preload` works too, at its import's cost).
            argv: the arguments ``main`` gets.
            env: the child's whole environment (it replaces the server's in the child).
            stderr_path: the child's stderr, opened for writing (truncated).
            pipes: give the child a stdin and a stdout pipe (``False``: ``/dev/null``).
            cwd: the child's working directory (default: the server's).

        Returns:
            The child, running.

        Raises:
            ForkServerError: the server is not running, did not answer within 30 s, or could
                not fork; or ``env`` differs from the server's outside :data:`LATE_ENV`.
        """
        if not self.alive:
            raise ForkServerError(f"fork server is not running{': ' + self._dead if self._dead else ''}")
        if server_key(env) != server_key(self.env):
            differ = sorted({k for k, _ in set(server_key(env)) ^ set(server_key(self.env))})
            raise ForkServerError(f"child environment differs from the server's in {', '.join(differ)}")
        close_after: list[int] = []
        ours_in = ours_out = None
        try:
            if pipes:
                child_in, ours_in = os.pipe()
                ours_out, child_out = os.pipe()
                close_after += [child_in, child_out]
            else:
                child_in = os.open(os.devnull, os.O_RDONLY)
                child_out = os.open(os.devnull, os.O_WRONLY)
                close_after += [child_in, child_out]
            child_err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            close_after.append(child_err)
            request_id = next(self._ids)
            pending = _Pending()
            with self._state:
                self._pending[request_id] = pending
            message = {
                "op": "spawn",
                "id": request_id,
                "module": module,
                "argv": list(argv),
                "env": dict(env),
                "cwd": cwd,
            }
            self._send(message, fds=[child_in, child_out, child_err])
        except BaseException:
            for fd in (ours_in, ours_out):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in close_after:
                os.close(fd)
        if not pending.event.wait(_SPAWN_TIMEOUT_S) or pending.process is None:
            for fd in (ours_in, ours_out):
                if fd is not None:
                    os.close(fd)
            error = pending.error or self._dead or f"no answer within {_SPAWN_TIMEOUT_S:g} s"
            raise ForkServerError(f"fork server could not start {module}: {error}")
        process = pending.process
        process.stdin = os.fdopen(ours_in, "wb") if ours_in is not None else None
        process.stdout = os.fdopen(ours_out, "rb") if ours_out is not None else None
        return process

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server: it kills (SIGKILL) and reaps every child still running, then exits.
        Idempotent."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._mark_dead("closed")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals

    def _send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = json.dumps(message).encode()
        with self._send_lock:
            if self._sock is None:
                raise ForkServerError("fork server is closed")
            try:
                if fds:
                    socket.send_fds(self._sock, [data], list(fds))
                else:
                    self._sock.send(data)
            except OSError as exc:
                raise ForkServerError(f"fork server is gone: {exc}") from exc

    def _signal(self, pid: int, signum: int) -> None:
        with contextlib.suppress(ForkServerError):
            self._send({"op": "signal", "pid": pid, "signum": signum})

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None  # set before this thread starts
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
            except ValueError:
                continue
            self._handle(message)
        code = self._proc.poll() if self._proc is not None else None
        if code is None and self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(5)
        self._mark_dead(f"fork server exited (code {code})" if self._dead is None else self._dead)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("event")
        with self._state:
            if kind == "ready":
                self._ready = True
            elif kind == "failed":
                self._dead = str(message.get("error", "failed"))
            elif kind == "spawned":
                pending = self._pending.pop(message["id"], None)
                if pending is not None:
                    process = ForkedProcess(self, int(message["pid"]), None, None)
                    self._children[process.pid] = process
                    pending.process = process
                    pending.event.set()
            elif kind == "spawn_failed":
                pending = self._pending.pop(message["id"], None)
                if pending is not None:
                    pending.error = str(message.get("error"))
                    pending.event.set()
            elif kind == "exited":
                gone = self._children.pop(int(message["pid"]), None)
                if gone is not None:
                    gone._set_exit(int(message["returncode"]))
            self._state.notify_all()

    def _mark_dead(self, reason: str) -> None:
        with self._state:
            if self._dead is None:
                self._dead = reason
            for pending in self._pending.values():
                pending.event.set()
            self._pending.clear()
            # Children die with their server (PR_SET_PDEATHSIG): none is left running.
            for process in self._children.values():
                process._set_exit(-signal.SIGKILL)
            self._children.clear()
            self._state.notify_all()

    def _stderr_tail(self) -> str:
        if self.stderr_path is None:
            return ""
        try:
            tail = Path(self.stderr_path).read_bytes()[-1500:].decode("utf-8", errors="replace").strip()
        except OSError:
            return ""
        return f"\n--- fork server stderr (tail) ---\n{tail}" if tail else ""


class ForkServerPool:
    """Fork servers by environment (:func:`server_key`), started when first needed.

    Args:
        state_dir: where each server's stderr log goes (``forkserver-<n>.log``).
        preload: what every server imports (:data:`PRELOAD`).

    A server that died is started again at the next :meth:`spawn`.
    """

    def __init__(self, state_dir: Path, *, preload: Sequence[str] = PRELOAD) -> None:
        self.state_dir = Path(state_dir)
        self.preload = tuple(preload)
        self._servers: dict[tuple[tuple[str, str], ...], ForkServer] = {}
        self._count = 0

    def server_for(self, env: Mapping[str, str]) -> ForkServer:
        """The running server for ``env``, started if needed.

        Raises:
            ForkServerError: it could not start.
        """
        key = server_key(env)
        server = self._servers.get(key)
        if server is None or not server.alive:
            if server is not None:
                server.close()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._count += 1
            base = {k: v for k, v in env.items() if k not in LATE_ENV}
            server = ForkServer(
                base, preload=self.preload, stderr_path=self.state_dir / f"forkserver-{self._count}.log"
            )
            self._servers[key] = server
            server.start()
        return server

    def spawn(
        self, module: str, argv: Sequence[str], *, env: Mapping[str, str], stderr_path: Path, pipes: bool = True
    ) -> ForkedProcess:
        """:meth:`ForkServer.spawn` on the server for ``env``.

        Raises:
            ForkServerError: as :meth:`server_for` and :meth:`ForkServer.spawn`.
        """
        return self.server_for(env).spawn(module, argv, env=env, stderr_path=stderr_path, pipes=pipes)

    def close(self) -> None:
        """Stop every server (and so every child still running)."""
        for server in self._servers.values():
            server.close()
        self._servers.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------- the server


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def die_with_parent() -> None:
    """Ask the kernel to send this process SIGKILL when its parent exits (``PR_SET_PDEATHSIG``,
    Linux; nothing elsewhere). The signal follows the parent *thread* that started the process."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _run_child(message: dict[str, Any], fds: Sequence[int], server_pid: int) -> None:
    """In the forked child: take the sent streams and environment, run ``main``, ``_exit``."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        die_with_parent()
        if os.getppid() != server_pid:  # the server died before the line above
            os._exit(128 + signal.SIGKILL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        os.environ.clear()
        os.environ.update(message["env"])
        if message.get("cwd"):
            os.chdir(message["cwd"])
        sys.argv = [message["module"], *message["argv"]]
        result = importlib.import_module(message["module"]).main(list(message["argv"]))
        code = int(result or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            with contextlib.suppress(Exception):
                print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - whatever it was, the child reports it and exits
        with contextlib.suppress(Exception):
            traceback.print_exc(file=sys.stderr)
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket, preload: Sequence[str]) -> int:
    """The server's loop (``python -m workers.forkserver FD [MODULE...]``): import ``preload``,
    say ready, then fork on every spawn request until the agent's end of ``sock`` closes
    (:meth:`_Server.handle`; SIGTERM stops it too). Children still running when it stops are
    killed and reaped.

    Returns:
        The exit code: 0 after a clean close, 1 if an import failed or the server had threads.
    """
    server = _Server(sock)
    try:
        for name in preload:
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - reported to the agent
        traceback.print_exc()
        server.say(event="failed", error=f"cannot import: {type(exc).__name__}: {exc}")
        return 1
    threads = _thread_count()
    if threads != 1:
        server.say(event="failed", error=f"{threads} threads after importing {', '.join(preload)}: forking is unsafe")
        return 1

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    server.say(event="ready", pid=server.me)
    try:
        while not stopping:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                    continue
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return 0
                server.handle(json.loads(data), fds)
            server.reap()
    except KeyboardInterrupt:
        pass
    finally:
        server.kill_children()
    return 0


class _Server:
    """The fork server's side of the agent's socket: its pid and the children it forked."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: set[int] = set()
        self.me = os.getpid()

    def say(self, **message: Any) -> None:
        """Send one event to the agent (lost if the agent's end is gone)."""
        with contextlib.suppress(OSError):
            self.sock.send(json.dumps(message).encode())

    def handle(self, message: dict[str, Any], fds: list[int]) -> None:
        """One request: ``signal`` (to one of this server's children only) or ``spawn`` (fork;
        the child runs :func:`_run_child` with ``fds`` as its standard streams, the server
        closes its copies and says ``spawned`` or ``spawn_failed``)."""
        if message.get("op") == "signal":
            if message["pid"] in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(message["pid"], message["signum"])
            return
        if message.get("op") == "spawn":
            try:
                pid = os.fork()
            except OSError as exc:
                self.say(event="spawn_failed", id=message["id"], error=f"fork: {exc}")
                pid = None
            if pid == 0:
                _run_child(message, fds, self.me)  # never returns
            for fd in fds:
                os.close(fd)
            if pid is not None:
                self.children.add(pid)
                self.say(event="spawned", id=message["id"], pid=pid)

    def reap(self) -> None:
        """Collect the children that exited and say so, with their exit codes."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.say(event="exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))

    def kill_children(self) -> None:
        """Kill every child still running and reap it, saying so."""
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                _pid, status = os.waitpid(pid, 0)
                self.say(event="exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m workers.forkserver FD [MODULE...]`` (started by
    :meth:`ForkServer.start`; ``FD`` is its end of the socket pair)."""
    parser = argparse.ArgumentParser(prog="python -m workers.forkserver", description=__doc__.split("\n")[0])
    parser.add_argument("fd", type=int, help="the server's end of the agent's SOCK_SEQPACKET socket pair")
    parser.add_argument("preload", nargs="*", help="modules to import before serving")
    args = parser.parse_args(argv)
    try:
        sock = socket.socket(fileno=args.fd)
    except OSError as exc:
        print(f"error: fd {args.fd} is not a socket: {exc}", file=sys.stderr)
        return 2
    return serve(sock, args.preload)


if __name__ == "__main__":
    sys.exit(main())
