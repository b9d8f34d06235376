"""The predictor's input: configurations, the models' workloads, profile samples, and the host
speed correction applied to samples before anything is fitted.

Nothing here depends on how a backend lays shares onto a device (that is
:mod:`controlplane.planning.predictor.physics`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
StrArray = npt.NDArray[np.str_]

MAX_MIX = 8
"""Most co-located tasks the predictor answers for, and so the planner plans, on one device
(MPS allows up to 48 clients; the paper's mixes stop at 4 and the sweeps at
:attr:`~workers.protocol.messages.ProfileSweepRequest.max_mix`, at most 8)."""

LEGACY_MAX_MIX = 4
"""What :data:`MAX_MIX` was until issue 22: predictors fitted before then encode exactly this
many slots and answer for at most this many tasks
(:attr:`~controlplane.planning.predictor.encoding.FeatureSpace.max_mix`). It is also the
fewest slots a learned family's design matrix has
(:attr:`~controlplane.planning.predictor.encoding.FeatureSpace.slots`), so a predictor fitted
on mixes of at most 4 tasks is the very model it was before :data:`MAX_MIX` grew."""


@dataclass(frozen=True)
class MixTask:
    """One task of a configuration: its model, batch size ``B`` and share ``R`` (percent)."""

    architecture: str
    batch_size: int
    share: int


@dataclass(frozen=True)
class ModelWorkload:
    """Per-sample workload of a model (``F_i``): training FLOPs, activation bytes and
    parameters, and the operations one training step dispatches (``None``: not counted; see
    :class:`workers.protocol.messages.WorkloadFeatures`)."""

    train_flops_per_sample: float
    activation_bytes_per_sample: float
    params: int
    param_bytes: int
    ops_per_step: int | None = None


@dataclass(frozen=True)
class ProfiledTask:
    """A measured task of a measured configuration (one profile sample).

    Attributes:
        config_key: identifies the configuration this task ran in (all its tasks share it).
        mix: every task of that configuration, in the order they were listed.
        task_index: which of ``mix`` this sample measures.
        throughput_sps: measured samples/s.
        standalone_sps: ``P_alone`` of the same model and batch size, if measured.
        peak_memory_bytes: the task's peak memory, if measured.
        speed_index: how fast the device ran while it was measured (the ``cpu`` backend's
            speed probe, :mod:`workers.profiling.speed_probe`), if known; see :func:`normalise_speed`.
        cross_core_rtt_ns: how far apart the task's allocation units were while it was measured
            (the ``cpu`` backend's round trip between its cores, nanoseconds, for tasks on 2 or
            more cores), if known; read by the physics' link term
            (:meth:`controlplane.planning.predictor.physics.Physics.link_log_ratio`).
        host_step_s: host (CPU) seconds the trainer spent issuing one step, timed-window mean
            (on a GPU the launch cost; on the cpu backend the whole step), if measured.
        gpu_busy_fraction: fraction (0-1) of the timed window the GPU was busy, if measured.
    """

    config_key: str
    mix: tuple[MixTask, ...]
    task_index: int
    throughput_sps: float
    standalone_sps: float | None = None
    peak_memory_bytes: int | None = None
    speed_index: float | None = None
    cross_core_rtt_ns: float | None = None
    host_step_s: float | None = None
    gpu_busy_fraction: float | None = None


DEFAULT_HOST_S_PER_OP = 20e-6
"""Host seconds per dispatched operation when no profile sample measured the host's time: an
eager PyTorch step on an H200 host spent 18-25 µs per operation (issue 31: resnet18 about 11 ms
for its ~480 operations at batch 32, step time flat in the batch size)."""


class PredictorError(ValueError):
    """The predictor cannot be fitted or cannot answer (too few samples, unknown model...)."""


def normalise_speed(samples: Sequence[ProfiledTask]) -> tuple[list[ProfiledTask], float | None]:
    """Take the host's speed changes out of measured throughputs.

    A virtual machine's cores change speed by tens of percent within seconds
    (:mod:`workers.profiling.speed_probe`); a sample measured in a fast moment and one in a slow moment
    disagree by that much for the same configuration. Each sample with a ``speed_index``
    ``s`` becomes ``P · s_ref / s``: its throughput at the reference speed ``s_ref``, the
    median ``speed_index`` of ``samples``. Its ``standalone_sps`` is dropped: that value was
    measured at another moment (the standalone configuration's own sample carries it, with its
    own index). Samples without an index (closed-loop samples from runs, backends without a
    speed probe) are kept as they are. The predictor fitted on the result predicts throughput
    at ``s_ref``.

    Returns:
        ``(samples, s_ref)``; ``s_ref`` is ``None`` (samples unchanged) when none has an index.
    """
    probed = [s.speed_index is not None and s.speed_index > 0 for s in samples]
    if not any(probed):
        return list(samples), None
    reference = float(np.median([s.speed_index for s, p in zip(samples, probed, strict=True) if p]))
    out = [
        replace(s, throughput_sps=s.throughput_sps * reference / s.speed_index, standalone_sps=None)
        if p and s.speed_index is not None
        else s
        for s, p in zip(samples, probed, strict=True)
    ]
    return out, reference


def host_seconds_per_op(samples: Sequence[ProfiledTask], workloads: Mapping[str, ModelWorkload]) -> float:
    """Host seconds the device spends per dispatched operation: the median over ``samples``
    with a measured ``host_step_s`` (and a model whose ``ops_per_step`` is known and positive)
    of ``host_step_s / ops_per_step``; :data:`DEFAULT_HOST_S_PER_OP` when there is none.

    ``ops_per_step × host_seconds_per_op`` is a step's host launch time (issue 31's regime
    term): on a GPU whose step is host-bound it is the step time, whatever the batch size.
    """
    ratios = []
    for s in samples:
        workload = workloads.get(s.mix[s.task_index].architecture)
        ops = workload.ops_per_step if workload is not None else None
        if s.host_step_s is not None and s.host_step_s > 0 and ops:
            ratios.append(s.host_step_s / ops)
    return float(np.median(ratios)) if ratios else DEFAULT_HOST_S_PER_OP
