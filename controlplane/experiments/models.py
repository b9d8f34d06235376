"""Experiment state: what is trained where (tasks, experiments, shards) and what happened
(runs, rounds, assignments, standalone throughputs, checkpoints).

Vocabulary (docs/DESIGN.md §2): an *experiment* is the setup; a *run* executes one strategy on it;
a *round* is one FL synchronisation cycle; an *assignment* is one task on one device in one round
(the allocation plan of a round is its set of assignments); a *checkpoint* is the global model of
a task after a round.

Strategy, model, data set and partition rule names are plain strings checked by the services
against their registries (:mod:`controlplane.planning.strategies`, :mod:`workers.registry`), so
a plug-in's names need no migration.
"""

from __future__ import annotations

from typing import get_args

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.common.limits import (
    ACTIVE_THREAD_PERCENTAGE,
    CLIENT_FRACTION,
    DEADLINE_FACTOR,
    DEVICE_RETRIES,
    KEEP_LAST_CHECKPOINTS,
    LOCAL_EPOCHS,
    PRIORITY,
    REPEATS,
    ROUNDS,
    Limit,
)
from controlplane.fleet.models import Device
from controlplane.planning.guard import UNTRUSTED_PREDICTOR_CHOICES
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING, LR_SCALING_RULES
from workers.protocol.messages import (
    DEFAULT_INPUT_SHAPE,
    EXECUTED_MODES,
    OPTIMIZERS,
    ExecutionMode,
    ExecutionOptions,
    Precision,
)

EXECUTION_MODES: tuple[str, ...] = get_args(ExecutionMode)
"""``Task.execution_mode`` choices: the values of :data:`workers.protocol.messages.ExecutionMode`."""
PRECISIONS: tuple[str, ...] = get_args(Precision)
"""``Task.precision`` choices: the values of :data:`workers.protocol.messages.Precision`."""
EXECUTION_HELP = (
    "; the task's, not a strategy's: every strategy of a comparison runs it so, and speedups compare like with like"
)

MAX_DEVICE_RETRIES = int(DEVICE_RETRIES.high)
CLIENT_SAMPLING_RULES = ("uniform", "weighted")
"""How a round's participants are drawn: uniformly, or with probability proportional to each
device's data volume (its samples over the experiment's tasks)."""
MAX_REPEATS = int(REPEATS.high)
"""The most repeats a comparison takes (each repeat runs every strategy once)."""


def _within(limit: Limit) -> list[MinValueValidator | MaxValueValidator]:
    """The validators of ``limit``'s closed range (:mod:`controlplane.common.limits`)."""
    return [MinValueValidator(limit.low), MaxValueValidator(limit.high)]


def _default_input_shape() -> list[int]:
    return list(DEFAULT_INPUT_SHAPE)


class Task(models.Model):
    """A learning task: a registered model architecture trained on a registered data set.

    What follows from the data (``input_shape``, ``train_size``, ``test_size``, ``train_labels``,
    ``label_counts``) is read by the plug-in check when the task is created or its data changes
    (:func:`controlplane.experiments.services.catalog.task_metadata_ensure`), so partitioning an
    experiment by label never imports the data set's plug-in in the web process. A task saved
    before that check existed has ``train_labels`` null until an experiment first needs them.
    """

    name = models.CharField(max_length=100, unique=True)
    architecture = models.CharField(max_length=64, help_text="a model of workers.registry.models.MODEL_REGISTRY")
    dataset = models.CharField(
        max_length=32, default="digits", help_text="a data set of workers.registry.datasets.DATASET_REGISTRY"
    )
    dataset_root = models.CharField(
        max_length=1024, blank=True, default="", help_text="local folder of the data set (cifar10)"
    )
    num_classes = models.PositiveIntegerField(default=10)
    input_shape = models.JSONField(
        default=_default_input_shape, help_text="shape of one sample, e.g. [3, 32, 32] (an image) or [20] (features)"
    )
    train_size = models.PositiveIntegerField(null=True, blank=True, help_text="samples in the training split")
    test_size = models.PositiveIntegerField(null=True, blank=True, help_text="samples in the test split")
    train_labels = models.BinaryField(
        null=True,
        editable=False,
        help_text="the training split's labels: np.savez_compressed bytes of one int64 array 'labels' of shape "
        "(train_size,) (catalog.task_train_labels reads them)",
    )
    label_counts = models.JSONField(
        default=list, blank=True, help_text="the training split's class histogram: num_classes counts"
    )
    optimizer = models.CharField(max_length=16, choices=[(o, o) for o in OPTIMIZERS], default="sgd")
    learning_rate = models.FloatField(default=0.05)
    momentum = models.FloatField(default=0.9)
    weight_decay = models.FloatField(default=5e-4)
    execution_mode = models.CharField(
        max_length=8,
        choices=[(m, m) for m in EXECUTION_MODES],
        default=ExecutionOptions().mode,
        help_text="how its trainers run a training step: graphs (captured once per batch size as a CUDA graph and "
        "replayed; GPU backends only), eager (op by op) or auto (graphs on a GPU backend, eager on cpu)"
        + EXECUTION_HELP,
    )
    precision = models.CharField(
        max_length=8,
        choices=[(p, p) for p in PRECISIONS],
        default=ExecutionOptions().precision,
        help_text="fp32, or bf16 (forward pass and loss under torch.autocast in bfloat16; GPU backends only)"
        + EXECUTION_HELP,
    )
    channels_last = models.BooleanField(
        default=ExecutionOptions().channels_last,
        help_text="4-D inputs and weights in torch.channels_last memory format" + EXECUTION_HELP,
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tasks",
        help_text="who defined it; only they (or a superuser) may change it. Tasks are the lab's "
        "shared catalogue: every researcher sees them and may use them",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


class Experiment(models.Model):
    """A multi-task FL setup: tasks, devices, rounds, local epochs and how data is split.

    The per-device, per-task sample counts are derived from ``partition_rule`` when the
    experiment is created and kept as :class:`Shard` rows.
    """

    EXPLICIT = "explicit"
    """``partition_rule`` of an experiment whose sample counts were given rather than derived."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    tasks = models.ManyToManyField(Task, related_name="experiments")
    devices = models.ManyToManyField(Device, related_name="experiments")
    rounds = models.PositiveIntegerField(validators=_within(ROUNDS))
    local_epochs = models.PositiveIntegerField(default=1, validators=_within(LOCAL_EPOCHS))
    partition_rule = models.CharField(
        max_length=32,
        default="iid",
        help_text="a partition rule of workers.registry.partitioners.PARTITIONER_REGISTRY, or 'explicit'",
    )
    dirichlet_alpha = models.FloatField(
        null=True, blank=True, help_text="kept for old clients: partition_params['alpha'] of a rule that takes one"
    )
    partition_params = models.JSONField(
        default=dict,
        blank=True,
        help_text="the partition rule's parameters by name (its record's `parameters`), e.g. {'alpha': 0.5}",
    )
    seed = models.PositiveIntegerField(default=0)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="owned_experiments",
        help_text="sees and changes it and chooses its collaborators; without one (created from "
        "the command line without --owner) only superusers see it",
    )
    collaborators = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="shared_experiments",
        help_text="see it and launch or cancel its runs and comparisons, like the owner",
    )
    device_retries = models.PositiveSmallIntegerField(
        default=0,
        validators=[MaxValueValidator(DEVICE_RETRIES.high)],  # the lower bound, 0: a positive field
        help_text="how many times a round re-sends a device's part when its agent is lost or its trainers fail "
        "(0: the round goes on without that device, as partial)",
    )
    deadline_factor = models.FloatField(
        null=True,
        blank=True,
        validators=_within(DEADLINE_FACTOR),
        help_text="a round's deadline is this × its predicted round time (null: MTFL_DEADLINE_FACTOR); rounds "
        "without a prediction use MTFL_ROUND_DEADLINE_S",
    )
    lr_scaling = models.CharField(
        max_length=8,
        choices=[(r, r) for r in LR_SCALING_RULES],
        default=DEFAULT_LR_SCALING,
        help_text="how an assignment's learning rate follows its batch size, relative to batch 128 "
        "(controlplane.planning.lr_scaling): none, linear (Goyal et al. 2017) or sqrt",
    )
    untrusted_predictor = models.CharField(
        max_length=8,
        choices=[(c, c) for c in UNTRUSTED_PREDICTOR_CHOICES],
        default="plan",
        help_text="what a vres_* run does when a device's predictor is not trusted (held-out RMSLE above "
        "MTFL_PREDICTOR_MAX_RMSLE, or a mix it was not fitted on): plan (anyway, with a warning), baseline "
        "(run the best baseline's plan instead) or measure (run the best baseline's plan first, then replan "
        "from what it measured)",
    )
    aggregation = models.CharField(
        max_length=32,
        default="fedavg",
        help_text="how each task's device models become its next global model: an aggregator of "
        "workers.registry.aggregators.AGGREGATOR_REGISTRY (fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fedprox)",
    )
    aggregation_params = models.JSONField(
        default=dict,
        blank=True,
        help_text="the aggregator's hyper-parameters by name (its record's `parameters`), checked and with "
        "defaults filled in, e.g. {'server_learning_rate': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001}",
    )
    task_aggregation = models.JSONField(
        default=dict,
        blank=True,
        help_text="per-task overrides, {task id (a string): {'aggregation': name, 'aggregation_params': {...}}}; "
        "a task left out uses the experiment's",
    )
    clients_per_round = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="devices trained per round (partial participation); null with client_fraction null: every device",
    )
    client_fraction = models.FloatField(
        null=True,
        blank=True,
        validators=_within(CLIENT_FRACTION),  # the open lower end: the service's check
        help_text=f"fraction of the devices trained per round, in {CLIENT_FRACTION.interval} (rounded up, at least 1); "
        "exclusive with clients_per_round",
    )
    client_sampling = models.CharField(
        max_length=8,
        choices=[(r, r) for r in CLIENT_SAMPLING_RULES],
        default="uniform",
        help_text="how each round's participants are drawn, seeded by the experiment's seed and the round: "
        "uniform, or weighted by each device's data volume",
    )
    keep_device_weights = models.BooleanField(
        default=False,
        help_text="keep every device's uploaded weights after its round is aggregated (for debugging); "
        "default: deleted once the round's global models are checkpointed",
    )
    keep_last_checkpoints = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=_within(KEEP_LAST_CHECKPOINTS),
        help_text="global checkpoints kept per run and task: the last N rounds' plus the best by test "
        "accuracy and the initial model; null: the lab default MTFL_KEEP_LAST_CHECKPOINTS",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.name


class Shard(models.Model):
    """``|D_ij|``: which (and how many) training samples of a task a device holds in an experiment.

    A rule that chooses the samples (every registered partitioner) stores their positions in
    the task's training split as ``indices`` (:func:`workers.protocol.indices.encode_indices`,
    ``num_samples`` of them). ``explicit`` experiments (and shards saved before partitioners
    chose samples) have ``indices`` null: the samples are then
    ``permutation[offset : offset + num_samples]`` of the training split
    (:func:`workers.training.partition.shard_indices`, seeded by the experiment's seed).
    ``label_counts`` is the shard's class histogram (``num_classes`` counts; empty when unknown).
    """

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="shards")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="shards")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="shards")
    num_samples = models.PositiveIntegerField()
    offset = models.PositiveIntegerField()
    indices = models.TextField(
        null=True, blank=True, help_text="the shard's sample positions (workers.protocol.indices); null: the window"
    )
    label_counts = models.JSONField(default=list, blank=True, help_text="samples per class in this shard")

    class Meta:
        ordering = ["experiment", "device", "task"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "device", "task"], name="uniq_shard"),
        ]


class Comparison(models.Model):
    """Every strategy run on the same experiment one after another, on the same devices, data
    and seeds (the paper's Fig. 4 and 5): its runs start one at a time, each once the previous
    one has ended.

    With ``repeats`` > 1 every strategy runs once per repeat, in interleaved orders (repeat 0 in
    ``strategies`` order, repeat 1 reversed, repeat 2 in order again...: each run's
    :attr:`Run.repeat`), so a drift of a shared machine does not favour whichever strategy runs
    first. ``targets`` holds the test accuracy each task's time to accuracy is taken to,
    ``{task id (a string): accuracy}`` (each in :data:`~controlplane.common.limits.TARGET_ACCURACY`);
    a task left out takes the lowest final
    accuracy any run of the comparison reached.
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        CANCELLED = "cancelled"

    experiment = models.ForeignKey("Experiment", on_delete=models.CASCADE, related_name="comparisons")
    strategies = models.JSONField(help_text="strategy names in the order repeat 0's runs start")
    repeats = models.PositiveSmallIntegerField(
        default=1,
        validators=_within(REPEATS),
        help_text="how many times every strategy runs, in interleaved orders",
    )
    targets = models.JSONField(
        default=dict,
        blank=True,
        help_text="test accuracy to reach per task id, for time to accuracy; a task left out takes the lowest "
        "final accuracy any run of the comparison reached",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"comparison {self.pk} of {self.experiment}"


class Run(models.Model):
    """One strategy executed on an experiment, round after round.

    ``options`` holds the planner's settings for ``vres_*`` (``objective``, ``slack``,
    ``replan``) and, for any strategy, the run's own aggregator (``aggregation``,
    ``aggregation_params``: runs of several FL algorithms on one experiment);
    ``planned`` the plan they made when the run was created (every round uses it, so ``P_alone``
    is measured at the batch sizes actually trained), with each assignment's predicted
    throughput and the predicted round time.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    strategy = models.CharField(
        max_length=32, help_text="a strategy of controlplane.planning.strategies.STRATEGY_REGISTRY"
    )
    manual_plan = models.JSONField(null=True, blank=True)
    options = models.JSONField(default=dict, blank=True)
    planned = models.JSONField(null=True, blank=True)
    comparison = models.ForeignKey(Comparison, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    repeat = models.PositiveSmallIntegerField(
        default=0, help_text="which repeat of its comparison it is, from 0 (0 outside a comparison)"
    )
    simulated = models.BooleanField(default=False, help_text="its devices' numbers come from the simulated backend")
    standalone_task_ids = models.JSONField(
        default=dict, blank=True, help_text="Celery task id of each device's P_alone measurement, by device name"
    )
    claimed_by = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="the control worker that began the run (resume after a restart)",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(
        null=True, blank=True, help_text="when it first began; kept when a restart begins it again (its wall time)"
    )
    claimed_at = models.DateTimeField(
        null=True, blank=True, help_text="when claimed_by last began it (a claim older than a worker is abandoned)"
    )
    restarts = models.PositiveIntegerField(
        default=0, help_text="times it was begun again after the control worker preparing it was lost"
    )
    last_restart_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    pool = models.ForeignKey(
        "fleet.DevicePool",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="runs",
        help_text="run on this pool's free devices: each round's participants are placed on the experiment's "
        "devices of the pool that are free; null: the experiment's devices (or each round's drawn participants)",
    )
    priority = models.SmallIntegerField(
        default=0,
        validators=_within(PRIORITY),
        help_text=f"{PRIORITY.span}: a waiting round of a higher-priority run gets free devices first",
    )
    raw_throughput_sps = models.FloatField(null=True, blank=True)
    fair_throughput = models.FloatField(null=True, blank=True)
    fl_throughput_sps = models.FloatField(null=True, blank=True)
    warnings = models.JSONField(
        default=list,
        blank=True,
        help_text="what the planner's guard found before the run started (an untrusted predictor, a mix "
        "outside what it was fitted on) and what the run did about it",
    )

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["experiment", "strategy", "status"])]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.strategy}) of {self.experiment}"

    @property
    def is_finished(self) -> bool:
        return self.status in {self.Status.SUCCEEDED, self.Status.FAILED, self.Status.CANCELLED}


class StandaloneThroughput(models.Model):
    """``P_alone``: a task's throughput alone on the whole device at a batch size, per run.

    ``source`` says where the number came from: ``measured`` for this run, or ``cache`` (a
    :class:`StandaloneCacheEntry` another run measured on the same device, for the same workload
    and environment, within ``MTFL_STANDALONE_CACHE_MAX_AGE_S``; ``measured_at`` is then the
    entry's measurement time).
    """

    class Source(models.TextChoices):
        MEASURED = "measured"
        CACHE = "cache"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="standalone_throughputs")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+")
    batch_size = models.PositiveIntegerField()
    throughput_sps = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    simulated = models.BooleanField(default=False)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MEASURED)
    measured_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "device", "task", "batch_size"], name="uniq_standalone"),
        ]


class StandaloneCacheEntry(models.Model):
    """A successful ``P_alone`` measurement kept across runs
    (:mod:`controlplane.experiments.services.standalone_cache`), so a run of a workload already
    measured on a device asks that device nothing before round 0.

    The key is everything the number depends on: the ``device`` (never shared between devices,
    even of one class), its ``backend``, the agent's ``code_version`` (mtfl-lab and torch
    versions) and ``hardware`` (accelerator, GPU UUID, cores) as the device last reported them,
    the task's ``workload_key`` (a digest of what determines its training speed: architecture,
    classes, input shape, data set, optimizer and its momentum and weight decay; not its name,
    learning rate or data folder; its execution options, which change the speed, are in), the ``batch_size`` trained (``min(batch size, shard size)``:
    a smaller shard is trained whole as every batch) and the ``share`` (``P_alone`` runs on the
    whole device: 100). An entry older than ``MTFL_STANDALONE_CACHE_MAX_AGE_S`` is not used; the
    ``simulated`` backend keeps none.
    """

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    backend = models.CharField(max_length=32)
    code_version = models.CharField(max_length=200, blank=True, default="")
    hardware = models.CharField(max_length=400, blank=True, default="")
    workload_key = models.CharField(max_length=64, help_text="sha256 of the task's workload identity")
    workload = models.JSONField(default=dict, help_text="the workload identity the key digests (for reading)")
    batch_size = models.PositiveIntegerField()
    share = models.PositiveSmallIntegerField(default=100, help_text="active-thread percentage (P_alone: 100)")
    throughput_sps = models.FloatField()
    simulated = models.BooleanField(default=False)
    measured_at = models.DateTimeField()
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", help_text="the run that measured it"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device", "backend", "code_version", "hardware", "workload_key", "batch_size", "share"],
                name="uniq_standalone_cache",
            ),
        ]


class Round(models.Model):
    """One FL synchronisation cycle of a run.

    ``round_time_s`` is the cycle's compute span, first trainer start to last trainer end
    (:func:`controlplane.planning.metrics.round_time`); ``wall_time_s`` is dispatch to
    aggregation done, process start-up and FedAvg included. The round's metrics (``round_time_s``,
    ``samples_trained``, the throughputs) and each device's (``device_metrics``) are computed
    once, when the round is recorded (:func:`controlplane.planning.metrics.round_metrics`), and
    read as stored everywhere else.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        QUEUED = "queued"
        RUNNING = "running"
        AGGREGATING = "aggregating"
        SUCCEEDED = "succeeded"
        PARTIAL = "partial"
        FAILED = "failed"
        CANCELLED = "cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rounds")
    index = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    queued_at = models.DateTimeField(
        null=True, blank=True, help_text="when it asked the lab scheduler for its devices (status queued)"
    )
    queue_s = models.FloatField(
        null=True,
        blank=True,
        help_text="seconds it waited for its devices: queued_at to the lease of all of them (started_at)",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    round_time_s = models.FloatField(null=True, blank=True)
    wall_time_s = models.FloatField(null=True, blank=True)
    samples_trained = models.PositiveBigIntegerField(default=0)
    fl_throughput_sps = models.FloatField(null=True, blank=True)
    raw_throughput_sps = models.FloatField(null=True, blank=True)
    fair_throughput = models.FloatField(null=True, blank=True)
    device_metrics = models.JSONField(
        default=dict,
        blank=True,
        help_text="each device's metrics in the round, by device name, computed once when the round was "
        "recorded (controlplane.planning.metrics.DeviceMetrics.as_json: counts, raw_throughput_sps, "
        "fair_throughput, samples_trained, compute_s, idle_s); empty until the round is recorded",
    )
    error = models.TextField(blank=True, default="")
    flags = models.JSONField(default=list, blank=True)
    predicted_round_time_s = models.FloatField(null=True, blank=True)
    replan = models.JSONField(
        null=True,
        blank=True,
        help_text="closed-loop replanning before this round (controlplane.planning.closed_loop): per device, "
        "whether it moved to a new plan or kept its best measured one, and why; null: the run's first plan",
    )
    participants = models.JSONField(
        null=True,
        blank=True,
        help_text="ids of the devices drawn to train this round (partial participation), in id order; "
        "null: every device of the experiment",
    )
    deadline_s = models.FloatField(
        null=True,
        blank=True,
        help_text="how long the round waits for its devices (factor × predicted round time, "
        "or MTFL_ROUND_DEADLINE_S; never below MTFL_ROUND_DEADLINE_FLOOR_S)",
    )
    deadline_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when devices still without a result are failed (stragglers excluded); a "
        "retry moves it to at least deadline_s after the retry",
    )
    aggregating_at = models.DateTimeField(null=True, blank=True, help_text="when its aggregation was claimed")
    claimed_by = models.CharField(
        max_length=200, blank=True, default="", help_text="the control worker aggregating it (resume after a restart)"
    )

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="uniq_round_index")]

    def __str__(self) -> str:
        return f"round {self.index} of run {self.run_id}"


ASSIGNMENT_RESULT_COLUMNS: dict[str, str] = {
    "samples_trained": "samples_trained",
    "throughput_sps": "throughput_sps",
    "simulated": "simulated",
    "seconds": "seconds",
    "train_loss": "train_loss",
    "started_at": "started_at",
    "finished_at": "finished_at",
    "weights": "weights_path",
    "weights_sha256": "weights_sha256",
    "peak_memory_bytes": "peak_memory_bytes",
    "torch_device": "torch_device",
    "mps_active_thread_percentage": "mps_active_thread_percentage",
    "visible_sm_count": "visible_sm_count",
    "mps_verified": "mps_verified",
    "mps_detail": "mps_detail",
    "execution_mode": "execution_mode",
    "execution_fallback": "execution_fallback",
}
"""What a trainer measured, copied onto its assignment when the round is recorded: each
:class:`workers.protocol.messages.AssignmentResult` attribute and the :class:`Assignment` column
it fills, declared once. The recorder copies them (with ``status`` and ``error``, which it
decides) and writes them in one bulk update; the API's assignment serializer lists them. A
timestamp arrives as Unix seconds, and a text column stores ``""`` for a missing value
(:func:`controlplane.experiments.services.rounds.record.result_columns`)."""


class Assignment(models.Model):
    """One task on one device in one round: the plan (batch size, share, samples) and what the
    trainer measured (throughput, loss, timestamps)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="assignments")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="assignments")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="assignments")
    batch_size = models.PositiveIntegerField()
    active_thread_percentage = models.PositiveSmallIntegerField(validators=_within(ACTIVE_THREAD_PERCENTAGE))
    samples = models.PositiveIntegerField(help_text="|D_ij|: the shard size")
    samples_trained = models.PositiveIntegerField(default=0)
    throughput_sps = models.FloatField(null=True, blank=True)
    predicted_throughput_sps = models.FloatField(null=True, blank=True)
    standalone_throughput_sps = models.FloatField(null=True, blank=True)
    simulated = models.BooleanField(default=False, help_text="measured by the simulated backend's model, not a device")
    seconds = models.FloatField(null=True, blank=True)
    train_loss = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True, default="")
    weights_path = models.CharField(max_length=512, blank=True, default="")
    weights_sha256 = models.CharField(max_length=64, blank=True, default="")
    weights_deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="when the retention policy deleted its uploaded weights"
    )
    peak_memory_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="the trainer's peak: on a GPU, peak reserved memory (torch.cuda.max_memory_reserved) plus the "
        "CUDA context; on cpu, private (anonymous) resident memory",
    )
    torch_device = models.CharField(max_length=16, blank=True, default="", help_text="cpu or cuda")
    mps_active_thread_percentage = models.FloatField(
        null=True, blank=True, help_text="SMs the trainer saw, as a percentage of the GPU's (null: not under MPS)"
    )
    visible_sm_count = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="streaming multiprocessors the trainer's CUDA context reported (null: cpu, or not reported)",
    )
    mps_verified = models.BooleanField(
        null=True,
        blank=True,
        help_text="the trainer saw fewer SMs than the GPU has, within one TPC of its share's; at 100 %: the MPS "
        "server logged its connection (null: not under MPS)",
    )
    mps_detail = models.TextField(blank=True, default="", help_text="what the agent found in the MPS server log")
    execution_mode = models.CharField(
        max_length=8,
        blank=True,
        default="",
        choices=[(m, m) for m in EXECUTED_MODES],
        help_text="how the trainer ran its steps, as it reported (eager or graphs: the task's auto resolved); "
        "empty: not reported",
    )
    execution_fallback = models.TextField(
        blank=True,
        default="",
        help_text="why the trainer ran eager although graphs were asked for (the capture's failure); empty when it "
        "ran what was asked",
    )
    attempt = models.PositiveSmallIntegerField(
        default=0,
        help_text="the dispatch of the device's part this row waits for or was recorded from (0: first, "
        "1 and up: retries); results of other attempts are ignored",
    )
    device_task_id = models.CharField(
        max_length=64, blank=True, default="", help_text="Celery id of that dispatch's train_round task"
    )

    class Meta:
        ordering = ["round", "device", "task"]
        constraints = [
            models.UniqueConstraint(fields=["round", "device", "task"], name="uniq_assignment"),
        ]


class DeviceTelemetry(models.Model):
    """Whole-GPU utilisation and memory of one device during one round, sampled by its agent
    through NVML about once a second (:class:`workers.protocol.messages.GpuSample`).

    Under MPS, NVML cannot attribute work to a client: these are device totals, and per-task
    throughput always comes from the trainers. The series are stored as parallel lists (one row
    per device and round, not per sample) so a long round costs one row.
    """

    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="telemetry")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="telemetry")
    t = models.JSONField(default=list, help_text="sample times, Unix seconds")
    gpu_util_percent = models.JSONField(default=list, help_text="0-100 per sample")
    memory_used_bytes = models.JSONField(default=list, help_text="bytes per sample")
    memory_total_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    mps_restarted = models.BooleanField(
        default=False, help_text="the agent restarted its MPS server after a trainer of this round failed"
    )

    class Meta:
        ordering = ["round", "device"]
        constraints = [models.UniqueConstraint(fields=["round", "device"], name="uniq_device_telemetry")]


class Checkpoint(models.Model):
    """The global model of a task after a round (``round`` null: the initial model).

    Its test accuracy and loss are filled in beside the next round
    (:mod:`controlplane.experiments.services.evaluation`): ``evaluation_status`` says whether
    they are still ``pending`` (both null), ``done``, or ``failed`` (both null,
    ``evaluation_error`` says why). ``created_at`` is when the model existed; ``evaluated_at``
    when its evaluation ended.
    """

    class Evaluation(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        FAILED = "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="checkpoints")
    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="checkpoints", null=True, blank=True)
    artifact_path = models.CharField(max_length=512)
    sha256 = models.CharField(max_length=64)
    test_accuracy = models.FloatField(null=True, blank=True)
    test_loss = models.FloatField(null=True, blank=True)
    evaluation_status = models.CharField(
        max_length=16,
        choices=Evaluation.choices,
        default=Evaluation.DONE,
        help_text="pending: test accuracy and loss not evaluated yet; failed: see evaluation_error",
    )
    evaluation_error = models.TextField(blank=True, default="", help_text="why the evaluation failed")
    evaluated_at = models.DateTimeField(null=True, blank=True, help_text="when its evaluation ended")
    kept_previous = models.BooleanField(
        default=False, help_text="no device had samples of this task: the previous model was kept"
    )
    aggregation = models.CharField(
        max_length=32, blank=True, default="", help_text="the aggregator that made it (empty: the initial model)"
    )
    server_state_path = models.CharField(
        max_length=512,
        blank=True,
        default="",
        help_text="artifact key of the aggregator's server state after this round (momentum, m, v; safetensors); "
        "empty: a stateless aggregator, or none yet",
    )
    server_state_sha256 = models.CharField(max_length=64, blank=True, default="")
    deleted_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when the retention policy deleted its files (model and server state); its metrics stay",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "task", "created_at"]
        indexes = [
            # The resume sweep looks for pending evaluations among every run's checkpoints.
            models.Index(
                fields=["evaluation_status"],
                name="checkpoint_eval_pending",
                condition=models.Q(evaluation_status="pending"),
            )
        ]


ROUND_ENDED = (Round.Status.SUCCEEDED, Round.Status.PARTIAL, Round.Status.FAILED, Round.Status.CANCELLED)
"""Round states after which nothing reads its device weights again (the retention policy may
delete them)."""

RUN_ENDED = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED)
"""Run states after which nothing of the run is in flight (it may be deleted)."""
