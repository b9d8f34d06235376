"""API serializers: shapes and types only; every rule about values lives in the services."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rest_framework import serializers

from controlplane.api.fast_lists import FastReadListSerializer
from controlplane.experiments.models import (
    MAX_DEVICE_RETRIES,
    Assignment,
    Checkpoint,
    Comparison,
    DeviceTelemetry,
    Experiment,
    Round,
    Run,
    Shard,
    Task,
)
from controlplane.experiments.services.catalog import partition_rules
from controlplane.experiments.services.templates import (
    DEFAULT_DIRICHLET_ALPHA,
    DEFAULT_LOCAL_EPOCHS,
    DEFAULT_ROUNDS,
    MAX_NAME_LENGTH,
    TEMPLATES,
)
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_effective_status
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES
from controlplane.planning.strategies import (
    MAX_BATCH_SIZE,
    MIN_BATCH_SIZE,
    STRATEGY_REGISTRY,
)
from controlplane.profiling.models import (
    ModelWorkload,
    Predictor,
    ProfileSample,
    ProfileSweep,
)
from workers.protocol.messages import OPTIMIZERS
from workers.registry.backends import BACKEND_REGISTRY
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY

MAX_ID = 2**63 - 1
MAX_LIST = 1000


class ChoiceField(serializers.ChoiceField):
    """A choice field whose error lists the allowed values."""

    def to_internal_value(self, data):
        if data == "" and self.allow_blank:
            return ""
        if not isinstance(data, str) or data not in self.choice_strings_to_values:
            allowed = ", ".join(map(str, self.choices))
            raise serializers.ValidationError(f"{data!r} is not allowed; allowed: {allowed}")
        return self.choice_strings_to_values[data]


class RegisteredField(ChoiceField):
    """A name from a registry (strategies, models, data sets, backends...), read from the registry
    each time a request is validated or the schema is drawn, so a plug-in registered at run
    time is accepted at once; the error lists the allowed names.

    Args:
        names: ``() -> names``, e.g. ``STRATEGY_REGISTRY.names``.
    """

    def __init__(self, names: Callable[[], Iterable[str]], **kwargs):
        self._names = names
        super().__init__(choices=(), **kwargs)

    @property
    def choices(self) -> dict[str, str]:
        return {name: name for name in self._names()}

    @choices.setter
    def choices(self, _value) -> None:
        """The registry decides: whatever ``ChoiceField.__init__`` sets is ignored."""

    @property
    def grouped_choices(self) -> dict[str, str]:
        return self.choices

    @grouped_choices.setter
    def grouped_choices(self, _value) -> None:
        """As :attr:`choices`."""

    @property
    def choice_strings_to_values(self) -> dict[str, str]:
        return self.choices

    @choice_strings_to_values.setter
    def choice_strings_to_values(self, _value) -> None:
        """As :attr:`choices`."""


class StrictCharField(serializers.CharField):
    """A string field that refuses numbers and other types instead of converting them."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError(f"must be a string, got {type(data).__name__}")
        return super().to_internal_value(data)


def integer(lo: int, hi: int, **kwargs) -> serializers.IntegerField:
    """An integer field in ``[lo, hi]`` whose errors give the allowed range (and the OpenAPI
    schema its ``minimum``/``maximum``)."""
    allowed = f"allowed {lo} to {hi}"
    return serializers.IntegerField(
        min_value=lo,
        max_value=hi,
        error_messages={
            "invalid": f"must be an integer: {allowed}",
            "min_value": f"must be at least {{min_value}}: {allowed}",
            "max_value": f"must be at most {{max_value}}: {allowed}",
            "max_string_length": f"is too long for an integer: {allowed}",
        },
        **kwargs,
    )


class StrictFloatField(serializers.FloatField):
    """A float field that refuses booleans (``float(True)`` is 1.0) as well as NaN and infinity."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


def number(**kwargs) -> serializers.FloatField:
    """A float field that refuses NaN, infinity and booleans (ranges are checked by the services)."""
    return StrictFloatField(error_messages={"invalid": "must be a finite number"}, **kwargs)


def id_list(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=integer(1, MAX_ID), allow_empty=False, max_length=MAX_LIST, **kwargs)


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them and the fields it accepts.

    ``fixed_fields`` maps fields a client may know but not write here to the reason.
    """

    fixed_fields: dict[str, str] = {}

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            errors = {
                name: [self.fixed_fields[name]]
                if name in self.fixed_fields
                else [f"unknown field; allowed: {', '.join(self.fields)}"]
                for name in sorted(set(data.keys()) - set(self.fields))
            }
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


# --- devices -------------------------------------------------------------------------------


class DeviceSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(read_only=True)
    status = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = [
            "id",
            "name",
            "backend",
            "queue",
            "status",
            "inventory",
            "plugins",
            "last_heartbeat_at",
            "created_at",
        ]
        read_only_fields = fields

    def get_status(self, device: Device) -> str:
        return device_effective_status(device)


class DeviceCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=63)
    backend = RegisteredField(BACKEND_REGISTRY.names, default="cpu")


class DeviceUpdateSerializer(StrictSerializer):
    backend = RegisteredField(BACKEND_REGISTRY.names, required=False)
    fixed_fields = {"name": "cannot change: a device's name is its Celery queue; register a new device"}


# --- tasks ---------------------------------------------------------------------------------


class TaskSerializer(serializers.ModelSerializer):
    workload = serializers.SerializerMethodField()
    owner = serializers.SlugRelatedField(
        slug_field="username", read_only=True, help_text="who defined it (only they may change it); null from the CLI"
    )

    class Meta:
        model = Task
        fields = [
            "id",
            "name",
            "architecture",
            "dataset",
            "dataset_root",
            "num_classes",
            "input_shape",
            "train_size",
            "test_size",
            "label_counts",
            "optimizer",
            "learning_rate",
            "momentum",
            "weight_decay",
            "owner",
            "created_at",
            "workload",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "input_shape": {"help_text": "shape of one sample, read from the data set when the task was checked"},
            "train_size": {"help_text": "samples in the training split (null: a task not checked yet)"},
            "test_size": {"help_text": "samples in the test split (null: a task not checked yet)"},
            "label_counts": {"help_text": "the training split's samples per class (num_classes counts)"},
        }

    def get_workload(self, task: Task) -> dict | None:
        """The model's workload features at the task's classes and input shape (null until the
        control worker has computed them)."""
        from controlplane.profiling.services.workloads import workload_get

        workload = workload_get(
            architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape
        )
        return ModelWorkloadSerializer(workload).data if workload else None


class TaskWriteSerializer(StrictSerializer):
    name = StrictCharField(max_length=100)
    architecture = RegisteredField(MODEL_REGISTRY.names)
    dataset = RegisteredField(DATASET_REGISTRY.names, default="digits")
    dataset_root = StrictCharField(max_length=1024, required=False, allow_blank=True, default="")
    num_classes = integer(
        2,
        100_000,
        required=False,
        allow_null=True,
        default=None,
        help_text="null or left out: the data's class count; a stated one may exceed it, never fall below it",
    )
    optimizer = ChoiceField(choices=OPTIMIZERS, default="sgd")
    learning_rate = number(default=0.05)
    momentum = number(default=0.9)
    weight_decay = number(default=5e-4)


# --- experiments ---------------------------------------------------------------------------


class ShardSerializer(serializers.ModelSerializer):
    device_name = serializers.CharField(source="device.name", read_only=True)
    task_name = serializers.CharField(source="task.name", read_only=True)

    class Meta:
        model = Shard
        fields = ["device", "device_name", "task", "task_name", "num_samples", "offset", "label_counts"]
        read_only_fields = fields


class ExperimentSerializer(serializers.ModelSerializer):
    tasks = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    devices = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    shards = ShardSerializer(many=True, read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    collaborators = serializers.SlugRelatedField(slug_field="username", many=True, read_only=True)

    class Meta:
        model = Experiment
        fields = [
            "id",
            "name",
            "description",
            "tasks",
            "devices",
            "rounds",
            "local_epochs",
            "partition_rule",
            "partition_params",
            "dirichlet_alpha",
            "seed",
            "shards",
            "owner",
            "collaborators",
            "device_retries",
            "deadline_factor",
            "created_at",
        ]
        read_only_fields = fields


class SampleCountSerializer(StrictSerializer):
    device = integer(1, MAX_ID)
    task = integer(1, MAX_ID)
    num_samples = serializers.IntegerField(
        max_value=10**9, error_messages={"invalid": "must be an integer: allowed 0 or 2 and more"}
    )


DEVICE_RETRIES_HELP = (
    "how many times a round re-sends a device's part when its agent is lost or its trainers "
    "fail (0: the round goes on without that device, as partial)"
)
DEADLINE_FACTOR_HELP = (
    "a round's deadline as a multiple of its predicted round time, 1 to 100; null: "
    "MTFL_DEADLINE_FACTOR. Rounds without a prediction wait MTFL_ROUND_DEADLINE_S"
)


class ExperimentCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=200)
    description = StrictCharField(required=False, allow_blank=True, default="", max_length=10_000)
    tasks = id_list()
    devices = id_list()
    rounds = integer(1, 10_000)
    local_epochs = integer(1, 1000, default=1)
    partition_rule = RegisteredField(partition_rules, default="iid")
    partition_params = serializers.DictField(
        child=number(),
        required=False,
        allow_null=True,
        default=None,
        help_text='the partition rule\'s parameters by name, e.g. {"alpha": 0.5} (GET /api/plugins/ lists each '
        "rule's parameters, ranges and defaults); left-out ones take their defaults",
    )
    dirichlet_alpha = number(
        required=False,
        allow_null=True,
        default=None,
        help_text="partition_params.alpha under its former name (rules that take an alpha: quantity, "
        "dirichlet_labels); both given must agree",
    )
    seed = integer(0, 2**31 - 1, default=0)
    sample_counts = SampleCountSerializer(many=True, required=False, default=None, allow_null=True)
    device_retries = integer(0, MAX_DEVICE_RETRIES, default=0, help_text=DEVICE_RETRIES_HELP)
    deadline_factor = number(required=False, allow_null=True, default=None, help_text=DEADLINE_FACTOR_HELP)


class ExperimentUpdateSerializer(StrictSerializer):
    name = StrictCharField(max_length=200, required=False)
    description = StrictCharField(required=False, allow_blank=True, max_length=10_000)
    rounds = integer(1, 10_000, required=False)
    local_epochs = integer(1, 1000, required=False)
    device_retries = integer(0, MAX_DEVICE_RETRIES, required=False, help_text=DEVICE_RETRIES_HELP)
    deadline_factor = number(required=False, allow_null=True, help_text=DEADLINE_FACTOR_HELP)
    collaborators = serializers.ListField(
        child=StrictCharField(max_length=150),
        max_length=1000,
        required=False,
        help_text="user names that replace the collaborators (owner only); they see the experiment and "
        "launch or cancel its runs",
    )
    fixed_fields = {
        name: "cannot change after creation (runs would no longer be comparable); create a new experiment"
        for name in (
            "tasks",
            "devices",
            "partition_rule",
            "partition_params",
            "dirichlet_alpha",
            "seed",
            "sample_counts",
        )
    }


class ExperimentTemplateSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True, help_text="what to pass as `template`")
    title = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    architectures = serializers.ListField(child=RegisteredField(MODEL_REGISTRY.names), read_only=True)
    dataset = RegisteredField(
        DATASET_REGISTRY.names,
        read_only=True,
        help_text="the data set an experiment from the template trains on unless one is asked for: cifar10 "
        "when MTFL_CIFAR10_ROOT holds it, digits otherwise",
    )


class ExperimentFromTemplateSerializer(StrictSerializer):
    """Shapes and types only: the service checks every value and fills in the defaults, so the
    API, the CLI and the dashboard word their errors alike."""

    template = StrictCharField(help_text=f"one of {', '.join(TEMPLATES)} (GET /api/experiment-templates/)")
    devices = serializers.ListField(child=integer(1, MAX_ID), max_length=MAX_LIST, help_text="device ids, at least one")
    name = StrictCharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text=f"at most {MAX_NAME_LENGTH} characters; default (also when blank): '<template> mix', numbered if taken",
    )
    rounds = serializers.IntegerField(
        required=False,
        error_messages={"invalid": "must be an integer"},
        help_text=f"1 to 10000; default {DEFAULT_ROUNDS}",
    )
    local_epochs = serializers.IntegerField(
        required=False,
        error_messages={"invalid": "must be an integer"},
        help_text=f"1 to 1000; default {DEFAULT_LOCAL_EPOCHS}",
    )
    dirichlet_alpha = number(
        required=False,
        help_text="Dirichlet concentration of the data volumes per task and "
        f"device, in (0, 1000]; smaller skews more; default {DEFAULT_DIRICHLET_ALPHA}",
    )
    seed = serializers.IntegerField(
        required=False, error_messages={"invalid": "must be an integer"}, help_text="0 to 2147483647; default 0"
    )
    dataset = StrictCharField(
        required=False,
        allow_null=True,
        help_text="a registered data set (built-ins: digits, cifar10); default: cifar10 when MTFL_CIFAR10_ROOT holds "
        "it, digits otherwise",
    )


# --- runs ----------------------------------------------------------------------------------


class RunSerializer(serializers.ModelSerializer):
    raw_speedup = serializers.SerializerMethodField()
    fair_speedup = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "experiment",
            "strategy",
            "status",
            "simulated",
            "manual_plan",
            "options",
            "planned",
            "comparison",
            "created_at",
            "started_at",
            "finished_at",
            "error",
            "raw_throughput_sps",
            "fair_throughput",
            "fl_throughput_sps",
            "raw_speedup",
            "fair_speedup",
        ]
        read_only_fields = fields

    def _speedups(self, run: Run) -> dict:
        from controlplane.experiments.selectors import run_baselines, run_speedups

        cache = self.context.setdefault("baselines", {})
        if run.experiment_id not in cache:
            # every run of the experiment at once: a page of runs costs one query per experiment
            cache[run.experiment_id] = run_baselines(run.experiment, run.experiment.runs.all())
        return run_speedups(run, cache[run.experiment_id].get(run.id))

    def get_raw_speedup(self, run: Run) -> float | None:
        """Raw throughput over the baseline (``temporal``) run of the run's comparison, or for a
        run outside a comparison the experiment's newest succeeded one."""
        return self._speedups(run)["raw_speedup"]

    def get_fair_speedup(self, run: Run) -> float | None:
        """Fair throughput over the same baseline run as ``raw_speedup``."""
        return self._speedups(run)["fair_speedup"]


class ManualPlanEntrySerializer(StrictSerializer):
    device = integer(1, MAX_ID)
    task = integer(1, MAX_ID)
    batch_size = integer(MIN_BATCH_SIZE, MAX_BATCH_SIZE)
    active_thread_percentage = integer(1, 100)


class PlannerOptionsSerializer(StrictSerializer):
    """Settings of the ``vres_*`` planners (controlplane.planning.planner)."""

    objective = ChoiceField(
        choices=OBJECTIVES,
        required=False,
        help_text="vres_greedy's share objective: raw (Σ P) or fair (Σ P / P_alone); default raw",
    )
    slack = ChoiceField(
        choices=SLACK_POLICIES,
        required=False,
        help_text="what vres_sync gives devices that finish early; default smaller_batches",
    )


class RunCreateSerializer(StrictSerializer):
    strategy = RegisteredField(STRATEGY_REGISTRY.names)
    plan = ManualPlanEntrySerializer(many=True, required=False, default=None, allow_null=True, max_length=MAX_LIST)
    options = PlannerOptionsSerializer(required=False, default=None, allow_null=True)


class ComparisonCreateSerializer(StrictSerializer):
    options = PlannerOptionsSerializer(required=False, default=None, allow_null=True)
    strategies = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        default=None,
        allow_null=True,
        max_length=64,
        help_text="strategies to run, in order, including the baseline 'temporal' (default: every compared "
        "strategy, plug-ins included)",
    )


class ComparisonSerializer(serializers.ModelSerializer):
    runs = serializers.SerializerMethodField()

    class Meta:
        model = Comparison
        fields = ["id", "experiment", "strategies", "status", "created_at", "finished_at", "runs"]
        read_only_fields = fields

    def get_runs(self, comparison: Comparison) -> list[dict]:
        """The comparison's runs in start order: ``{id, strategy, status}``."""
        return [
            {"id": r.id, "strategy": r.strategy, "status": r.status}
            for r in sorted(comparison.runs.all(), key=lambda r: r.id)
        ]


class RoundSerializer(serializers.ModelSerializer):
    class Meta:
        model = Round
        fields = [
            "id",
            "run",
            "index",
            "status",
            "started_at",
            "finished_at",
            "round_time_s",
            "wall_time_s",
            "samples_trained",
            "fl_throughput_sps",
            "raw_throughput_sps",
            "fair_throughput",
            "error",
            "flags",
            "predicted_round_time_s",
            "deadline_s",
            "deadline_at",
        ]
        read_only_fields = fields
        list_serializer_class = FastReadListSerializer


class AssignmentSerializer(serializers.ModelSerializer):
    """An assignment of :func:`controlplane.experiments.selectors.assignment_list` (annotated with
    ``run``, ``round_index``, ``device_name`` and ``task_name``)."""

    run = serializers.IntegerField(read_only=True)
    round_index = serializers.IntegerField(read_only=True)
    device_name = serializers.CharField(read_only=True)
    task_name = serializers.CharField(read_only=True)

    class Meta:
        model = Assignment
        fields = [
            "id",
            "run",
            "round",
            "round_index",
            "device",
            "device_name",
            "task",
            "task_name",
            "batch_size",
            "active_thread_percentage",
            "samples",
            "samples_trained",
            "throughput_sps",
            "predicted_throughput_sps",
            "standalone_throughput_sps",
            "simulated",
            "seconds",
            "train_loss",
            "started_at",
            "finished_at",
            "status",
            "error",
            "weights_path",
            "weights_sha256",
            "peak_memory_bytes",
            "torch_device",
            "mps_active_thread_percentage",
            "mps_verified",
            "mps_detail",
            "attempt",
        ]
        read_only_fields = fields
        list_serializer_class = FastReadListSerializer


class DeviceTelemetrySerializer(serializers.ModelSerializer):
    """One device's whole-GPU series of a round (parallel lists, one entry per NVML sample)."""

    device_name = serializers.CharField(source="device.name", read_only=True)

    class Meta:
        model = DeviceTelemetry
        fields = [
            "device",
            "device_name",
            "t",
            "gpu_util_percent",
            "memory_used_bytes",
            "memory_total_bytes",
            "mps_restarted",
        ]
        read_only_fields = fields


class CheckpointSerializer(serializers.ModelSerializer):
    round_index = serializers.IntegerField(source="round.index", read_only=True, allow_null=True)
    task_name = serializers.CharField(source="task.name", read_only=True)

    class Meta:
        model = Checkpoint
        fields = [
            "id",
            "run",
            "task",
            "task_name",
            "round",
            "round_index",
            "artifact_path",
            "sha256",
            "test_accuracy",
            "test_loss",
            "kept_previous",
            "created_at",
        ]
        read_only_fields = fields
        list_serializer_class = FastReadListSerializer


class LabelHistogramSerializer(serializers.Serializer):
    """One device's shard of one task of an experiment, with its class histogram."""

    task = serializers.IntegerField(read_only=True)
    task_name = serializers.CharField(read_only=True)
    device = serializers.IntegerField(read_only=True)
    device_name = serializers.CharField(read_only=True)
    num_samples = serializers.IntegerField(read_only=True)
    label_counts = serializers.ListField(
        child=serializers.IntegerField(), read_only=True, help_text="samples of each class 0..num_classes-1"
    )


# --- plug-ins ------------------------------------------------------------------------------


class InstalledPluginSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=("models", "datasets", "partitioners"), read_only=True)
    name = serializers.CharField(read_only=True)
    label = serializers.CharField(read_only=True)
    source = serializers.CharField(read_only=True, help_text="the distribution providing it and its version")
    builtin = serializers.BooleanField(read_only=True, help_text="part of mtfl-lab itself")
    details = serializers.DictField(
        read_only=True,
        help_text="datasets: input_shape, num_classes (null when they follow from the files), needs_root; "
        "partitioners: parameters (name, label, kind, minimum, maximum, minimum_open, default)",
    )


class PluginFailureSerializer(serializers.Serializer):
    kind = serializers.CharField(read_only=True)
    group = serializers.CharField(read_only=True)
    name = serializers.CharField(read_only=True)
    value = serializers.CharField(read_only=True)
    error = serializers.CharField(read_only=True)


class DevicePluginsSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    backend = serializers.CharField(read_only=True)
    status = serializers.CharField(read_only=True)
    declares_nothing = serializers.BooleanField(
        read_only=True, help_text="an agent older than plug-in declarations: mtfl-lab's built-ins are assumed"
    )
    plugins = serializers.DictField(read_only=True, help_text="{kind: {name: 'distribution version'}}")


class PluginsSerializer(serializers.Serializer):
    installed = InstalledPluginSerializer(many=True, read_only=True, help_text="registered on the control plane")
    failures = PluginFailureSerializer(many=True, read_only=True, help_text="entry points that failed to load here")
    devices = DevicePluginsSerializer(many=True, read_only=True, help_text="what each online device's agent declared")


# --- profiling -----------------------------------------------------------------------------


class ModelWorkloadSerializer(serializers.ModelSerializer):
    class Meta:
        model = ModelWorkload
        fields = [
            "architecture",
            "num_classes",
            "input_shape",
            "forward_flops_per_sample",
            "train_flops_per_sample",
            "params",
            "param_bytes",
            "activation_bytes_per_sample",
            "computed_at",
        ]
        read_only_fields = fields


class ProfileSweepSerializer(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField()

    class Meta:
        model = ProfileSweep
        fields = [
            "id",
            "device",
            "backend",
            "budget_s",
            "request",
            "status",
            "configs",
            "samples",
            "repeat_spread",
            "error",
            "created_at",
            "started_at",
            "last_record_at",
            "finished_at",
            "progress",
        ]
        read_only_fields = fields

    def get_progress(self, sweep: ProfileSweep) -> float:
        """Fraction of the time budget spent (1.0 once the sweep ended)."""
        from controlplane.profiling.selectors import sweep_progress

        return sweep_progress(sweep)


class ProfileSweepCreateSerializer(StrictSerializer):
    budget_s = number()
    architectures = serializers.ListField(
        child=RegisteredField(MODEL_REGISTRY.names), required=False, allow_empty=False, max_length=64
    )
    batch_sizes = serializers.ListField(child=integer(2, 4096), required=False, allow_empty=False, max_length=64)
    max_mix = integer(1, 8, required=False)
    seed = integer(0, 2**31 - 1, default=0)
    tasks = id_list(
        required=False,
        help_text="task ids: their architectures are profiled at each task's own classes and input shape "
        "(a plug-in model on non-image data, say), beside `architectures`",
    )


class ProfileSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProfileSample
        fields = [
            "id",
            "source",
            "sweep",
            "assignment",
            "device",
            "backend",
            "device_class",
            "config_key",
            "configuration",
            "mix_size",
            "task_index",
            "architecture",
            "batch_size",
            "active_thread_percentage",
            "throughput_sps",
            "standalone_sps",
            "peak_memory_bytes",
            "speed_index",
            "cross_core_rtt_ns",
            "simulated",
            "repeat_of",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields
        list_serializer_class = FastReadListSerializer


class PredictorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Predictor
        fields = [
            "id",
            "version",
            "backend",
            "device_class",
            "status",
            "feature_spec",
            "training_samples",
            "training_configurations",
            "kept_family",
            "heldout_rmsle",
            "heldout_mape",
            "metrics",
            "artifact_path",
            "sha256",
            "fit_seconds",
            "error",
            "created_at",
        ]
        read_only_fields = fields


class PredictorCreateSerializer(StrictSerializer):
    backend = RegisteredField(BACKEND_REGISTRY.names, default="cpu")
    device_class = StrictCharField(max_length=64, required=False)
