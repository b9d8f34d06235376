"""Message schemas exchanged over Celery between the control plane and device agents.

Every message is plain JSON on the wire (Celery's JSON serializer); these pydantic models
validate it at both ends. Units: throughputs in samples per second (``*_sps``), durations in
seconds (``*_s``), timestamps in Unix seconds (float, the host's wall clock), shares in percent
of the device (``active_thread_percentage``, integer 1-100). Results carry ``simulated=True``
when the ``simulated`` backend produced them: their throughputs come from a model, and their
durations and timestamps are virtual (a simulated round of an hour takes no time).

Model, data set, backend and aggregator names are plain strings marked :class:`RegisteredName`: this module
checks only their shape and imports no registry (it depends on pydantic, the standard library and
nothing else of the project). They are checked against the registries where a message is built or
received (:func:`workers.registry.names.check_names`), so a plug-in's name passes the wire on a
host that has the plug-in. This module imports neither torch nor Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIB = 1 << 20


@dataclass(frozen=True)
class RegisteredName:
    """Marks a ``str`` field as the name of a registry entry (``Annotated[str, RegisteredName(...)]``).

    pydantic ignores the marker; :func:`workers.registry.names.check_names` finds it and looks the
    name up in the registry of ``kind``.

    Attributes:
        kind: which registry: ``"model"``, ``"dataset"`` or ``"backend"``.
        field: the name an unknown name's error gives the field (``"architecture"``).
    """

    kind: str
    field: str


MAX_BATCH_SIZE = 4096
"""The largest batch size any message carries (samples per training step); the control plane's
``batch_size`` limit (:mod:`controlplane.common.limits`) reads it, so planner and wire agree."""

MAX_ACTIVE_THREAD_PERCENTAGE = 100
"""The largest MPS share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``): the whole device."""

Architecture = Annotated[str, RegisteredName("model", "architecture")]
"""A model name of :data:`workers.registry.models.MODEL_REGISTRY` (``"resnet18"``)."""

DatasetName = Annotated[str, RegisteredName("dataset", "dataset")]
"""A data set name of :data:`workers.registry.datasets.DATASET_REGISTRY` (``"digits"``)."""

InputShapeField = Annotated[
    tuple[Annotated[int, Field(ge=1, le=65_536)], ...],
    Field(min_length=1, max_length=4, description="shape of one sample, e.g. [3, 32, 32] or [20]"),
]
"""The shape of one sample of a task's data: 1 to 4 positive dimensions (an image is
``(channels, height, width)``, tabular data ``(features,)``)."""

DEFAULT_INPUT_SHAPE: tuple[int, ...] = (3, 32, 32)
"""The input shape of the built-in image data sets (and of a message that names none)."""

OptimizerName = Literal["sgd", "adam"]
OPTIMIZERS: tuple[str, ...] = OptimizerName.__args__  # type: ignore[attr-defined]

Partitioning = Literal["timeslice", "mps"]
"""How co-located trainers share a device.

``timeslice``: no partitioning; on a GPU the driver time-slices contexts, on the ``cpu`` backend
trainers take turns holding a per-device lock for each iteration, each using all the device's
cores while it holds it (the faithful CPU analogue of GPU time slicing, docs/DESIGN.md §2).
``mps``: each trainer gets its ``active_thread_percentage`` of the device (MPS on a GPU, a
thread count and core set on the ``cpu`` backend). Which backend realises which partitioning is
the table of :mod:`workers.registry.backends`.
"""

AggregatorName = Annotated[str, RegisteredName("aggregator", "aggregator")]
"""An aggregator name of :data:`workers.registry.aggregators.AGGREGATOR_REGISTRY` (``"fedprox"``)."""

BackendName = Annotated[str, RegisteredName("backend", "backend")]
"""An execution backend name of :data:`workers.registry.backends.BACKEND_REGISTRY` (``"cpu"``,
``"simulated"``, ``"cuda-mps"``, ``"cuda-timeslice"`` among the built-ins)."""


def _simulated_field() -> bool:
    return Field(
        default=False,
        description="True when the numbers come from the simulated backend's model, not from a "
        "measurement (timestamps and durations are then virtual)",
    )


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetRef(_Message):
    """Which data set a task trains on; ``root`` is a local folder (required for ``cifar10``)."""

    name: DatasetName = "digits"
    root: str | None = None


class OptimizerConfig(_Message):
    """Optimizer hyper-parameters of a task (SGD with momentum or Adam)."""

    name: OptimizerName = "sgd"
    learning_rate: float = Field(default=0.05, gt=0, le=10)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=5e-4, ge=0, le=1)


class TaskRef(_Message):
    """A learning task as the worker needs it: model, classes, data set, optimizer."""

    task_id: int
    name: str
    architecture: Architecture
    num_classes: int = Field(ge=2, le=100_000)
    dataset: DatasetRef
    optimizer: OptimizerConfig = OptimizerConfig()
    input_shape: InputShapeField = DEFAULT_INPUT_SHAPE


class ShardRef(_Message):
    """A device's shard of a task's training split.

    With ``indices`` (a partition rule that chose the samples, e.g. by label), the shard is
    those positions of the training split, :func:`workers.protocol.indices.decode_indices` of
    the string, ``count`` of them. Without, it is ``permutation[offset : offset + count]``
    where ``permutation`` is :func:`workers.training.partition.shard_indices`' seeded
    permutation of the training split.
    """

    permutation_seed: int = Field(ge=0)
    offset: int = Field(ge=0)
    count: int = Field(ge=0)
    indices: str | None = Field(
        default=None,
        max_length=64 << 20,
        description="the shard's sample positions, workers.protocol.indices.encode_indices; None: the window",
    )


ExecutionMode = Literal["auto", "eager", "graphs"]
"""How a trainer runs its training step: ``graphs`` captures the whole step (forward, loss,
backward, optimiser step) once per batch size as a CUDA graph and replays it; ``eager`` runs it
op by op; ``auto`` is ``graphs`` on the GPU backends and ``eager`` on ``cpu`` (and on
``simulated``, which models the mode it is told)."""

Precision = Literal["fp32", "bf16"]
"""``bf16``: the forward pass and loss under ``torch.autocast(dtype=torch.bfloat16)`` (GPU only)."""


class ExecutionOptions(_Message):
    """How a task's trainer executes its steps; the same for every strategy of a comparison
    (they are the task's), so speedups compare like with like."""

    mode: ExecutionMode = "auto"
    precision: Precision = "fp32"
    channels_last: bool = Field(default=False, description="4-D inputs and weights in torch.channels_last")


EXECUTED_MODES = ("eager", "graphs")
"""What a trainer reports it ran (``AssignmentResult.execution_mode``): never ``auto``."""


class AssignmentSpec(_Message):
    """One task on one device in one round: what the trainer process must do."""

    assignment_id: int
    task: TaskRef
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)
    active_thread_percentage: int = Field(ge=1, le=MAX_ACTIVE_THREAD_PERCENTAGE)
    shard: ShardRef
    local_epochs: int = Field(ge=1, le=1000)
    global_weights: str = Field(description="artifact key of the global model to start from")
    output_weights: str = Field(description="artifact key the trained weights are written to")
    seed: int = Field(default=0, ge=0, description="seeds data shuffling and dropout")
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="the optimizer's learning rate for this assignment, scaled to its batch size by the "
        "experiment's rule (controlplane.planning.lr_scaling); None: task.optimizer.learning_rate",
    )
    aggregator: AggregatorName | None = Field(
        default=None,
        max_length=100,
        description="the task's aggregator when it asks anything of trainers: the trainer builds the "
        "client term of that aggregator's registry record from client_options (fedprox: its proximal "
        "term); None: plain local steps",
    )
    client_options: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        max_length=64,
        description='the options the aggregator\'s record sends every trainer of the task (fedprox: {"mu": mu})',
    )
    memory_limit_bytes: int | None = Field(
        default=None,
        ge=MIB,
        le=1 << 50,
        description="device memory the trainer may pin, bytes (MPS: "
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, rounded up to MiB); None: no limit",
    )
    predicted_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        le=1 << 50,
        description="the planner's estimate of the trainer's peak device memory, bytes; a GPU "
        "device refuses a round whose trainers cannot fit together",
    )
    execution: ExecutionOptions = ExecutionOptions()

    @model_validator(mode="before")
    @classmethod
    def _read_proximal_mu(cls, data: Any) -> Any:
        """A message from before aggregators' trainer options were generic carried FedProx's mu
        as ``proximal_mu``: it is read as ``aggregator="fedprox"``, ``client_options={"mu": mu}``
        (0, the old default, as no aggregator: plain local steps)."""
        if isinstance(data, dict) and "proximal_mu" in data:
            data = dict(data)
            mu = data.pop("proximal_mu")
            # the old field's own bounds, so an old message is refused where it was before
            if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 <= mu <= 1000:
                raise ValueError(f"proximal_mu must be a number from 0 to 1000, got {mu!r}")
            if mu and "aggregator" not in data:
                data.update(aggregator="fedprox", client_options={"mu": mu})
        return data


def round_idempotency_key(round_id: int, device: str, attempt: int) -> str:
    """The idempotency key of one dispatch of a device's part of a round:
    ``round-<round_id>/<device>/attempt-<attempt>``.

    The control plane records at most one result per key and only the key of the device's
    current attempt, so a redelivered or retried device task is never counted twice in FedAvg.
    """
    return f"round-{round_id}/{device}/attempt-{attempt}"


class TrainRoundRequest(_Message):
    """Payload of :data:`workers.protocol.queues.TaskName.TRAIN_ROUND`: a device's part of one round.

    ``attempt`` counts the control plane's dispatches of this device's part (0 first, then one
    more per retry); ``idempotency_key`` is :func:`round_idempotency_key` of ``(round_id,
    device, attempt)``, echoed in the :class:`DeviceRoundResult`.
    """

    run_id: int
    round_id: int
    round_index: int = Field(ge=0)
    device: str
    backend: BackendName = "cpu"
    partitioning: Partitioning
    warmup_iterations: int = Field(default=2, ge=0, le=1000)
    assignments: list[AssignmentSpec]
    attempt: int = Field(default=0, ge=0, le=100)
    idempotency_key: str = Field(default="", max_length=200)


AssignmentStatus = Literal["succeeded", "failed"]


class AssignmentResult(_Message):
    """What one trainer process measured and produced.

    ``throughput_sps`` is steady-state: samples of the timed iterations (warm-up iterations
    excluded) over their wall-clock seconds, waits for the device included (time slicing makes a
    task wait; that is part of its throughput). ``seconds`` is the whole training span,
    ``finished_at - started_at``, measured after the start barrier.
    """

    assignment_id: int
    task_id: int
    status: AssignmentStatus
    error: str = ""
    samples_trained: int = Field(default=0, ge=0)
    iterations: int = Field(default=0, ge=0)
    timed_iterations: int = Field(default=0, ge=0)
    seconds: float | None = None
    throughput_sps: float | None = None
    train_loss: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    weights: str | None = None
    weights_sha256: str | None = None
    threads: int | None = None
    cores: list[int] | None = None
    torch_device: str | None = Field(default=None, description="where the trainer computed: 'cpu' or 'cuda'")
    peak_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="the trainer's peak memory, bytes: on a GPU what a pinned memory limit must allow, "
        "torch.cuda.max_memory_reserved plus the CUDA context; private (anonymous) resident memory on CPU",
    )
    visible_sm_count: int | None = Field(
        default=None,
        ge=0,
        description="streaming multiprocessors the trainer's CUDA context reported "
        "(torch.cuda.get_device_properties().multi_processor_count); None on CPU",
    )
    mps_active_thread_percentage: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="the share MPS applied to this trainer as the trainer saw it: visible_sm_count as a "
        "percentage of the GPU's SMs; None when the trainer did not run under MPS or reported no SM count",
    )
    mps_verified: bool | None = Field(
        default=None,
        description="under MPS partitioning: True when the SM count the trainer saw shows MPS limited it "
        "to its active_thread_percentage (fewer SMs than the GPU has, within one TPC of the share's; at "
        "100 %, all SMs and the MPS server log shows it connected); None when not under MPS",
    )
    mps_detail: str = Field(default="", description="why mps_verified is False (or what was seen)")
    execution_mode: Literal["eager", "graphs"] | None = Field(
        default=None, description="how the trainer ran its steps (``auto`` resolved); None: it did not report"
    )
    execution_fallback: str = Field(
        default="",
        description="why the trainer ran eager although graphs were asked for (capture failed: the reason); "
        "empty when it ran what was asked",
    )
    simulated: bool = _simulated_field()


class GpuSample(_Message):
    """One whole-GPU telemetry sample taken by the agent through NVML during a round.

    Under MPS, NVML sees every trainer as the MPS server process, so these are device totals;
    per-task throughput always comes from the trainers (:class:`AssignmentResult`).

    Attributes:
        t: Unix seconds (the agent host's wall clock) the sample was taken.
        gpu_util_percent: percent of the sample period during which one or more kernels ran
            on the GPU (``nvmlDeviceGetUtilizationRates().gpu``), 0-100.
        memory_used_bytes: device memory in use by all processes, bytes
            (``nvmlDeviceGetMemoryInfo().used``).
        memory_total_bytes: device memory, bytes.
    """

    t: float
    gpu_util_percent: int = Field(ge=0, le=100)
    memory_used_bytes: int = Field(ge=0)
    memory_total_bytes: int | None = Field(default=None, ge=0)


class DeviceRoundResult(_Message):
    """Return value of ``train_round``: failures are data (``status="failed"`` and ``error``).

    ``telemetry`` is the whole-GPU series a GPU backend sampled about once a second from just
    before its trainers started until they all ended (empty on ``cpu`` and ``simulated``, or
    when NVML could not be read; the agent logs why). ``mps_restarted`` says the agent
    restarted its MPS control daemon before this round because the device's previous
    dispatch failed (a fatal fault under MPS poisons every client of the server).
    """

    run_id: int
    round_id: int
    device: str
    status: AssignmentStatus
    error: str = ""
    host: str = ""
    assignments: list[AssignmentResult] = []
    telemetry: list[GpuSample] = []
    mps_restarted: bool = False
    simulated: bool = _simulated_field()
    attempt: int = Field(default=0, ge=0, le=100, description="the request's attempt, echoed")
    idempotency_key: str = Field(default="", max_length=200, description="the request's key, echoed")


class StandaloneItem(_Message):
    """One task to be measured alone on the whole device at a given batch size."""

    task: TaskRef
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)
    shard: ShardRef
    execution: ExecutionOptions = ExecutionOptions()


class StandaloneRequest(_Message):
    """Payload of :data:`workers.protocol.queues.TaskName.MEASURE_STANDALONE` (``P_alone``, docs/DESIGN.md §1)."""

    run_id: int
    device: str
    backend: BackendName = "cpu"
    warmup_iterations: int = Field(default=2, ge=0, le=1000)
    timed_iterations: int = Field(default=5, ge=1, le=10_000)
    items: list[StandaloneItem]


class StandaloneMeasurement(_Message):
    """``throughput_sps`` of one task alone on the device, or ``error`` when it failed."""

    task_id: int
    batch_size: int
    throughput_sps: float | None = None
    execution_mode: Literal["eager", "graphs"] | None = None
    execution_fallback: str = ""
    error: str = ""
    simulated: bool = _simulated_field()


class StandaloneResult(_Message):
    """Return value of ``measure_standalone``; failures are data."""

    run_id: int
    device: str
    status: AssignmentStatus
    error: str = ""
    measurements: list[StandaloneMeasurement] = []
    simulated: bool = _simulated_field()


class DeviceInventory(_Message):
    """What an agent reports about its device at start and on every heartbeat."""

    name: str
    backend: BackendName
    host: str
    cores: list[int] = Field(description="CPU cores the device may use (os.sched_getaffinity ids)")
    memory_bytes: int | None = None
    accelerator: str = Field(default="", description="the accelerator's model (a simulated preset, a GPU name)")
    allocation_units: int | None = Field(default=None, ge=1, description="what shares are granted in: SMs of a GPU")
    platform: str = ""
    python: str = ""
    torch_version: str = ""
    agent_version: str = ""
    gpu_uuid: str = Field(
        default="", description="the GPU's UUID (GPU-…), how trainers name it in CUDA_VISIBLE_DEVICES"
    )
    gpu_index: int | None = Field(default=None, ge=0, description="the GPU's NVML index on its host")
    driver_version: str = Field(default="", description="NVIDIA driver version, e.g. '550.54.15'")
    cuda_version: str = Field(default="", description="highest CUDA version the driver supports, e.g. '12.4'")
    sm_count: int | None = Field(default=None, ge=1, description="streaming multiprocessors of the GPU")
    compute_capability: str = Field(default="", description="e.g. '9.0'; empty when it could not be probed")
    compute_mode: str = Field(default="", description="NVML compute mode: Default, Exclusive_Process, Prohibited")
    mps_available: bool | None = Field(
        default=None, description="nvidia-cuda-mps-control is installed (None: not a GPU backend)"
    )
    agent_pid: int | None = Field(
        default=None,
        ge=1,
        description="the agent process's id on its host: a new one means the agent restarted (and lost the "
        "device task it was running)",
    )
    plugins: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="what this host can run, by kind ('models', 'datasets', 'partitioners'): name → the "
        "distribution providing it and its version ('mtfl-lab 0.1.0'); workers.registry.inventory",
    )


# --------------------------------------------------------------------------- workload features


class WorkloadFeatures(_Message):
    """Per-sample workload of a model at an input shape (docs/DESIGN.md §1: ``F_i``).

    FLOPs count a multiply-add as 2 FLOPs (``torch.utils.flop_counter``'s convention; published
    "GMACs" are half of ``forward_flops_per_sample``). Bytes are float32.
    """

    architecture: Architecture
    num_classes: int
    input_shape: InputShapeField = DEFAULT_INPUT_SHAPE
    forward_flops_per_sample: float = Field(ge=0)
    train_flops_per_sample: float = Field(ge=0, description="forward + backward")
    params: int = Field(ge=0)
    param_bytes: int = Field(ge=0)
    activation_bytes_per_sample: float = Field(ge=0, description="tensors saved for backward")
    ops_per_step: int | None = Field(
        default=None,
        ge=0,
        description="operations one training step dispatches (forward, loss, backward, per-parameter SGD step); "
        "None where not counted",
    )


# --------------------------------------------------------------------------- profiling sweeps


class ProfileTaskSpec(_Message):
    """One task of a co-located configuration: a model at a batch size and a share."""

    architecture: Architecture
    batch_size: int = Field(ge=2, le=MAX_BATCH_SIZE)
    active_thread_percentage: int = Field(ge=1, le=MAX_ACTIVE_THREAD_PERCENTAGE)


class WorkloadShape(_Message):
    """The classes and sample shape a model is built and fed at."""

    num_classes: int = Field(ge=2, le=100_000)
    input_shape: InputShapeField = DEFAULT_INPUT_SHAPE


class ProfileSweepRequest(_Message):
    """Payload of :data:`workers.protocol.queues.TaskName.PROFILE_SWEEP`: measure co-located mixes on a
    device for ``budget_s`` seconds (a space-filling design, not a grid).

    Each configuration is 1 to ``max_mix`` tasks drawn from ``architectures`` with batch sizes
    from ``batch_sizes`` and shares on a ``share_step`` grid in ``[share_min, 100]``. Every
    ``repeat_every``-th configuration repeats an earlier one, to measure the spread.
    """

    sweep_id: int
    device: str
    backend: BackendName = "cpu"
    budget_s: float = Field(ge=5, le=7 * 24 * 3600)
    architectures: list[Architecture] = Field(min_length=1)
    batch_sizes: list[Annotated[int, Field(ge=2, le=MAX_BATCH_SIZE)]] = Field(
        default=[16, 32, 64, 128, 256, 512], min_length=1
    )
    share_min: int = Field(default=10, ge=1, le=100)
    share_step: int = Field(default=5, ge=1, le=100)
    max_mix: int = Field(default=4, ge=1, le=8)
    warmup_iterations: int = Field(default=2, ge=0, le=100)
    min_timed_iterations: int = Field(default=3, ge=1, le=1000)
    min_window_s: float = Field(default=2.0, ge=0, le=600)
    config_timeout_s: float = Field(default=300.0, ge=1, le=24 * 3600)
    repeat_every: int = Field(default=8, ge=0, le=1000, description="0: no repeats")
    num_classes: int = Field(default=10, ge=2, le=100_000)
    seed: int = Field(default=0, ge=0)
    workloads: dict[str, WorkloadShape] = Field(
        default_factory=dict,
        description="architecture → the classes and input shape it is profiled at, for an architecture "
        "whose task is not (num_classes, [3, 32, 32]) (a plug-in model on tabular data, say)",
    )
    execution: ExecutionOptions = Field(
        default=ExecutionOptions(),
        description="how every profiled trainer runs its steps; a predictor is fitted on one execution "
        "mode's samples, so profile with the mode the rounds will use",
    )

    def workload_shape(self, architecture: str) -> WorkloadShape:
        """The classes and sample shape ``architecture`` is built and fed at in this sweep:
        ``workloads[architecture]`` when the request names one (a model whose task is not
        ``(num_classes, (3, 32, 32))``, e.g. a plug-in MLP on ``(20,)`` features), else
        ``num_classes`` and :data:`DEFAULT_INPUT_SHAPE`."""
        shape = self.workloads.get(architecture)
        if shape is not None:
            return shape
        return WorkloadShape(num_classes=self.num_classes, input_shape=DEFAULT_INPUT_SHAPE)


class ProfileMeasurement(_Message):
    """One task of one measured configuration.

    ``throughput_sps`` is the task's steady-state samples/s while all the configuration's tasks
    ran (warm-up excluded); ``standalone_sps`` is the same model and batch size alone on the
    whole device (``P_alone``); ``peak_memory_bytes`` is the process's peak (private resident memory on CPU,
    ``torch.cuda.max_memory_allocated`` on GPU). ``speed_index`` is how fast the task's cores
    executed while it was timed (:class:`workers.profiling.speed_probe.SpeedProbe`, millions of probe-loop
    iterations per CPU-second; ``cpu`` backend only): the predictor divides the throughput by
    it, relative to the median over its training samples, to take the host's speed changes out.
    ``cross_core_rtt_ns`` is the median round trip of a cache line between the task's cores
    while it was timed (:class:`workers.profiling.core_link_probe.CoreLinkProbe`, nanoseconds; ``cpu``
    backend, tasks on 2 or more cores only): a multi-threaded task slows down when the host
    places those cores far apart, and the predictor learns by how much.
    """

    task_index: int = Field(ge=0)
    architecture: Architecture
    batch_size: int
    active_thread_percentage: int
    throughput_sps: float | None = None
    standalone_sps: float | None = None
    peak_memory_bytes: int | None = None
    speed_index: float | None = Field(default=None, gt=0)
    cross_core_rtt_ns: float | None = Field(default=None, gt=0)
    timed_iterations: int = 0
    execution_mode: Literal["eager", "graphs"] | None = Field(
        default=None, description="how the trainer ran its steps; None: not reported"
    )
    host_step_s: float | None = Field(
        default=None,
        ge=0,
        description="host (CPU) seconds the trainer spent issuing one step, timed window mean: launch cost; "
        "on cpu, where the host does the work, the whole step",
    )
    gpu_busy_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="fraction of the timed window the GPU was busy (NVML utilisation, whole device); None on cpu",
    )
    error: str = ""
    simulated: bool = _simulated_field()


class ProfileConfigResult(_Message):
    """Everything measured for one configuration; sent to ``PROFILE_RECORD`` as soon as it is
    measured, so a sweep that dies keeps what it measured."""

    sweep_id: int
    device: str
    backend: BackendName = "cpu"
    config_index: int = Field(ge=0)
    repeat_of: int | None = Field(default=None, description="config_index this one repeats")
    tasks: list[ProfileTaskSpec]
    measurements: list[ProfileMeasurement]
    started_at: float
    finished_at: float
    status: AssignmentStatus
    error: str = ""
    simulated: bool = _simulated_field()


class ProfileSweepSummary(_Message):
    """Sent to ``PROFILE_DONE`` when a sweep ends (budget spent, failure or shutdown).

    ``repeat_spread`` is, for each repeated configuration, the largest relative difference of a
    task's throughput between the two measurements (``|a - b| / mean(a, b)``). On the
    ``simulated`` backend ``elapsed_s`` is simulated seconds (what measuring would have taken).
    """

    sweep_id: int
    device: str
    status: AssignmentStatus
    error: str = ""
    configs: int = 0
    samples: int = 0
    elapsed_s: float = 0.0
    repeat_spread: list[float] = []
    seconds_per_config: float | None = Field(
        default=None, ge=0, description="elapsed_s over configs: what one configuration cost, its set-up included"
    )
    simulated: bool = _simulated_field()
