"""The execution-backend interface and the trainer-process backends' round and measurement.

:class:`ExecutionBackend` is what the device agent calls. :class:`AnalyticBackend` is the kind
that answers from a model instead of running anything (``simulated``).
:class:`TrainerProcessBackend` implements a round the way docs/DESIGN.md §2 describes it: one
``python -m workers.training.trainer`` process per assignment, started, held at the READY/GO barrier so
they really overlap, watched and reaped by the launch engine (:class:`workers.launch.ProcessGroup`).
A subclass only decides each trainer's resources (threads, cores, lock, environment).
Unless ``MTFL_WARM_TRAINERS=0``, the trainers are warm processes from the backend's
:class:`workers.warm.TrainerPool`, kept between rounds (and standalone measurements): a later
round on the same tasks and resources hands its jobs to them instead of starting processes; the
barrier, the fates and the results are the same as with new processes.

Failures are data: if any trainer fails, times out, the agent shuts down or the control plane
cancels the task (:func:`workers.launch.request_cancel`), every trainer of the device is killed
(on a GPU under MPS one client's fatal fault reaches them all anyway) and the round comes back as
``DeviceRoundResult(status="failed")`` naming the task and its error.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import ValidationError

from workers import config
from workers.backends.gpu import GpuTelemetry
from workers.launch import (
    Child,
    ProcessGroup,
    ProcessSpec,
    cancel_requested,
    shutdown_requested,
)
from workers.protocol.messages import (
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
from workers.training.trainer import StandaloneSpec, TrainerSpec
from workers.warm import TRAINER_MODULE, TrainerPool

logger = logging.getLogger(__name__)

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

TRAINER_COMMAND: list[str] = [sys.executable, "-m", TRAINER_MODULE]
"""The command that starts one trainer process; the mode (``train``/``standalone``), SPEC.json
and RESULT.json are appended."""


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

    def describe(self) -> dict[str, object]:
        """What the agent adds to its :class:`~workers.protocol.messages.DeviceInventory` about the
        accelerator: ``accelerator`` (a model name), ``memory_bytes`` and ``allocation_units``
        (what a share is granted in: SMs on a GPU), and on a GPU its UUID, driver and CUDA
        versions, SM count and whether MPS is available. Nothing by default: the host
        describes a cpu device (its cores and memory).

        Raises:
            BackendUnavailableError: the accelerator cannot be described (one line).
        """
        return {}

    def start(self, ctx: AgentContext) -> None:  # noqa: B027 - an optional hook: nothing by default
        """Prepare the device when the agent starts (``cuda-mps``: start the MPS control
        daemon). Nothing by default.

        Raises:
            BackendUnavailableError: the device cannot be prepared (one line saying why).
        """

    def stop(self) -> None:  # noqa: B027 - an optional hook: nothing by default
        """Release what :meth:`start` (or a dispatch) set up, on exit and on SIGTERM
        (``cuda-mps``: quit the MPS control daemon). Idempotent; never raises. Nothing by
        default."""


class AnalyticBackend(ExecutionBackend):
    """A backend whose numbers come from a model instead of running trainers.

    Nothing is trained or timed: a round, a standalone measurement or a profiling
    configuration is answered at once, with virtual durations, and every result says
    ``simulated=True``. :func:`workers.profiling.sweep.run_sweep` spends a sweep's budget in those
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
        """Answer one profiling configuration as :func:`workers.profiling.sweep.measure_configuration`
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


def device_round_failed(
    request: TrainRoundRequest,
    ctx: AgentContext,
    error: str,
    results: list[AssignmentResult] | None = None,
    *,
    simulated: bool = False,
) -> DeviceRoundResult:
    """A device's round that failed with ``error`` (one line, or one per failed task), with the
    assignments' results it has (none when the round failed before any trainer ran)."""
    return DeviceRoundResult(
        run_id=request.run_id,
        round_id=request.round_id,
        device=ctx.device,
        status="failed",
        error=error,
        host=socket.gethostname(),
        assignments=results or [],
        simulated=simulated,
    )


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
        return (
            f"round refused before launch: {len(request.assignments)} co-located trainers, "
            f"but device {ctx.device!r} runs at most {max_processes} at once"
        )
    if memory_bytes is not None:
        needs = [a.memory_limit_bytes or a.predicted_memory_bytes or 0 for a in request.assignments]
        if sum(needs) > memory_bytes:
            parts = ", ".join(
                f"task {a.task.task_id}: {n / 2**30:.2f} GiB"
                for a, n in zip(request.assignments, needs, strict=True)
                if n
            )
            return (
                f"round refused before launch: the trainers need {sum(needs) / 2**30:.2f} GiB "
                f"of device memory ({parts}) but device {ctx.device!r} has "
                f"{memory_bytes / 2**30:.2f} GiB"
            )
    return None


class TrainerProcessBackend(ExecutionBackend):
    """Runs rounds and standalone measurements as ``workers.training.trainer`` subprocesses.

    Subclasses implement :meth:`resources_for_shares` (the one place a share becomes real
    partitioning: cores and threads on ``cpu``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under MPS)
    and :meth:`standalone_resources`. Rounds (:meth:`trainer_resources`) and profiling sweeps
    (:mod:`workers.profiling.sweep`) both go through :meth:`resources_for_shares`.
    """

    probes_host_speed: ClassVar[bool] = False
    """Whether profiling runs a :class:`workers.profiling.speed_probe.SpeedProbe` on the device's cores
    beside the trainers (only where the trainers' speed is the host cores' speed)."""

    forks_profilers: ClassVar[bool] = False
    """Whether profiling sweeps fork their profiler processes from a
    :class:`workers.forkserver.ForkServerPool` (torch imported once per sweep) instead of
    starting a new interpreter for each. Off where it has not been checked on the real device
    (the GPU backends: no GPU was at hand)."""

    profiles_warm: ClassVar[bool] = False
    """Whether profiling sweeps take their profiler processes from the backend's warm pool
    (:meth:`profiler_pool`: a ``profile`` job of a warm trainer, its model and CUDA context kept
    from one configuration to the next) instead of starting or forking one per task. On where
    a process's peak memory is right when it is reused (a GPU: the allocator's peak statistics
    are reset per job); off on ``cpu``, where the private resident memory never shrinks."""

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

    def trainer_resources(self, request: TrainRoundRequest, ctx: AgentContext) -> list[TrainerResources]:
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

    def kill_hook(self, partitioning: Partitioning) -> Callable[[Sequence[int]], object] | None:
        """What to do with a round's trainers that are still running when the round ends and
        they are about to be killed (their pids), or ``None`` (the default: just kill them;
        ``cuda-mps``: ``terminate_client`` first)."""
        return None

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

    # ------------------------------------------------------------------- warm trainers

    warm_process_limit: ClassVar[int | None] = None
    """Most trainer processes the device holds at once whatever the setting says (``cuda-mps``:
    the MPS client limit, which an idle warm client counts against), or ``None``."""

    _warm_pool: TrainerPool | None = None
    _warm_pool_off: bool = False
    """The count setting is 0, or a setting was bad: every dispatch starts new processes."""

    def warm_pool(self) -> TrainerPool | None:
        """The backend's pool of warm trainers (:mod:`workers.warm`), created on first use from
        ``MTFL_WARM_TRAINERS`` and ``MTFL_WARM_TRAINERS_MEMORY_MB``
        (:func:`workers.config.warm_trainers`); ``None`` when the count is 0: every
        trainer is then a new process, as before the pool.

        Raises:
            ValueError: a bad setting (naming it).
        """
        if self._warm_pool is not None or self._warm_pool_off:
            return self._warm_pool
        count = config.warm_trainers()
        if self.warm_process_limit is not None:
            count = min(count, self.warm_process_limit)
        if count == 0:
            self._warm_pool_off = True
            return None
        self._warm_pool = TrainerPool(count, config.warm_trainers_memory_bytes())
        return self._warm_pool

    def close_warm_pool(self) -> None:
        """Kill every warm trainer (the next dispatch starts new ones). Never raises."""
        if self._warm_pool is not None:
            self._warm_pool.close()

    def stop(self) -> None:
        """Kill the warm trainers (:meth:`close_warm_pool`). Idempotent; never raises."""
        self.close_warm_pool()

    def profiler_pool(self) -> TrainerPool | None:
        """The warm pool a profiling sweep takes its profiler processes from (by default where
        the backend :attr:`profiles_warm`): the backend's pool, or ``None`` when it is off (a
        bad setting is logged and the sweep runs cold)."""
        return self._launcher()

    def gpu_telemetry(self, interval_s: float) -> GpuTelemetry | None:
        """A sampler of the device's GPU utilisation every ``interval_s`` seconds (not started),
        for a profiling configuration's busy fraction; ``None`` (the default) where the device
        has no GPU."""
        return None

    def _launcher(self) -> TrainerPool | None:
        """The pool for a dispatch; a bad setting is logged and the dispatch runs cold."""
        try:
            return self.warm_pool()
        except ValueError as exc:
            logger.error("warm trainers off: %s", exc)
            self._warm_pool_off = True
            return None

    # ----------------------------------------------------------------- environment & launch

    def trainer_env(self, resources: TrainerResources) -> dict[str, str]:
        """Return a trainer's environment: the agent's, thread counts, the package on the path."""
        env = dict(os.environ)
        threads = str(resources.threads)
        # Set before the child imports torch, so OpenMP/MKL size their pools to the share.
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
        env.update(resources.env)
        return env

    def _process(self, mode: str, stem: Path, resources: TrainerResources, label: str) -> ProcessSpec:
        """The launch engine's description of one ``workers.training.trainer`` process whose files are
        ``<stem>.spec.json`` (written by the caller), ``.result.json`` and ``.stderr.log``."""
        return ProcessSpec(
            command=TRAINER_COMMAND,
            args=[mode, str(stem.with_suffix(".spec.json")), str(stem.with_suffix(".result.json"))],
            env=self.trainer_env(resources),
            stderr_path=stem.with_suffix(".stderr.log"),
            label=label,
            # Only the package's own trainer has the warm mode; another command (a stand-in)
            # is always started anew.
            module=TRAINER_MODULE if TRAINER_COMMAND[-1] == TRAINER_MODULE else None,
            result_path=stem.with_suffix(".result.json"),
        )

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
            return device_round_failed(request, ctx, error, results)

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
            specs = self._write_specs(request, ctx, allocations)
        except (OSError, ValueError) as exc:
            return failed(f"cannot write the trainers' specs: {type(exc).__name__}: {exc}")

        ready_deadline = time.monotonic() + min(ctx.ready_timeout_s, ctx.trainer_timeout_s)
        with ProcessGroup(
            specs,
            where=" on this device",
            before_kill=self.kill_hook(request.partitioning),
            launcher=self._launcher(),
        ) as group:
            try:
                group.launch()
                if group.wait_ready(ready_deadline, "ready_timeout_s") and group.go():
                    group.wait_exit(time.monotonic() + ctx.trainer_timeout_s, "trainer_timeout_s")
            except Exception as exc:  # noqa: BLE001 - the round is reported, never raised
                logger.exception("round %s of run %s crashed in the agent", request.round_index, request.run_id)
                group.fail_all(f"{type(exc).__name__}: {exc}")

        children = group.children
        results = [
            self._collect(assignment, resources, child)
            for assignment, resources, child in zip(request.assignments, allocations, children, strict=True)
        ]
        causes = group.causes()
        causes += [c for c, r in zip(children, results, strict=True) if r.status == "failed" and c.fate is None]
        self.finish_dispatch(ctx, failed=bool(causes))
        results = self.review_round(request, ctx, [c.proc.pid if c.proc else None for c in children], results)
        if not causes:
            return DeviceRoundResult(
                run_id=request.run_id,
                round_id=request.round_id,
                device=ctx.device,
                status="succeeded",
                host=socket.gethostname(),
                assignments=results,
            )
        errors = {id(c): r.error for c, r in zip(children, results, strict=True)}
        return failed("; ".join(f"{c.label}: {errors[id(c)]}" for c in causes), results)

    def _write_specs(
        self, request: TrainRoundRequest, ctx: AgentContext, allocations: list[TrainerResources]
    ) -> list[ProcessSpec]:
        """Write one spec file per assignment; return the trainers to launch, in order."""
        if len(allocations) != len(request.assignments):
            raise ValueError(
                f"backend allocated {len(allocations)} trainers for {len(request.assignments)} assignments"
            )
        work = ctx.state_dir / "work" / f"run-{request.run_id}" / f"round-{request.round_index}"
        work.mkdir(parents=True, exist_ok=True)
        specs = []
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
            task = assignment.task
            specs.append(self._process("train", stem, resources, f"task {task.task_id} ({task.name})"))
        return specs

    @staticmethod
    def _collect(assignment: AssignmentSpec, resources: TrainerResources, child: Child) -> AssignmentResult:
        """Build the assignment's result from its RESULT.json, exit code and fate."""
        reported: AssignmentResult | None = None
        try:
            assert child.spec.result_path is not None
            reported = AssignmentResult.model_validate_json(child.spec.result_path.read_text())
        except (OSError, ValidationError, ValueError):
            reported = None
        if child.fate is None and reported is not None and reported.status == "succeeded":
            return reported
        if child.fate in ("killed", "shutdown", "timeout", "agent", "cancelled"):
            error = child.fate_detail
        elif reported is not None and reported.error:
            error = reported.error
        else:
            error = child.fate_detail or f"trainer exited with code {child.returncode} without a result"
        if child.fate not in ("killed", "shutdown", "cancelled"):
            tail = child.stderr_tail()
            if tail:
                error = f"{error}\n--- trainer stderr (tail) ---\n{tail}"
        return AssignmentResult(
            assignment_id=assignment.assignment_id,
            task_id=assignment.task.task_id,
            status="failed",
            error=error,
            threads=resources.threads,
            cores=resources.cores,
        )

    # ------------------------------------------------------------------------- standalone

    def measure_standalone(self, request: StandaloneRequest, ctx: AgentContext) -> StandaloneResult:
        """Measure every item alone on the whole device, in one ``standalone`` trainer.

        Work files go to ``ctx.state_dir/work/run-<run_id>/standalone/``.

        Returns:
            The trainer's :class:`StandaloneResult`, or ``status="failed"`` with the reason
            (timeout, crash with its stderr tail, shutdown, cancellation).
        """

        def failed(error: str) -> StandaloneResult:
            return StandaloneResult(run_id=request.run_id, device=ctx.device, status="failed", error=error)

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
        measured: StandaloneResult | None = None
        try:
            work = ctx.state_dir / "work" / f"run-{request.run_id}" / "standalone"
            work.mkdir(parents=True, exist_ok=True)
            spec = StandaloneSpec(
                run_id=request.run_id,
                device=ctx.device,
                items=request.items,
                threads=resources.threads,
                cores=resources.cores,
                warmup_iterations=request.warmup_iterations,
                timed_iterations=request.timed_iterations,
            )
            stem = work / "standalone"
            stem.with_suffix(".spec.json").write_text(spec.model_dump_json(indent=2))
            measured = self._run_standalone(
                request,
                ctx,
                self._process("standalone", stem, resources, "standalone measurement"),
                failed,
                self._launcher(),
            )
        finally:
            self.finish_dispatch(ctx, failed=measured is None or measured.status != "succeeded")
        return measured

    @staticmethod
    def _run_standalone(
        request: StandaloneRequest,
        ctx: AgentContext,
        spec: ProcessSpec,
        failed: Callable[[str], StandaloneResult],
        launcher: TrainerPool | None = None,
    ) -> StandaloneResult:
        """Launch the standalone trainer (a warm one from ``launcher``), wait for it, read its
        result (never raises)."""
        with ProcessGroup([spec], barrier=False, launcher=launcher) as group:
            try:
                group.launch()
                group.wait_exit(time.monotonic() + ctx.trainer_timeout_s, "trainer_timeout_s")
            except Exception as exc:  # noqa: BLE001 - reported, never raised
                logger.exception("standalone measurement of run %s crashed", request.run_id)
                return failed(f"{type(exc).__name__}: {exc}")
        (child,) = group.children
        if child.fate in ("shutdown", "cancelled"):
            return failed(child.fate_detail)
        if child.fate == "timeout":
            return failed("standalone measurement timed out (trainer_timeout_s exceeded)")
        try:
            assert spec.result_path is not None
            return StandaloneResult.model_validate_json(spec.result_path.read_text())
        except (OSError, ValidationError, ValueError):
            tail = child.stderr_tail()
            return failed(
                f"standalone trainer exited with code {child.returncode} without a result"
                + (f"\n--- trainer stderr (tail) ---\n{tail}" if tail else "")
            )
