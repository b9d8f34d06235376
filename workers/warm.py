"""Warm trainer processes: a pool of ``python -m workers.training.trainer serve`` processes kept
alive between rounds, so a later round's trainers start without a process start.

A cold trainer pays, every round, for starting an interpreter, importing torch and torchvision,
building the model and loading its shard (measured on 2 cores for resnet18 on the digits:
about 5 s to the first step, and 1.7 s more to exit and be collected). A warm trainer
(:func:`workers.training.trainer.serve`) pays that once per key: it builds the model and loads the
shard once, and each later job only loads the global weights into the model it already has.
Profiling sweeps on the GPU backends hand the pool ``profile`` jobs too
(:mod:`workers.profiling.sweep`): a warm profiler keeps its CUDA context, model and cuDNN
autotuning from one configuration to the next.

The pool is a :class:`workers.launch.Launcher`: a :class:`workers.launch.ProcessGroup` given it
as ``launcher`` hands each trainer's job to a warm process of the right key instead of starting
one, and gets back a :class:`WarmJob`, which behaves like the process a cold trainer would be
(it "exits", with the cold trainer's exit code, when the job is done), so the launch engine's
barrier, watch, fates and the backend's result collection are the same for both. When the group
closes, each job is released (:class:`workers.launch.ReusableProcess`): its process goes back to
the pool if the whole dispatch went well, and is killed otherwise, so a failed dispatch leaves
no process behind and the next one starts fresh, exactly as with cold trainers.

Key of a process (:func:`process_key`): everything fixed when it starts — its whole environment
(threads, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_VISIBLE_DEVICES``, OpenMP and allocator
settings) — and what its caches hold: the task identity (architecture, classes, input shape,
data set), its cores, threads and time-slicing lock. Never a run or a round: the same tasks on
the same resources reuse their processes across rounds and runs.

Bounds: at most ``max_processes`` processes (busy and idle together; the count setting, and on
``cuda-mps`` the MPS client limit, since an idle client holds its slot) and at most
``memory_bytes`` of idle processes' private resident memory (``RssAnon`` of
``/proc/<pid>/status``); the least recently used idle process is evicted first. A process
found dead when a job is handed to it (it died while idle) is reaped and replaced before the
job starts. Nothing outlives the agent: warm processes ask the kernel for SIGKILL when the agent
dies (``PR_SET_PDEATHSIG``), see the end of their stdin when it exits, and :meth:`TrainerPool.close`
(called by the backend's ``stop``, on the agent's shutdown and at exit) kills them.

This module imports neither torch nor Django.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from workers.launch import DONE_LINE, JOB_LINE

logger = logging.getLogger(__name__)

TRAINER_MODULE = "workers.training.trainer"
"""The module whose ``serve`` mode the pool runs."""

SERVE_COMMAND: list[str] = [sys.executable, "-m", TRAINER_MODULE]
"""The command that starts a warm trainer; ``serve --parent <agent pid>`` is appended (the GPU
tests put a stand-in here, tests/workers/fakes/fake_trainer.py)."""

_JOB_MODES = ("train", "standalone", "profile")
"""The jobs a warm trainer takes (:data:`workers.training.trainer.JOB_MODES`, not imported: the
trainer imports this module)."""

_EOF = b""
_REAP_S = 5.0


def rss_anon_bytes(pid: int | str) -> int | None:
    """Process ``pid``'s private resident memory (``RssAnon`` of ``/proc/<pid>/status``; ``"self"``
    for the calling process), bytes;
    ``None`` where ``/proc`` does not say (the process is gone, or not Linux). Not the resident
    set size, which also counts torch's shared libraries that every process shares
    (:func:`workers.training.runtime.cpu_memory_bytes`)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (state ``Z`` in ``/proc/<pid>/stat``);
    ``False`` where ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def process_key(module: str, argv: Sequence[str], env: Mapping[str, str]) -> tuple[object, ...]:
    """The pool key of a job ``module.main(argv)`` started with ``env``.

    ``argv`` is ``[mode, SPEC.json, RESULT.json]``. A ``train`` job's key holds its task identity
    (architecture, classes, input shape, data set) and resources (threads, cores; not the
    time-slicing lock, which each job takes from its spec); a ``profile`` job's its model
    (architecture, classes, input shape: what :class:`workers.training.profiler.WarmModels`
    keeps; not the batch size, which a warm process changes from one job to the next) and
    resources; a ``standalone`` job's its threads and
    cores (its items vary). All hold the whole environment, which is fixed at the process's
    start (under MPS its ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: a process serves one share).

    Raises:
        ValueError: ``argv`` is not ``[mode, spec, result]`` or the spec cannot be read (the
            dispatch then fails as the launch would have).
    """
    if module != TRAINER_MODULE or len(argv) != 3 or argv[0] not in _JOB_MODES:
        raise ValueError(
            f"a warm trainer runs {TRAINER_MODULE} {'|'.join(_JOB_MODES)} SPEC RESULT, got {module} {argv}"
        )
    mode, spec_path = argv[0], Path(argv[1])
    try:
        spec = json.loads(spec_path.read_text())
        # Not the time-slicing lock: a job takes it from its own spec (IterationLock), so one
        # process serves a task time-sliced in one round and shared in the next, and a plan that
        # moves a device between the two starts no trainer cold. Cores and threads stay: OpenMP
        # workers keep the affinity they were created with, whatever the next job asks.
        resources = (spec.get("threads"), tuple(spec.get("cores") or ()))
        if mode == "train":
            task = spec["task"]
            identity: tuple[object, ...] = (
                task["architecture"],
                task["num_classes"],
                tuple(task.get("input_shape") or ()),
                json.dumps(task["dataset"], sort_keys=True),
            )
        elif mode == "profile":
            identity = (spec["architecture"], spec.get("num_classes"), tuple(spec.get("input_shape") or ()))
        else:
            identity = ()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"cannot read the job's spec {spec_path}: {type(exc).__name__}: {exc}") from None
    return (module, mode, identity, resources, tuple(sorted(env.items())))


class WarmProcess:
    """One ``serve`` trainer process and the reader of its stdout.

    Lines it prints go to the job in progress (:class:`WarmJob`); ``DONE <code>`` ends the job.
    Start it with :meth:`start`; a job is handed over with :meth:`submit`.
    """

    def __init__(self, key: tuple[object, ...], popen: subprocess.Popen[bytes]) -> None:
        self.key = key
        self.popen = popen
        self._job: WarmJob | None = None
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"warm-{popen.pid}-stdout")
        self._reader.start()

    @classmethod
    def start(cls, key: tuple[object, ...], env: Mapping[str, str], stderr_path: Path) -> WarmProcess:
        """Start ``python -m workers.training.trainer serve`` with ``env``, its stderr going to
        ``stderr_path`` (truncated) until its first job redirects it.

        Raises:
            OSError: the process could not be started.
        """
        with open(stderr_path, "wb") as stderr:
            popen = subprocess.Popen(
                [*SERVE_COMMAND, "serve", "--parent", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=dict(env),
                close_fds=True,
            )
        return cls(key, popen)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process runs. A killed trainer with threads (torch's) is a zombie leader
        until its last thread has exited, and ``poll()`` cannot reap it yet: its stdin still
        takes a job line that nobody will read. So a zombie counts as dead here."""
        return self.popen.poll() is None and not _zombie(self.pid)

    def memory_bytes(self) -> int:
        """Its private resident memory, bytes (:func:`rss_anon_bytes`; 0 when unknown)."""
        return rss_anon_bytes(self.pid) or 0

    def submit(self, argv: Sequence[str], stderr_path: Path, *, pipes: bool) -> WarmJob:
        """Hand it the job ``argv`` (``[mode, SPEC, RESULT]``), whose stderr goes to
        ``stderr_path`` (truncated here).

        Raises:
            OSError: the process cannot be written to (it died).
        """
        with open(stderr_path, "wb"):
            pass
        job = WarmJob(self, pipes=pipes)
        with self._lock:
            self._job = job
        payload = {"mode": argv[0], "spec": str(argv[1]), "result": str(argv[2]), "stderr": str(stderr_path)}
        assert self.popen.stdin is not None
        self.popen.stdin.write(f"{JOB_LINE} {json.dumps(payload)}\n".encode())
        self.popen.stdin.flush()
        return job

    def write(self, data: bytes) -> None:
        """Write ``data`` to its stdin.

        Raises:
            OSError, ValueError: it cannot be written to (it died).
        """
        assert self.popen.stdin is not None
        self.popen.stdin.write(data)

    def flush(self) -> None:
        """Flush its stdin."""
        assert self.popen.stdin is not None
        self.popen.stdin.flush()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            words = raw.decode("utf-8", errors="replace").split()
            with self._lock:
                job = self._job
                if words and words[0] == DONE_LINE and job is not None:
                    self._job = None
            if job is None:
                if words:
                    logger.warning("warm trainer %s printed %r between jobs", self.pid, raw)
                continue
            if words and words[0] == DONE_LINE:
                try:
                    code = int(words[1])
                except (IndexError, ValueError):
                    code = 1
                job._finish(code)
            else:
                job._lines.put(raw)
        with self._lock:
            job, self._job = self._job, None
        if job is not None:
            job._lines.put(_EOF)

    def kill(self) -> None:
        """SIGKILL it, reap it, close its pipes, join its reader. Idempotent."""
        if self.popen.poll() is None:
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=_REAP_S)
        except subprocess.TimeoutExpired:
            logger.error("warm trainer %s did not die after SIGKILL", self.pid)
        for pipe in (self.popen.stdin, self.popen.stdout):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:
                    pass  # a dead reader: nothing to flush
        self._reader.join(timeout=_REAP_S)


class _JobStdin:
    """A job's view of the warm process's stdin: writes go through, ``close`` does not close
    the pipe (the process serves further jobs)."""

    def __init__(self, process: WarmProcess) -> None:
        self._process = process
        self.closed = False

    def write(self, data: bytes) -> int:
        if self.closed:
            raise ValueError("write to a job's closed stdin")
        self._process.write(data)
        return len(data)

    def flush(self) -> None:
        self._process.flush()

    def close(self) -> None:
        self.closed = True


class _JobStdout:
    """A job's view of the warm process's stdout: its lines until ``DONE`` (or the process's
    end), then end of file."""

    def __init__(self, lines: queue.Queue[bytes]) -> None:
        self._lines = lines
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        while True:
            raw = self._lines.get()
            if raw == _EOF:
                return
            yield raw

    def close(self) -> None:
        self.closed = True


class WarmJob:
    """One job of a :class:`WarmProcess`, seen by the launch engine as a process
    (:class:`workers.launch.ChildProcess`): it "exits" with the cold trainer's exit code when the
    trainer prints ``DONE``, or with the process's own exit code if the process dies first.
    Signalling or killing a job in progress signals or kills the process (a job that is done
    is left alone); :meth:`release` hands the process back to its pool."""

    def __init__(self, process: WarmProcess, *, pipes: bool) -> None:
        self.process = process
        self.pool: TrainerPool | None = None
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._code: int | None = None
        self._done = threading.Event()
        self._released = False
        self._stdin = _JobStdin(process) if pipes else None
        self._stdout = _JobStdout(self._lines) if pipes else None

    def _finish(self, code: int) -> None:
        self._code = code
        self._done.set()
        self._lines.put(_EOF)

    @property
    def pid(self) -> int:
        """The warm process's id."""
        return self.process.pid

    @property
    def stdin(self) -> IO[bytes] | None:
        """The job's stdin (``GO`` goes here), or ``None`` without the barrier."""
        return self._stdin  # type: ignore[return-value]  # the part of IO[bytes] the engine uses

    @property
    def stdout(self) -> IO[bytes] | None:
        """The job's stdout (``READY``), or ``None`` without the barrier."""
        return self._stdout  # type: ignore[return-value]  # the part of IO[bytes] the engine uses

    @property
    def returncode(self) -> int | None:
        """What :meth:`poll` says."""
        return self.poll()

    def poll(self) -> int | None:
        """The job's exit code once it is done, the process's if it died first, else ``None``."""
        if self._done.is_set():
            return self._code
        code = self.process.popen.poll()
        if code is None:
            return None
        # Dead: a DONE it printed just before may still sit in the pipe; the reader ends soon.
        self.process._reader.join(timeout=1.0)
        return self._code if self._done.is_set() else code

    def wait(self, timeout: float | None = None) -> int:
        """Wait for :meth:`poll` to say something; raises :class:`subprocess.TimeoutExpired`
        after ``timeout`` seconds."""
        limit = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if limit is not None and time.monotonic() > limit:
                raise subprocess.TimeoutExpired([TRAINER_MODULE, "serve"], timeout or 0.0)
            self._done.wait(0.02)
        return code

    def send_signal(self, signum: int) -> None:
        """Send the process ``signum`` while the job runs (nothing once it is done)."""
        if self.poll() is None:
            self.process.popen.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the process while the job runs (nothing once it is done)."""
        if self.poll() is None:
            self.process.popen.kill()

    def release(self, keep: bool) -> None:
        """Hand the process back to the pool: kept if ``keep``, the job ended with code 0 and
        the process lives; killed otherwise. Idempotent."""
        if self._released:
            return
        self._released = True
        if self.pool is not None:
            self.pool._release(self, keep=keep and self.poll() == 0)
        else:
            self.process.kill()


class TrainerPool:
    """Warm trainer processes of one agent, by key, least recently used evicted first.

    A :class:`workers.launch.Launcher` for ``workers.training.trainer`` jobs (see the module
    docstring). Thread-safe; warm processes are started from the thread that calls
    :meth:`spawn` (``PR_SET_PDEATHSIG`` follows that thread).

    Args:
        max_processes: most processes, busy and idle together, ``>= 1``. A dispatch that needs
            more busy ones than this still gets them; idle ones are evicted first.
        memory_bytes: most private resident memory of the idle processes together, bytes, or
            ``None`` for no memory bound.

    Raises:
        ValueError: ``max_processes < 1`` or ``memory_bytes < 0``.
    """

    def __init__(self, max_processes: int, memory_bytes: int | None = None) -> None:
        if max_processes < 1:
            raise ValueError(f"max_processes must be >= 1, got {max_processes}")
        if memory_bytes is not None and memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
        self.max_processes = max_processes
        self.memory_bytes = memory_bytes
        self._idle: OrderedDict[int, WarmProcess] = OrderedDict()  # oldest use first
        self._busy: dict[int, WarmProcess] = {}
        self._lock = threading.RLock()
        self.started = 0
        """Processes started so far."""
        self.evicted = 0
        """Idle processes evicted (bounds) or replaced (found dead) so far."""
        weakref.finalize(self, _kill_all, self._idle, self._busy)

    # -- Launcher

    def spawn(
        self, module: str, argv: Sequence[str], *, env: Mapping[str, str], stderr_path: Path, pipes: bool = True
    ) -> WarmJob:
        """Hand the job ``module.main(argv)`` to an idle process of its key, or start one.

        Raises:
            ValueError: the job cannot be keyed (:func:`process_key`).
            OSError: a process could not be started or written to.
        """
        key = process_key(module, argv, env)
        while True:
            with self._lock:
                process = self._take_idle(key)
                reused = process is not None
                if process is None:
                    self._make_room(1)
                    process = WarmProcess.start(key, env, stderr_path)
                    self.started += 1
                self._busy[process.pid] = process
            try:
                job = process.submit(argv, stderr_path, pipes=pipes)
            except (OSError, ValueError):
                with self._lock:
                    self._busy.pop(process.pid, None)
                process.kill()
                if not reused:
                    raise
                # It died while idle, after the liveness check: a new one takes the job.
                logger.warning("warm trainer %s died while idle; starting a new one", process.pid)
                self.evicted += 1
                continue
            job.pool = self
            return job

    def _take_idle(self, key: tuple[object, ...]) -> WarmProcess | None:
        """The most recently used live idle process of ``key`` (dead ones met are replaced)."""
        for pid in reversed(list(self._idle)):
            process = self._idle[pid]
            if process.key != key:
                continue
            del self._idle[pid]
            if process.alive():
                return process
            logger.warning(
                "warm trainer %s died while idle (exit code %s); starting a new one", pid, process.popen.poll()
            )
            process.kill()
            self.evicted += 1
        return None

    def _make_room(self, needed: int) -> None:
        """Evict idle processes, oldest first, until ``needed`` more fit under ``max_processes``."""
        while self._idle and len(self._idle) + len(self._busy) + needed > self.max_processes:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, process = self._idle.popitem(last=False)
        process.kill()
        self.evicted += 1

    def _release(self, job: WarmJob, *, keep: bool) -> None:
        process = job.process
        with self._lock:
            self._busy.pop(process.pid, None)
            if keep and process.alive():
                self._idle[process.pid] = process
                self._idle.move_to_end(process.pid)
                self._trim()
                return
        process.kill()

    def _trim(self) -> None:
        """Evict idle processes, oldest first, past the count or the memory bound."""
        while self._idle and len(self._idle) + len(self._busy) > self.max_processes:
            self._evict_oldest()
        if self.memory_bytes is None:
            return
        # Each idle process's memory read once (from /proc), not again after every eviction.
        memory = {pid: p.memory_bytes() for pid, p in self._idle.items()}
        total = sum(memory.values())
        while self._idle and total > self.memory_bytes:
            total -= memory[next(iter(self._idle))]
            self._evict_oldest()

    # -- state

    def idle_pids(self) -> list[int]:
        """Idle processes' pids, least recently used first."""
        with self._lock:
            return list(self._idle)

    def pids(self) -> list[int]:
        """Every process's pid (idle and busy)."""
        with self._lock:
            return [*self._idle, *self._busy]

    def close(self) -> None:
        """Kill every process, idle or busy (the agent is stopping). Idempotent; never raises."""
        _kill_all(self._idle, self._busy)


def _kill_all(idle: OrderedDict[int, WarmProcess], busy: dict[int, WarmProcess]) -> None:
    processes = [*idle.values(), *busy.values()]
    idle.clear()
    busy.clear()
    for process in processes:
        try:
            process.kill()
        except Exception:  # noqa: BLE001 - stopping: the others must still be killed
            logger.warning("could not kill warm trainer %s", process.pid, exc_info=True)


__all__ = [
    "TRAINER_MODULE",
    "TrainerPool",
    "WarmJob",
    "WarmProcess",
    "process_key",
    "rss_anon_bytes",
]
