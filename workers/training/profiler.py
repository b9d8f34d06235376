"""The profiler process: trains one model on synthetic data until told to stop.

Run by :func:`workers.profiling.sweep.measure_configuration`, one OS process per task of a
co-located configuration, either started anew::

    python -m workers.training.profiler SPEC.json RESULT.json

or forked by a :mod:`workers.forkserver` server that has imported torch and never used it,
which calls :func:`main` with the same arguments (what a sweep does on the ``cpu`` backend).

SPEC.json is a :class:`ProfileChildSpec`. The process pins itself to its cores, builds the
model (:func:`workers.training.zoo.build_model`, seed 0), an SGD optimizer with the default
:class:`~workers.protocol.messages.OptimizerConfig` (what a task trains with unless told otherwise), and
one synthetic batch: ``(N, *input_shape)`` float32 drawn from a standard normal distribution
(``input_shape`` of the spec: ``(3, 32, 32)`` unless the task's data has another shape, e.g.
``(20,)`` features for a plug-in model on tabular data) and ``N`` random labels. Synthetic data is enough because the values of the inputs do not change the work of a
dense float32 training step (the same kernels run on the same shapes), and it spares the
process the data loading a round needs; the batch is reused for every iteration, as a real
loader's pinned batch would be.

Protocol on stdin/stdout (line by line, nothing else is written to the real stdout):

1. the process prints ``READY`` and blocks until the parent sends ``GO`` (the start barrier,
   as in :mod:`workers.training.trainer`);
2. it runs ``warmup_iterations`` untimed iterations (in graphs mode at least the capture's,
   :data:`~workers.training.execution.STEPS_BEFORE_REPLAY`), then timed ones in chunks: the
   host synchronises with the device only at the end of a chunk, and prints then
   ``ITER <start> <end> <samples> <steps>`` (``time.monotonic()`` seconds — the same clock in
   every process of the host —, the chunk's samples and steps). A chunk is as many steps as
   take about :data:`CHUNK_S` (:func:`next_chunk_steps`, sized from the chunk before: 1 step,
   then at most 4 times more each time), so the timed window holds no per-step
   synchronisation and the host queues steps ahead of the device;
3. between steps it checks stdin without blocking (``select``); on ``STOP`` (or end of
   file: the parent is gone) it drops the unfinished chunk, writes RESULT.json and exits.

RESULT.json is a :class:`ProfileChildResult`: the peak memory, the execution mode that ran,
the host seconds per timed step and, on failure, the error.

Device: ``MTFL_TRAINER_DEVICE`` in the environment (:func:`workers.training.runtime.trainer_device`,
set by the GPU backends) chooses ``cpu`` (default) or ``cuda``. On ``cuda`` the model and the
synthetic batch are created on the GPU before ``READY``, cuDNN autotuning runs during the
warm-up iterations, each chunk's ``end`` is taken after ``torch.cuda.synchronize()``,
and the peak memory is ``torch.cuda.max_memory_allocated``. On ``cpu`` the peak memory is the
private resident memory (:func:`workers.training.runtime.cpu_memory_bytes`: anonymous pages, the same
whether the process was started anew or forked), in bytes.

Exit codes: 0 success, 1 error while profiling (RESULT.json says which), 2 bad spec or usage.
torch is imported inside functions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.fl.artifacts import atomic_write_path
from workers.launch import GO_LINE, READY_LINE
from workers.protocol.messages import (
    DEFAULT_INPUT_SHAPE,
    Architecture,
    AssignmentStatus,
    ExecutionOptions,
    InputShapeField,
    OptimizerConfig,
)
from workers.registry.names import check_names
from workers.training import zoo
from workers.training.execution import STEPS_BEFORE_REPLAY, ExecutedMode, StepRunner
from workers.training.runtime import (
    IterationLock,
    apply_resources,
    build_optimizer,
    cpu_memory_bytes,
    open_device,
    peak_memory,
    synchronize,
    trainer_device,
)

if TYPE_CHECKING:
    import torch

EXIT_OK = 0
EXIT_PROFILE_ERROR = 1
EXIT_BAD_SPEC = 2

STOP_LINE = "STOP"
ITER_PREFIX = "ITER"

CHUNK_S = 0.2
"""Target seconds of a timed chunk (one synchronisation and one ``ITER`` line each). Long
enough that the synchronisation's idle gap (the device waits for the host's next launch, tens of
microseconds) is under 0.1 % of it; short enough that the common window's edges, where a chunk
that straddles them is left out (:func:`workers.profiling.sweep.common_window`), lose little of
a window of a second or two."""
MAX_CHUNK_GROWTH = 4
"""A chunk holds at most this many times the steps of the chunk before, so one fast outlier
cannot size a chunk far past :data:`CHUNK_S`."""

INPUT_SHAPE = DEFAULT_INPUT_SHAPE
"""Shape of one synthetic sample unless the spec says otherwise (CIFAR-10 size, the built-in
image data sets')."""


class ProfileChildSpec(BaseModel):
    """SPEC.json of a profiler process.

    Attributes:
        architecture: the zoo model.
        batch_size: samples per iteration, ``>= 2`` (BatchNorm needs two).
        num_classes: classifier outputs.
        input_shape: the shape of one synthetic sample, 1 to 4 dimensions (the task's).
        threads: intra-op threads, ``>= 1``.
        cores: CPU ids to pin to; ``None`` keeps the inherited set.
        lock_path: per-iteration exclusive lock (time slicing), or ``None``.
        warmup_iterations: untimed iterations after ``GO``.
        seed: seeds the model's initialisation and the synthetic batch.
        execution: how the steps run (the sweep's ``ProfileSweepRequest.execution``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    architecture: Architecture
    batch_size: int = Field(ge=2, le=4096)
    num_classes: int = Field(default=10, ge=2, le=100_000)
    input_shape: InputShapeField = INPUT_SHAPE
    threads: int = Field(ge=1, le=4096)
    cores: list[int] | None = None
    lock_path: str | None = None
    warmup_iterations: int = Field(default=2, ge=0, le=1000)
    seed: int = Field(default=0, ge=0)
    execution: ExecutionOptions = ExecutionOptions()


class ProfileChildResult(BaseModel):
    """RESULT.json of a profiler process.

    Attributes:
        status: ``succeeded`` or ``failed``.
        error: ``"ExcType: message"`` when failed.
        iterations: iterations run after ``GO``, warm-up included.
        peak_memory_bytes: the process's peak memory, bytes: ``torch.cuda.max_memory_allocated``
            on a GPU, the private resident memory on CPU (:func:`workers.training.runtime.cpu_memory_bytes`).
        execution_mode: what the steps ran as (``eager`` or ``graphs``); ``None`` if it failed
            before choosing.
        execution_fallback: why ``execution_mode`` is not what the spec asked, ``""`` if it is.
        host_step_s: host seconds per timed step while issuing it (:class:`ProfileRun`);
            ``None`` when no chunk completed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: AssignmentStatus
    error: str = ""
    iterations: int = 0
    peak_memory_bytes: int | None = None
    execution_mode: ExecutedMode | None = None
    execution_fallback: str = ""
    host_step_s: float | None = Field(default=None, ge=0)


class StdinCommands:
    """Lines from a raw file descriptor, read without blocking once started.

    Python's buffered ``sys.stdin`` may hold lines ``select`` no longer sees, so the fd is read
    directly.

    Args:
        fd: the descriptor to read (0 for stdin).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self.closed = False

    def _fill(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if ready:
            chunk = os.read(self._fd, 4096)
            if chunk:
                self._buffer += chunk
            else:
                self.closed = True

    def _pop_line(self) -> str | None:
        if b"\n" not in self._buffer:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace").strip()

    def wait_line(self) -> str | None:
        """Block until a whole line arrives; return it, or ``None`` at end of file."""
        while True:
            line = self._pop_line()
            if line is not None:
                return line
            if self.closed:
                return None
            self._fill(None)

    def readline(self) -> str:
        """The next whole line with its newline, ``""`` at end of file (blocking): what a reader
        of ``sys.stdin`` expects (:func:`workers.training.trainer.train` reads ``GO`` so in a
        warm trainer, whose job lines come through this same reader)."""
        line = self.wait_line()
        return "" if line is None else line + "\n"

    def poll_line(self) -> str | None:
        """Return a line if one has arrived, ``""`` if none has, ``None`` at end of file."""
        line = self._pop_line()
        if line is not None:
            return line
        if not self.closed:
            self._fill(0)
        line = self._pop_line()
        if line is not None:
            return line
        return None if self.closed else ""


_PER_JOB_FIELDS = {"batch_size", "threads", "cores", "lock_path", "warmup_iterations"}
"""Fields of a :class:`ProfileChildSpec` that do not change the model a job builds."""


class WarmModels:
    """What a warm trainer (:func:`workers.training.trainer.serve`) keeps between profile jobs:
    the last model built and its initial weights.

    Keyed by every field of the spec that fixes the model (architecture, classes, input shape,
    seed, and whatever else the spec adds, e.g. its execution options) and the device; not by
    the batch size, threads, cores, lock or warm-up, which do not change it. A job for the same
    key gets the same module with its initial parameters and buffers (BatchNorm statistics
    included) loaded back, so it starts from exactly the state a cold profiler's freshly built
    model has; another key replaces the entry (the agent's pool keys processes by model, so a
    process serves one).
    """

    def __init__(self) -> None:
        self._key: tuple[str, str] | None = None
        self._model: torch.nn.Module | None = None
        self._initial: dict[str, torch.Tensor] = {}
        self.models_built = 0
        """How many models this cache built (tests: a warm job builds none)."""

    def model(self, spec: ProfileChildSpec, device: torch.device) -> torch.nn.Module:
        """The spec's model on ``device`` in its freshly built state (:func:`workers.training.zoo.build_model`
        with ``spec.seed``), gradients cleared."""
        key = (spec.model_dump_json(exclude=_PER_JOB_FIELDS), str(device))
        if self._model is None or key != self._key:
            self._model, self._initial = None, {}  # free the old one before building the next
            model = zoo.build_model(spec.architecture, spec.num_classes, spec.seed, spec.input_shape).to(device)
            self._initial = {name: value.detach().clone() for name, value in model.state_dict().items()}
            self._model, self._key = model, key
            self.models_built += 1
        else:
            # In place (copy_ into the existing tensors): the parameters keep their addresses.
            self._model.load_state_dict(self._initial, strict=True)
        self._model.zero_grad(set_to_none=True)
        return self._model


_DEVICE = None  # the torch device profile() trains on, once chosen


def peak_memory_bytes() -> int:
    """This process's peak memory in bytes: once :func:`profile` has chosen a GPU, the
    allocator's peak reserved memory plus the CUDA context
    (:func:`workers.training.runtime.peak_memory`), else its private resident memory
    (:func:`workers.training.runtime.cpu_memory_bytes`)."""
    if _DEVICE is not None and _DEVICE.type == "cuda":
        return peak_memory(_DEVICE)
    return cpu_memory_bytes()


@dataclass(frozen=True)
class ProfileRun:
    """What :func:`profile` ran.

    Attributes:
        iterations: steps run after ``GO``, warm-up and an unfinished last chunk included.
        execution_mode: ``eager`` or ``graphs``, as the :class:`StepRunner` ran them.
        execution_fallback: why not what was asked (``""`` if it was).
        host_step_s: host seconds per step: on a GPU the median over the chunks of the issuing
            thread's CPU time (``time.thread_time``) of each chunk's first step, issued right
            after a synchronisation into an empty launch queue (the launch cost that says
            whether the device waits for the host; later steps of a chunk may wait in the driver
            for a full queue); on ``cpu``, where the step's work is the host's and spreads over
            the intra-op threads, the mean wall time of the reported chunks' step calls.
            ``None`` when no chunk completed.
    """

    iterations: int
    execution_mode: ExecutedMode
    execution_fallback: str
    host_step_s: float | None


def next_chunk_steps(previous_steps: int, previous_s: float, target_s: float = CHUNK_S) -> int:
    """Steps of the next timed chunk: as many as take ``target_s`` at the previous chunk's pace,
    at least 1 and at most :data:`MAX_CHUNK_GROWTH` times ``previous_steps``.

    Args:
        previous_steps: steps of the chunk before, ``>= 1``.
        previous_s: its seconds, ``>= 0`` (0: as fast as the clock can tell: grow the most).
        target_s: the target chunk length, seconds.
    """
    ceiling = MAX_CHUNK_GROWTH * previous_steps
    if previous_s <= 0:
        return ceiling
    return max(1, min(ceiling, int(target_s * previous_steps / previous_s)))


def profile(
    spec: ProfileChildSpec, protocol_out: TextIO, commands: StdinCommands, models: WarmModels | None = None
) -> ProfileRun:
    """Set up, pass the barrier, train until ``STOP``; report what ran.

    With ``models`` (a warm trainer's :class:`WarmModels`) the model comes from it, in the state
    a freshly built one has, instead of being built. Steps run through a :class:`StepRunner`
    with ``spec.execution``'s options; after the warm-up, timed steps go in chunks ended by
    one synchronisation and one ``ITER`` line each (module docstring, :func:`_train_until_stop`).

    Raises:
        RuntimeError: if the barrier is aborted (anything but ``GO`` on stdin).
        Exception: any error of setup or training.
    """
    device, runner, x, y = _prepare(spec, models)
    warmup = max(spec.warmup_iterations, STEPS_BEFORE_REPLAY) if runner.mode == "graphs" else spec.warmup_iterations

    protocol_out.write(READY_LINE + "\n")
    protocol_out.flush()
    line = commands.wait_line()
    if line != GO_LINE:
        raise RuntimeError(f"start barrier aborted: expected {GO_LINE!r} on stdin, got {line!r}")

    iterations, host_step_s = _train_until_stop(spec, device, runner, x, y, warmup, protocol_out, commands)
    return ProfileRun(
        iterations=iterations,
        execution_mode=runner.mode,
        execution_fallback=runner.fallback,
        host_step_s=host_step_s,
    )


def _prepare(
    spec: ProfileChildSpec, models: WarmModels | None
) -> tuple[torch.device, StepRunner, torch.Tensor, torch.Tensor]:
    """Everything before the barrier: the process's resources, the device (kept in
    ``_DEVICE``), the model in training mode with its optimizer and step runner, and one random
    batch ``(x, y)`` seeded ``spec.seed`` on the device; the dropout seed set."""
    # deferred: torch stays out of processes that import this module without training (the web app, the agent)
    import torch

    global _DEVICE
    apply_resources(spec.threads, spec.cores)
    device = _DEVICE = open_device(trainer_device())
    if models is None:
        model = zoo.build_model(spec.architecture, spec.num_classes, spec.seed, spec.input_shape)
    else:
        model = models.model(spec, device)
    model.to(device)
    model.train()
    optimizer = build_optimizer(model, OptimizerConfig())
    runner = StepRunner(model, optimizer, device, spec.execution)
    generator = torch.Generator().manual_seed(spec.seed)
    # Drawn on the CPU generator, so the batch is the same on every device, then moved once.
    x = torch.randn(spec.batch_size, *spec.input_shape, generator=generator).to(device)
    y = torch.randint(0, spec.num_classes, (spec.batch_size,), generator=generator).to(device)
    torch.manual_seed(spec.seed)  # dropout masks
    return device, runner, x, y


def _train_until_stop(
    spec: ProfileChildSpec,
    device: torch.device,
    runner: StepRunner,
    x: torch.Tensor,
    y: torch.Tensor,
    warmup: int,
    protocol_out: TextIO,
    commands: StdinCommands,
) -> tuple[int, float | None]:
    """Step until ``STOP`` (or stdin closes): ``warmup`` steps, then chunks of timed steps, each
    reported in one ``ITER`` line (:func:`next_chunk_steps` sizes the next). Returns the steps
    run and the host time of one step [s] (``None`` when no timed step ran); closes ``runner``."""
    hold = IterationLock(spec.lock_path)
    # A lock on a GPU time-slices it: a step must have finished before the lock goes to the
    # next holder (as in workers.training.trainer.run_epochs).
    sync_each_step = spec.lock_path is not None and device.type == "cuda"
    host_clock = time.thread_time if device.type == "cuda" else time.perf_counter
    iterations = 0
    chunk_steps, chunk_done, chunk_host_s, chunk_start = 1, 0, 0.0, 0.0
    timed_steps, timed_host_s = 0, 0.0
    # On a GPU the host time of a step is its issue time only while the launch queue has room:
    # once it is full, each launch waits in the driver (spinning, so thread time counts the
    # wait) and a GPU-bound step would read as host-bound. The first step of each chunk is
    # issued right after a synchronisation, into an empty queue: its host time is the issue
    # cost alone. On cpu the host does the work, so every step's wall time counts.
    drained_host_s: list[float] = []
    try:
        while True:
            command = commands.poll_line()
            if command is None or command == STOP_LINE:
                break
            if iterations == warmup:
                synchronize(device)
                chunk_start = time.monotonic()
            host_tick = host_clock()
            with hold:
                runner.step(x, y)
                if sync_each_step:
                    synchronize(device)
            host_s = host_clock() - host_tick
            iterations += 1
            if iterations <= warmup:
                continue
            if chunk_done == 0:
                drained_host_s.append(host_s)
            chunk_done += 1
            chunk_host_s += host_s
            if chunk_done == chunk_steps:
                synchronize(device)
                end = time.monotonic()
                protocol_out.write(
                    f"{ITER_PREFIX} {chunk_start!r} {end!r} {chunk_steps * spec.batch_size} {chunk_steps}\n"
                )
                protocol_out.flush()
                timed_steps += chunk_steps
                timed_host_s += chunk_host_s
                chunk_steps = next_chunk_steps(chunk_steps, end - chunk_start)
                chunk_done, chunk_host_s, chunk_start = 0, 0.0, time.monotonic()
        if iterations:
            runner.take_loss()  # its check: a diverged profile is an error, not a figure
    finally:
        runner.close()
        hold.close()
    if device.type == "cuda" and drained_host_s:
        return iterations, float(statistics.median(drained_host_s))
    return iterations, (timed_host_s / timed_steps if timed_steps else None)


def _write_result(path: Path, result: ProfileChildResult) -> None:
    with atomic_write_path(path) as tmp:
        tmp.write_text(result.model_dump_json(indent=2))


def run_profile_job(
    spec_path: Path,
    result_path: Path,
    protocol_out: TextIO,
    commands: StdinCommands,
    models: WarmModels | None = None,
) -> int:
    """Run one profile job: read SPEC.json, :func:`profile`, write RESULT.json (atomically).

    The one job of a profiler process (:func:`main`) and each ``profile`` job of a warm trainer
    (:func:`workers.training.trainer.serve`, which passes its :class:`WarmModels` and the reader
    its job lines come through, so no byte of stdin is read by anyone else).

    Args:
        spec_path: the job's SPEC.json (a :class:`ProfileChildSpec`).
        result_path: where RESULT.json (a :class:`ProfileChildResult`) goes.
        protocol_out: where ``READY`` and the ``ITER`` lines are written.
        commands: where ``GO`` and ``STOP`` are read from.
        models: a warm trainer's model cache, or ``None`` (build the model).

    Returns:
        The exit code: 0 success, 1 profiling error, 2 bad spec.
    """
    try:
        spec = check_names(ProfileChildSpec.model_validate_json(spec_path.read_text()))
    except (OSError, ValidationError, ValueError) as exc:
        error = f"bad spec {spec_path}: {type(exc).__name__}: {exc}"
        print(error, file=sys.stderr)
        with contextlib.suppress(OSError):
            _write_result(result_path, ProfileChildResult(status="failed", error=error))
        return EXIT_BAD_SPEC

    try:
        run = profile(spec, protocol_out, commands, models)
    except Exception as exc:  # noqa: BLE001 - reported in RESULT.json and the exit code
        traceback.print_exc(file=sys.stderr)
        _write_result(
            result_path,
            ProfileChildResult(
                status="failed",
                error=f"{type(exc).__name__}: {exc}",
                peak_memory_bytes=peak_memory_bytes(),
            ),
        )
        return EXIT_PROFILE_ERROR
    _write_result(
        result_path,
        ProfileChildResult(
            status="succeeded",
            iterations=run.iterations,
            peak_memory_bytes=peak_memory_bytes(),
            execution_mode=run.execution_mode,
            execution_fallback=run.execution_fallback,
            host_step_s=run.host_step_s,
        ),
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m workers.training.profiler SPEC.json RESULT.json``: one
    :func:`run_profile_job` on this process's stdin and stdout.

    Returns:
        The exit code: 0 success, 1 profiling error, 2 bad spec.
    """
    parser = argparse.ArgumentParser(prog="python -m workers.training.profiler", description=__doc__.split("\n")[0])
    parser.add_argument("spec", type=Path, help="spec JSON file")
    parser.add_argument("result", type=Path, help="where the result JSON is written")
    args = parser.parse_args(argv)

    # The protocol owns the real stdout; stray prints (library warnings) go to stderr.
    protocol_out = sys.stdout
    sys.stdout = sys.stderr
    return run_profile_job(args.spec, args.result, protocol_out, StdinCommands(sys.stdin.fileno()))


if __name__ == "__main__":
    code = main()
    # Everything is written (RESULT.json atomically, the protocol flushed line by line); an
    # interpreter that imported torch takes 1-3 s to tear itself down, of the sweep's budget.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
