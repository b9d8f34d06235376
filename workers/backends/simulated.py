"""The ``simulated`` backend: an analytic contention model in place of trainers (docs/DESIGN.md §2).

Nothing is trained. A round, a standalone measurement or a profiling configuration is answered
at once from :func:`simulate_throughput`, a closed-form model of co-located DNN training on one
GPU: per-task speed from its FLOPs, bytes and share against the device's compute and memory
bandwidth, a slowdown when the tasks ask for more of the device than there is, an out-of-memory
refusal, and seeded noise. Every result carries ``simulated=True``; durations and timestamps
are virtual. It serves tests (a whole FL run in seconds, no GPU) and planning at thousands of
devices (the model is NumPy, vectorised over configurations; no torch at import).

The device is a :class:`DeviceSpec`, chosen by name with ``MTFL_SIM_DEVICE`` (default
``titan-v``, the paper's GPU) when the backend is created; ``MTFL_SIM_TIME_SCALE`` (default 0)
makes a round sleep ``scale ×`` its simulated seconds, for watching a run unfold live.

The model's shape was checked against real A100 measurements,
``benchmarks/reference-data/parvagpu-a100`` (inference of torchvision models under MIG slices
with 1-5 identical MPS processes): with the constants below, RMSLE 0.11 of the per-process
throughput over 622 configurations, 0.07 of the co-location shape ``P_k / P_1``, and the same
trends (throughput grows with the batch and saturates; per-process throughput falls as processes
are added; ``k`` processes together get between 1× and ``k``× one). On the paper's Titan V mixes
it gives 1.8-2.2× over time slicing for the best shares (the paper: 2.16-2.38×). ``python
benchmarks/sim_calibration.py`` prints the comparison (``--fit`` redoes the search). The same
benchmark scores the model on data sets held out of each fit: ParvaGPU's, MISO's A100 training
on MIG slices, Gavel's P100/K80 co-located training pairs and this project's H200 run
(docs/benchmarks.md). Where a constant is an assumption rather than a fit, its comment says so.

A step runs eager, its host launching every operation, or as one CUDA graph replay (a task's
:class:`~workers.protocol.messages.ExecutionOptions`; ``auto`` is graphs, since the backend
models a GPU): :func:`simulate_throughput`'s launch term. On the ``h200`` and ``h100-sxm``
presets the eager term is the workload's counted operations per step times a host time per
operation fitted on the H200 run, where every eager configuration was host-bound. Results
carry the mode they modelled; profiling measurements carry the modelled host seconds per step
and GPU busy fraction, as the GPU backends measure them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, TypedDict, Unpack

import numpy as np
import numpy.typing as npt

from workers.backends.base import AgentContext, AnalyticBackend, device_round_failed, round_request_problem
from workers.fl.artifacts import LocalArtifactStore, atomic_write_path, sha256_file
from workers.launch import cancel_requested, shutdown_requested
from workers.protocol.messages import (
    AssignmentResult,
    AssignmentSpec,
    AssignmentStatus,
    DeviceRoundResult,
    ExecutionOptions,
    ProfileConfigResult,
    ProfileMeasurement,
    ProfileSweepRequest,
    ProfileTaskSpec,
    StandaloneMeasurement,
    StandaloneRequest,
    StandaloneResult,
    TaskRef,
    TrainRoundRequest,
)
from workers.training.features import leaf_module_count, workload_features

if TYPE_CHECKING:
    from pathlib import Path

ENV_DEVICE = "MTFL_SIM_DEVICE"
ENV_TIME_SCALE = "MTFL_SIM_TIME_SCALE"
DEFAULT_DEVICE = "titan-v"

GIB = 1024**3

# ----------------------------------------------------------------------- model constants

TRAIN_KERNELS_PER_LAYER = 3.0
"""Kernels a training iteration launches per layer: forward, input gradient, weight gradient."""
ACTIVATION_TRAFFIC = 2.0
"""DRAM bytes moved per byte of saved activation: written in the forward, read in the backward."""
PARAM_TRAFFIC = 8.0
"""DRAM bytes moved per parameter byte in a training iteration with SGD + momentum: weights
read in the forward and the backward (2), gradients written (1), the optimizer reads weights,
gradients and momentum (3) and writes weights and momentum (2)."""
PARAM_MEMORY = 4.0
"""Resident bytes per parameter byte while training: weights, gradients, optimizer state, and
one more copy for allocator slack and cuDNN workspaces (an assumption, not a fit)."""
INTENSITY_HALF = 500.0
"""FLOPs per output element and pass at which kernels reach half of ``flops_efficiency``:
short reductions (1×1 and depthwise convolutions) keep the arithmetic units less busy than
long ones (VGG's 3×3 convolutions over hundreds of channels) (fitted)."""
SMOOTH_MAX_P = 3.0
"""Exponent of the smooth maximum that overlaps host launch time with device time (fitted)."""
WIDTH_HALF = 2.0
"""A layer fills half of a slice when its output elements per iteration equal this multiple of
the slice's resident-thread slots (fitted)."""
BANDWIDTH_SATURATING_SHARE = 0.5
"""Share of the SMs that can draw the whole DRAM bandwidth (an assumption: on current GPUs
about half the SMs keep enough loads in flight)."""
RECLAIM = 0.6
"""Fraction of the device left idle by a mix that co-located work can fill when shares overlap
(fitted)."""
CONTENTION = 0.3
"""How fast that fraction falls as the shares on a device exceed 100 %: it is divided by
``1 + CONTENTION · (Σ shares − 1)`` (fitted)."""
NOISE_SIGMA = 0.03
"""Standard deviation of the log of the multiplicative noise: about 3 % run-to-run spread (an
assumption; the cpu backend's repeated profiling measurements spread a few percent too)."""
OPS_PER_LAYER = 7.5
"""PyTorch operations an eager training step issues per leaf module, for a workload whose op
count is not known (:attr:`SimWorkload.ops_per_step` 0): forward, input and weight gradients,
autograd's accumulations and the optimiser's per-parameter updates. 7.5 is about the ratio of
:func:`workers.training.features.training_ops_per_step`'s counts (435, 1,218 and 1,187 for
resnet18, mobilenet_v3_large and shufflenet_v2_x1_0 at 32×32) to their leaf modules (52,
168, 164)."""
GRAPH_HOST_OPS = 3.0
"""Eager operations a CUDA-graph step still issues on the host besides the replay: the batch's
gather from the shard and the copies into the graph's two static input buffers
(workers/training/execution.py's StepRunner)."""
PROFILE_STARTUP_S = 5.0
"""Virtual seconds a profiling configuration spends before its first iteration: processes
start, torch import, CUDA context, model build (an assumption)."""


# ------------------------------------------------------------------------------ devices


DeviceValue = float | npt.NDArray[np.float64]
"""A numeric field of :class:`DeviceSpec`: one device's value, or an array of them (:func:`stack_devices`)."""


@dataclass(frozen=True)
class DeviceSpec:
    """A GPU as the model sees it.

    Numeric fields may also be NumPy arrays of shape ``(...)`` broadcastable to the leading
    (configuration) axes of :func:`simulate_throughput`'s inputs, to simulate many different
    devices in one call (:func:`stack_devices`).

    Attributes:
        name: preset name (see :data:`DEVICE_PRESETS`).
        peak_flops: dense fp32 peak, FLOP/s.
        memory_bandwidth: DRAM bandwidth, bytes/s.
        memory_bytes: device memory training may use, bytes.
        sms: streaming multiprocessors.
        threads_per_sm: resident threads per SM (2048 on Volta/Ampere, 1024 on Turing).
        kernel_s: host seconds per kernel launch in eager PyTorch (Python, dispatcher and
            driver); the iteration time of a model too small to fill the device. 20 µs: the
            reference host's fitted 30 µs per inference kernel launched from Python, less for
            the backward's kernels, launched from C++ (an assumption).
        flops_efficiency: fraction of ``peak_flops`` that kernels with long reductions attain
            at full occupancy (``η_max``; shorter reductions get less, see
            :data:`INTENSITY_HALF`). 0.8 for fp32 is an assumption; the A100 reference fit
            gives 0.5 of the TF32 peak.
        context_bytes: device memory each process holds before its model (CUDA context,
            cuDNN/cuBLAS handles).
        timeslice_overhead: fraction of each time slice lost to context switches when
            processes share the device without MPS (an assumption).
        host_op_s: host seconds per PyTorch operation of an eager training step (Python,
            dispatcher, allocator and driver launch together). When ``> 0`` the eager launch
            term is ``ops_per_step × host_op_s`` (:attr:`SimWorkload.ops_per_step`), which
            replaces ``3·N·kernel_s``; 0 keeps the per-layer term. Fitted for ``h200`` and
            ``h100-sxm`` on this project's H200 measurements (``benchmarks/sim_calibration.py``).
        graph_launch_s: host seconds to replay one captured CUDA graph (``torch.cuda.CUDAGraph
            .replay``: one ``cudaGraphLaunch``). 10 µs is an assumption: NVIDIA gives a few µs
            for ``cudaGraphLaunch`` and, since CUDA 12.6, a launch time independent of the
            node count for straight-line graphs ("Constant Time Launch for Straight-Line CUDA
            Graphs", NVIDIA Technical Blog, 2024); PyTorch's replay wrapper adds a few µs.
        kernel_gap_s: device seconds between consecutive kernels of one stream (the GPU-side
            launch latency), counted once per operation of a training step: the floor of a
            graph replay's time, hidden behind the host in eager mode. 1 µs on Hopper is an
            assumption from NVIDIA's measurement of ~0.5-1 µs per kernel with graphs
            ("Getting Started with CUDA Graphs", NVIDIA Technical Blog, 2019: 3.4 µs per
            2.9 µs kernel); 0 (the default) leaves it out.
    """

    name: str
    peak_flops: DeviceValue
    memory_bandwidth: DeviceValue
    memory_bytes: DeviceValue
    sms: DeviceValue
    threads_per_sm: DeviceValue
    kernel_s: DeviceValue = 20e-6
    flops_efficiency: DeviceValue = 0.8
    context_bytes: DeviceValue = 0.3 * GIB
    timeslice_overhead: DeviceValue = 0.05
    host_op_s: DeviceValue = 0.0
    graph_launch_s: DeviceValue = 10e-6
    kernel_gap_s: DeviceValue = 0.0


H200_HOST_OP_S = 22.6e-6
"""Host seconds per eager PyTorch operation fitted on the H200 measurements
(``benchmarks/reference-data/mtfl-h200``, ``python benchmarks/sim_calibration.py``): the host of
that run (16 cores, Python 3.12, torch 2.11, CUDA 13) issuing a training step op by op. The
H100 preset takes the same value: the launch cost is the host's and the driver's, not the
GPU's (an assumption until an H100 is measured)."""
HOPPER_KERNEL_GAP_S = 1e-6
"""Device seconds between kernels on Hopper (see :attr:`DeviceSpec.kernel_gap_s`; an assumption)."""


DEVICE_PRESETS: dict[str, DeviceSpec] = {
    # Dense fp32 peak (boost clock, no tensor cores), DRAM bandwidth and memory from NVIDIA's
    # data sheets; SMs and resident threads per SM from the architecture whitepapers (Kepler
    # GK110/GK210, Pascal GP100, Volta GV100, Turing TU104, Ampere GA100, Hopper GH100). The
    # data sheets' memory in GB is taken as GiB (HBM stacks come in GiB), except where noted.
    # The Titan V is the paper's GPU (Yu et al. 2022, §5) and the default.
    "titan-v": DeviceSpec("titan-v", 14.9e12, 652.8e9, 12 * GIB, 80, 2048),
    # Tesla V100 SXM2 16 GB (V100 data sheet, 2020): 15.7 TFLOP/s fp32, 900 GB/s HBM2.
    "v100": DeviceSpec("v100", 15.7e12, 900e9, 16 * GIB, 80, 2048),
    "a100-40gb": DeviceSpec("a100-40gb", 19.5e12, 1555e9, 40 * GIB, 108, 2048),
    "a100-80gb": DeviceSpec("a100-80gb", 19.5e12, 2039e9, 80 * GIB, 108, 2048),
    # H100 SXM5 80 GB (H100 data sheet, 2023): 67 TFLOP/s fp32 (non-tensor; 989 TFLOP/s
    # dense bf16 on tensor cores), 3.35 TB/s HBM3, 132 SMs. Host launch term as the H200's.
    "h100-sxm": DeviceSpec(
        "h100-sxm",
        67e12,
        3350e9,
        80 * GIB,
        132,
        2048,
        host_op_s=H200_HOST_OP_S,
        kernel_gap_s=HOPPER_KERNEL_GAP_S,
    ),
    # H200 SXM 141 GB (H200 data sheet, 2024): the H100's GH100 die (67 TFLOP/s fp32, 132
    # SMs) with 141 GB of HBM3e at 4.8 TB/s; host launch term fitted on the project's run.
    "h200": DeviceSpec(
        "h200",
        67e12,
        4800e9,
        141 * GIB,
        132,
        2048,
        host_op_s=H200_HOST_OP_S,
        kernel_gap_s=HOPPER_KERNEL_GAP_S,
    ),
    "t4": DeviceSpec("t4", 8.1e12, 320e9, 15 * GIB, 40, 1024),  # 16 GB, 15 GiB usable
    # Tesla P100 PCIe 16 GB (P100 data sheet, 2016): 9.3 TFLOP/s fp32, 732 GB/s, 56 SMs; the
    # PCIe card is the one clouds rent and Gavel measured (benchmarks/reference-data).
    "p100": DeviceSpec("p100", 9.3e12, 732e9, 16 * GIB, 56, 2048),
    # Tesla K80 (K80 data sheet, 2014): a board of two GK210 dies, 8.73 TFLOP/s fp32 at boost,
    # 480 GB/s and 24 GB in all. A preset is ONE die, as CUDA, clouds and Gavel count a K80
    # "GPU": half of each, 4.37 TFLOP/s, 240 GB/s, 12 GB, 13 SMX of 2048 resident threads.
    "k80": DeviceSpec("k80", 4.37e12, 240e9, 12 * GIB, 13, 2048),
}
"""Named devices ``MTFL_SIM_DEVICE`` may choose: ``titan-v`` (default), ``v100``,
``a100-40gb``, ``a100-80gb``, ``h100-sxm``, ``h200``, ``t4``, ``p100``, ``k80``. Their
``kernel_s`` and ``flops_efficiency`` are :class:`DeviceSpec`'s defaults (assumptions, see
there); ``benchmarks/sim_calibration.py`` fits them against measurements for the A100 (MISO,
ParvaGPU), P100 and K80 (Gavel) and reports the figures without changing the presets. The
``h200`` and ``h100-sxm`` presets carry a per-operation host term (``host_op_s``, fitted on
the project's H200 run, :data:`H200_HOST_OP_S`) and a device-side gap per kernel."""

_NUMERIC_FIELDS = tuple(f.name for f in dataclasses.fields(DeviceSpec) if f.name != "name")


def device_spec(name: str) -> DeviceSpec:
    """Return the preset called ``name``.

    Raises:
        ValueError: for an unknown name, listing the presets.
    """
    if name not in DEVICE_PRESETS:
        raise ValueError(f"simulated device {name!r} is unknown; allowed: {', '.join(sorted(DEVICE_PRESETS))}")
    return DEVICE_PRESETS[name]


def device_from_env() -> DeviceSpec:
    """Return the preset named by ``MTFL_SIM_DEVICE`` (default ``titan-v``).

    Raises:
        ValueError: naming the variable and the allowed values, for an unknown name.
    """
    name = os.environ.get(ENV_DEVICE, "").strip() or DEFAULT_DEVICE
    if name not in DEVICE_PRESETS:
        raise ValueError(
            f"{ENV_DEVICE}={name!r} is not a simulated device; allowed: {', '.join(sorted(DEVICE_PRESETS))}"
        )
    return DEVICE_PRESETS[name]


def time_scale_from_env() -> float:
    """Return ``MTFL_SIM_TIME_SCALE`` (default 0: simulated rounds return at once).

    Raises:
        ValueError: naming the variable, for a value that is not a finite number ``>= 0``.
    """
    text = os.environ.get(ENV_TIME_SCALE, "").strip()
    if not text:
        return 0.0
    try:
        scale = float(text)
    except ValueError:
        scale = math.nan
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"{ENV_TIME_SCALE}={text!r} must be a number >= 0 (0: never sleep)")
    return scale


def stack_devices(devices: Sequence[DeviceSpec]) -> DeviceSpec:
    """Combine ``N`` devices into one :class:`DeviceSpec` whose numeric fields are arrays of
    shape ``(N,)``: pass it with inputs of shape ``(N, I)`` to simulate ``N`` devices at once.

    Raises:
        ValueError: if ``devices`` is empty.
    """
    if not devices:
        raise ValueError("stack_devices needs at least one device")
    return DeviceSpec(
        name="+".join(d.name for d in devices),
        **{f: np.array([getattr(d, f) for d in devices], dtype=float) for f in _NUMERIC_FIELDS},
    )


# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class SimWorkload:
    """What the model needs to know about a DNN at one input shape.

    Attributes:
        flops_per_sample: training FLOPs per sample, forward + backward (2 per multiply-add).
        activation_bytes_per_sample: bytes autograd saves for the backward per sample.
        param_bytes: bytes of the parameters (float32).
        layers: leaf modules of the model (convolutions, norms, activations, ...): each
            launches about one kernel per pass.
        ops_per_step: PyTorch operations one eager training step issues (forward, loss,
            backward, optimiser step), ``WorkloadFeatures.ops_per_step``
            (:func:`workers.training.features.training_ops_per_step`); 0 when not known,
            then estimated as :data:`OPS_PER_LAYER` × ``layers``.
    """

    flops_per_sample: float
    activation_bytes_per_sample: float
    param_bytes: float
    layers: int
    ops_per_step: int = 0


def simulation_workload(
    architecture: str, num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32)
) -> SimWorkload:
    """Return a registered model's workload at an input shape (1 to 4 dimensions: an image
    ``(C, H, W)``, a feature vector ``(F,)``), from
    :func:`workers.training.features.workload_features` and
    :func:`~workers.training.features.leaf_module_count`; cached per
    ``(architecture, num_classes, input_shape)`` in this process.

    torch is imported (the model runs on the meta device, shapes only, a fraction of a second;
    a model that cannot runs once on the CPU).

    Raises:
        ValueError: for an unknown architecture, ``num_classes < 2``, an input shape out of
            range or one the model cannot take (as
            :func:`~workers.training.features.workload_features`).
    """
    return _workload(architecture, num_classes, tuple(input_shape))


@functools.lru_cache(maxsize=128)
def _workload(architecture: str, num_classes: int, input_shape: tuple[int, ...]) -> SimWorkload:
    features = workload_features(architecture, num_classes, input_shape)
    return SimWorkload(
        flops_per_sample=features.train_flops_per_sample,
        activation_bytes_per_sample=features.activation_bytes_per_sample,
        param_bytes=float(features.param_bytes),
        layers=leaf_module_count(architecture, num_classes, input_shape),
        ops_per_step=features.ops_per_step or 0,
    )


# -------------------------------------------------------------------------------- noise


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014), element-wise on uint64."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def noise_factors(
    seed: int,
    round_index: int,
    device: str,
    task_ids: Sequence[int] | np.ndarray,
    sigma: float = NOISE_SIGMA,
) -> np.ndarray:
    """Multiplicative lognormal noise ``exp(σ·z)``, ``z ~ N(0, 1)``, one factor per task.

    Deterministic: the same ``(seed, round_index, device, task_id)`` always gives the same
    factor, on any machine and in any process (a BLAKE2b digest of the first three, mixed with
    the task id by SplitMix64, two uniforms, Box-Muller), and different tasks, rounds, devices
    or seeds give independent ones.

    Args:
        seed: any integer (an assignment's seed, a sweep's seed, a run id).
        round_index: any integer (a round, a configuration index; -1 for standalone).
        device: the device name.
        task_ids: integers of any shape.
        sigma: standard deviation of ``log(factor)``; 0 gives ones.

    Returns:
        float64 factors with the shape of ``task_ids``, median 1.
    """
    digest = hashlib.blake2b(f"mtfl-sim|{seed}|{round_index}|{device}".encode(), digest_size=8)
    base = np.uint64(int.from_bytes(digest.digest(), "little"))
    ids = np.asarray(task_ids, dtype=np.int64).astype(np.uint64)
    mixed = _splitmix64(ids ^ base)
    u1 = (_splitmix64(mixed) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    u2 = (_splitmix64(~mixed) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return np.exp(sigma * z)


# -------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class MixPrediction:
    """What :func:`simulate_throughput` predicts for configurations of shape ``(..., I)``.

    Attributes:
        throughput_sps: samples/s per task, ``(..., I)``; NaN for absent and out-of-memory
            tasks.
        iteration_s: seconds per training iteration, ``(..., I)``; NaN where throughput is.
        peak_memory_bytes: device memory each task holds at its peak, ``(..., I)``; 0 for
            absent tasks.
        oom: ``(..., I)`` bool, True for tasks refused for lack of device memory.
        device_utilisation: ``(...)``, the fraction of the device's attainable compute and
            bandwidth the configuration keeps busy (``Σ v_i / t_i``; see the formula).
        host_step_s: host seconds each task spends issuing one step (its launch term ``L``),
            ``(..., I)``; NaN where throughput is.
        gpu_busy_fraction: ``(...)``, the fraction of time some kernel runs on the device, as
            NVML's utilisation counts it (see the formula); 0 with no task running.
    """

    throughput_sps: np.ndarray
    iteration_s: np.ndarray
    peak_memory_bytes: np.ndarray
    oom: np.ndarray
    device_utilisation: np.ndarray
    host_step_s: np.ndarray
    gpu_busy_fraction: np.ndarray


def _smooth_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a**SMOOTH_MAX_P + b**SMOOTH_MAX_P) ** (1.0 / SMOOTH_MAX_P)


def _device_field(device: DeviceSpec, field: str, lead_shape: tuple[int, ...]) -> np.ndarray:
    value = np.asarray(getattr(device, field), dtype=float)
    if value.ndim:
        try:
            np.broadcast_shapes(value.shape, lead_shape)
        except ValueError:
            raise ValueError(
                f"device field {field!r} has shape {value.shape}, which does not broadcast "
                f"with the configurations' leading shape {lead_shape}"
            ) from None
        value = value[..., None]  # against the task axis
    return value


def _check_inputs(present: np.ndarray, **arrays: np.ndarray) -> None:
    rules: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
        "flops_per_sample": (lambda x: x >= 0, ">= 0"),
        "activation_bytes_per_sample": (lambda x: x >= 0, ">= 0"),
        "param_bytes": (lambda x: x >= 0, ">= 0"),
        "layers": (lambda x: x >= 1, ">= 1"),
        "batch_size": (lambda x: x >= 1, ">= 1"),
        "share": (lambda x: (x > 0) & (x <= 100), "in (0, 100] percent"),
        "ops_per_step": (lambda x: x >= 0, ">= 0"),
    }
    for name, (ok, text) in rules.items():
        values = arrays[name]
        bad = present & ~(np.isfinite(values) & ok(values))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{name} must be finite and {text} for every present task; got {values[where]!r} at index {where}"
            )


class _TaskColumns(TypedDict):
    """The per-task inputs of :func:`simulate_throughput`, shape ``(I,)`` each."""

    flops_per_sample: np.ndarray
    activation_bytes_per_sample: np.ndarray
    param_bytes: np.ndarray
    layers: np.ndarray
    batch_size: np.ndarray
    share: np.ndarray
    ops_per_step: np.ndarray
    graphs: np.ndarray


class _Measured(TypedDict, total=False):
    """What a simulated profiling measurement reports besides its task (see ProfileMeasurement)."""

    throughput_sps: float
    peak_memory_bytes: int
    timed_iterations: int
    host_step_s: float
    gpu_busy_fraction: float
    error: str


def simulate_throughput(
    flops_per_sample: npt.ArrayLike,
    activation_bytes_per_sample: npt.ArrayLike,
    param_bytes: npt.ArrayLike,
    layers: npt.ArrayLike,
    batch_size: npt.ArrayLike,
    share: npt.ArrayLike,
    device: DeviceSpec,
    *,
    partitioning: str = "mps",
    present: npt.ArrayLike | None = None,
    noise: npt.ArrayLike | None = None,
    inference: bool = False,
    ops_per_step: npt.ArrayLike = 0,
    graphs: npt.ArrayLike = False,
) -> MixPrediction:
    """Predict every co-located task's training throughput on a device, for many mixes at once.

    Inputs are broadcast together to shape ``(..., I)``: leading axes are independent
    configurations (mixes, devices), the last axis the ``I`` tasks co-located in one
    configuration (pad with ``present=False``). The model, step by step: memory and who is
    refused for lack of it (:func:`_admit`); each task's work, traffic, efficiencies, device
    time and host launch time (:class:`_TaskTerms`, units there); the iteration time under
    contention, ``partitioning="mps"`` (:func:`_mps_times`: the paper's competitive sharing) or
    ``"timeslice"`` (:func:`_timeslice_times`: no MPS, one context at a time); throughput
    ``B / t`` multiplied by ``noise`` (e.g. :func:`noise_factors`) when given, and the GPU's busy
    fraction (:func:`_prediction`).

    Args:
        flops_per_sample: training FLOPs per sample (forward + backward), ``(..., I)``.
        activation_bytes_per_sample: bytes saved for the backward per sample.
        param_bytes: parameter bytes.
        layers: leaf modules per model, ``>= 1``.
        batch_size: samples per iteration, ``>= 1``.
        share: percent of the device's SMs, in ``(0, 100]``.
        device: the GPU; its numeric fields may be arrays over the leading axes.
        partitioning: ``"mps"`` or ``"timeslice"``.
        present: bool mask of the tasks that exist (default all).
        noise: multiplicative factors broadcastable to ``(..., I)`` (default none).
        inference: model a forward pass instead of a training step (one kernel per layer,
            parameters read once and held once, only two layers' activations live; the
            caller passes forward FLOPs): for checking the shape against inference
            measurements such as ``benchmarks/reference-data/parvagpu-a100``. The launch
            term is then always ``N·k_s`` (op counts are a training step's).
        ops_per_step: PyTorch operations per eager training step, ``>= 0`` (0: estimated
            from ``layers``).
        graphs: bool per task, True where the step runs as a CUDA graph replay.

    Returns:
        A :class:`MixPrediction`.

    Raises:
        ValueError: for inputs that do not broadcast, a configuration without a task axis,
            an unknown partitioning, or a present task with a value out of range (naming the
            argument and the index).
    """
    if partitioning not in ("mps", "timeslice"):
        raise ValueError(f"partitioning {partitioning!r} is unknown; allowed: 'timeslice', 'mps'")
    (F, A, P, N, B, R, C, G), present = _checked_inputs(
        present,
        flops_per_sample,
        activation_bytes_per_sample,
        param_bytes,
        layers,
        batch_size,
        share,
        ops_per_step,
        graphs,
    )
    lead = F.shape[:-1]
    dev = {f: _device_field(device, f, lead) for f in _NUMERIC_FIELDS}
    peak, oom = _admit(A, P, N, B, present, dev, inference=inference)
    run = present & ~oom
    terms = _TaskTerms.of(F, A, P, N, B, C, G, dev, inference=inference)
    if partitioning == "timeslice":
        D, stretch, t = _timeslice_times(terms, run, dev)
    else:
        D, stretch, t = _mps_times(terms, R, run)
    return _prediction(terms, run, B, D, stretch, t, peak, oom, noise=noise, partitioning=partitioning)


def _checked_inputs(
    present: npt.ArrayLike | None,
    flops_per_sample: npt.ArrayLike,
    activation_bytes_per_sample: npt.ArrayLike,
    param_bytes: npt.ArrayLike,
    layers: npt.ArrayLike,
    batch_size: npt.ArrayLike,
    share: npt.ArrayLike,
    ops_per_step: npt.ArrayLike,
    graphs: npt.ArrayLike,
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """:func:`simulate_throughput`'s per-task inputs as float arrays broadcast together (in this
    order), and the ``present`` mask broadcast to their shape (default all), values checked.

    Raises:
        ValueError: if they do not broadcast, give no task axis (0-d), or a present task has a
            value out of range (:func:`_check_inputs`).
    """
    arrays = (
        flops_per_sample,
        activation_bytes_per_sample,
        param_bytes,
        layers,
        batch_size,
        share,
        ops_per_step,
        graphs,
    )
    try:
        F, A, P, N, B, R, C, G = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in arrays))
    except ValueError as exc:
        raise ValueError(f"simulate_throughput inputs do not broadcast: {exc}") from None
    if F.ndim == 0:
        raise ValueError("simulate_throughput needs a task axis: pass arrays of shape (..., I)")
    shape = F.shape
    present = np.ones(shape, dtype=bool) if present is None else np.broadcast_to(np.asarray(present, dtype=bool), shape)
    _check_inputs(
        present,
        flops_per_sample=F,
        activation_bytes_per_sample=A,
        param_bytes=P,
        layers=N,
        batch_size=B,
        share=R,
        ops_per_step=C,
    )
    return (F, A, P, N, B, R, C, G), present


def _admit(
    A: np.ndarray,
    P: np.ndarray,
    N: np.ndarray,
    B: np.ndarray,
    present: np.ndarray,
    dev: dict[str, np.ndarray],
    *,
    inference: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Memory, and who is refused for lack of it (in task order, as processes would start).

    Task ``i`` holds ``context_bytes + 4·P + A·B`` [byte] at its peak (:data:`PARAM_MEMORY`;
    with ``inference`` ``P + 2·A·B/N``: parameters held once, two layers' activations live).
    Tasks are admitted in order; one that does not fit beside those admitted before it is out of
    memory (``oom``), gets NaN throughput and takes no part in the contention. Returns
    ``(peak, oom)``, shape ``(..., I)``; ``peak`` is 0 for an absent task.
    """
    shape = present.shape
    lead = shape[:-1]
    if inference:
        need = P + 2.0 * A * B / N
    else:
        need = PARAM_MEMORY * P + A * B
    peak = np.where(present, dev["context_bytes"] + need, 0.0)
    capacity = np.broadcast_to(dev["memory_bytes"], (*lead, 1))[..., 0]
    oom = np.zeros(shape, dtype=bool)
    held = np.zeros(np.broadcast_shapes(lead, capacity.shape))
    for i in range(shape[-1]):
        fits = held + peak[..., i] <= capacity
        oom[..., i] = present[..., i] & ~fits
        held = held + np.where(present[..., i] & fits, peak[..., i], 0.0)
    return peak, oom


@dataclass(frozen=True)
class _TaskTerms:
    """Each task's terms in :func:`simulate_throughput`'s model, shape ``(..., I)`` (units in
    brackets):

    - iteration work ``W = F·B`` [FLOP] (``F`` = ``flops_per_sample``, ``B`` = batch size);
      DRAM traffic ``Q = 2·A·B + 8·P`` [byte] (``A`` = saved activation bytes per sample,
      written forward and read backward; ``P`` = parameter bytes, see :data:`PARAM_TRAFFIC`);
    - share ``r = R/100`` of the SMs (MPS active-thread percentage ``R``);
    - parallel efficiency on that slice ``e = x / (x + h·r·T)``, where ``x = A·B/(4·N)`` are
      the float32 output elements of an average layer (``N`` = ``layers``), ``T`` = SMs ×
      resident threads per SM, ``h`` = :data:`WIDTH_HALF`: small batches cannot fill the
      device, and a smaller slice fills with less (the paper's "small operators leave SMs
      idle", Yu et al. 2022 §3.1);
    - kernel efficiency ``η = η_max · I / (I + I_½)`` with ``I = F / (3·A/4)`` the FLOPs per
      output element and pass (``F / (A/4)`` with ``inference``), i.e. the reduction length:
      long for VGG's 3×3 convolutions, short for 1×1 and depthwise ones; ``η_max`` =
      ``flops_efficiency``, ``I_½`` = :data:`INTENSITY_HALF`;
    - device time alone on the slice ``D = W/(η·F_peak·r·e) + Q/(BW·min(1, r/0.5))`` [s]
      (roofline terms added; a half-device slice draws the full bandwidth,
      :data:`BANDWIDTH_SATURATING_SHARE`), and its work in whole-device seconds
      ``v = W/(η·F_peak) + Q/BW``, so the task keeps ``a = v/D ≤ 1`` of the device busy;
    - host launch time, eager: ``L = O·h`` [s] on a device with a per-operation host time
      ``h`` = ``host_op_s > 0`` (``O`` = ``ops_per_step``, or :data:`OPS_PER_LAYER`·``N`` when
      0), else ``L = 3·N·k_s`` (three kernels per layer, ``k_s`` = ``kernel_s``). Under CUDA
      graphs (``graphs``) the step is one replay: ``L = g + 3·h`` (``g`` = ``graph_launch_s``;
      :data:`GRAPH_HOST_OPS` eager ops for the batch and its copies into the static inputs;
      ``h`` = ``kernel_s`` where ``host_op_s`` is 0), so the step takes the GPU's time.
      Consecutive kernels of one stream leave the device idle ``O·k_g`` [s] per step
      (``k_g`` = ``kernel_gap_s``, device-side launch latency): added to ``D``
      (:meth:`device_time`), not to the work ``v`` (co-located work may fill the gaps);
    - the host enqueues while the device runs, so an iteration takes the smooth maximum
      ``t = (L^p + (σ·D)^p)^(1/p)``, ``p`` = :data:`SMOOTH_MAX_P`, stretch ``σ ≥ 1``
      (:func:`_mps_times`, :func:`_timeslice_times`).
    """

    work: np.ndarray
    traffic: np.ndarray
    rate: np.ndarray
    """``η·F_peak`` [FLOP/s]."""
    launch: np.ndarray
    gaps: np.ndarray
    elements: np.ndarray
    slots: np.ndarray
    bandwidth: np.ndarray
    v: np.ndarray

    @classmethod
    def of(
        cls,
        F: np.ndarray,
        A: np.ndarray,
        P: np.ndarray,
        N: np.ndarray,
        B: np.ndarray,
        C: np.ndarray,
        G: np.ndarray,
        dev: dict[str, np.ndarray],
        *,
        inference: bool,
    ) -> _TaskTerms:
        """The terms of tasks with these inputs (as :func:`simulate_throughput` names them) on
        the device ``dev`` (its numeric fields over the leading axes)."""
        work = F * B
        traffic = ACTIVATION_TRAFFIC * A * B + (1.0 if inference else PARAM_TRAFFIC) * P
        kernels = 1.0 if inference else TRAIN_KERNELS_PER_LAYER
        with np.errstate(divide="ignore", invalid="ignore"):
            intensity = np.where(A > 0, F / (kernels * A / 4.0), np.inf)
            kernel_efficiency = np.where(np.isinf(intensity), 1.0, intensity / (intensity + INTENSITY_HALF))
        rate = dev["flops_efficiency"] * kernel_efficiency * dev["peak_flops"]
        host_op = dev["host_op_s"]
        if inference:  # op counts are a training step's: one kernel per layer, the per-layer host term
            ops = kernels * N
            launch = ops * dev["kernel_s"]
        else:
            ops = np.where(C > 0, C, OPS_PER_LAYER * N)
            eager_launch = np.where(host_op > 0, ops * host_op, kernels * N * dev["kernel_s"])
            graph_launch = dev["graph_launch_s"] + GRAPH_HOST_OPS * np.where(host_op > 0, host_op, dev["kernel_s"])
            launch = np.where(G != 0, graph_launch, eager_launch)
        return cls(
            work=work,
            traffic=traffic,
            rate=rate,
            launch=launch,
            gaps=ops * dev["kernel_gap_s"],
            elements=A * B / (4.0 * N),
            slots=dev["sms"] * dev["threads_per_sm"],
            bandwidth=dev["memory_bandwidth"],
            v=work / rate + traffic / dev["memory_bandwidth"],
        )

    def device_time(self, r: np.ndarray) -> np.ndarray:
        """``D`` [s] on a slice ``r`` of the SMs, kernel gaps included."""
        with np.errstate(divide="ignore", invalid="ignore"):
            # No activations says nothing about parallelism: treat the slice as filled.
            efficiency = np.where(self.elements > 0, self.elements / (self.elements + WIDTH_HALF * r * self.slots), 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            compute = np.where(self.work > 0, self.work / (self.rate * r * efficiency), 0.0)
        bandwidth = self.bandwidth * np.minimum(1.0, r / BANDWIDTH_SATURATING_SHARE)
        seconds: np.ndarray = compute + self.traffic / bandwidth + self.gaps
        return seconds


def _mps_times(terms: _TaskTerms, R: np.ndarray, run: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Device times ``D``, stretch ``σ`` (shape ``(...)``) and iteration times ``t`` [s] under MPS.

    The tasks' demand ``Σ v_i / t_i`` [device-seconds per second] may not exceed the capacity
    ``c = U + φ·(1 − U)``, where ``S = Σ r_i``, ``U = min(1, Σ a_i / max(1, S))`` is what the
    slices use without overlapping, and ``φ = ρ / (1 + γ·max(0, S − 1))`` (``ρ`` =
    :data:`RECLAIM`, ``γ`` = :data:`CONTENTION`) is how much of the idle rest co-located work can
    fill: some overlap fills idle SMs, more overlap fills less (the paper's competitive sharing,
    §3.1). ``σ`` is the smallest stretch ``≥ 1`` with ``Σ v_i / t_i(σ) ≤ c`` (bisection,
    :func:`_stretch`), common to all tasks of the configuration (each keeps its proportion of
    the device). A task alone is never stretched (``c ≥ a``); ``k`` identical tasks at 100 %
    together get between 1× and ``k``× one task's throughput; when all are device-bound
    ``σ → Σ a_i / c``: each share scaled down by about ``max(1, S)``, a little more as the
    overlap grows.
    """
    r = np.where(run, R / 100.0, 1.0)
    D = terms.device_time(r)
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.where(run & (D > 0), terms.v / D, 0.0)
    S = np.where(run, r, 0.0).sum(axis=-1)
    used = np.minimum(1.0, busy.sum(axis=-1) / np.maximum(1.0, S))
    reclaim = RECLAIM / (1.0 + CONTENTION * np.maximum(0.0, S - 1.0))
    cap = used + reclaim * (1.0 - used)
    stretch = _stretch(terms.v, terms.launch, D, run, cap, busy)
    return D, stretch, _smooth_max(terms.launch, stretch[..., None] * D)


def _timeslice_times(
    terms: _TaskTerms, run: np.ndarray, dev: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Device times ``D₁``, stretch ``σ`` (shape ``(...)``) and iteration times ``t`` [s] under
    time slicing (no MPS).

    Shares are ignored; each task's kernels run on the whole device (``r = 1``, device time
    ``D₁``) one context at a time, so the contexts' device times add up: ``Σ D₁_i / t_i ≤ 1 −
    overhead`` when ``k > 1`` tasks run (:attr:`DeviceSpec.timeslice_overhead` lost to context
    switches), with ``t_i = smooth_max(L_i, σ·D₁_i)`` and ``σ ≥ 1`` the smallest stretch that
    satisfies it. Device-bound tasks get ``t = t_alone · k / (1 − overhead)``, their turn of
    ``1/k``; host-bound ones barely slow down: the driver hands the idle device to whichever
    context has work, as measured on the H200 (``temporal`` ran each light-mix task at its
    alone speed, benchmarks/results/gpu_check_h200).
    """
    shape = run.shape
    lead = shape[:-1]
    D = terms.device_time(np.ones(shape))
    k = run.sum(axis=-1)
    cap = np.where(k > 1, 1.0 - np.broadcast_to(dev["timeslice_overhead"], (*lead, 1))[..., 0], 1.0)
    slots_used = np.where(run & (D > 0), 1.0, 0.0)
    stretch = _stretch(np.where(run, D, 0.0), terms.launch, D, run, cap, slots_used)
    return D, stretch, _smooth_max(terms.launch, stretch[..., None] * D)


def _prediction(
    terms: _TaskTerms,
    run: np.ndarray,
    B: np.ndarray,
    D: np.ndarray,
    stretch: np.ndarray,
    t: np.ndarray,
    peak: np.ndarray,
    oom: np.ndarray,
    *,
    noise: npt.ArrayLike | None,
    partitioning: str,
) -> MixPrediction:
    """:func:`simulate_throughput`'s answer from the iteration times ``t`` (NaN where a task does
    not run).

    Throughput ``B / t`` [samples/s], multiplied by ``noise`` when given. GPU busy fraction:
    task ``i`` keeps kernels running ``b_i = min(1, σ·(D_i − O_i·k_g)/t_i)`` of the time; under
    MPS the device is busy when any task is, ``1 − Π(1 − b_i)`` (independent tasks); under time
    slicing ``min(1, Σ b_i)``.
    """
    shape = run.shape
    t = np.where(run, t, np.nan)
    throughput = B / t
    if noise is not None:
        throughput = throughput * np.broadcast_to(np.asarray(noise, dtype=float), shape)
    with np.errstate(invalid="ignore"):
        utilisation = np.where(run, terms.v / t, 0.0).sum(axis=-1)
        kernels_running = np.where(run, np.minimum(1.0, stretch[..., None] * np.maximum(D - terms.gaps, 0.0) / t), 0.0)
    if partitioning == "timeslice":
        gpu_busy = np.minimum(1.0, kernels_running.sum(axis=-1))
    else:
        gpu_busy = 1.0 - np.prod(1.0 - kernels_running, axis=-1)
    return MixPrediction(
        throughput_sps=np.where(run, throughput, np.nan),
        iteration_s=t,
        peak_memory_bytes=peak,
        oom=oom,
        device_utilisation=utilisation,
        host_step_s=np.where(run, np.broadcast_to(terms.launch, shape), np.nan),
        gpu_busy_fraction=gpu_busy,
    )


def _stretch(
    v: np.ndarray, launch: np.ndarray, D: np.ndarray, run: np.ndarray, cap: np.ndarray, busy: np.ndarray
) -> np.ndarray:
    """Smallest ``σ >= 1`` with ``Σ_run v / smooth_max(L, σ·D) <= cap``, shape ``(...)``.

    The demand falls monotonically in ``σ`` and is at most ``Σ a / σ``, so the root lies in
    ``[1, max(1, Σ a / cap)]``; 50 halvings of its logarithm reach float precision. Only the
    configurations whose demand exceeds the capacity at ``σ = 1`` are searched.
    """
    tasks = v.shape[-1]
    lead = v.shape[:-1]
    v = np.where(run, v, 0.0).reshape(-1, tasks)
    D = np.where(run, D, 0.0).reshape(-1, tasks)
    launch = np.broadcast_to(launch, run.shape).reshape(-1, tasks)
    run = run.reshape(-1, tasks)
    cap = np.broadcast_to(cap, lead).reshape(-1)
    busy = np.broadcast_to(busy, run.shape).reshape(-1, tasks)

    def demand(sigma: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
        t = _smooth_max(launch[rows], sigma[:, None] * D[rows])
        with np.errstate(divide="ignore", invalid="ignore"):
            total: np.ndarray = np.where(run[rows] & (t > 0), v[rows] / t, 0.0).sum(axis=-1)
        return total

    sigma = np.ones(cap.shape)
    rows = np.flatnonzero(demand(sigma, slice(None)) > cap * (1.0 + 1e-12))
    if rows.size:
        limit = cap[rows]
        low = np.zeros(rows.size)
        high = np.log(np.maximum(1.0, busy[rows].sum(axis=-1) / limit))
        for _ in range(50):
            middle = 0.5 * (low + high)
            too_much = demand(np.exp(middle), rows) > limit
            low = np.where(too_much, middle, low)
            high = np.where(too_much, high, middle)
        sigma[rows] = np.exp(high)
    return sigma.reshape(lead)


def alone_throughput(
    workload: SimWorkload, batch_size: int, device: DeviceSpec, noise: float = 1.0, *, graphs: bool = False
) -> float | None:
    """Samples/s of one task alone on the whole device (``P_alone``, share 100), eager or as a
    CUDA graph replay (``graphs``).

    Returns:
        The throughput, or ``None`` if the task does not fit in the device's memory.
    """
    prediction = simulate_throughput(
        [workload.flops_per_sample],
        [workload.activation_bytes_per_sample],
        [workload.param_bytes],
        [workload.layers],
        [batch_size],
        [100],
        device,
        noise=[noise],
        ops_per_step=[workload.ops_per_step],
        graphs=[graphs],
    )
    return None if prediction.oom[0] else float(prediction.throughput_sps[0])


# ------------------------------------------------------------------------------ backend


def simulated_execution_mode(options: ExecutionOptions) -> Literal["eager", "graphs"]:
    """The mode the simulated backend models for ``options``: ``auto`` is ``graphs`` (the
    backend models a GPU, where ``auto`` captures the step), ``eager`` and ``graphs`` are as
    asked. A simulated capture never fails, so there is no fallback. ``precision`` and
    ``channels_last`` are not modelled: every figure is fp32's."""
    return "eager" if options.mode == "eager" else "graphs"


def _effective_batch(batch_size: int, count: int) -> int:
    """The trainer's batch: a shard smaller than the batch is one batch of the whole shard."""
    return max(1, min(batch_size, count))


def epoch_iterations(count: int, batch_size: int) -> int:
    """Iterations of one epoch over ``count`` samples, as :func:`workers.training.trainer.epoch_batches`
    cuts them: ``ceil(count / batch_size)``, less one when a trailing batch of a single sample
    is merged into the one before it."""
    batches = -(-count // batch_size)
    if batches >= 2 and count % batch_size == 1:
        batches -= 1
    return batches


def _timed_iterations(iterations: int, warmup_iterations: int) -> int:
    """How many iterations :func:`workers.training.trainer.steady_state` would time."""
    if iterations > warmup_iterations:
        return iterations - warmup_iterations
    return iterations - 1 if iterations >= 2 else iterations


def _gib(value: DeviceValue) -> str:
    return f"{float(value) / GIB:.2f} GiB"


class SimulatedBackend(AnalyticBackend):
    """Answers rounds, standalone measurements and profiling configurations from
    :func:`simulate_throughput` on one :class:`DeviceSpec`; see the module docstring.

    Args:
        device: the simulated GPU (default: ``MTFL_SIM_DEVICE``, see :func:`device_from_env`).
        time_scale: seconds slept per simulated second of a round (default:
            ``MTFL_SIM_TIME_SCALE``, see :func:`time_scale_from_env`).

    Raises:
        ValueError: naming the variable, for a bad ``MTFL_SIM_DEVICE`` or
            ``MTFL_SIM_TIME_SCALE``.
    """

    name = "simulated"

    def __init__(self, device: DeviceSpec | None = None, time_scale: float | None = None) -> None:
        self.device = device_from_env() if device is None else device
        self.time_scale = time_scale_from_env() if time_scale is None else time_scale
        self._digests: dict[tuple[int, int, int, int], str] = {}

    def describe(self) -> dict[str, object]:
        """The simulated GPU: its preset name, memory and SMs (its allocation units)."""
        return {
            "accelerator": self.device.name,
            "memory_bytes": int(self.device.memory_bytes),
            "allocation_units": int(self.device.sms),
        }

    def check_available(self) -> None:
        """Nothing to check: the model needs only NumPy, which importing this module already
        required; no GPU, CUDA, MPS daemon or CPU affinity. (Workload features build the
        models on torch's meta device, which needs no accelerator either.)"""

    # ------------------------------------------------------------------------------ rounds

    def run_round(self, request: TrainRoundRequest, ctx: AgentContext) -> DeviceRoundResult:
        """Simulate a device's round: no training, the global weights passed through.

        Each assignment trains ``E·n`` samples (``E`` = ``local_epochs``, ``n`` = shard
        count). The co-located mix is simulated in phases: all tasks run at the mix's
        throughput until the first finishes its samples, then the rest run as a smaller mix,
        and so on (as real trainers speed up when a neighbour ends). Each assignment runs in
        the mode its ``execution`` resolves to (:func:`simulated_execution_mode`: ``auto`` is
        CUDA graphs), reported as ``execution_mode``. ``seconds`` is when a
        task finished, ``throughput_sps = E·n / seconds``; ``started_at`` is now for all,
        ``finished_at = started_at + seconds`` (virtual: nothing sleeps unless
        ``time_scale > 0``). ``iterations`` and ``timed_iterations`` are what the trainer
        would count; ``train_loss`` is ``None``. ``output_weights`` receives
        ``global_weights`` unchanged (a hard link, or a copy across file systems; FedAvg of
        copies is the global model again), with its SHA-256.

        Failures are data, as on a real device, where one trainer's failure ends the device's
        round: a missing global model or a task that does not fit in memory fails that task
        and stops the others (``status="failed"``, ``error`` naming the task).

        Returns:
            The :class:`DeviceRoundResult`, ``simulated=True`` on it and every assignment.
        """
        failed = functools.partial(device_round_failed, request, ctx, simulated=True)
        problem = round_request_problem(request, ctx)
        if problem:
            return failed(problem)
        if not request.assignments:
            return _round_succeeded(request, ctx)

        assignments = request.assignments
        store = LocalArtifactStore(ctx.artifact_root)
        workloads, errors = _round_workloads(assignments, store)
        if errors:
            return _failed_round(failed, assignments, errors)
        arrays, noise, modes = _round_columns(request, ctx, workloads)
        first = simulate_throughput(**arrays, device=self.device, partitioning=request.partitioning, noise=noise)
        if first.oom.any():
            return _failed_round(failed, assignments, _oom_errors(first, self.device))

        counts = np.array([a.shard.count for a in assignments])
        samples = counts * np.array([a.local_epochs for a in assignments])
        seconds = _phased_seconds(samples.astype(float), arrays, self.device, request.partitioning, noise)
        started_at = time.time()
        if self.time_scale > 0 and not self._sleep(float(seconds.max()) * self.time_scale):
            why = "agent shutting down" if shutdown_requested() else cancel_requested() or "cancelled"
            return failed(
                why,
                [
                    AssignmentResult(
                        assignment_id=a.assignment_id,
                        task_id=a.task.task_id,
                        status="failed",
                        error=why,
                        simulated=True,
                    )
                    for a in assignments
                ],
            )
        timing = _RoundTiming(counts, arrays["batch_size"], samples, seconds, started_at)
        results = self._round_results(request, store, timing, modes, errors)
        if errors:
            return _failed_round(failed, assignments, errors)
        return _round_succeeded(request, ctx, results)

    def _round_results(
        self,
        request: TrainRoundRequest,
        store: LocalArtifactStore,
        timing: _RoundTiming,
        modes: list[Literal["eager", "graphs"]],
        errors: dict[int, str],
    ) -> list[AssignmentResult]:
        """Each assignment's result once the round's time has passed, its ``output_weights``
        passed through (:meth:`_pass_through`); an assignment whose weights cannot be written
        gets an entry in ``errors`` (by index) instead of a result."""
        results = []
        for k, assignment in enumerate(request.assignments):
            try:
                sha = self._pass_through(store, assignment.output_weights, store.path(assignment.global_weights))
            except (OSError, ValueError) as exc:
                errors[k] = f"cannot write output_weights: {type(exc).__name__}: {exc}"
                continue
            counts, batches, samples, seconds = timing.counts, timing.batches, timing.samples, timing.seconds
            iterations = epoch_iterations(int(counts[k]), int(batches[k])) * assignment.local_epochs
            trained = samples[k] > 0
            results.append(
                AssignmentResult(
                    assignment_id=assignment.assignment_id,
                    task_id=assignment.task.task_id,
                    status="succeeded",
                    samples_trained=int(samples[k]),
                    iterations=iterations if trained else 0,
                    timed_iterations=_timed_iterations(iterations, request.warmup_iterations) if trained else 0,
                    seconds=float(seconds[k]),
                    throughput_sps=float(samples[k] / seconds[k]) if trained else None,
                    train_loss=None,
                    started_at=timing.started_at,
                    finished_at=timing.started_at + float(seconds[k]),
                    weights=assignment.output_weights,
                    weights_sha256=sha,
                    execution_mode=modes[k],
                    simulated=True,
                )
            )
        return results

    def _pass_through(self, store: LocalArtifactStore, key: str, source: Path) -> str:
        """Store the global weights ``source`` unchanged under ``key``; return their SHA-256.

        A hard link where the file system allows it, else a copy: every artifact write is an
        atomic replace (never an in-place change), so the two names keep the same bytes. The
        digest of a file already hashed (same device, inode, size and mtime: the same bytes)
        is reused, so a thousand devices fed one global model hash it once, not a thousand
        times.

        Raises:
            OSError: ``source`` cannot be read or ``key`` cannot be written.
        """
        with atomic_write_path(store.path(key)) as tmp:
            tmp.unlink()
            try:
                os.link(source, tmp)
            except FileNotFoundError:
                raise
            except OSError:  # another file system, or links not allowed: copy
                shutil.copyfile(source, tmp)
            stat = tmp.stat()
            ident = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            digest = self._digests.get(ident)
            if digest is None:
                if len(self._digests) >= 1024:
                    self._digests.clear()
                digest = self._digests[ident] = sha256_file(tmp)
        return digest

    @staticmethod
    def _sleep(seconds: float) -> bool:
        """Sleep, waking for shutdown or a cancellation; False if either came."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if shutdown_requested() or cancel_requested() is not None:
                return False
            time.sleep(min(0.1, left))
        return not shutdown_requested() and cancel_requested() is None

    # -------------------------------------------------------------------------- standalone

    def measure_standalone(self, request: StandaloneRequest, ctx: AgentContext) -> StandaloneResult:
        """Each item's simulated throughput alone on the whole device (share 100), in the mode
        its ``execution`` resolves to (:func:`simulated_execution_mode`), reported as
        ``execution_mode``.

        The batch is ``min(batch_size, shard.count)`` as the trainer uses it; the noise is
        seeded by ``(run_id, -1, device, task_id)``. An empty shard or a task too large for the
        device's memory is that item's ``error`` (and ``status="failed"``).

        Returns:
            The :class:`StandaloneResult`, ``simulated=True`` on it and every measurement.
        """

        def failed(error: str) -> StandaloneResult:
            return StandaloneResult(
                run_id=request.run_id, device=ctx.device, status="failed", error=error, simulated=True
            )

        if shutdown_requested():
            return failed("agent shutting down: measurement refused")
        if request.device != ctx.device:
            return failed(f"request for device {request.device!r} reached agent {ctx.device!r}")
        measurements = []
        errors = []
        for item in request.items:
            task = item.task
            error = ""
            throughput = None
            if item.shard.count == 0:
                error = "ValueError: shard.count is 0: nothing to measure"
            else:
                try:
                    workload = _task_workload(task)
                except ValueError as exc:
                    error = f"ValueError: {exc}"
                else:
                    noise = noise_factors(request.run_id, -1, ctx.device, [task.task_id])[0]
                    throughput = alone_throughput(
                        workload,
                        _effective_batch(item.batch_size, item.shard.count),
                        self.device,
                        float(noise),
                        graphs=simulated_execution_mode(item.execution) == "graphs",
                    )
                    if throughput is None:
                        error = (
                            f"CUDA out of memory (simulated): batch {item.batch_size} "
                            f"does not fit in {self.device.name}'s "
                            f"{_gib(self.device.memory_bytes)}"
                        )
            if error:
                errors.append(f"task {task.task_id} ({task.name}): {error}")
            measurements.append(
                StandaloneMeasurement(
                    task_id=task.task_id,
                    batch_size=item.batch_size,
                    throughput_sps=throughput,
                    execution_mode=simulated_execution_mode(item.execution),
                    error=error,
                    simulated=True,
                )
            )
        return StandaloneResult(
            run_id=request.run_id,
            device=ctx.device,
            status="failed" if errors else "succeeded",
            error="; ".join(errors),
            measurements=measurements,
            simulated=True,
        )

    # --------------------------------------------------------------------------- profiling

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
        """Simulate one profiling configuration (MPS shares) and what measuring it would cost.

        Throughputs are :func:`simulate_throughput`'s for the mix, in the mode
        ``request.execution`` resolves to (:func:`simulated_execution_mode`), with noise seeded
        by ``(request.seed, config_index, device, task index)`` (a repeat draws new noise, as a
        re-measurement would). Each measurement carries that ``execution_mode``, the modelled
        ``host_step_s`` (the task's launch term) and the configuration's ``gpu_busy_fraction``. The virtual cost mirrors
        :func:`workers.profiling.sweep.measure_configuration`: :data:`PROFILE_STARTUP_S`, then
        ``warmup_iterations`` of the slowest task, then a window of
        ``max(min_window_s, (min_timed_iterations + 1) · t_max)`` and one more ``t_max`` to
        finish after STOP (``t_max`` = the slowest iteration). Each task's
        ``timed_iterations`` is the window over its iteration time. A configuration costing
        more than ``config_timeout_s`` fails as timed out (charged ``config_timeout_s``); one
        that does not fit in memory, or cannot be simulated, fails at start (charged the
        start-up): every answer costs at least :data:`PROFILE_STARTUP_S`.

        Returns:
            See :meth:`AnalyticBackend.profile_configuration`; ``peak_memory_bytes`` is the
            modelled device memory.
        """
        mode = simulated_execution_mode(request.execution)
        config = _SimulatedConfig(tasks, request, ctx, config_index, repeat_of, started_at, mode)
        # Every answer costs virtual time, failures too: a sweep's clock must always advance.
        if not tasks:
            return config.result("failed", [], PROFILE_STARTUP_S, "a configuration needs at least one task")
        try:
            prediction = simulate_configuration(
                request, tasks, self.device, device_name=ctx.device, config_index=config_index
            )
        except ValueError as exc:
            error = f"cannot simulate the configuration: {exc}"
            return config.result(
                "failed", [config.measurement(k, error=error) for k in range(len(tasks))], PROFILE_STARTUP_S, error
            )

        peaks = [int(p) for p in prediction.peak_memory_bytes]
        if prediction.oom.any():
            oom = _oom_errors(prediction, self.device)
            errors = {k: oom.get(k, "not measured: another task failed") for k in range(len(tasks))}
            return config.result(
                "failed",
                [config.measurement(k, peak_memory_bytes=peaks[k], error=errors[k]) for k in range(len(tasks))],
                PROFILE_STARTUP_S,
                "; ".join(
                    f"task {k} ({tasks[k].architecture}, batch {tasks[k].batch_size}, "
                    f"{tasks[k].active_thread_percentage} %): {oom[k]}"
                    for k in sorted(oom)
                ),
            )
        return _timed_configuration(config, prediction, peaks)


# ------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class _SimulatedConfig:
    """One simulated profiling configuration (:meth:`SimulatedBackend.profile_configuration`):
    what its result and each of its measurements repeat whatever the outcome."""

    tasks: Sequence[ProfileTaskSpec]
    request: ProfileSweepRequest
    ctx: AgentContext
    config_index: int
    repeat_of: int | None
    started_at: float
    """Virtual Unix time the configuration starts."""
    mode: Literal["eager", "graphs"]

    def result(
        self, status: AssignmentStatus, measurements: list[ProfileMeasurement], cost: float, error: str = ""
    ) -> ProfileConfigResult:
        """The configuration's result, finished ``cost`` virtual seconds after it started."""
        return ProfileConfigResult(
            sweep_id=self.request.sweep_id,
            device=self.ctx.device,
            backend=self.request.backend,
            config_index=self.config_index,
            repeat_of=self.repeat_of,
            tasks=list(self.tasks),
            measurements=measurements,
            started_at=self.started_at,
            finished_at=self.started_at + cost,
            status=status,
            error=error,
            simulated=True,
        )

    def measurement(self, k: int, **values: Unpack[_Measured]) -> ProfileMeasurement:
        """Task ``k``'s measurement with these values."""
        task = self.tasks[k]
        return ProfileMeasurement(
            task_index=k,
            architecture=task.architecture,
            batch_size=task.batch_size,
            active_thread_percentage=task.active_thread_percentage,
            execution_mode=self.mode,
            simulated=True,
            **values,
        )


def _timed_configuration(config: _SimulatedConfig, prediction: MixPrediction, peaks: list[int]) -> ProfileConfigResult:
    """A simulated configuration that fits in memory, timed as measuring it would be (the cost
    :meth:`SimulatedBackend.profile_configuration` describes); failed as timed out when that
    cost passes ``config_timeout_s``."""
    request, tasks = config.request, config.tasks
    iteration = prediction.iteration_s
    slowest = float(iteration.max())
    window = max(request.min_window_s, (request.min_timed_iterations + 1) * slowest)
    cost = PROFILE_STARTUP_S + request.warmup_iterations * slowest + window + slowest
    if cost > request.config_timeout_s:
        error = "timed out while training (config_timeout_s exceeded)"
        return config.result(
            "failed",
            [config.measurement(k, peak_memory_bytes=peaks[k], error=error) for k in range(len(tasks))],
            request.config_timeout_s,
            "; ".join(
                f"task {k} ({t.architecture}, batch {t.batch_size}, {t.active_thread_percentage} %): {error}"
                for k, t in enumerate(tasks)
            ),
        )
    return config.result(
        "succeeded",
        [
            config.measurement(
                k,
                throughput_sps=float(prediction.throughput_sps[k]),
                peak_memory_bytes=peaks[k],
                timed_iterations=max(request.min_timed_iterations, int(window // iteration[k])),
                host_step_s=float(prediction.host_step_s[k]),
                gpu_busy_fraction=float(prediction.gpu_busy_fraction),
            )
            for k in range(len(tasks))
        ],
        cost,
    )


def _task_workload(task: TaskRef) -> SimWorkload:
    """The task's model at the task's classes and input shape (``TaskRef.input_shape``)."""
    return simulation_workload(task.architecture, task.num_classes, task.input_shape)


def _assignment_workload(assignment: AssignmentSpec) -> SimWorkload:
    return _task_workload(assignment.task)


def _oom_errors(prediction: MixPrediction, device: DeviceSpec) -> dict[int, str]:
    """Per out-of-memory task (index), the error a CUDA allocator would have raised."""
    peaks = prediction.peak_memory_bytes
    errors = {}
    held = 0.0
    for k, (peak, refused) in enumerate(zip(peaks, prediction.oom, strict=True)):
        if refused:
            errors[k] = (
                f"CUDA out of memory (simulated): needs {_gib(peak)} with {_gib(held)} "
                f"held by the tasks before it; {device.name} has "
                f"{_gib(device.memory_bytes)}"
            )
        else:
            held += float(peak)
    return errors


def _round_succeeded(
    request: TrainRoundRequest, ctx: AgentContext, results: list[AssignmentResult] | None = None
) -> DeviceRoundResult:
    """A simulated device round that succeeded, with these assignments' results (none given:
    a round without assignments)."""
    if results is None:
        return DeviceRoundResult(
            run_id=request.run_id,
            round_id=request.round_id,
            device=ctx.device,
            status="succeeded",
            host=socket.gethostname(),
            simulated=True,
        )
    return DeviceRoundResult(
        run_id=request.run_id,
        round_id=request.round_id,
        device=ctx.device,
        status="succeeded",
        host=socket.gethostname(),
        assignments=results,
        simulated=True,
    )


def _round_workloads(
    assignments: Sequence[AssignmentSpec], store: LocalArtifactStore
) -> tuple[list[SimWorkload], dict[int, str]]:
    """Each assignment's workload, once its global model is found in ``store``; errors by
    assignment index for those whose model is missing or whose workload cannot be built (the
    workloads are then incomplete and not to be used)."""
    errors: dict[int, str] = {}
    workloads: list[SimWorkload | None] = []
    for k, assignment in enumerate(assignments):
        workload = None
        try:
            path = store.path(assignment.global_weights)
            if not path.is_file():
                raise FileNotFoundError(f"global_weights {assignment.global_weights!r} not found at {path}")
            workload = _assignment_workload(assignment)
        except (OSError, ValueError) as exc:
            errors[k] = f"{type(exc).__name__}: {exc}"
        workloads.append(workload)
    return [w for w in workloads if w is not None], errors


def _round_columns(
    request: TrainRoundRequest, ctx: AgentContext, loaded: list[SimWorkload]
) -> tuple[_TaskColumns, np.ndarray, list[Literal["eager", "graphs"]]]:
    """A round's assignments as :func:`simulate_throughput`'s inputs (the batch as the trainer
    uses it, :func:`_effective_batch`), their noise (seeded by ``(seed, round_index, device,
    task_id)``) and their execution modes."""
    assignments = request.assignments
    batches = np.array([_effective_batch(a.batch_size, a.shard.count) for a in assignments])
    noise = np.array([noise_factors(a.seed, request.round_index, ctx.device, [a.task.task_id])[0] for a in assignments])
    modes = [simulated_execution_mode(a.execution) for a in assignments]
    arrays = _TaskColumns(
        flops_per_sample=np.array([w.flops_per_sample for w in loaded]),
        activation_bytes_per_sample=np.array([w.activation_bytes_per_sample for w in loaded]),
        param_bytes=np.array([w.param_bytes for w in loaded]),
        layers=np.array([w.layers for w in loaded]),
        batch_size=batches,
        share=np.array([a.active_thread_percentage for a in assignments]),
        ops_per_step=np.array([w.ops_per_step for w in loaded]),
        graphs=np.array([m == "graphs" for m in modes]),
    )
    return arrays, noise, modes


class _RoundTiming(NamedTuple):
    """A simulated round's numbers per assignment, shape ``(I,)`` each."""

    counts: np.ndarray
    """Shard sizes [samples]."""
    batches: np.ndarray
    """Batch sizes as the trainer uses them."""
    samples: np.ndarray
    """Samples trained: ``local_epochs · count``."""
    seconds: np.ndarray
    """When each task finished [s after ``started_at``]."""
    started_at: float
    """Unix time the round started."""


def _failed_round(
    failed: Callable[[str, list[AssignmentResult]], DeviceRoundResult],
    assignments: Sequence[AssignmentSpec],
    errors: dict[int, str],
) -> DeviceRoundResult:
    """The device's round failed because of ``errors`` (by assignment index): those tasks
    fail with their error, the others are stopped, as a real device kills them."""

    def label(assignment: AssignmentSpec) -> str:
        return f"task {assignment.task.task_id} ({assignment.task.name})"

    culprits = ", ".join(label(assignments[k]) for k in sorted(errors))
    results = [
        AssignmentResult(
            assignment_id=a.assignment_id,
            task_id=a.task.task_id,
            status="failed",
            error=errors.get(k, f"stopped because {culprits} failed on this device"),
            simulated=True,
        )
        for k, a in enumerate(assignments)
    ]
    return failed("; ".join(f"{label(assignments[k])}: {errors[k]}" for k in sorted(errors)), results)


def _phased_seconds(
    samples: np.ndarray, arrays: _TaskColumns, device: DeviceSpec, partitioning: str, noise: np.ndarray
) -> np.ndarray:
    """Seconds until each task has trained its ``samples``, the mix shrinking as tasks finish.

    Tasks with nothing to train take 0 s and never join the mix.
    """
    finish = np.zeros(len(samples))
    left = samples.copy()
    active = left > 0
    now = 0.0
    while active.any():
        rate = simulate_throughput(
            **arrays, device=device, partitioning=partitioning, present=active, noise=noise
        ).throughput_sps
        step = np.min(np.where(active, left / np.where(active, rate, 1.0), np.inf))
        now += step
        left = np.where(active, left - rate * step, left)
        # Relative tolerance: tasks finishing together leave the mix together.
        done = active & (left <= samples * 1e-9)
        finish[done] = now
        active &= ~done
    return finish


def simulate_configuration(
    request: ProfileSweepRequest,
    tasks: Sequence[ProfileTaskSpec],
    device: DeviceSpec,
    *,
    device_name: str,
    config_index: int,
    partitioning: str = "mps",
) -> MixPrediction:
    """The simulator's answer for one profiled configuration: ``tasks`` co-located on
    ``device`` at their batch sizes and shares (``partitioning="timeslice"``: taking turns,
    shares ignored), in the sweep's execution mode, with the sweep's seeded noise
    (:func:`noise_factors` of ``(request.seed, config_index, device_name)``).

    Raises:
        ValueError: a configuration the model cannot answer (as :func:`simulate_throughput`).
    """
    graphs = simulated_execution_mode(request.execution) == "graphs"
    shapes = [request.workload_shape(t.architecture) for t in tasks]
    workloads = [
        simulation_workload(t.architecture, shape.num_classes, shape.input_shape)
        for t, shape in zip(tasks, shapes, strict=True)
    ]
    return simulate_throughput(
        [w.flops_per_sample for w in workloads],
        [w.activation_bytes_per_sample for w in workloads],
        [w.param_bytes for w in workloads],
        [w.layers for w in workloads],
        [t.batch_size for t in tasks],
        [100 if partitioning == "timeslice" else t.active_thread_percentage for t in tasks],
        device,
        partitioning=partitioning,
        noise=noise_factors(request.seed, config_index, device_name, range(len(tasks))),
        ops_per_step=[w.ops_per_step for w in workloads],
        graphs=graphs,
    )


__all__ = [
    "simulate_configuration",
    "DEFAULT_DEVICE",
    "DEVICE_PRESETS",
    "ENV_DEVICE",
    "ENV_TIME_SCALE",
    "DeviceSpec",
    "MixPrediction",
    "SimWorkload",
    "SimulatedBackend",
    "alone_throughput",
    "device_from_env",
    "device_spec",
    "epoch_iterations",
    "noise_factors",
    "simulate_throughput",
    "simulated_execution_mode",
    "simulation_workload",
    "stack_devices",
    "time_scale_from_env",
]
