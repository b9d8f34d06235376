"""The trainer process: trains one task's shard for one round, or measures tasks alone.

Run by an execution backend, one OS process per task (never forked)::

    python -m workers.training.trainer train SPEC.json RESULT.json
    python -m workers.training.trainer standalone SPEC.json RESULT.json
    python -m workers.training.trainer serve [--parent PID]

``train``: SPEC.json is a :class:`TrainerSpec` (an :class:`~workers.protocol.messages.AssignmentSpec`
plus the resources the backend gave it). The trainer pins itself to its cores, loads its shard,
builds the model and loads the global weights, then prints ``READY`` on stdout and blocks until
``GO`` arrives on stdin: the start barrier that makes co-located trainers really overlap. It
then trains ``local_epochs`` epochs, writes the weights to ``output_weights`` and RESULT.json
(an :class:`~workers.protocol.messages.AssignmentResult`).

``standalone``: SPEC.json is a :class:`StandaloneSpec`; each item runs alone with all the given
threads and cores for ``warmup_iterations + timed_iterations`` training steps and RESULT.json is
a :class:`~workers.protocol.messages.StandaloneResult` (``P_alone``, docs/DESIGN.md §1). No barrier.

``serve``: a warm trainer (:func:`serve`, kept by the agent's pool, :mod:`workers.warm`): it runs
``train``, ``standalone`` and ``profile`` jobs (a profiling sweep's profiler,
:func:`workers.training.profiler.run_profile_job`) handed over on stdin one after the other, each
exactly as the one-shot mode would, printing ``DONE <exit code>`` after each instead of exiting; the model and
the shard stay in memory between jobs (:class:`TrainerCache`).

Exit codes: 0 success, 1 training error (RESULT.json has ``status="failed"`` and
``error="ExcType: message"``), 2 bad spec or usage (RESULT.json, when it can be written, holds
``{"status": "failed", "error": ...}``).

Device: ``MTFL_TRAINER_DEVICE`` in the environment (set by the GPU backends) chooses ``cpu``
(default) or ``cuda`` (the one GPU ``CUDA_VISIBLE_DEVICES`` shows; under MPS the backend has
already put the trainer's share in its environment, read by CUDA when it initialises). On
``cuda`` the shard is moved to the GPU once, before ``READY``; cuDNN autotuning
(``cudnn.benchmark``) is on, and every distinct batch shape of the round (the full batch and an
epoch's short last one) is autotuned before ``READY`` (:func:`warm_up_shapes`), so no autotuning
lands in a timed iteration, its own or a co-located trainer's. Steps run through a
:class:`~workers.training.execution.StepRunner` in the task's execution mode (``spec.execution``:
CUDA graphs by default on a GPU, eager on ``cpu``) and are never waited for one by one: the
host synchronises at the end of the warm-up and of each epoch (:func:`run_epochs`), so a timing
window's wall time covers the kernels it queued, and reads the loss once per epoch. Peak memory is what
a pinned memory limit must allow: the caching allocator's peak reserved memory plus the CUDA
context (:func:`peak_memory`). On ``cpu`` steps are done when they return, and peak memory is the private resident memory (:func:`cpu_memory_bytes`). There is no data loader: batches are slices of
tensors already in memory (on the device), so there is no loader wait to separate from compute.

Only ``READY`` is written to the real stdout (everything else printed goes to stderr), so the
parent can read the protocol line by line. torch is imported inside functions: importing this
module (as the backends do, for the spec models) stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.fl.artifacts import (
    LocalArtifactStore,
    atomic_write_path,
    load_model_weights,
    save_model_weights,
)
from workers.forkserver import die_with_parent
from workers.launch import DONE_LINE, GO_LINE, JOB_LINE, READY_LINE
from workers.protocol.indices import decode_indices
from workers.protocol.messages import (
    AssignmentResult,
    AssignmentSpec,
    OptimizerConfig,
    ShardRef,
    StandaloneItem,
    StandaloneMeasurement,
    StandaloneResult,
    TaskRef,
)
from workers.registry.aggregators import ClientTerm, build_client_term
from workers.registry.datasets import root_fingerprint, split_arrays
from workers.registry.names import check_names
from workers.training.datasets import load_split, load_splits
from workers.training.execution import STEPS_BEFORE_REPLAY, ExecutedMode, StepRunner, resolve_execution
from workers.training.partition import shard_indices
from workers.training.profiler import StdinCommands, WarmModels, run_profile_job
from workers.training.runtime import (
    IterationLock,
    apply_resources,
    build_optimizer,
    open_device,
    peak_memory,
    synchronize,
    trainer_device,
    visible_sm_count,
)
from workers.training.zoo import build_model

if TYPE_CHECKING:
    import torch

EXIT_OK = 0
EXIT_TRAINING_ERROR = 1
EXIT_BAD_SPEC = 2

JOB_MODES = ("train", "standalone", "profile")
"""The jobs a trainer runs, one-shot or warm (:func:`run_job`)."""


class TrainerSpec(AssignmentSpec):
    """SPEC.json of ``train`` mode: the assignment plus the resources the backend chose.

    Attributes:
        artifact_root: folder of the :class:`~workers.fl.artifacts.LocalArtifactStore` holding
            ``global_weights`` and receiving ``output_weights``.
        threads: intra-op threads (``torch.set_num_threads``), ``>= 1``.
        cores: CPU ids to pin to (``os.sched_setaffinity``); ``None`` keeps the inherited set.
        lock_path: for ``timeslice`` partitioning, a file whose exclusive ``flock`` is held for
            each iteration (forward, backward, optimizer step), with ``<lock_path>.turnstile``
            beside it to make turns fair (:class:`IterationLock`); ``None`` for no lock.
        warmup_iterations: leading iterations left out of ``throughput_sps``.
    """

    artifact_root: str
    threads: int = Field(ge=1, le=4096)
    cores: list[int] | None = None
    lock_path: str | None = None
    warmup_iterations: int = Field(default=2, ge=0, le=1000)


class StandaloneSpec(BaseModel):
    """SPEC.json of ``standalone`` mode: tasks to measure one after the other, each alone.

    Attributes:
        run_id: copied into the result.
        device: copied into the result.
        items: the tasks, batch sizes and shards to measure.
        threads: intra-op threads for every item, ``>= 1``.
        cores: CPU ids to pin to; ``None`` keeps the inherited set.
        warmup_iterations: untimed steps per item.
        timed_iterations: timed steps per item, ``>= 1``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: int
    device: str
    items: list[StandaloneItem]
    threads: int = Field(ge=1, le=4096)
    cores: list[int] | None = None
    warmup_iterations: int = Field(default=2, ge=0, le=1000)
    timed_iterations: int = Field(default=5, ge=1, le=10_000)


class BarrierAborted(RuntimeError):
    """The parent closed stdin or sent something other than ``GO`` at the start barrier."""


@dataclass(frozen=True)
class IterationRecord:
    """A timing window: ``iterations`` consecutive training steps of epoch ``epoch`` between
    two host synchronisations, ``samples`` in their batches, wall ``seconds`` from the window's
    start to the synchronisation that ends it (lock waits included).

    A window, not a single step: steps are queued without waiting for the device
    (:class:`~workers.training.execution.StepRunner`), so only a synchronisation says when
    the work queued before it is done (:func:`window_ends` chooses where the trainer takes
    one)."""

    epoch: int
    samples: int
    seconds: float
    iterations: int = 1


def untimed_iterations(iterations: int, warmup_iterations: int) -> int:
    """How many leading steps of a run of ``iterations`` steps :func:`steady_state` leaves out.

    Normally ``warmup_iterations``. When the run has no more steps than that, warm-up is cut
    short rather than reporting nothing: the first step only if there are at least 2 (it
    carries one-off allocation costs, and in graphs mode a capture's), else none. The
    simulated backend mirrors this rule (``workers.backends.simulated._timed_iterations``).
    """
    if iterations > warmup_iterations:
        return warmup_iterations
    return 1 if iterations >= 2 else 0


def window_ends(steps_per_epoch: int, epochs: int, warmup_iterations: int) -> list[int]:
    """Where a trainer synchronises: after these step counts (1-based, ascending).

    At the end of the warm-up :func:`untimed_iterations` leaves out (so the timed windows hold
    no warm-up or capture step) and at the end of every epoch (the epoch's loss is read there:
    :meth:`~workers.training.execution.StepRunner.take_loss`). Nowhere else: a step is never
    waited for on its own, so the host queues the next one while the device runs this one.

    Args:
        steps_per_epoch: batches in an epoch, ``>= 0``.
        epochs: epochs, ``>= 0``.
        warmup_iterations: leading steps to leave out of the throughput.

    Returns:
        The step counts after which a window ends; empty for a run of no steps.
    """
    total = steps_per_epoch * epochs
    ends = {steps_per_epoch * (epoch + 1) for epoch in range(epochs)} if steps_per_epoch else set()
    warmup = untimed_iterations(total, warmup_iterations)
    if 0 < warmup < total:
        ends.add(warmup)
    return sorted(ends)


def steady_state(
    records: Sequence[IterationRecord], warmup_iterations: int
) -> tuple[list[IterationRecord], float | None]:
    """Pick the timed windows and return them with their throughput in samples/s.

    The windows after the first :func:`untimed_iterations` steps of the run;
    ``throughput_sps = Σ samples / Σ seconds`` over them.

    Returns:
        ``(timed, throughput_sps)``; ``([], None)`` when ``records`` is empty.

    Raises:
        ValueError: a window holds both warm-up and timed steps (the trainer must end a window
            where warm-up ends: :func:`window_ends`).
    """
    if not records:
        return [], None
    skip = untimed_iterations(sum(r.iterations for r in records), warmup_iterations)
    timed: list[IterationRecord] = []
    seen = 0
    for record in records:
        if seen >= skip:
            timed.append(record)
        elif seen + record.iterations > skip:
            raise ValueError(
                f"a timing window of steps {seen + 1}-{seen + record.iterations} straddles the end of the "
                f"{skip} warm-up steps"
            )
        seen += record.iterations
    seconds = sum(r.seconds for r in timed)
    samples = sum(r.samples for r in timed)
    return timed, (samples / seconds if seconds > 0 else None)


def epoch_batches(num_samples: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffle ``range(num_samples)`` and cut it into batches of ``batch_size``.

    Nothing is dropped: the last batch may be smaller. A trailing batch of a single sample is
    merged into the batch before it (which then holds ``batch_size + 1``), because BatchNorm
    cannot train on one sample when the feature map is 1×1 (every zoo model but VGG16 at 32×32
    input) and torch would raise mid-round.

    Args:
        num_samples: samples in the shard, ``>= 0``.
        batch_size: ``>= 1``.
        generator: seeded ``torch.Generator`` for the shuffle.

    Returns:
        int64 index tensors; together a permutation of ``range(num_samples)``.
    """
    # deferred: torch (the agent and backends import this module for its specs: it stays light)
    import torch

    order = torch.randperm(num_samples, generator=generator)
    batches = list(torch.split(order, batch_size))
    if len(batches) >= 2 and len(batches[-1]) == 1:
        leftover = batches.pop()
        batches[-1] = torch.cat([batches[-1], leftover])
    return batches


def assignment_optimizer(spec: AssignmentSpec) -> OptimizerConfig:
    """The task's optimizer settings with the assignment's learning rate when it has one (the
    control plane scales it to the batch size: ``AssignmentSpec.learning_rate``)."""
    if spec.learning_rate is None:
        return spec.task.optimizer
    return spec.task.optimizer.model_copy(update={"learning_rate": spec.learning_rate})


def shard_positions(task: TaskRef, shard: ShardRef, train_size: int) -> np.ndarray:
    """A shard's positions in the task's training split.

    With ``shard.indices`` (a rule that chose the samples, e.g. by label) they are
    :func:`workers.protocol.indices.decode_indices` of it; without, the window
    ``[offset, offset + count)`` of the task's seeded permutation
    (:func:`workers.training.partition.shard_indices`).

    Args:
        task: the task (for messages).
        shard: the device's shard.
        train_size: samples in the loaded training split.

    Returns:
        int64 positions of shape ``(shard.count,)`` in ``[0, train_size)``.

    Raises:
        ValueError: naming ``shard.indices`` when they are corrupt, not ``shard.count`` of them,
            or past the split; naming ``offset``/``count`` when the window is past the split.
    """
    if shard.indices is None:
        return shard_indices(train_size, shard.permutation_seed, shard.offset, shard.count)
    positions = decode_indices(shard.indices)
    if len(positions) != shard.count:
        raise ValueError(f"shard.indices hold {len(positions)} positions but shard.count is {shard.count}")
    if positions.size and positions[-1] >= train_size:
        raise ValueError(
            f"shard.indices reach position {positions[-1]}, past the {train_size} samples of task "
            f"{task.name!r}'s training split ({task.dataset.name}): allowed [0, {train_size})"
        )
    return positions


def _load_shard(task: TaskRef, shard: ShardRef) -> tuple[torch.Tensor, torch.Tensor]:
    """The shard's samples ``(x (n, *task.input_shape) float32, y (n,) int64)``, checked against
    the task: samples of the task's ``input_shape``, labels in ``[0, task.num_classes)``."""
    _, labels = split_arrays(load_splits(task.dataset), "train")
    x, y = load_split(task.dataset, "train", shard_positions(task, shard, len(labels)))
    if tuple(x.shape[1:]) != tuple(task.input_shape):
        raise ValueError(
            f"task.input_shape={tuple(task.input_shape)} but the {task.dataset.name} data set's samples have "
            f"shape {tuple(x.shape[1:])}"
        )
    if len(y) and int(y.max()) >= task.num_classes:
        raise ValueError(
            f"task.num_classes={task.num_classes} but the shard has label {int(y.max())} of the "
            f"{task.dataset.name} data set: labels must lie in [0, {task.num_classes})"
        )
    return x, y


def warm_up_shapes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_sizes: Sequence[int]) -> list[int]:
    """Run one forward and backward pass at each distinct batch size, leaving the model as it was.

    With cuDNN autotuning on (``cudnn.benchmark``, :func:`open_device`), the first pass at a new
    input shape tries every convolution algorithm; an epoch's short last batch is such a shape.
    Done before ``READY``, that search lands neither in this trainer's timed iterations nor,
    under MPS or time slicing, in a co-located trainer's. The optimizer is not stepped, the
    gradients are dropped and the buffers the forward passes update (BatchNorm running
    statistics and counters) are restored, so training starts from exactly the same state.

    Args:
        model: in training mode, on the device.
        x: the shard's inputs, ``(N, *input_shape)``, on the device.
        y: their labels, ``(N,)`` int64.
        batch_sizes: the sizes of the round's batches (repeats and sizes above ``N`` ignored).

    Returns:
        The distinct batch sizes warmed, ascending.
    """
    # deferred: torch (the agent and backends import this module for its specs: it stays light)
    import torch.nn.functional as F

    sizes = sorted({size for size in batch_sizes if 0 < size <= len(x)})
    saved = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    for size in sizes:
        loss = F.cross_entropy(model(x[:size]), y[:size])
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    model.zero_grad(set_to_none=True)
    for name, buffer in model.named_buffers():
        buffer.copy_(saved[name])
    return sizes


def recalibrate_batchnorm(model: torch.nn.Module, x: torch.Tensor, batch_size: int) -> None:
    """Re-estimate BatchNorm running statistics over the shard with the final weights.

    With the few local iterations of an FL round, BatchNorm's exponential running averages
    still mix in statistics of much earlier weights, and the global model's eval-mode accuracy
    collapses to chance even when its training loss is low (measured here: ShuffleNetV2 on
    digits after one epoch, 20 % → 74 % test accuracy). One no-grad pass over the device's own
    shard with a cumulative average (``torch.optim.swa_utils.update_bn``, as SWA does) fixes
    that without sharing any data; FedAvg then averages accurate per-device statistics.
    Models without BatchNorm (VGG16) are left untouched.

    Args:
        model: the trained model, modified in place (left in train mode).
        x: the shard's inputs, ``(N, *input_shape)``.
        batch_size: forward batch size; a trailing batch of one sample is merged into the
            previous one (BatchNorm cannot normalise a single 1×1 activation). A shard of one
            sample is skipped.
    """
    # deferred: torch (the agent and backends import this module for its specs: it stays light)
    from torch.optim.swa_utils import update_bn

    n = len(x)
    if n < 2:
        return
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    bounds = [*starts[1:], n]
    update_bn((x[a:b] for a, b in zip(starts, bounds, strict=True)), model)
    model.train()


class TrainerCache:
    """What a warm trainer (:func:`serve`) keeps between its jobs: one model and one shard.

    The model is keyed by what fixes its structure (architecture, number of classes, input
    shape) and the device; the shard by the data set, the shard's description and the device.
    A job for another key replaces the entry (a warm process serves one task identity: the
    agent's pool, :class:`workers.warm.TrainerPool`, keys processes by it).
    """

    def __init__(self) -> None:
        self._model_key: tuple[object, ...] | None = None
        self._model: torch.nn.Module | None = None
        self._shard_key: tuple[object, ...] | None = None
        self._shard: tuple[torch.Tensor, torch.Tensor] | None = None
        self.models_built = 0
        """How many models this cache built (tests: a warm job builds none)."""
        self.shards_loaded = 0
        """How many shards this cache loaded (tests: an unchanged shard is not re-loaded)."""

    def model(self, task: TaskRef, seed: int, device: torch.device) -> torch.nn.Module:
        """The task's model on ``device``: the cached one, or one built with ``seed`` (its
        values are overwritten by the caller's global weights either way)."""
        key = (task.architecture, task.num_classes, tuple(task.input_shape), str(device))
        if self._model is None or key != self._model_key:
            self._model = None  # free the old one before building the next
            model = build_model(task.architecture, task.num_classes, seed, task.input_shape)
            self._model, self._model_key = model.to(device), key
            self.models_built += 1
        return self._model

    def shard(self, task: TaskRef, shard: ShardRef, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The shard's ``(x, y)`` on ``device`` (:func:`_load_shard`), loaded again only when
        the data set (or its files on disk: :func:`~workers.registry.datasets.root_fingerprint`),
        the shard or the checks' inputs (input shape, classes) change."""
        key = (
            task.dataset.model_dump_json(),
            root_fingerprint(task.dataset.root),
            tuple(task.input_shape),
            task.num_classes,
            shard.model_dump_json(),
            str(device),
        )
        if self._shard is None or key != self._shard_key:
            self._shard = None
            x, y = _load_shard(task, shard)
            self._shard, self._shard_key = (x.to(device), y.to(device)), key
            self.shards_loaded += 1
        return self._shard


def train(
    spec: TrainerSpec, protocol_out: TextIO, protocol_in: TextIO, cache: TrainerCache | None = None
) -> AssignmentResult:
    """Run ``train`` mode: set up, pass the start barrier, train, write weights.

    With ``cache`` (a warm trainer, :func:`serve`) the model and the shard come from it: the
    model is built once and gets the global weights loaded into it, the shard is loaded once
    and again only when it changes (:func:`_set_up`). The optimizer, the aggregator's
    client term and every seed are set up as in a cold trainer, so the round's weights are
    bit-identical to a cold one's.

    ``samples_trained`` counts every sample of every epoch (``shard.count · local_epochs``);
    ``train_loss`` is the last epoch's mean cross-entropy weighted by batch sizes (without the
    client term the assignment's aggregator adds to every step, FedProx's proximal term:
    :func:`workers.registry.aggregators.build_client_term`);
    ``throughput_sps`` is chosen by :func:`steady_state` over the timing windows of
    :func:`run_epochs`; ``execution_mode``/``execution_fallback`` are what the
    :class:`~workers.training.execution.StepRunner` ran and why it is not what ``spec.execution``
    asked (a shard of 0 samples reports the mode it would have run); ``started_at``/``finished_at`` are
    Unix seconds taken after ``GO`` and after the weights are written, so the span includes
    :func:`recalibrate_batchnorm`'s pass, which the throughput (training steps only) excludes. A shard of 0 samples
    trains nothing: the output weights are a copy of the global weights, ``samples_trained=0``
    and ``throughput_sps=None``.

    Raises:
        Exception: any error of setup or training (the caller turns it into a failed result).
    """
    apply_resources(spec.threads, spec.cores)
    device = open_device(trainer_device())
    store = LocalArtifactStore(spec.artifact_root)
    global_path = store.path(spec.global_weights)
    model, optimizer, client_term, x, y = _set_up(spec, device, global_path, cache)

    protocol_out.write(READY_LINE + "\n")
    protocol_out.flush()
    line = protocol_in.readline()
    if line.strip() != GO_LINE:
        raise BarrierAborted(f"start barrier aborted: expected {GO_LINE!r} on stdin, got {line!r}")

    started_at = time.time()
    records: list[IterationRecord] = []
    train_loss: float | None = None
    if len(y) == 0:
        sha = store.put_file(spec.output_weights, global_path)
        execution_mode, execution_fallback = resolve_execution(spec.execution, device)
    else:
        records, train_loss, execution_mode, execution_fallback = _train_epochs(
            spec, model, optimizer, client_term, device, x, y
        )
        sha = save_model_weights(model, store.path(spec.output_weights))
    finished_at = time.time()

    timed, throughput = steady_state(records, spec.warmup_iterations)
    return AssignmentResult(
        assignment_id=spec.assignment_id,
        task_id=spec.task.task_id,
        status="succeeded",
        samples_trained=sum(r.samples for r in records),
        iterations=sum(r.iterations for r in records),
        timed_iterations=sum(r.iterations for r in timed),
        seconds=finished_at - started_at,
        throughput_sps=throughput,
        train_loss=train_loss,
        started_at=started_at,
        finished_at=finished_at,
        weights=spec.output_weights,
        weights_sha256=sha,
        threads=spec.threads,
        cores=spec.cores,
        torch_device=device.type,
        peak_memory_bytes=peak_memory(device),
        visible_sm_count=visible_sm_count(device),
        execution_mode=execution_mode,
        execution_fallback=execution_fallback,
    )


def _set_up(
    spec: TrainerSpec, device: torch.device, global_path: Path, cache: TrainerCache | None
) -> tuple[torch.nn.Module, torch.optim.Optimizer, ClientTerm | None, torch.Tensor, torch.Tensor]:
    """Everything before the barrier: the model with the global weights loaded and the shard
    ``(x, y)``, all on ``device`` (no copies inside the timing; on CUDA, warmed up at every batch
    size the epochs will use, :func:`warm_up_shapes`), its optimizer and the aggregator's client
    term; the dropout seed set.

    A cold trainer builds the model (seeded ``spec.seed``) and loads the shard; a warm one
    (``cache``) takes both from its cache and resets the model's gradients.

    Raises:
        FileNotFoundError: the global weights are not at ``global_path``.
    """
    # deferred: torch (the agent and backends import this module for its specs: it stays light)
    import torch

    if cache is None:
        x, y = _load_shard(spec.task, spec.shard)
        model = build_model(spec.task.architecture, spec.task.num_classes, spec.seed, spec.task.input_shape)
        if not global_path.is_file():
            raise FileNotFoundError(f"global_weights {spec.global_weights!r} not found at {global_path}")
        load_model_weights(model, global_path)
        # Model and data go to the device once, before the barrier: no copies inside the timing.
        model.to(device)
        x, y = x.to(device), y.to(device)
    else:
        x, y = cache.shard(spec.task, spec.shard, device)
        model = cache.model(spec.task, spec.seed, device)
        if not global_path.is_file():
            raise FileNotFoundError(f"global_weights {spec.global_weights!r} not found at {global_path}")
        # Every parameter and persistent buffer is overwritten (strict), so the model is in the
        # state a freshly built one would be after loading: the seed it was built with is moot.
        load_model_weights(model, global_path)
        model.zero_grad(set_to_none=True)
    if device.type == "cuda" and len(y):
        # Before the dropout seed below, so training draws the same masks as without it.
        model.train()
        shapes = epoch_batches(len(y), spec.batch_size, torch.Generator().manual_seed(spec.seed))
        warm_up_shapes(model, x, y, [len(batch) for batch in shapes])
    optimizer = build_optimizer(model, assignment_optimizer(spec))
    # The aggregator's client term (FedProx's proximal term, from its registry record) is built
    # on the model as loaded (on the device), before any step; an assignment that names no
    # aggregator, or FedProx's μ = 0, builds nothing, so a plain round runs exactly the
    # operations it always did.
    client_term = build_client_term(spec.aggregator, spec.client_options, model)
    torch.manual_seed(spec.seed)  # dropout masks
    return model, optimizer, client_term, x, y


def _train_epochs(
    spec: TrainerSpec,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    client_term: ClientTerm | None,
    device: torch.device,
    x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[list[IterationRecord], float, ExecutedMode, str]:
    """Train the shard's ``local_epochs`` (:func:`run_epochs`, each step under the device's
    iteration lock when ``spec.lock_path`` is set) and recalibrate BatchNorm. Returns the
    timing records, the last epoch's loss, and the mode the steps ran in with why it is not
    the one asked for."""
    model.train()
    runner = StepRunner(model, optimizer, device, spec.execution, client_term=client_term)
    hold = IterationLock(spec.lock_path)
    try:
        records, train_loss = run_epochs(
            runner,
            x,
            y,
            batch_size=spec.batch_size,
            epochs=spec.local_epochs,
            seed=spec.seed,
            warmup_iterations=spec.warmup_iterations,
            hold=hold,
            sync_each_step=spec.lock_path is not None and device.type == "cuda",
        )
        with hold:
            recalibrate_batchnorm(model, x, spec.batch_size)
    finally:
        runner.close()
        hold.close()
    return records, train_loss, runner.mode, runner.fallback


def batches_per_epoch(num_samples: int, batch_size: int) -> int:
    """How many batches :func:`epoch_batches` cuts from ``num_samples >= 1`` samples:
    ``ceil(num_samples / batch_size)``, less one when a trailing batch of a single sample is
    merged into the one before it."""
    batches = -(-num_samples // batch_size)
    if batches >= 2 and num_samples % batch_size == 1:
        batches -= 1
    return batches


def run_epochs(
    runner: StepRunner,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    epochs: int,
    seed: int,
    warmup_iterations: int,
    hold: IterationLock,
    sync_each_step: bool = False,
) -> tuple[list[IterationRecord], float]:
    """Train ``epochs`` epochs of the shard ``(x, y)`` with ``runner``, timing windows of steps.

    Epoch ``e`` visits the shard in the order of :func:`epoch_batches` seeded ``seed + e``.
    The epoch's order goes to the device in one copy (a copy of each batch's host indices would
    block the host until the device caught up: a pageable host-to-device copy synchronises).
    The host synchronises with the device only where :func:`window_ends` says, at the end of
    the warm-up and of each epoch, and reads the epoch's loss once there
    (:meth:`StepRunner.take_loss`), so it queues steps ahead of the device.

    Each step runs inside ``hold`` (the ``cpu`` backend's time-slicing lock,
    :class:`IterationLock`). With ``sync_each_step`` (a lock on a GPU) the step also waits for its
    kernels inside the lock: a time slice must cover the step's execution, not only its launch,
    or the next holder's kernels would run beside it. On ``cpu`` a step's work is done when it
    returns, so no wait is needed.

    Args:
        runner: the step runner over the model and optimiser.
        x: the shard's inputs ``(N, *input_shape)`` on the device, ``N >= 1``.
        y: their labels ``(N,)`` int64 on the device.
        batch_size: ``>= 1``.
        epochs: ``>= 1``.
        seed: the shuffles' seed.
        warmup_iterations: leading steps to end the first window after (:func:`window_ends`).
        hold: the iteration lock (one without a path does nothing).
        sync_each_step: wait for each step's kernels inside the lock.

    Returns:
        ``(records, train_loss)``: the timing windows in order, and the last epoch's mean
        cross-entropy weighted by batch sizes.

    Raises:
        FloatingPointError: an epoch's loss is not finite (lower optimizer.learning_rate).
    """
    # deferred: torch (the agent and backends import this module for its specs: it stays light)
    import torch

    device = y.device
    num_samples = len(y)
    ends = iter(window_ends(batches_per_epoch(num_samples, batch_size), epochs, warmup_iterations))
    next_end = next(ends, None)
    records: list[IterationRecord] = []
    train_loss = float("nan")
    step = 0
    for epoch in range(epochs):
        batches = epoch_batches(num_samples, batch_size, torch.Generator().manual_seed(seed + epoch))
        order = torch.cat(batches).to(device)
        offset = 0
        window_samples = window_steps = 0
        tick = time.perf_counter()
        for batch in batches:
            idx = order[offset : offset + len(batch)]
            offset += len(batch)
            with hold:
                runner.step(x[idx], y[idx])
                if sync_each_step:
                    synchronize(device)
            step += 1
            window_samples += len(batch)
            window_steps += 1
            if step == next_end:
                synchronize(device)
                now = time.perf_counter()
                records.append(IterationRecord(epoch, window_samples, now - tick, window_steps))
                tick, window_samples, window_steps = now, 0, 0
                next_end = next(ends, None)
        total, samples = runner.take_loss()
        train_loss = total / samples
    return records, train_loss


def measure_item(
    item: StandaloneItem, warmup_iterations: int, timed_iterations: int, device: torch.device | None = None
) -> StandaloneMeasurement:
    """Measure one task's training throughput alone on the device (``P_alone``).

    Runs ``warmup_iterations`` untimed then ``timed_iterations`` timed training steps at
    ``item.batch_size`` on the task's shard, cycling over reshuffled passes of the shard when it
    is smaller than needed, with ``item.execution``'s options (:class:`StepRunner`). A shard
    smaller than the batch size is used whole as every batch. The model starts from a seeded
    random initialisation (throughput does not depend on the weights' values). On a GPU the
    shard is moved there first. The timed steps are one window: one synchronisation before it
    and one after it, none inside, so the host queues steps ahead of the device as a round's
    trainer does. In graphs mode at least :data:`~workers.training.execution.STEPS_BEFORE_REPLAY`
    steps are untimed, so the window holds replays only (no eager warm-up step, no capture).

    Args:
        item: the task, batch size, shard and execution options.
        warmup_iterations: untimed steps (at least the capture's in graphs mode).
        timed_iterations: timed steps, ``>= 1``.
        device: where to train (default CPU).

    Returns:
        The measurement, ``throughput_sps = timed samples / the window's seconds``, with the
        execution mode that ran and why it is not what was asked.

    Raises:
        ValueError: if the shard is empty.
        FloatingPointError: the loss is not finite (lower optimizer.learning_rate).
        Exception: any error of setup or training.
    """
    # deferred: torch (the agent and backends import this module for its specs: it stays light)
    import torch

    device = torch.device("cpu") if device is None else device
    x, y = _load_shard(item.task, item.shard)
    num_samples = len(y)
    if num_samples == 0:
        raise ValueError("shard.count is 0: nothing to measure")
    batch = min(item.batch_size, num_samples)
    x, y = x.to(device), y.to(device)
    model = build_model(item.task.architecture, item.task.num_classes, 0, item.task.input_shape)
    model.to(device)
    model.train()
    optimizer = build_optimizer(model, item.task.optimizer)
    runner = StepRunner(model, optimizer, device, item.execution)
    if runner.mode == "graphs":
        warmup_iterations = max(warmup_iterations, STEPS_BEFORE_REPLAY)
    generator = torch.Generator().manual_seed(0)
    steps = warmup_iterations + timed_iterations
    needed = steps * batch
    order = torch.cat([torch.randperm(num_samples, generator=generator) for _ in range(-(-needed // num_samples))]).to(
        device
    )
    try:
        tick = time.perf_counter()
        for step in range(steps):
            if step == warmup_iterations:
                synchronize(device)
                tick = time.perf_counter()
            idx = order[step * batch : (step + 1) * batch]
            runner.step(x[idx], y[idx])
        synchronize(device)
        seconds = time.perf_counter() - tick
        runner.take_loss()  # its check: a diverged measurement is an error, not a figure
    finally:
        runner.close()
    return StandaloneMeasurement(
        task_id=item.task.task_id,
        batch_size=item.batch_size,
        throughput_sps=timed_iterations * batch / seconds if seconds > 0 else None,
        execution_mode=runner.mode,
        execution_fallback=runner.fallback,
    )


def standalone(spec: StandaloneSpec) -> StandaloneResult:
    """Run ``standalone`` mode: measure every item in turn; a failing item is reported as data.

    Raises:
        RuntimeError: ``MTFL_TRAINER_DEVICE=cuda`` but torch sees no GPU.
        ValueError: a bad ``MTFL_TRAINER_DEVICE``.
    """
    apply_resources(spec.threads, spec.cores)
    device = open_device(trainer_device())
    measurements = []
    errors = []
    for item in spec.items:
        try:
            measurements.append(measure_item(item, spec.warmup_iterations, spec.timed_iterations, device))
        except Exception as exc:  # noqa: BLE001 - one task's failure must not hide the others'
            error = _describe(exc)
            traceback.print_exc(file=sys.stderr)
            errors.append(f"task {item.task.task_id} ({item.task.name}): {error}")
            measurements.append(
                StandaloneMeasurement(task_id=item.task.task_id, batch_size=item.batch_size, error=error)
            )
    return StandaloneResult(
        run_id=spec.run_id,
        device=spec.device,
        status="failed" if errors else "succeeded",
        error="; ".join(errors),
        measurements=measurements,
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    with atomic_write_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2))


def run_job(
    mode: str,
    spec_path: Path,
    result_path: Path,
    protocol_out: TextIO,
    commands: StdinCommands,
    cache: TrainerCache | None = None,
    models: WarmModels | None = None,
) -> int:
    """Run one ``train``, ``standalone`` or ``profile`` job: read SPEC.json, do the work, write
    RESULT.json (atomically).

    ``profile`` is a profiler process's job (:func:`workers.training.profiler.run_profile_job`:
    SPEC.json a :class:`~workers.training.profiler.ProfileChildSpec`, ``READY``/``GO``, ``ITER``
    lines until ``STOP``), so a warm trainer serves profiling sweeps too.

    Args:
        mode: ``"train"``, ``"standalone"`` or ``"profile"``.
        spec_path: the job's SPEC.json.
        result_path: where RESULT.json goes.
        protocol_out: where ``READY`` (and a profile job's ``ITER`` lines) are written.
        commands: where ``GO`` (and a profile job's ``STOP``) are read from: stdin read
            unbuffered (:class:`~workers.training.profiler.StdinCommands`), the same reader a warm
            trainer's job lines come through, so no job's bytes sit in another reader's buffer.
        cache: a warm trainer's :class:`TrainerCache`, or ``None`` (a cold one-shot trainer).
        models: a warm trainer's profile models (:class:`~workers.training.profiler.WarmModels`),
            or ``None``.

    Returns:
        The exit code: 0 success, 1 training error, 2 bad spec.
    """
    if mode == "profile":
        return run_profile_job(spec_path, result_path, protocol_out, commands, models)
    model_cls = TrainerSpec if mode == "train" else StandaloneSpec
    try:
        spec = check_names(model_cls.model_validate_json(spec_path.read_text()))
    except (OSError, ValidationError, ValueError) as exc:
        error = f"bad spec {spec_path}: {_describe(exc)}"
        print(error, file=sys.stderr)
        with contextlib.suppress(OSError):
            _write_json(result_path, {"status": "failed", "error": error})
        return EXIT_BAD_SPEC

    if isinstance(spec, StandaloneSpec):
        try:
            measured = standalone(spec)
        except Exception as exc:  # noqa: BLE001 - reported in RESULT.json and the exit code
            traceback.print_exc(file=sys.stderr)
            measured = StandaloneResult(run_id=spec.run_id, device=spec.device, status="failed", error=_describe(exc))
        _write_json(result_path, measured.model_dump(mode="json"))
        return EXIT_OK if measured.status == "succeeded" else EXIT_TRAINING_ERROR

    try:
        # train reads GO with readline(), which StdinCommands answers as a text stream does.
        result = train(spec, protocol_out, cast(TextIO, commands), cache)
    except Exception as exc:  # noqa: BLE001 - reported in RESULT.json and the exit code
        traceback.print_exc(file=sys.stderr)
        result = AssignmentResult(
            assignment_id=spec.assignment_id,
            task_id=spec.task.task_id,
            status="failed",
            error=_describe(exc),
            threads=spec.threads,
            cores=spec.cores,
        )
    _write_json(result_path, result.model_dump(mode="json"))
    return EXIT_OK if result.status == "succeeded" else EXIT_TRAINING_ERROR


def _die_with_parent(parent: int | None) -> None:
    """Ask the kernel for SIGKILL when the parent exits (``PR_SET_PDEATHSIG``, Linux; as the
    fork server's children do, :mod:`workers.forkserver`), and exit now if ``parent`` is
    already gone. The signal follows the parent *thread* that started this process: the agent
    starts warm trainers from the thread that runs its tasks (the main thread of its solo
    pool). Elsewhere than Linux, the parent's death still closes stdin, which ends :func:`serve`
    once the current job is done."""
    die_with_parent()
    if parent is not None and os.getppid() != parent:
        os._exit(EXIT_OK)


def _redirect_stderr(path: str) -> None:
    """Send this process's stderr (file descriptor 2, and so ``sys.stderr``) to ``path``
    (appended: the parent truncates it before handing over the job), so each job's errors land
    in that job's log, as a cold trainer's do."""
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def serve(protocol_out: TextIO, commands: StdinCommands, parent: int | None = None) -> int:
    """Run a warm trainer: one job after another, each handed over on stdin, until stdin closes.

    Each job is one line, a JSON object ``{"mode": "train"|"standalone"|"profile", "spec": PATH,
    "result": PATH, "stderr": PATH}`` (:data:`workers.launch.JOB_LINE`, then the object). The
    job's stderr goes to ``stderr``; it then runs exactly as the one-shot mode ``mode`` would
    (:func:`run_job`: ``READY`` and the wait for ``GO`` for ``train`` and ``profile``, then a
    profile job's ``ITER`` lines until ``STOP``), with a :class:`TrainerCache` and a
    :class:`~workers.training.profiler.WarmModels` kept across jobs (so the model, the shard and
    the CUDA context with its cuDNN autotuning results stay warm), and ends with ``DONE <code>``
    (:data:`workers.launch.DONE_LINE`, ``code`` the exit code the one-shot trainer would have
    returned) on stdout. End of stdin between jobs: exit 0.

    Job lines, ``GO`` and ``STOP`` are all read through ``commands``, one unbuffered reader of
    stdin: a profile job polls it with ``select`` while it trains, which a buffered reader
    holding the next lines would defeat. Each job's peak memory is its own: on a GPU the
    device is opened per job (:func:`open_device` resets the allocator's peak statistics) and
    the cached unused memory is handed back between jobs; on ``cpu`` the private resident
    memory never shrinks, which is why sweeps on ``cpu`` fork a fresh profiler per task instead
    (:mod:`workers.profiling.sweep`).

    Returns:
        The exit code: 0 at end of input, 2 for a job line that cannot be read.
    """
    _die_with_parent(parent)
    cache = TrainerCache()
    models = WarmModels()
    while True:
        line = commands.wait_line()
        if line is None:
            return EXIT_OK
        head, _, payload = line.partition(" ")
        try:
            if head != JOB_LINE:
                raise ValueError(f"expected {JOB_LINE!r}, got {head!r}")
            job = json.loads(payload)
            mode, spec_path, result_path, stderr_path = job["mode"], job["spec"], job["result"], job["stderr"]
            if mode not in JOB_MODES:
                raise ValueError(f"mode must be one of {', '.join(map(repr, JOB_MODES))}, got {mode!r}")
        except (ValueError, KeyError, TypeError) as exc:
            # The parent speaks the protocol or is broken: nothing sensible to go on with.
            print(f"bad job line {line!r}: {_describe(exc)}", file=sys.stderr)
            return EXIT_BAD_SPEC
        _redirect_stderr(stderr_path)
        code = run_job(mode, Path(spec_path), Path(result_path), protocol_out, commands, cache, models)
        _release_cached_device_memory()
        sys.stderr.flush()
        protocol_out.write(f"{DONE_LINE} {code}\n")
        protocol_out.flush()


def _release_cached_device_memory() -> None:
    """Between a warm trainer's jobs, hand the GPU memory its caching allocator holds but no
    tensor uses back to the device (``torch.cuda.empty_cache``): an idle warm process then keeps
    only its context, model and shard, not its last job's peak, which a co-located trainer of
    another key may need, and the next job's peak (:func:`peak_memory`) is its own. Nothing on
    ``cpu`` or before CUDA was used."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m workers.training.trainer {train,standalone,profile} SPEC.json
    RESULT.json`` (one job, then exit) and ``python -m workers.training.trainer serve [--parent
    PID]`` (a warm trainer: :func:`serve`).

    Returns:
        The exit code: 0 success, 1 training error, 2 bad spec.
    """
    parser = argparse.ArgumentParser(prog="python -m workers.training.trainer", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=(*JOB_MODES, "serve"))
    parser.add_argument("spec", type=Path, nargs="?", help="spec JSON file (train, standalone, profile)")
    parser.add_argument(
        "result", type=Path, nargs="?", help="where the result JSON is written (train, standalone, profile)"
    )
    parser.add_argument("--parent", type=int, default=None, help="serve: the parent's pid (exit if it is gone)")
    args = parser.parse_args(argv)

    # The protocol owns the real stdout; stray prints (library warnings) go to stderr.
    protocol_out = sys.stdout
    sys.stdout = sys.stderr

    commands = StdinCommands(sys.stdin.fileno())
    if args.mode == "serve":
        return serve(protocol_out, commands, args.parent)
    if args.spec is None or args.result is None:
        parser.error(f"{args.mode} needs SPEC and RESULT")
    return run_job(args.mode, args.spec, args.result, protocol_out, commands)


if __name__ == "__main__":
    sys.exit(main())
