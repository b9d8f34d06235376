"""Profiling sweeps: measure co-located training mixes on a device for the throughput predictor.

docs/DESIGN.md §1 fits one multi-output regressor ``(P_1, …, P_I) = Pre((F_1·B_1, R_1), …)`` on
profiled runs. A sweep (:func:`run_sweep`, served by the agent's ``profile_sweep`` task) turns a
:class:`~workers.protocol.messages.ProfileSweepRequest` into those runs:

- :func:`sweep_design` proposes configurations — 1 to ``max_mix`` tasks, each an architecture,
  a batch size and a share — as a seeded space-filling sequence, not a grid;
- :func:`measure_configuration` measures one configuration: one ``workers.training.profiler``
  process per task (a new interpreter, a fork of a fork server that has imported torch, or a
  ``profile`` job of a warm trainer: see "Where profilers come from"), each with the resources the backend's
  :meth:`~workers.backends.base.TrainerProcessBackend.resources_for_shares` gives its share,
  held at a READY/GO barrier, stopped together once every task has been timed long enough
  while all the others ran (:func:`common_window`); each process builds and feeds its
  architecture at the classes and random inputs of :meth:`~workers.protocol.messages.ProfileSweepRequest.workload_shape`;
- :func:`run_sweep` loops until the time budget is spent, measures each (architecture, batch
  size) alone once (``P_alone``), re-measures an earlier configuration every ``repeat_every``
  configurations to estimate the noise, and hands every result to ``emit`` as soon as it exists.
  On an :class:`~workers.backends.base.AnalyticBackend` (``simulated``) the same loop asks the
  backend's model instead of measuring, and the budget is spent in virtual seconds.

Where profilers come from (:func:`run_sweep`): on the GPU backends (``cuda-mps``,
``cuda-timeslice``: :attr:`~workers.backends.base.TrainerProcessBackend.profiles_warm`) each
task is a ``profile`` job of a warm trainer from the agent's
:class:`~workers.warm.TrainerPool`, reused across configurations of the same model and
resources (its environment included, so under MPS its share: the pool's key), which keeps the
CUDA context, the model and cuDNN's autotuning between configurations — what cost 15-27 s per
configuration on an H200 with a new process each — and reports its own peak GPU memory (the
allocator's statistics are reset per job). On ``cpu`` each task is forked from a fork server
(torch imported once per sweep): a process's private resident memory never shrinks, so a
reused one would report the largest peak it ever had, not this configuration's.

Each configuration reports, per task, the GPU's busy fraction over its timed iterations (NVML
utilisation sampled every :data:`BUSY_SAMPLE_INTERVAL_S`, :func:`busy_fraction`; ``None``
without a GPU); the sweep reports seconds per configuration (``seconds_per_config``), logged as
it goes.

Failures are data: a configuration whose process crashes or that runs past
``config_timeout_s`` comes back ``status="failed"`` (all its processes killed) and the sweep
goes on. This module imports neither torch nor scipy at import time (the agent imports it).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, TypeVar

from pydantic import ValidationError

from workers.backends.base import (
    AgentContext,
    AnalyticBackend,
    BackendUnavailableError,
    ExecutionBackend,
    TrainerProcessBackend,
    TrainerResources,
)
from workers.backends.gpu import GpuTelemetry
from workers.forkserver import ForkServerError, ForkServerPool
from workers.launch import (
    FATES_CAUSING,
    Child,
    Launcher,
    ProcessGroup,
    ProcessSpec,
    cancel_requested,
    shutdown_requested,
)
from workers.profiling.core_link_probe import CoreLinkProbe
from workers.profiling.speed_probe import SpeedProbe
from workers.protocol.messages import (
    GpuSample,
    Partitioning,
    ProfileConfigResult,
    ProfileMeasurement,
    ProfileSweepRequest,
    ProfileSweepSummary,
    ProfileTaskSpec,
)
from workers.training.profiler import (
    ITER_PREFIX,
    STOP_LINE,
    ProfileChildResult,
    ProfileChildSpec,
)
from workers.warm import TRAINER_MODULE, TrainerPool

logger = logging.getLogger(__name__)

PROFILER_COMMAND: list[str] = [sys.executable, "-m", "workers.training.profiler"]
"""The command that starts one profiler process; SPEC.json and RESULT.json paths are appended."""

PROFILER_MODULE = "workers.training.profiler"
"""The module whose ``main([SPEC.json, RESULT.json])`` a forked profiler process runs
(:class:`~workers.forkserver.ForkServerPool`): the same program as :data:`PROFILER_COMMAND`."""

WARM_PROFILER_COMMAND: list[str] = [sys.executable, "-m", TRAINER_MODULE, "profile"]
"""The profiler as a trainer job (``python -m workers.training.trainer profile SPEC RESULT``, the
same program as :data:`PROFILER_COMMAND`): what a warm trainer of the backend's
:class:`~workers.warm.TrainerPool` runs (:func:`run_sweep` on the GPU backends)."""

BUSY_SAMPLE_INTERVAL_S = 0.1
"""Seconds between NVML utilisation samples during a configuration on a GPU. NVML's
utilisation is the fraction of its own sample period (1/6 s to 1 s, by GPU) with a kernel
running, so sampling faster only repeats values; slower would leave a short timed window
(about 0.5 s when a configuration is to cost 2 s) with one sample or none."""

FORK_SERVER_ENV = "MTFL_PROFILER_FORK_SERVER"
"""``0`` turns the profilers' fork server off (:func:`run_sweep`): every profiler process is
then a new interpreter, as before it existed."""

_POLL_S = 0.02
_EXIT_GRACE_S = 30.0
_LINK_WAIT_S = 3.0
"""How much longer than its window a configuration may train for its first core link reading
(the probe reads every 0.1 s once its process runs; a probe that never reads costs this once
per configuration and leaves ``cross_core_rtt_ns`` empty)."""
_DESIGN_CHUNK = 64


# --------------------------------------------------------------------------------- design


def share_grid(share_min: int, share_step: int) -> list[int]:
    """The shares a sweep draws from: multiples of ``share_step`` in ``[share_min, 100]``,
    plus 100 (the whole device, MPS's default) whether or not it is a multiple.

    Example:
        >>> share_grid(10, 20)
        [20, 40, 60, 80, 100]
        >>> share_grid(25, 30)
        [30, 60, 90, 100]
    """
    first = -(-share_min // share_step) * share_step
    return sorted({*range(first, 101, share_step), 100})


_T = TypeVar("_T")


def _unique(values: Sequence[_T]) -> list[_T]:
    return list(dict.fromkeys(values))


def sweep_design(request: ProfileSweepRequest) -> Iterator[list[ProfileTaskSpec]]:
    """Yield configurations to measure, for ever: a seeded, space-filling sequence.

    The sequence is a scrambled Halton sequence (``scipy.stats.qmc.Halton``, seeded with
    ``request.seed``) in ``d = 1 + 3 · max_mix`` dimensions. Point ``u ∈ [0, 1)^d`` becomes one
    configuration, with ``pick(v, t) = v[min(⌊t · len(v)⌋, len(v) − 1)]``:

    - mix size ``k = 1 + ⌊u_0 · max_mix⌋`` (uniform over ``1..max_mix``, single tasks included);
    - task ``j < k``: architecture ``pick(architectures, u_{1+3j})``, batch size
      ``pick(batch_sizes, u_{2+3j})``, share ``pick(share_grid(share_min, share_step), u_{3+3j})``
      (:func:`share_grid`); coordinates of slots ``j ≥ k`` are unused.

    Lists are deduplicated first (keeping order), so repeating a value does not weight it.
    Low-discrepancy points cover every dimension evenly from the first few dozen on, which a
    full grid (``(|A|·|B|·|R|)^k`` mixes) could never be measured to. The same request gives the
    same sequence (with the same scipy). Repeats of earlier configurations are
    :func:`run_sweep`'s business.

    Args:
        request: the sweep; see :class:`~workers.protocol.messages.ProfileSweepRequest`.

    Yields:
        Lists of 1 to ``max_mix`` :class:`~workers.protocol.messages.ProfileTaskSpec`.
    """
    # deferred: scipy.stats costs the agent a second at start; only a sweep's design needs it
    from scipy.stats import qmc

    architectures = _unique(request.architectures)
    batch_sizes = _unique(request.batch_sizes)
    shares = share_grid(request.share_min, request.share_step)

    def pick(values: list[_T], t: float) -> _T:
        return values[min(int(t * len(values)), len(values) - 1)]

    sampler = qmc.Halton(d=1 + 3 * request.max_mix, scramble=True, seed=request.seed)
    while True:
        for point in sampler.random(_DESIGN_CHUNK):
            size = 1 + min(int(point[0] * request.max_mix), request.max_mix - 1)
            yield [
                ProfileTaskSpec(
                    architecture=pick(architectures, point[1 + 3 * j]),
                    batch_size=pick(batch_sizes, point[2 + 3 * j]),
                    active_thread_percentage=pick(shares, point[3 + 3 * j]),
                )
                for j in range(size)
            ]


# ------------------------------------------------------------------------ timing window


class Iteration(NamedTuple):
    """One timed chunk of a profiler process: ``steps`` training iterations between two
    synchronisations (host monotonic seconds), ``samples`` in them."""

    start: float
    end: float
    samples: int
    steps: int = 1


def common_window(
    iterations: Sequence[Sequence[Iteration]], until: float
) -> tuple[float | None, list[list[Iteration]]]:
    """Pick, for each task, the timed iterations run while every task was in steady state.

    The common window opens at ``t_all``, the latest of the tasks' first timed-iteration
    starts (from then on no task is still warming up), and closes at ``until`` (when STOP was
    sent). A task's iterations count if they started at or after ``t_all`` and ended at or
    before ``until``: every counted iteration ran while all the other tasks were training.

    Args:
        iterations: per task, its timed iterations in order.
        until: end of the window, monotonic seconds.

    Returns:
        ``(t_all, counted)``; ``t_all`` is ``None`` (and every list empty) while some task has
        no timed iteration yet.
    """
    if not iterations or any(not its for its in iterations):
        return None, [[] for _ in iterations]
    t_all = max(its[0].start for its in iterations)
    counted = [[it for it in its if it.start >= t_all and it.end <= until] for its in iterations]
    return t_all, counted


def window_throughput(counted: Sequence[Iteration]) -> float | None:
    """Samples per second of consecutive iterations: ``Σ samples / (last end − first start)``.

    Returns:
        ``None`` for no iterations or a zero span.
    """
    if not counted:
        return None
    span = counted[-1].end - counted[0].start
    return sum(it.samples for it in counted) / span if span > 0 else None


def window_complete(
    iterations: Sequence[Sequence[Iteration]], now: float, min_iterations: int, min_window_s: float
) -> bool:
    """Whether the processes may be stopped: the common window (:func:`common_window`, closing
    ``now``) is at least ``min_window_s`` long and holds ``min_iterations`` of every task."""
    t_all, counted = common_window(iterations, now)
    if t_all is None or now - t_all < min_window_s:
        return False
    return all(sum(it.steps for it in its) >= min_iterations for its in counted)


def busy_fraction(samples: Sequence[GpuSample], start: float, end: float) -> float | None:
    """The GPU's busy fraction over ``[start, end]`` (Unix seconds, the samples' clock): the
    mean NVML utilisation (``gpu_util_percent / 100``) of the samples taken in it.

    NVML's utilisation at a sample is the fraction of its last sample period (1/6 s to 1 s, by
    GPU) during which a kernel ran (``nvmlDeviceGetUtilizationRates``), so a sample describes the
    time just before it. A window too short to hold a sample gets the first sample taken after
    it, which covers its end.

    Returns:
        A fraction in ``[0, 1]``, or ``None`` without a sample in or after the window (or for
        ``end < start``).
    """
    if end < start:
        return None
    inside = [s.gpu_util_percent for s in samples if start <= s.t <= end]
    if not inside:
        after = [s for s in samples if s.t > end]
        if not after:
            return None
        inside = [min(after, key=lambda s: s.t).gpu_util_percent]
    return min(1.0, max(0.0, sum(inside) / len(inside) / 100))


# -------------------------------------------------------------------- one configuration


@dataclass
class _Profiler:
    """One task of a configuration: its share's resources and the iterations it reported."""

    index: int
    task: ProfileTaskSpec
    resources: TrainerResources
    child: Child
    iterations: list[Iteration] = field(default_factory=list)

    @property
    def result_path(self) -> Path:
        assert self.child.spec.result_path is not None
        return self.child.spec.result_path


def _label(index: int, task: ProfileTaskSpec) -> str:
    return f"task {index} ({task.architecture}, batch {task.batch_size}, {task.active_thread_percentage} %)"


def _record_iteration(profilers: dict[int, _Profiler]) -> Callable[[Child, list[str]], None]:
    """The launch engine's ``on_line``: ``ITER <start> <end> <samples> [<steps>]`` lines (a
    chunk of ``steps`` iterations, 1 when left out) become :class:`Iteration` records of the
    profiler that wrote them."""

    def on_line(child: Child, words: list[str]) -> None:
        if len(words) in (4, 5) and words[0] == ITER_PREFIX:
            steps = int(words[4]) if len(words) == 5 else 1
            profilers[id(child)].iterations.append(Iteration(float(words[1]), float(words[2]), int(words[3]), steps))
        else:
            logger.warning("profiler %s wrote an unknown line: %r", child.label, " ".join(words))

    return on_line


@dataclass(frozen=True)
class _Config:
    """One configuration being measured: what its result repeats whatever the outcome."""

    tasks: Sequence[ProfileTaskSpec]
    request: ProfileSweepRequest
    ctx: AgentContext
    config_index: int
    repeat_of: int | None
    started_at: float
    """Unix time the measurement began."""

    def failed(self, error: str, measurements: list[ProfileMeasurement] | None = None) -> ProfileConfigResult:
        """``status="failed"`` with ``error``; without ``measurements``, one per task saying ``error``."""
        return ProfileConfigResult(
            sweep_id=self.request.sweep_id,
            device=self.ctx.device,
            backend=self.request.backend,
            config_index=self.config_index,
            repeat_of=self.repeat_of,
            tasks=list(self.tasks),
            measurements=measurements
            or [
                ProfileMeasurement(
                    task_index=k,
                    architecture=t.architecture,
                    batch_size=t.batch_size,
                    active_thread_percentage=t.active_thread_percentage,
                    error=error,
                )
                for k, t in enumerate(self.tasks)
            ],
            started_at=self.started_at,
            finished_at=time.time(),
            status="failed",
            error=error,
        )

    def succeeded(self, measurements: list[ProfileMeasurement]) -> ProfileConfigResult:
        """``status="succeeded"`` with one measurement per task."""
        return ProfileConfigResult(
            sweep_id=self.request.sweep_id,
            device=self.ctx.device,
            backend=self.request.backend,
            config_index=self.config_index,
            repeat_of=self.repeat_of,
            tasks=list(self.tasks),
            measurements=measurements,
            started_at=self.started_at,
            finished_at=time.time(),
            status="succeeded",
        )


@dataclass
class _Watchers:
    """What watches a configuration besides its processes (``None`` where the backend has none):
    the cores' :class:`~workers.profiling.speed_probe.SpeedProbe` and
    :class:`~workers.profiling.core_link_probe.CoreLinkProbe` (``cpu``) and the GPU's
    utilisation sampler. ``wall_offset`` maps monotonic iteration times onto
    :class:`GpuSample`'s Unix time; ``samples`` holds the GPU's samples once :meth:`finish` ran."""

    probe: SpeedProbe | None
    link: CoreLinkProbe | None
    telemetry: GpuTelemetry | None
    wall_offset: float = 0.0
    samples: list[GpuSample] = field(default_factory=list)

    def open_window(self) -> None:
        """At GO: the speed probe and the GPU sampler start (the link probe started at launch)."""
        if self.probe is not None:
            self.probe.start()
        if self.telemetry is not None:
            self.telemetry.start()

    def close_window(self) -> None:
        """At STOP: no reading after it is used."""
        if self.probe is not None:
            self.probe.stop()  # the window is closed: no reading after STOP is used
        if self.link is not None:
            self.link.stop()
        if self.telemetry is not None:
            self.telemetry.stop()

    def finish(self) -> None:
        """Stop everything whatever happened (stopping twice is harmless) and keep the GPU's samples."""
        if self.probe is not None:
            self.probe.stop()
        if self.link is not None:
            self.link.stop()
        self.samples = self.telemetry.stop() if self.telemetry is not None else []


def measure_configuration(
    tasks: Sequence[ProfileTaskSpec],
    request: ProfileSweepRequest,
    ctx: AgentContext,
    backend: TrainerProcessBackend,
    *,
    config_index: int,
    repeat_of: int | None = None,
    should_stop: Callable[[], bool] = shutdown_requested,
    partitioning: Partitioning = "mps",
    launcher: Launcher | None = None,
) -> ProfileConfigResult:
    """Measure one co-located configuration on the device; never raises for its failures.

    One ``python -m workers.training.profiler`` process per task, with the resources
    ``backend.resources_for_shares(shares, partitioning, ctx)`` gives; all print READY, then all
    get GO; each warms up (``request.warmup_iterations``) and then reports every timed iteration;
    when :func:`window_complete` holds for ``request.min_timed_iterations`` and
    ``request.min_window_s`` all get STOP at once, so every counted iteration ran while all the
    other tasks were training (:func:`_run_window`). What each measurement holds (throughput,
    peak memory, the GPU's busy fraction, the cores' speed and round trip) and where each comes
    from: :func:`_measurements`. Work files go to
    ``ctx.state_dir/work/sweep-<sweep_id>/config-<config_index>/``, removed when the
    configuration succeeds (kept for a failed one).

    Args:
        tasks: the configuration, 1 or more tasks.
        request: the sweep (warm-up, window, timeout, number of classes).
        ctx: the device.
        backend: maps shares to resources and builds the processes' environment.
        config_index: copied into the result (also names the work folder).
        repeat_of: copied into the result.
        should_stop: polled while measuring; when true the configuration is abandoned
            (``status="failed"``, processes killed).
        partitioning: how the processes share the device (:data:`~workers.protocol.messages.Partitioning`),
            passed to ``backend.resources_for_shares`` and ``backend.prepare_dispatch``. Sweeps keep
            ``"mps"`` (the predictor's input is the share); ``"timeslice"`` measures the tasks
            time-sliced, shares ignored, as the ``temporal`` strategy runs them (``cuda-mps``: plain
            CUDA contexts outside MPS; ``cpu``: the per-iteration device lock), as
            ``benchmarks/gpu_check.py`` does; an unknown one fails the configuration ("cannot
            allocate the device").
        launcher: fork the profilers from these fork servers (a :class:`~workers.forkserver.ForkServerPool`:
            :data:`PROFILER_MODULE`, torch already imported), or hand each task to a warm trainer of
            this pool (a :class:`~workers.warm.TrainerPool`: :data:`WARM_PROFILER_COMMAND`'s
            ``profile`` job), instead of starting :data:`PROFILER_COMMAND`; the same program every
            way. A launcher that cannot start a process fails the configuration.

    Returns:
        ``status="succeeded"`` with a measurement per task, or ``"failed"`` with ``error`` naming
        each task that failed and why (crash with its stderr tail, timeout, stop) and per-task
        measurements saying so. ``standalone_sps`` is left unset (:func:`run_sweep` fills it).
    """
    config = _Config(tasks, request, ctx, config_index, repeat_of, started_at=time.time())
    deadline = time.monotonic() + request.config_timeout_s
    if not tasks:
        return config.failed("a configuration needs at least one task")
    try:
        allocations = backend.resources_for_shares([t.active_thread_percentage for t in tasks], partitioning, ctx)
    except ValueError as exc:
        return config.failed(f"cannot allocate the device: {exc}")
    try:
        backend.prepare_dispatch(partitioning, ctx)
    except BackendUnavailableError as exc:
        return config.failed(f"device not ready: {exc}")
    work = ctx.state_dir / "work" / f"sweep-{request.sweep_id}" / f"config-{config_index}"
    try:
        specs = _write_specs(tasks, allocations, request, work, backend, warm=isinstance(launcher, TrainerPool))
    except (OSError, ValueError, ValidationError) as exc:
        return config.failed(f"cannot write the profilers' specs: {type(exc).__name__}: {exc}")

    group, ordered = _process_group(
        specs, tasks, allocations, backend, partitioning=partitioning, should_stop=should_stop, launcher=launcher
    )
    stop_at, watchers = _run_window(group, ordered, backend, config, deadline)
    return _settle(config, ordered, backend, stop_at, watchers, work)


def _process_group(
    specs: list[ProcessSpec],
    tasks: Sequence[ProfileTaskSpec],
    allocations: Sequence[TrainerResources],
    backend: TrainerProcessBackend,
    *,
    partitioning: Partitioning,
    should_stop: Callable[[], bool],
    launcher: Launcher | None,
) -> tuple[ProcessGroup, list[_Profiler]]:
    """The configuration's processes (not launched yet) and one :class:`_Profiler` per task, in
    the tasks' order, that collects its iterations; ``should_stop`` interrupts the group."""

    def interrupt() -> tuple[str, str] | None:
        if not should_stop():
            return None
        return "stopped", ("agent shutting down" if shutdown_requested() else cancel_requested() or "sweep stopped")

    profilers: dict[int, _Profiler] = {}
    group = ProcessGroup(
        specs,
        interrupt=interrupt,
        on_line=_record_iteration(profilers),
        launcher=launcher,
        poll_s=_POLL_S,
        before_kill=backend.kill_hook(partitioning),
    )
    for k, (task, resources, child) in enumerate(zip(tasks, allocations, group.children, strict=True)):
        profilers[id(child)] = _Profiler(k, task, resources, child)
    return group, list(profilers.values())


def _run_window(
    group: ProcessGroup, ordered: list[_Profiler], backend: TrainerProcessBackend, config: _Config, deadline: float
) -> tuple[float | None, _Watchers]:
    """Launch the configuration, hold it at the READY/GO barrier, release it and STOP every process
    at once when :func:`_window_done`, the watchers running from GO to STOP (the link probe from
    launch). Returns the STOP time (monotonic; ``None`` when the window never closed: a crash, a
    timeout or a stop, which the children's fates say) and the watchers, finished. Never raises:
    an error in the agent fails every process."""
    request, ctx = config.request, config.ctx
    stop_at: float | None = None
    phases = [time.monotonic()]  # launch, GO, STOP, exit: where a configuration's time goes
    watchers = _Watchers(
        probe=SpeedProbe(ctx.cores) if backend.probes_host_speed else None,
        link=CoreLinkProbe(ctx.cores) if backend.probes_host_speed and len(set(ctx.cores)) > 1 else None,
        telemetry=backend.gpu_telemetry(BUSY_SAMPLE_INTERVAL_S),
    )
    # GpuSample.t is Unix time; iterations are monotonic: one offset maps the windows onto it.
    watchers.wall_offset = time.time() - time.monotonic()
    with group:
        try:
            if watchers.link is not None:
                watchers.link.start()  # now: its interpreter starts while the trainers import torch, not in their window
            group.launch()
            if group.wait_ready(deadline, "config_timeout_s"):
                phases.append(time.monotonic())
                watchers.open_window()
                if group.go(close=False):
                    stop_at = group.wait_until(
                        _window_done(ordered, request, deadline, watchers.link), deadline, "config_timeout_s"
                    )
                if stop_at is not None:
                    phases.append(stop_at)
                    watchers.close_window()
                    group.broadcast(STOP_LINE, close=True)
                    group.wait_exit(
                        min(deadline, time.monotonic() + _EXIT_GRACE_S), "config_timeout_s", phase="after STOP"
                    )
                    phases.append(time.monotonic())
                    logger.debug(
                        "sweep %s config %s: start %.1f s, warm-up + window %.1f s, stop %.1f s",
                        request.sweep_id,
                        config.config_index,
                        *(b - a for a, b in itertools.pairwise(phases)),
                    )
        except ForkServerError as exc:
            group.fail_all(str(exc))
        except Exception as exc:  # noqa: BLE001 - the configuration is reported, never raised
            logger.exception("configuration %s of sweep %s crashed in the agent", config.config_index, request.sweep_id)
            group.fail_all(f"{type(exc).__name__}: {exc}")
        finally:
            watchers.finish()
    return stop_at, watchers


def _settle(
    config: _Config,
    ordered: list[_Profiler],
    backend: TrainerProcessBackend,
    stop_at: float | None,
    watchers: _Watchers,
    work: Path,
) -> ProfileConfigResult:
    """The configuration's result once its processes have exited. A task that crashed, timed out
    or was stopped, or wrote no successful result, fails the configuration (the backend is told,
    the work folder kept); otherwise the measurements (:func:`_measurements`) and the work folder
    removed."""
    outcomes = [_child_result(p) for p in ordered]
    causes = [p for p in ordered if p.child.fate in FATES_CAUSING]
    causes += [
        p
        for p, r in zip(ordered, outcomes, strict=True)
        if p.child.fate is None and (r is None or r.status != "succeeded")
    ]
    backend.finish_dispatch(config.ctx, failed=bool(causes) or stop_at is None)
    if causes or stop_at is None:
        errors = [_failure(p, outcome) for p, outcome in zip(ordered, outcomes, strict=True)]
        error = "; ".join(f"{p.child.label}: {errors[p.index]}" for p in causes) or "not measured"
        return config.failed(
            error,
            [
                ProfileMeasurement(
                    task_index=p.index,
                    architecture=p.task.architecture,
                    batch_size=p.task.batch_size,
                    active_thread_percentage=p.task.active_thread_percentage,
                    peak_memory_bytes=outcome.peak_memory_bytes if outcome else None,
                    error=errors[p.index],
                )
                for p, outcome in zip(ordered, outcomes, strict=True)
            ],
        )
    measurements = _measurements(ordered, outcomes, watchers, stop_at)
    shutil.rmtree(work, ignore_errors=True)
    return config.succeeded(measurements)


def _measurements(
    ordered: list[_Profiler],
    outcomes: list[ProfileChildResult | None],
    watchers: _Watchers,
    stop_at: float,
) -> list[ProfileMeasurement]:
    """One measurement per task of a configuration that succeeded, over :func:`common_window`'s
    iterations (those before ``stop_at`` while all the tasks ran).

    Throughput is :func:`window_throughput` (samples/s). Peak memory (bytes) is each process's
    own: on ``cpu`` its private resident memory (:func:`workers.training.runtime.cpu_memory_bytes`);
    on a GPU the allocator's peak reserved memory plus the context
    (:func:`workers.training.runtime.peak_memory`, reset per job in a warm process). Where the
    backend has a GPU (:meth:`~workers.backends.base.TrainerProcessBackend.gpu_telemetry`), its
    utilisation is sampled through NVML from GO to STOP and ``gpu_busy_fraction`` is
    :func:`busy_fraction` over the task's timed iterations. Where the backend
    ``probes_host_speed`` (``cpu``), a speed probe runs on the device's cores from GO to STOP and
    ``speed_index`` is its cores' speed over the task's timed iterations; on a device of 2 or
    more cores a core link probe runs from launch to STOP, and a task on 2 or more cores gets
    ``cross_core_rtt_ns``, the round trip between its cores over its timed iterations.
    """
    probe, link, telemetry = watchers.probe, watchers.link, watchers.telemetry
    samples, wall_offset = watchers.samples, watchers.wall_offset
    _, counted = common_window([p.iterations for p in ordered], stop_at)
    return [
        ProfileMeasurement(
            task_index=p.index,
            architecture=p.task.architecture,
            batch_size=p.task.batch_size,
            active_thread_percentage=p.task.active_thread_percentage,
            throughput_sps=window_throughput(its),
            peak_memory_bytes=outcome.peak_memory_bytes if outcome is not None else None,
            speed_index=(
                probe.speed_index(p.resources.cores or [], its[0].start, its[-1].end)
                if probe is not None and its
                else None
            ),
            cross_core_rtt_ns=(
                link.rtt_ns(p.resources.cores or [], its[0].start, its[-1].end) if link is not None and its else None
            ),
            gpu_busy_fraction=(
                busy_fraction(samples, its[0].start + wall_offset, its[-1].end + wall_offset)
                if telemetry is not None and its
                else None
            ),
            timed_iterations=sum(it.steps for it in its),
            host_step_s=outcome.host_step_s if outcome is not None else None,
            execution_mode=outcome.execution_mode if outcome is not None else None,
        )
        for p, its, outcome in zip(ordered, counted, outcomes, strict=True)
    ]


def _write_specs(
    tasks: Sequence[ProfileTaskSpec],
    allocations: Sequence[TrainerResources],
    request: ProfileSweepRequest,
    work: Path,
    backend: TrainerProcessBackend,
    *,
    warm: bool = False,
) -> list[ProcessSpec]:
    """Write one SPEC.json per task; return the profilers to launch, in task order: profiler
    processes (:data:`PROFILER_COMMAND`), or with ``warm`` warm trainers' ``profile`` jobs
    (:data:`WARM_PROFILER_COMMAND`)."""
    if len(allocations) != len(tasks):
        raise ValueError(f"backend allocated {len(allocations)} processes for {len(tasks)} tasks")
    work.mkdir(parents=True, exist_ok=True)
    specs = []
    for k, (task, resources) in enumerate(zip(tasks, allocations, strict=True)):
        stem = work / f"task-{k}"
        shape = request.workload_shape(task.architecture)
        spec = ProfileChildSpec(
            architecture=task.architecture,
            batch_size=task.batch_size,
            num_classes=shape.num_classes,
            input_shape=shape.input_shape,
            threads=resources.threads,
            cores=resources.cores,
            lock_path=None if resources.lock_path is None else str(resources.lock_path),
            warmup_iterations=request.warmup_iterations,
            execution=request.execution,
        )
        spec_path = stem.with_suffix(".spec.json")
        spec_path.write_text(spec.model_dump_json(indent=2))
        specs.append(
            ProcessSpec(
                command=WARM_PROFILER_COMMAND if warm else PROFILER_COMMAND,
                args=[str(spec_path), str(stem.with_suffix(".result.json"))],
                env=backend.trainer_env(resources),
                stderr_path=stem.with_suffix(".stderr.log"),
                label=_label(k, task),
                module=TRAINER_MODULE if warm else PROFILER_MODULE,
                result_path=stem.with_suffix(".result.json"),
            )
        )
    return specs


def _window_done(
    profilers: list[_Profiler], request: ProfileSweepRequest, deadline: float, link: CoreLinkProbe | None
) -> Callable[[float], bool]:
    """When to send STOP: once the common window is complete (:func:`window_complete`).

    With a core link probe, a complete window also waits (up to :data:`_LINK_WAIT_S` more, never
    past ``deadline``) until every task on 2 or more cores has a link reading among its counted
    iterations: the probe is a process of its own, and under load its first reading can come
    after a short window has closed, which left that measurement without ``cross_core_rtt_ns``."""
    complete_at: list[float] = []

    def done(now: float) -> bool:
        # Snapshots: the reader threads append while we look.
        snapshot = [list(p.iterations) for p in profilers]
        if not window_complete(snapshot, now, request.min_timed_iterations, request.min_window_s):
            return False
        if not complete_at:
            complete_at.append(now)
        # Never past the configuration's deadline: a missing link reading is no failure.
        return (
            link is None
            or now - complete_at[0] >= _LINK_WAIT_S
            or deadline - now <= 2 * _POLL_S
            or _links_read(profilers, snapshot, now, link)
        )

    return done


def _links_read(profilers: list[_Profiler], snapshot: list[list[Iteration]], now: float, link: CoreLinkProbe) -> bool:
    """Whether every task on 2 or more cores has a link reading within its counted iterations."""
    _, counted = common_window(snapshot, now)
    return all(
        link.rtt_ns(p.resources.cores or [], its[0].start, its[-1].end) is not None
        for p, its in zip(profilers, counted, strict=True)
        if len(set(p.resources.cores or [])) > 1 and its
    )


def _child_result(profiler: _Profiler) -> ProfileChildResult | None:
    try:
        return ProfileChildResult.model_validate_json(profiler.result_path.read_text())
    except (OSError, ValidationError, ValueError):
        return None


def _failure(profiler: _Profiler, outcome: ProfileChildResult | None) -> str:
    """The error of one process of a failed configuration, stderr tail included if it failed."""
    child = profiler.child
    if child.fate in ("killed", "stopped", "timeout", "agent"):
        return child.fate_detail
    if outcome is not None and outcome.error:
        error = outcome.error
    elif child.fate is None and outcome is not None:
        return "not measured: another task failed"
    else:
        error = child.fate_detail or f"profiler exited with code {child.returncode} without a result"
    tail = child.stderr_tail()
    return f"{error}\n--- profiler stderr (tail) ---\n{tail}" if tail else error


# ---------------------------------------------------------------------------- the sweep


def _throughputs(result: ProfileConfigResult) -> list[float | None]:
    return [m.throughput_sps for m in result.measurements]


def relative_spread(first: Sequence[float | None], second: Sequence[float | None]) -> float | None:
    """The largest relative difference between two measurements of the same configuration.

    ``max_k |a_k − b_k| / ((a_k + b_k) / 2)`` over the tasks (the definition of
    :attr:`~workers.protocol.messages.ProfileSweepSummary.repeat_spread`).

    Returns:
        The spread (0 = identical), or ``None`` if a throughput is missing or not positive, or
        the lengths differ.
    """
    if len(first) != len(second) or not first:
        return None
    spreads = []
    for a, b in zip(first, second, strict=True):
        if a is None or b is None or a <= 0 or b <= 0:
            return None
        spreads.append(abs(a - b) / ((a + b) / 2))
    return max(spreads)


@dataclass
class _Measured:
    """A configuration measured earlier in the sweep (a repeat candidate)."""

    index: int
    tasks: list[ProfileTaskSpec]
    throughputs: list[float | None]
    standalone: bool
    repeats: int = 0


def fork_server_wanted(backend: ExecutionBackend) -> bool:
    """The default of :func:`run_sweep`'s ``fork_server``: the backend forks its profilers
    (:attr:`~workers.backends.base.TrainerProcessBackend.forks_profilers`) and
    :data:`FORK_SERVER_ENV` is not ``0``."""
    return bool(getattr(backend, "forks_profilers", False)) and os.environ.get(FORK_SERVER_ENV, "1").strip() != "0"


def _start_fork_servers(
    request: ProfileSweepRequest, ctx: AgentContext, backend: TrainerProcessBackend
) -> ForkServerPool | None:
    """A fork server pool for the sweep, its first server (the whole-device environment of the
    standalone measurements) started now; ``None``, with a warning, if that server cannot
    start: the sweep then starts a new interpreter per profiler, slower but the same
    measurements."""
    pool = ForkServerPool(ctx.state_dir / "work" / f"sweep-{request.sweep_id}")
    try:
        pool.server_for(backend.trainer_env(backend.standalone_resources(ctx)))
    except (ForkServerError, OSError) as exc:
        pool.close()
        logger.warning(
            "sweep %s: profiler fork server unavailable, starting a new interpreter per profiler instead: %s",
            request.sweep_id,
            exc,
        )
        return None
    return pool


def run_sweep(
    request: ProfileSweepRequest,
    ctx: AgentContext,
    backend: ExecutionBackend,
    emit: Callable[[ProfileConfigResult], None],
    should_stop: Callable[[], bool] = shutdown_requested,
    *,
    fork_server: bool | None = None,
    warm: bool | None = None,
) -> ProfileSweepSummary:
    """Measure configurations of :func:`sweep_design` until ``request.budget_s`` is spent.

    Each design configuration is preceded by the standalone measurements (``P_alone``) it still
    lacks, and every ``repeat_every``-th one re-measures an earlier one: the order of work is
    :meth:`_Sweep.next_work`'s. No new configuration starts once ``budget_s`` seconds have passed
    (counted from when the fork server, if any, is ready; the last one may run past it, up to
    ``config_timeout_s``) or ``should_stop()`` is true. ``emit`` is called with each result as
    soon as it exists; an exception it raises is logged and the sweep goes on. On an
    :class:`~workers.backends.base.AnalyticBackend` nothing runs and the clock is virtual
    (:meth:`_Sweep.result`): ``budget_s`` and ``elapsed_s`` are simulated seconds, the order of
    work the same.

    Args:
        request: the sweep.
        ctx: the device (``ctx.device`` must equal ``request.device``).
        backend: a :class:`~workers.backends.base.TrainerProcessBackend` or an
            :class:`~workers.backends.base.AnalyticBackend`.
        emit: receives every :class:`~workers.protocol.messages.ProfileConfigResult`.
        should_stop: polled between and during configurations; the agent's shutdown flag by
            default.
        fork_server: fork the profiler processes from a :class:`~workers.forkserver.ForkServerPool`
            kept for the sweep (torch imported once); default: where the backend
            :attr:`~workers.backends.base.TrainerProcessBackend.forks_profilers` and
            :data:`FORK_SERVER_ENV` is not ``0`` (:func:`_sweep_launcher`).
        warm: take the profiler processes from the backend's warm pool
            (:meth:`~workers.backends.base.TrainerProcessBackend.profiler_pool`); default: where the
            backend :attr:`~workers.backends.base.TrainerProcessBackend.profiles_warm` (the GPU
            backends). Idle warm trainers are killed when the sweep starts and when it ends
            (:func:`_sweep_launcher`).

    Returns:
        The summary: ``configs`` emitted (failed ones included), ``samples`` = task
        measurements with a throughput, ``elapsed_s``, ``seconds_per_config``
        (``elapsed_s / configs``; ``None`` for none), ``repeat_spread``. ``status`` is
        ``"failed"`` with ``error`` if the request was refused (another device, a backend
        without profiler processes), the sweep was stopped before its budget was spent, or
        every configuration failed (the first error quoted); never raises. ``simulated`` is set
        on an analytic backend.
    """
    sweep = _Sweep(request, ctx, backend, emit, should_stop)
    refusal = sweep.refusal(backend)
    if refusal is not None:
        return sweep.summary("failed", refusal)
    processes = sweep.processes
    warm_pool, sweep.launcher = _sweep_launcher(request, ctx, backend, processes, fork_server=fork_server, warm=warm)
    sweep.started = time.monotonic()  # the budget is for measuring: the fork server's start is not charged
    pool_started = warm_pool.started if warm_pool is not None else 0
    try:
        stopped = sweep.run()
    except Exception as exc:  # noqa: BLE001 - failures are data
        logger.exception("sweep %s crashed", request.sweep_id)
        return sweep.summary("failed", f"sweep crashed: {type(exc).__name__}: {exc}")
    finally:
        if isinstance(sweep.launcher, ForkServerPool):
            sweep.launcher.close()
        elif processes is not None and warm_pool is not None:
            logger.info(
                "sweep %s: %d profiler processes started for %d configurations",
                request.sweep_id,
                warm_pool.started - pool_started,
                sweep.configs,
            )
            processes.close_warm_pool()  # the profilers hold what the next round needs
    return sweep.outcome(stopped)


def _sweep_launcher(
    request: ProfileSweepRequest,
    ctx: AgentContext,
    backend: ExecutionBackend,
    processes: TrainerProcessBackend | None,
    *,
    fork_server: bool | None,
    warm: bool | None,
) -> tuple[TrainerPool | None, Launcher | None]:
    """Where the sweep's profiler processes come from: the warm pool (if any) and the launcher.

    ``warm`` (default: the backend's
    :attr:`~workers.backends.base.TrainerProcessBackend.profiles_warm`, the GPU backends): the
    profilers are ``profile`` jobs of the backend's warm trainers
    (:meth:`~workers.backends.base.TrainerProcessBackend.profiler_pool`), reused across
    configurations of the same model and resources. Idle warm trainers are killed now (they hold
    GPU memory and, under MPS, client slots the profilers need) and again when the sweep ends
    (:func:`run_sweep`: its profilers hold the same, which the next round needs). Without a pool
    (``MTFL_WARM_TRAINERS=0``) each profiler is a new process, as before.

    ``fork_server`` (default: :func:`fork_server_wanted`), where there is no warm pool: a
    :class:`~workers.forkserver.ForkServerPool` kept for the sweep (torch imported once, not once
    per process: a configuration takes 2–3 times less than its measurement window plus 3–9 s of
    interpreter starts), or ``None`` if it cannot start (:func:`_start_fork_servers`). Ignored on
    an analytic backend (``processes`` is ``None``): nothing is launched there.
    """
    warm_pool = (
        processes.profiler_pool()
        if processes is not None and (warm if warm is not None else processes.profiles_warm)
        else None
    )
    if processes is not None and (warm_pool is not None or processes.warm_process_limit is not None):
        # Idle warm trainers (workers.warm) hold device memory and client slots (cuda-mps: MPS
        # clients) that the sweep's profilers need; the next round starts new ones.
        processes.close_warm_pool()
    launcher: Launcher | None = warm_pool
    if (
        launcher is None
        and processes is not None
        and (fork_server if fork_server is not None else fork_server_wanted(backend))
    ):
        launcher = _start_fork_servers(request, ctx, processes)
    return warm_pool, launcher


class _Sweep:
    """One sweep's state while it runs (:func:`run_sweep`): its clock, its counters, the
    standalone throughputs measured so far, the configurations that may be repeated and the
    work queued."""

    def __init__(
        self,
        request: ProfileSweepRequest,
        ctx: AgentContext,
        backend: ExecutionBackend,
        emit: Callable[[ProfileConfigResult], None],
        should_stop: Callable[[], bool],
    ) -> None:
        self.request = request
        self.ctx = ctx
        self.emit = emit
        self.should_stop = should_stop
        self.started = time.monotonic()
        self.analytic = isinstance(backend, AnalyticBackend)
        self.model = backend if isinstance(backend, AnalyticBackend) else None
        self.processes = backend if isinstance(backend, TrainerProcessBackend) else None
        self.virtual_start = time.time()
        self.virtual_elapsed = 0.0
        self.configs = 0
        self.samples = 0
        self.spreads: list[float] = []
        self.first_error = ""
        self.any_succeeded = False
        self.standalone: dict[tuple[str, int], float | None] = {}
        """``P_alone`` by (architecture, batch size); ``None`` for one that failed (not retried)."""
        self.measured: list[_Measured] = []
        self.chooser = random.Random(request.seed)
        self.design = sweep_design(request)
        self.queue: list[tuple[list[ProfileTaskSpec], bool]] = []  # (tasks, is a standalone measurement)
        self.launcher: Launcher | None = None

    def elapsed(self) -> float:
        """Seconds of the budget spent: virtual on an analytic backend, else since :attr:`started`."""
        return self.virtual_elapsed if self.analytic else time.monotonic() - self.started

    def summary(self, status: Literal["succeeded", "failed"], error: str = "") -> ProfileSweepSummary:
        """The sweep's summary as it stands."""
        return ProfileSweepSummary(
            sweep_id=self.request.sweep_id,
            device=self.ctx.device,
            status=status,
            error=error,
            configs=self.configs,
            samples=self.samples,
            elapsed_s=self.elapsed(),
            repeat_spread=self.spreads,
            seconds_per_config=self.elapsed() / self.configs if self.configs else None,
            simulated=self.analytic,
        )

    def refusal(self, backend: ExecutionBackend) -> str | None:
        """Why the sweep cannot start (another device's request, a backend without profiler
        processes or model, a stop already asked for); ``None`` when it can."""
        if self.request.device != self.ctx.device:
            return f"request for device {self.request.device!r} reached agent {self.ctx.device!r}"
        if self.model is None and self.processes is None:
            return f"backend {backend.name!r} cannot run profiling sweeps"
        if self.should_stop():
            return "agent shutting down: sweep refused" if shutdown_requested() else "sweep stopped before it started"
        return None

    def run(self) -> bool:
        """Measure until the budget is spent or a stop is asked for; ``True`` for a stop."""
        while True:
            if self.should_stop():
                return True
            if self.elapsed() >= self.request.budget_s:
                return False
            tasks, repeat_of, is_standalone = self.next_work()
            self.measure(tasks, repeat_of, is_standalone)

    def next_work(self) -> tuple[list[ProfileTaskSpec], int | None, bool]:
        """The next configuration: its tasks, the index it repeats (or ``None``), whether it is a
        standalone measurement.

        Before a design configuration, every (architecture, batch size) of it not yet measured
        alone is measured alone — a 1-task configuration at share 100, emitted like any other —
        and its throughput cached as ``P_alone`` for the rest of the sweep (a failed one is
        cached as unknown, not retried). A design configuration that is itself one task at 100 %
        serves as that measurement. Configurations are numbered in measuring order
        (``config_index``, from 0); when ``repeat_every > 0``, every index ``i`` with
        ``(i + 1) % repeat_every == 0`` re-measures an earlier succeeded configuration
        (``repeat_of`` set) and its :func:`relative_spread` goes into ``repeat_spread``. The one
        repeated is a design configuration if any succeeded (else a standalone one), among those
        the least repeated so far, ties broken by ``random.Random(request.seed)``: repeats spread
        over many configurations.
        """
        request = self.request
        if request.repeat_every and (self.configs + 1) % request.repeat_every == 0 and self.measured:
            pool = [m for m in self.measured if not m.standalone] or self.measured
            fewest = min(m.repeats for m in pool)
            original = self.chooser.choice([m for m in pool if m.repeats == fewest])
            original.repeats += 1
            return original.tasks, original.index, False
        if not self.queue:
            tasks = next(self.design)
            single_full = len(tasks) == 1 and tasks[0].active_thread_percentage == 100
            missing = _unique(
                [(t.architecture, t.batch_size) for t in tasks if (t.architecture, t.batch_size) not in self.standalone]
            )
            if single_full:
                missing = []  # the configuration is its own standalone measurement
            self.queue = [
                ([ProfileTaskSpec(architecture=a, batch_size=b, active_thread_percentage=100)], True)
                for a, b in missing
            ] + [(tasks, False)]
        tasks, is_standalone = self.queue.pop(0)
        return tasks, None, is_standalone

    def result(self, tasks: list[ProfileTaskSpec], repeat_of: int | None) -> ProfileConfigResult:
        """Measure one configuration (:func:`measure_configuration`), or, on an
        :class:`~workers.backends.base.AnalyticBackend`, answer it at once with
        ``backend.profile_configuration``: the clock is then virtual — it starts at the sweep's
        wall-clock start and advances by what each configuration would have taken to measure
        (``finished_at - started_at`` of its result)."""
        if self.model is not None:
            result = self.model.profile_configuration(
                tasks,
                self.request,
                self.ctx,
                config_index=self.configs,
                repeat_of=repeat_of,
                started_at=self.virtual_start + self.virtual_elapsed,
            )
            self.virtual_elapsed += result.finished_at - result.started_at
            return result
        assert self.processes is not None  # a sweep with neither was refused
        return measure_configuration(
            tasks,
            self.request,
            self.ctx,
            self.processes,
            config_index=self.configs,
            repeat_of=repeat_of,
            should_stop=self.should_stop,
            launcher=self.launcher,
        )

    def measure(self, tasks: list[ProfileTaskSpec], repeat_of: int | None, is_standalone: bool) -> None:
        """Measure one configuration, fill its ``standalone_sps`` from the cache (caching its own
        throughput first when it is a standalone measurement), count it, note a repeat's spread,
        log it and emit it."""
        index = self.configs
        result = self.result(tasks, repeat_of)
        alone = is_standalone or (len(tasks) == 1 and tasks[0].active_thread_percentage == 100)
        key = (tasks[0].architecture, tasks[0].batch_size)
        if alone and repeat_of is None and key not in self.standalone:
            self.standalone[key] = result.measurements[0].throughput_sps
        result = result.model_copy(
            update={
                "measurements": [
                    m.model_copy(update={"standalone_sps": self.standalone.get((m.architecture, m.batch_size))})
                    for m in result.measurements
                ]
            }
        )
        self.configs += 1
        self.samples += sum(m.throughput_sps is not None for m in result.measurements)
        if result.status == "succeeded":
            self.any_succeeded = True
            if repeat_of is None:
                self.measured.append(_Measured(index, list(tasks), _throughputs(result), alone))
        elif not self.first_error:
            self.first_error = f"config {index}: {result.error}"
        if repeat_of is not None:
            original = next(m for m in self.measured if m.index == repeat_of)
            spread = relative_spread(original.throughputs, _throughputs(result))
            if spread is not None:
                self.spreads.append(spread)
        logger.info(
            "sweep %s: configuration %s %s in %.1f s (%d tasks); %.2f s per configuration so far",
            self.request.sweep_id,
            index,
            result.status,
            result.finished_at - result.started_at,
            len(tasks),
            self.elapsed() / self.configs,
        )
        try:
            self.emit(result)
        except Exception:  # noqa: BLE001 - a lost record must not end the sweep
            logger.exception("could not emit configuration %s of sweep %s", index, self.request.sweep_id)

    def outcome(self, stopped: bool) -> ProfileSweepSummary:
        """The summary of a sweep that ran: failed when stopped before its budget was spent or
        when every configuration failed."""
        if stopped:
            cancelled = cancel_requested()
            reason = f"cancelled ({cancelled})" if cancelled else "stopped"
            reason = "agent shutting down" if shutdown_requested() else reason
            return self.summary(
                "failed",
                f"sweep {reason} after {self.configs} configurations, before its budget of "
                f"{self.request.budget_s:g} s was spent",
            )
        if self.configs and not self.any_succeeded:
            return self.summary("failed", f"all {self.configs} configurations failed; first: {self.first_error}")
        return self.summary("succeeded")
