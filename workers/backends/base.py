"""The execution-backend interface and the trainer-process machinery backends share.

:class:`ExecutionBackend` is what the device agent calls. :class:`AnalyticBackend` is the kind
that answers from a model instead of running anything (``simulated``).
:class:`TrainerProcessBackend` implements a round the way docs/DESIGN.md §2 describes it: one
``python -m workers.trainer`` process per assignment (``subprocess.Popen``, never
``fork``/``multiprocessing``: Celery children are daemonic and CUDA must not be forked), all
held at a start barrier (each prints ``READY``; when all have, each gets ``GO``) so they really
overlap, then waited for with a timeout. A subclass only decides each trainer's resources
(threads, cores, lock, environment).

Failures are data: if any trainer fails, times out, the agent shuts down or the control plane
cancels the task (:func:`request_cancel`), every trainer of the device is killed (on a GPU under MPS one client's fatal fault reaches them all anyway) and
the round comes back as ``DeviceRoundResult(status="failed")`` naming the task and its error.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import ValidationError

from workers.messages import (
    AssignmentResult,
    AssignmentSpec,
    DeviceRoundResult,
    Partitioning,
    ProfileConfigResult,
    ProfileSweepRequest,
    ProfileTaskSpec,
    StandaloneRequest,
    StandaloneResult,
    TrainRoundRequest,
)
from workers.trainer import GO_LINE, READY_LINE, StandaloneSpec, TrainerSpec

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_STDERR_TAIL_CHARS = 1500
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

TRAINER_COMMAND: list[str] = [sys.executable, "-m", "workers.trainer"]
"""The command that starts one trainer process; the mode (``train``/``standalone``), SPEC.json
and RESULT.json are appended."""

# Live trainer processes of this agent, by pid, for the shutdown hook. An RLock because the
# hook runs in a signal handler on the main thread, which may already hold it.
_CHILDREN: dict[int, subprocess.Popen] = {}
_CHILDREN_LOCK = threading.RLock()
_SHUTDOWN = threading.Event()
# The control plane cancelled the device task in progress (run cancelled, straggler past the
# round's deadline, superseded attempt): set by the agent's watcher thread, cleared before
# each task. The reason is what the killed trainers' results say.
_CANCEL = threading.Event()
_CANCEL_REASON: list[str] = [""]


class BackendUnavailableError(RuntimeError):
    """A backend cannot run on this host; the message is one line saying why."""


@dataclass
class AgentContext:
    """What a backend knows about the device it runs on.

    Attributes:
        device: the device name (``device.<name>`` queue).
        cores: CPU ids the device may use (``os.sched_getaffinity`` ids), non-empty.
        state_dir: the agent's folder for work files (specs, results, trainer logs, lock).
        artifact_root: folder of the local artifact store holding the weights.
        trainer_timeout_s: seconds a round's trainers may train after ``GO`` (and the limit of
            a standalone measurement) before they are killed.
        ready_timeout_s: seconds the trainers may take to reach ``READY`` (load data and model).
    """

    device: str
    cores: list[int]
    state_dir: Path
    artifact_root: Path
    trainer_timeout_s: float = 3 * 3600.0
    ready_timeout_s: float = 600.0


@dataclass(frozen=True)
class TrainerResources:
    """The slice of the device one trainer process gets.

    Attributes:
        threads: torch intra-op threads (also ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``).
        cores: CPU ids the process is pinned to; ``None`` to inherit the agent's.
        lock_path: per-iteration exclusive lock file (time slicing), or ``None``.
        env: extra environment variables (e.g. ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
    """

    threads: int
    cores: list[int] | None
    lock_path: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class ExecutionBackend(ABC):
    """How a device runs its share of a round; one implementation per kind of device."""

    name: ClassVar[str]

    @abstractmethod
    def check_available(self) -> None:
        """Check this host can run the backend.

        Raises:
            BackendUnavailableError: with one line saying what is missing.
        """

    @abstractmethod
    def run_round(self, request: TrainRoundRequest, ctx: AgentContext) -> DeviceRoundResult:
        """Train every assignment of the request concurrently and report what happened.

        Never raises for trainer problems: they come back as ``status="failed"`` results.
        """

    @abstractmethod
    def measure_standalone(self, request: StandaloneRequest, ctx: AgentContext) -> StandaloneResult:
        """Measure each item's throughput alone on the whole device (``P_alone``).

        Never raises for trainer problems: they come back as ``status="failed"`` / per-item
        ``error``.
        """

    def describe(self) -> dict:
        """What the agent adds to its :class:`~workers.messages.DeviceInventory` about the
        accelerator: ``accelerator`` (a model name), ``memory_bytes`` and ``allocation_units``
        (what a share is granted in: SMs on a GPU), and on a GPU its UUID, driver and CUDA
        versions, SM count and whether MPS is available. Nothing by default: the host
        describes a cpu device (its cores and memory).

        Raises:
            BackendUnavailableError: the accelerator cannot be described (one line).
        """
        return {}

    def start(self, ctx: AgentContext) -> None:
        """Prepare the device when the agent starts (``cuda-mps``: start the MPS control
        daemon). Nothing by default.

        Raises:
            BackendUnavailableError: the device cannot be prepared (one line saying why).
        """

    def stop(self) -> None:
        """Release what :meth:`start` (or a dispatch) set up, on exit and on SIGTERM
        (``cuda-mps``: quit the MPS control daemon). Idempotent; never raises. Nothing by
        default."""


class AnalyticBackend(ExecutionBackend):
    """A backend whose numbers come from a model instead of running trainers.

    Nothing is trained or timed: a round, a standalone measurement or a profiling
    configuration is answered at once, with virtual durations, and every result says
    ``simulated=True``. :func:`workers.profiling.run_sweep` spends a sweep's budget in those
    virtual seconds.
    """

    @abstractmethod
    def profile_configuration(
        self,
        tasks: Sequence[ProfileTaskSpec],
        request: ProfileSweepRequest,
        ctx: AgentContext,
        *,
        config_index: int,
        repeat_of: int | None,
        started_at: float,
    ) -> ProfileConfigResult:
        """Answer one profiling configuration as :func:`workers.profiling.measure_configuration`
        would have measured it (MPS-style shares), without running it.

        Args:
            tasks: the configuration, 1 or more tasks.
            request: the sweep (warm-up, timing window, timeout, number of classes, seed).
            ctx: the device.
            config_index: copied into the result; also seeds the noise.
            repeat_of: copied into the result.
            started_at: virtual Unix time the measurement starts.

        Returns:
            The result with ``simulated=True``; ``finished_at - started_at`` is the virtual
            seconds measuring it would have taken (what the sweep's budget is charged).
            Failures (out of memory, past ``config_timeout_s``, a bad share) are
            ``status="failed"`` data; ``standalone_sps`` is left unset.
        """


def request_shutdown() -> None:
    """Mark the agent as shutting down and terminate every live trainer (SIGTERM hook).

    Safe to call from a signal handler. A round in progress then returns failed with
    "agent shutting down"; later rounds are refused the same way.
    """
    _SHUTDOWN.set()
    terminate_children()


def shutdown_requested() -> bool:
    """Return whether :func:`request_shutdown` was called."""
    return _SHUTDOWN.is_set()


def request_cancel(reason: str) -> int:
    """Cancel the device task in progress: mark it cancelled with ``reason`` and terminate
    every live trainer; return how many were signalled.

    The round (or standalone measurement) then returns failed with ``reason`` instead of
    running on; unlike :func:`request_shutdown` the agent keeps serving. Safe from any thread.
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


def terminate_children() -> int:
    """Send SIGTERM to every live trainer process of this agent; return how many."""
    with _CHILDREN_LOCK:
        children = list(_CHILDREN.values())
    count = 0
    for proc in children:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                count += 1
            except ProcessLookupError:
                pass
    return count


def track_child(proc: subprocess.Popen) -> None:
    """Register a child process of the agent, so :func:`terminate_children` reaches it."""
    with _CHILDREN_LOCK:
        _CHILDREN[proc.pid] = proc


def untrack_child(proc: subprocess.Popen) -> None:
    """Forget a child registered with :func:`track_child` (call once it has been reaped)."""
    with _CHILDREN_LOCK:
        _CHILDREN.pop(proc.pid, None)


def kill_children(children: Sequence) -> None:
    """Kill and reap child processes, close their pipes, join their stdout readers and stop
    tracking them. Each child has ``proc`` (a ``subprocess.Popen`` or ``None`` if it never
    started) and ``reader`` (a ``threading.Thread`` or ``None``)."""
    for child in children:
        proc = child.proc
        if proc is None:
            continue
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdin and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass  # the pipe's reader is dead; nothing left to flush
        if child.reader is not None:
            child.reader.join(timeout=5)
        if proc.stdout:
            proc.stdout.close()
        untrack_child(proc)


def round_request_problem(
    request: TrainRoundRequest,
    ctx: AgentContext,
    *,
    max_processes: int | None = None,
    memory_bytes: int | None = None,
) -> str | None:
    """Why a device must refuse a round before launching anything, or ``None``.

    Refused: the agent is shutting down, the request is for another device, it repeats an
    ``assignment_id``, it co-locates more trainers than ``max_processes`` (e.g. the MPS client
    limit), or the trainers' memory cannot fit in ``memory_bytes``: each trainer counts its
    ``memory_limit_bytes`` when set, else its ``predicted_memory_bytes`` (unknown counts 0).

    Args:
        request: the round.
        ctx: the device.
        max_processes: most trainers the device can run at once, or ``None`` for no limit.
        memory_bytes: the device's memory, bytes, or ``None`` to skip the memory check.

    Returns:
        One line saying why, or ``None``.
    """
    if shutdown_requested():
        return "agent shutting down: round refused"
    if cancel_requested():
        return f"{cancel_requested()}: round refused"
    if request.device != ctx.device:
        return f"request for device {request.device!r} reached agent {ctx.device!r}"
    ids = [a.assignment_id for a in request.assignments]
    if len(ids) != len(set(ids)):
        return f"duplicate assignment_id in request: {ids}"
    if max_processes is not None and len(request.assignments) > max_processes:
        return (f"round refused before launch: {len(request.assignments)} co-located trainers, "
                f"but device {ctx.device!r} runs at most {max_processes} at once")
    if memory_bytes is not None:
        needs = [a.memory_limit_bytes or a.predicted_memory_bytes or 0 for a in request.assignments]
        if sum(needs) > memory_bytes:
            parts = ", ".join(f"task {a.task.task_id}: {n / 2**30:.2f} GiB"
                              for a, n in zip(request.assignments, needs, strict=True) if n)
            return (f"round refused before launch: the trainers need {sum(needs) / 2**30:.2f} GiB "
                    f"of device memory ({parts}) but device {ctx.device!r} has "
                    f"{memory_bytes / 2**30:.2f} GiB")
    return None


def _stderr_tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _STDERR_TAIL_CHARS))
            return handle.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


@dataclass
class _Trainer:
    """One launched trainer process and what the parent learned about it."""

    assignment: AssignmentSpec | None  # None for a standalone measurement
    resources: TrainerResources
    spec_path: Path
    result_path: Path
    stderr_path: Path
    proc: subprocess.Popen | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    # None while fine; else why the parent gave up on it ("failed", "timeout", "killed", ...).
    fate: str | None = None
    fate_detail: str = ""

    @property
    def label(self) -> str:
        task = self.assignment.task
        return f"task {task.task_id} ({task.name})"


class TrainerProcessBackend(ExecutionBackend):
    """Runs rounds and standalone measurements as ``workers.trainer`` subprocesses.

    Subclasses implement :meth:`resources_for_shares` (the one place a share becomes real
    partitioning: cores and threads on ``cpu``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under MPS)
    and :meth:`standalone_resources`. Rounds (:meth:`trainer_resources`) and profiling sweeps
    (:mod:`workers.profiling`) both go through :meth:`resources_for_shares`.
    """

    probes_host_speed: ClassVar[bool] = False
    """Whether profiling runs a :class:`workers.speed_probe.SpeedProbe` on the device's cores
    beside the trainers (only where the trainers' speed is the host cores' speed)."""

    forks_profilers: ClassVar[bool] = False
    """Whether profiling sweeps fork their profiler processes from a
    :class:`workers.forkserver.ForkServerPool` (torch imported once per sweep) instead of
    starting a new interpreter for each. Off where it has not been checked on the real device
    (the GPU backends: no GPU was at hand)."""

    @abstractmethod
    def resources_for_shares(
        self, shares: Sequence[int], partitioning: Partitioning, ctx: AgentContext
    ) -> list[TrainerResources]:
        """Map co-located processes' shares of the device to each one's resources.

        Args:
            shares: ``active_thread_percentage`` of each process, integers in ``[1, 100]``.
            partitioning: ``"mps"`` (each process gets its share) or ``"timeslice"`` (shares
                are ignored; processes take turns on the whole device).
            ctx: the device.

        Returns:
            One :class:`TrainerResources` per share, in order.

        Raises:
            ValueError: for a share outside ``[1, 100]`` (naming ``shares[k]``), an unknown
                partitioning, or a device that cannot host the processes.
        """

    def trainer_resources(
        self, request: TrainRoundRequest, ctx: AgentContext
    ) -> list[TrainerResources]:
        """Return the resources of each assignment's trainer, in assignment order.

        Raises:
            ValueError: if the request cannot be mapped onto the device
                (:meth:`resources_for_shares`).
        """
        shares = [a.active_thread_percentage for a in request.assignments]
        return self.resources_for_shares(shares, request.partitioning, ctx)

    @abstractmethod
    def standalone_resources(self, ctx: AgentContext) -> TrainerResources:
        """Return the resources of a standalone measurement (the whole device)."""

    # ------------------------------------------------------------------------ dispatch hooks

    def request_problem(self, request: TrainRoundRequest, ctx: AgentContext) -> str | None:
        """Why this device refuses ``request`` before launching anything, or ``None``
        (:func:`round_request_problem`; GPU backends add their client and memory limits)."""
        return round_request_problem(request, ctx)

    def prepare_dispatch(self, partitioning: Partitioning, ctx: AgentContext) -> None:
        """Make the device ready for trainers about to start: called before every round,
        standalone measurement and profiling configuration (``cuda-mps``: the MPS daemon is
        started, or restarted after a failed dispatch). Nothing by default.

        Raises:
            BackendUnavailableError: the device cannot take trainers now (one line).
        """

    def finish_dispatch(self, ctx: AgentContext, *, failed: bool) -> None:
        """Called after every round, standalone measurement and profiling configuration, once
        its processes have all been reaped; ``failed`` if any of them failed. Nothing by
        default."""

    def review_round(
        self,
        request: TrainRoundRequest,
        ctx: AgentContext,
        pids: Sequence[int | None],
        results: list[AssignmentResult],
    ) -> list[AssignmentResult]:
        """Add what the backend can tell about each trainer after the round (``cuda-mps``:
        whether MPS applied its share, from the MPS server log).

        Args:
            request: the round.
            ctx: the device.
            pids: each assignment's trainer process id (``None`` if it never started).
            results: each assignment's result, in assignment order.

        Returns:
            The results, in the same order (unchanged by default).
        """
        return results

    # ----------------------------------------------------------------- environment & launch

    def trainer_env(self, resources: TrainerResources) -> dict[str, str]:
        """Return a trainer's environment: the agent's, thread counts, the package on the path."""
        env = dict(os.environ)
        threads = str(resources.threads)
        # Set before the child imports torch, so OpenMP/MKL size their pools to the share.
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p
        )
        env.update(resources.env)
        return env

    def _launch(self, mode: str, trainer: _Trainer, with_barrier: bool) -> None:
        trainer.result_path.unlink(missing_ok=True)
        with open(trainer.stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                [*TRAINER_COMMAND, mode, str(trainer.spec_path), str(trainer.result_path)],
                stdin=subprocess.PIPE if with_barrier else subprocess.DEVNULL,
                stdout=subprocess.PIPE if with_barrier else subprocess.DEVNULL,
                stderr=stderr,
                env=self.trainer_env(trainer.resources),
                close_fds=True,
            )
        trainer.proc = proc
        track_child(proc)
        if with_barrier:
            trainer.reader = threading.Thread(
                target=_read_protocol, args=(proc, trainer.ready), daemon=True,
                name=f"trainer-{proc.pid}-stdout",
            )
            trainer.reader.start()

    # ----------------------------------------------------------------------------- rounds

    def run_round(self, request: TrainRoundRequest, ctx: AgentContext) -> DeviceRoundResult:
        """Run a device's round: one trainer per assignment, barrier, wait, collect.

        Work files go to ``ctx.state_dir/work/run-<run_id>/round-<round_index>/``:
        ``assignment-<id>.spec.json``, ``.result.json`` and ``.stderr.log``.

        Returns:
            ``status="succeeded"`` when every trainer succeeded; otherwise ``"failed"`` with
            ``error`` naming each task that failed and why (its stderr tail included), and the
            per-assignment results (killed ones say so).
        """
        def failed(error: str, results: list[AssignmentResult] | None = None) -> DeviceRoundResult:
            return DeviceRoundResult(
                run_id=request.run_id, round_id=request.round_id, device=ctx.device,
                status="failed", error=error, host=socket.gethostname(),
                assignments=results or [],
            )

        problem = self.request_problem(request, ctx)
        if problem:
            return failed(problem)
        try:
            allocations = self.trainer_resources(request, ctx)
        except ValueError as exc:
            return failed(f"cannot allocate the device: {exc}")
        try:
            self.prepare_dispatch(request.partitioning, ctx)
        except BackendUnavailableError as exc:
            return failed(f"device not ready: {exc}")
        try:
            trainers = self._prepare(request, ctx, allocations)
        except (OSError, ValueError) as exc:
            return failed(f"cannot write the trainers' specs: {type(exc).__name__}: {exc}")

        try:
            for trainer in trainers:
                self._launch("train", trainer, with_barrier=True)
            self._barrier(trainers, ctx)
            self._wait_all(trainers, ctx)
        except Exception as exc:  # noqa: BLE001 - the round is reported, never raised
            logger.exception("round %s of run %s crashed in the agent", request.round_index,
                             request.run_id)
            for trainer in trainers:
                if trainer.fate is None:
                    trainer.fate, trainer.fate_detail = "agent", f"{type(exc).__name__}: {exc}"
        finally:
            self._kill_all(trainers)

        results = [self._collect(trainer) for trainer in trainers]
        causes = [t for t in trainers if t.fate in ("failed", "timeout", "agent", "shutdown", "cancelled")]
        causes += [t for t, r in zip(trainers, results, strict=True)
                   if r.status == "failed" and t.fate is None]
        self.finish_dispatch(ctx, failed=bool(causes))
        results = self.review_round(request, ctx, [t.proc.pid if t.proc else None for t in trainers],
                                    results)
        if not causes:
            return DeviceRoundResult(
                run_id=request.run_id, round_id=request.round_id, device=ctx.device,
                status="succeeded", host=socket.gethostname(), assignments=results,
            )
        by_id = {r.assignment_id: r for r in results}
        error = "; ".join(f"{t.label}: {by_id[t.assignment.assignment_id].error}" for t in causes)
        return failed(error, results)

    @staticmethod
    def _prepare(
        request: TrainRoundRequest, ctx: AgentContext, allocations: list[TrainerResources]
    ) -> list[_Trainer]:
        """Write one spec file per assignment; return the (not yet launched) trainers."""
        if len(allocations) != len(request.assignments):
            raise ValueError(
                f"backend allocated {len(allocations)} trainers for "
                f"{len(request.assignments)} assignments"
            )
        work = ctx.state_dir / "work" / f"run-{request.run_id}" / f"round-{request.round_index}"
        work.mkdir(parents=True, exist_ok=True)
        trainers = []
        for assignment, resources in zip(request.assignments, allocations, strict=True):
            stem = work / f"assignment-{assignment.assignment_id}"
            spec = TrainerSpec(
                **assignment.model_dump(),
                artifact_root=str(ctx.artifact_root),
                threads=resources.threads,
                cores=resources.cores,
                lock_path=None if resources.lock_path is None else str(resources.lock_path),
                warmup_iterations=request.warmup_iterations,
            )
            spec_path = stem.with_suffix(".spec.json")
            spec_path.write_text(spec.model_dump_json(indent=2))
            trainers.append(
                _Trainer(assignment, resources, spec_path, stem.with_suffix(".result.json"),
                         stem.with_suffix(".stderr.log"))
            )
        return trainers

    def _barrier(self, trainers: list[_Trainer], ctx: AgentContext) -> None:
        """Wait until every trainer printed READY, then send GO to all."""
        deadline = time.monotonic() + min(ctx.ready_timeout_s, ctx.trainer_timeout_s)
        while not all(t.ready.is_set() for t in trainers):
            if self._check_abort(trainers, deadline, "before READY"):
                return
            time.sleep(_POLL_S)
        for trainer in trainers:
            try:
                trainer.proc.stdin.write(f"{GO_LINE}\n".encode())
                trainer.proc.stdin.flush()
                trainer.proc.stdin.close()
            except OSError as exc:
                trainer.fate, trainer.fate_detail = "failed", f"could not send GO: {exc}"
                self._mark_others_killed(trainers, trainer)
                return

    def _wait_all(self, trainers: list[_Trainer], ctx: AgentContext) -> None:
        """Wait for every trainer to exit; on the first failure or timeout, stop waiting."""
        if any(t.fate for t in trainers):
            return
        deadline = time.monotonic() + ctx.trainer_timeout_s
        while any(t.proc.poll() is None for t in trainers):
            if self._check_abort(trainers, deadline, "while training"):
                return
            time.sleep(_POLL_S)
        for trainer in trainers:
            if trainer.proc.returncode != 0 and trainer.fate is None:
                trainer.fate = "failed"

    def _check_abort(self, trainers: list[_Trainer], deadline: float, phase: str) -> bool:
        """Decide whether the device's trainers must be stopped; mark why. True = stop."""
        if shutdown_requested():
            for trainer in trainers:
                # Trainers the shutdown hook already terminated count as shut down, not failed.
                if trainer.proc.poll() is None or trainer.proc.returncode != 0:
                    trainer.fate, trainer.fate_detail = "shutdown", "agent shutting down"
            return True
        reason = cancel_requested()
        if reason is not None:
            for trainer in trainers:
                # Terminated by request_cancel (or still running): cancelled, not failed.
                if trainer.proc.poll() is None or trainer.proc.returncode != 0:
                    trainer.fate, trainer.fate_detail = "cancelled", reason
            return True
        exited = [t for t in trainers if t.proc.poll() is not None and t.proc.returncode != 0]
        if not exited and phase == "before READY":
            # A trainer that exits 0 before READY broke the protocol; treat it as failed.
            exited = [t for t in trainers if t.proc.poll() is not None and not t.ready.is_set()]
        if exited:
            for trainer in exited:
                trainer.fate = "failed"
            self._mark_others_killed(trainers, *exited)
            return True
        if time.monotonic() > deadline:
            timeout = "ready_timeout_s" if phase == "before READY" else "trainer_timeout_s"
            for trainer in trainers:
                if trainer.proc.poll() is None:
                    trainer.fate = "timeout"
                    trainer.fate_detail = f"timed out {phase} ({timeout} exceeded)"
            return True
        return False

    @staticmethod
    def _mark_others_killed(trainers: list[_Trainer], *culprits: _Trainer) -> None:
        names = ", ".join(t.label for t in culprits)
        for trainer in trainers:
            if trainer.fate is None and trainer.proc.poll() is None:
                trainer.fate = "killed"
                trainer.fate_detail = f"killed because {names} failed on this device"

    @staticmethod
    def _kill_all(trainers: list[_Trainer]) -> None:
        kill_children(trainers)

    def _collect(self, trainer: _Trainer) -> AssignmentResult:
        """Build the assignment's result from its RESULT.json, exit code and fate."""
        assignment = trainer.assignment
        reported: AssignmentResult | None = None
        try:
            reported = AssignmentResult.model_validate_json(trainer.result_path.read_text())
        except (OSError, ValidationError, ValueError):
            reported = None
        if trainer.fate is None and reported is not None and reported.status == "succeeded":
            return reported
        if trainer.fate in ("killed", "shutdown", "timeout", "agent", "cancelled"):
            error = trainer.fate_detail
        elif reported is not None and reported.error:
            error = reported.error
        else:
            code = trainer.proc.returncode if trainer.proc else None
            error = trainer.fate_detail or f"trainer exited with code {code} without a result"
        if trainer.fate not in ("killed", "shutdown", "cancelled"):
            tail = _stderr_tail(trainer.stderr_path)
            if tail:
                error = f"{error}\n--- trainer stderr (tail) ---\n{tail}"
        return AssignmentResult(
            assignment_id=assignment.assignment_id,
            task_id=assignment.task.task_id,
            status="failed",
            error=error,
            threads=trainer.resources.threads,
            cores=trainer.resources.cores,
        )

    # ------------------------------------------------------------------------- standalone

    def measure_standalone(self, request: StandaloneRequest, ctx: AgentContext) -> StandaloneResult:
        """Measure every item alone on the whole device, in one ``standalone`` trainer.

        Work files go to ``ctx.state_dir/work/run-<run_id>/standalone/``.

        Returns:
            The trainer's :class:`StandaloneResult`, or ``status="failed"`` with the reason
            (timeout, crash with its stderr tail, shutdown).
        """
        def failed(error: str) -> StandaloneResult:
            return StandaloneResult(run_id=request.run_id, device=ctx.device, status="failed",
                                    error=error)

        if shutdown_requested():
            return failed("agent shutting down: measurement refused")
        if request.device != ctx.device:
            return failed(f"request for device {request.device!r} reached agent {ctx.device!r}")
        resources = self.standalone_resources(ctx)
        try:
            # The whole device, alone: no share to grant, so never an MPS client.
            self.prepare_dispatch("timeslice", ctx)
        except BackendUnavailableError as exc:
            return failed(f"device not ready: {exc}")
        work = ctx.state_dir / "work" / f"run-{request.run_id}" / "standalone"
        work.mkdir(parents=True, exist_ok=True)
        spec = StandaloneSpec(
            run_id=request.run_id, device=ctx.device, items=request.items,
            threads=resources.threads, cores=resources.cores,
            warmup_iterations=request.warmup_iterations,
            timed_iterations=request.timed_iterations,
        )
        stem = work / "standalone"
        trainer = _Trainer(
            assignment=None, resources=resources,  # type: ignore[arg-type]
            spec_path=stem.with_suffix(".spec.json"), result_path=stem.with_suffix(".result.json"),
            stderr_path=stem.with_suffix(".stderr.log"),
        )
        trainer.spec_path.write_text(spec.model_dump_json(indent=2))
        measured: StandaloneResult | None = None
        try:
            measured = self._run_standalone(request, ctx, trainer, failed)
        finally:
            self.finish_dispatch(ctx, failed=measured is None or measured.status != "succeeded")
        return measured

    def _run_standalone(self, request: StandaloneRequest, ctx: AgentContext, trainer: _Trainer,
                        failed) -> StandaloneResult:
        """Launch the standalone trainer, wait for it, read its result (never raises)."""
        try:
            self._launch("standalone", trainer, with_barrier=False)
            deadline = time.monotonic() + ctx.trainer_timeout_s
            while trainer.proc.poll() is None:
                if shutdown_requested():
                    return failed("agent shutting down")
                if cancel_requested() is not None:
                    return failed(cancel_requested())
                if time.monotonic() > deadline:
                    return failed("standalone measurement timed out (trainer_timeout_s exceeded)")
                time.sleep(_POLL_S)
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            logger.exception("standalone measurement of run %s crashed", request.run_id)
            return failed(f"{type(exc).__name__}: {exc}")
        finally:
            self._kill_all([trainer])
        try:
            return StandaloneResult.model_validate_json(trainer.result_path.read_text())
        except (OSError, ValidationError, ValueError):
            tail = _stderr_tail(trainer.stderr_path)
            return failed(
                f"standalone trainer exited with code {trainer.proc.returncode} without a result"
                + (f"\n--- trainer stderr (tail) ---\n{tail}" if tail else "")
            )


def _read_protocol(proc: subprocess.Popen, ready: threading.Event) -> None:
    """Read a trainer's stdout until EOF, setting ``ready`` on the READY line."""
    for raw in proc.stdout:
        if raw.decode("utf-8", errors="replace").strip() == READY_LINE:
            ready.set()
