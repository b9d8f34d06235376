"""API serializers: shapes and types only; every rule about values lives in the services."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.api.fast_lists import FastReadListSerializer
from controlplane.common.limits import (
    ACTIVE_THREAD_PERCENTAGE,
    BATCH_SIZE,
    CLIENT_FRACTION,
    DEADLINE_FACTOR,
    DEVICE_RETRIES,
    DIRICHLET_ALPHA,
    KEEP_LAST_CHECKPOINTS,
    LOCAL_EPOCHS,
    NUM_CLASSES,
    PRIORITY,
    REPEATS,
    ROUNDS,
    SEED,
    TARGET_ACCURACY,
    Limit,
)
from controlplane.experiments.models import (
    ASSIGNMENT_RESULT_COLUMNS,
    CLIENT_SAMPLING_RULES,
    EXECUTION_MODES,
    PRECISIONS,
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
from controlplane.experiments.selectors import comparison_report, run_baselines, run_speedups
from controlplane.experiments.services.catalog import partition_rules
from controlplane.experiments.services.planning import REPLAN_POLICIES
from controlplane.experiments.services.templates import (
    DEFAULT_DIRICHLET_ALPHA,
    DEFAULT_LOCAL_EPOCHS,
    DEFAULT_ROUNDS,
    MAX_NAME_LENGTH,
    TEMPLATES,
)
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_effective_status
from controlplane.lab.selectors import queue_state, queued_run_ids, run_queue_entry
from controlplane.planning.guard import UNTRUSTED_PREDICTOR_CHOICES
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING, LR_SCALING_RULES
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES
from controlplane.planning.strategies import STRATEGY_REGISTRY
from controlplane.profiling.models import (
    ModelWorkload,
    Predictor,
    ProfileSample,
    ProfileSweep,
)
from controlplane.profiling.selectors import sweep_progress
from controlplane.profiling.services.workloads import workload_get
from workers.protocol.messages import EXECUTED_MODES, OPTIMIZERS, ExecutionOptions
from workers.registry.aggregators import AGGREGATOR_REGISTRY
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


def bounded(limit: Limit, **kwargs) -> serializers.IntegerField:
    """:func:`integer` over an integer field's declared range (:mod:`controlplane.common.limits`)."""
    return integer(int(limit.low), int(limit.high), **kwargs)


class StrictFloatField(serializers.FloatField):
    """A float field that refuses booleans (``float(True)`` is 1.0) as well as NaN and infinity."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A boolean field that takes JSON ``true``/``false`` only, not the strings and numbers DRF
    reads as booleans (``"yes"``, ``0``)."""

    default_error_messages = {"invalid": "must be true or false"}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


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
            "execution_mode",
            "precision",
            "channels_last",
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
        workload = workload_get(
            architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape
        )
        return ModelWorkloadSerializer(workload).data if workload else None


EXECUTION_MODE_HELP = (
    "how the task's trainers run a step: graphs (the whole step captured once per batch size as a CUDA graph and "
    "replayed; needs a GPU backend, cuda-mps or cuda-timeslice, on every device holding its data), eager (op by op) "
    "or auto (graphs on a GPU backend, eager on cpu); default auto. The task's, not a strategy's: every strategy of "
    "a comparison runs it so, and speedups compare like with like"
)
PRECISION_HELP = (
    "fp32, or bf16 (forward pass and loss under torch.autocast in bfloat16; needs a GPU backend); default fp32. "
    "The task's, not a strategy's"
)
CHANNELS_LAST_HELP = (
    "4-D inputs and weights in torch.channels_last memory format; default false. The task's, not a strategy's"
)


class TaskWriteSerializer(StrictSerializer):
    name = StrictCharField(max_length=100)
    architecture = RegisteredField(MODEL_REGISTRY.names)
    dataset = RegisteredField(DATASET_REGISTRY.names, default="digits")
    dataset_root = StrictCharField(max_length=1024, required=False, allow_blank=True, default="")
    num_classes = bounded(
        NUM_CLASSES,
        required=False,
        allow_null=True,
        default=None,
        help_text="null or left out: the data's class count; a stated one may exceed it, never fall below it",
    )
    optimizer = ChoiceField(choices=OPTIMIZERS, default="sgd")
    learning_rate = number(default=0.05)
    momentum = number(default=0.9)
    weight_decay = number(default=5e-4)
    execution_mode = ChoiceField(
        choices=EXECUTION_MODES, default=ExecutionOptions().mode, help_text=EXECUTION_MODE_HELP
    )
    precision = ChoiceField(choices=PRECISIONS, default=ExecutionOptions().precision, help_text=PRECISION_HELP)
    channels_last = StrictBooleanField(default=ExecutionOptions().channels_last, help_text=CHANNELS_LAST_HELP)


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
            "lr_scaling",
            "untrusted_predictor",
            "aggregation",
            "aggregation_params",
            "task_aggregation",
            "clients_per_round",
            "client_fraction",
            "client_sampling",
            "keep_device_weights",
            "keep_last_checkpoints",
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
    f"a round's deadline as a multiple of its predicted round time, {DEADLINE_FACTOR.span}; null: "
    "MTFL_DEADLINE_FACTOR. Rounds without a prediction wait MTFL_ROUND_DEADLINE_S"
)

LR_SCALING_HELP = (
    "how an assignment's learning rate follows its batch size B, for every strategy alike: none (the task's), "
    "linear (× B/128, Goyal et al. 2017) or sqrt (× √(B/128), Krizhevsky 2014); default none"
)

UNTRUSTED_PREDICTOR_HELP = (
    "what a vres_* run does when the planner's guard distrusts a device's predictor (held-out RMSLE above "
    "MTFL_PREDICTOR_MAX_RMSLE, or a mix it was not fitted on; GET /api/experiments/{id}/planner-check/): plan "
    "(anyway, with the warnings on the run), baseline (train the best baseline's plan instead) or measure "
    "(train it in round 0, then replan from what it measured); default plan"
)


AGGREGATION_HELP = (
    "how each task's device models become its next global model: a registered aggregator (fedavg; fedavgm, "
    "server momentum, Hsu et al. 2019; fedadam, fedyogi, fedadagrad, adaptive server optimisers, Reddi et al. "
    "2021; fedprox, a proximal term in every device's loss, Li et al. 2020; plug-ins: GET /api/plugins/); "
    "default fedavg"
)
AGGREGATION_PARAMS_HELP = (
    'the aggregator\'s hyper-parameters by name, e.g. {"server_learning_rate": 0.01} or {"mu": 0.01} (GET '
    "/api/plugins/ lists each aggregator's parameters, ranges and defaults); left-out ones take their defaults"
)
TASK_AGGREGATION_HELP = (
    'per-task overrides of the aggregator: {task id or name: {"aggregation": name, "aggregation_params": '
    '{...}}}, e.g. {"digits-resnet18": {"aggregation": "fedprox", "aggregation_params": {"mu": 0.1}}}; '
    "stored by task id; a task left out uses the experiment's aggregation"
)
CLIENTS_PER_ROUND_HELP = (
    "partial participation: devices trained per round, 1 to the experiment's devices, drawn anew each round "
    "(seeded by the experiment's seed and the round); exclusive with client_fraction; null with client_fraction "
    "null: every device, every round"
)
CLIENT_FRACTION_HELP = (
    f"partial participation: the fraction of the experiment's devices trained per round, in {CLIENT_FRACTION.interval} (rounded up, "
    "at least one); exclusive with clients_per_round"
)
CLIENT_SAMPLING_HELP = (
    "how each round's participants are drawn: uniform, or weighted by each device's data volume; default uniform"
)


KEEP_DEVICE_WEIGHTS_HELP = (
    "keep every device's uploaded weights after its round is aggregated (for debugging); default false: the "
    "retention policy deletes them once the round's global models are checkpointed"
)
KEEP_LAST_CHECKPOINTS_HELP = (
    "global checkpoints kept per run and task: the last N rounds', besides the initial model, the best by test "
    f"accuracy and the latest (what a resume reads); {KEEP_LAST_CHECKPOINTS.span}, null: the lab default "
    "MTFL_KEEP_LAST_CHECKPOINTS"
)


def keep_device_weights_field(**kwargs) -> StrictBooleanField:
    """``keep_device_weights``: JSON ``true`` or ``false``."""
    return StrictBooleanField(help_text=KEEP_DEVICE_WEIGHTS_HELP, **kwargs)


def keep_last_checkpoints_field(**kwargs) -> serializers.IntegerField:
    """``keep_last_checkpoints``: an integer in :data:`~controlplane.common.limits.KEEP_LAST_CHECKPOINTS`,
    or null (the lab default)."""
    return bounded(KEEP_LAST_CHECKPOINTS, allow_null=True, help_text=KEEP_LAST_CHECKPOINTS_HELP, **kwargs)


class TaskAggregationSerializer(StrictSerializer):
    """One task's aggregator override (an entry of ``task_aggregation``)."""

    aggregation = StrictCharField(
        required=False, max_length=32, help_text="a registered aggregator; left out: the experiment's"
    )
    aggregation_params = serializers.DictField(
        child=number(), required=False, allow_null=True, help_text=AGGREGATION_PARAMS_HELP
    )


MAX_CLIENTS_PER_ROUND = 1_000_000
"""The serializer's bound on ``clients_per_round`` (the service checks it against the devices)."""


def aggregation_field(**kwargs) -> RegisteredField:
    """``aggregation``: a registered aggregator."""
    return RegisteredField(AGGREGATOR_REGISTRY.names, help_text=AGGREGATION_HELP, **kwargs)


def aggregation_params_field(**kwargs) -> serializers.DictField:
    """``aggregation_params``: numbers by parameter name (the service checks names and ranges)."""
    return serializers.DictField(child=number(), allow_null=True, help_text=AGGREGATION_PARAMS_HELP, **kwargs)


def task_aggregation_field(**kwargs) -> serializers.DictField:
    """``task_aggregation``: one :class:`TaskAggregationSerializer` per task id or name."""
    kwargs.setdefault("help_text", TASK_AGGREGATION_HELP)
    return serializers.DictField(child=TaskAggregationSerializer(), allow_null=True, **kwargs)


def clients_per_round_field(**kwargs) -> serializers.IntegerField:
    """``clients_per_round``: a positive integer or null (the service bounds it by the devices)."""
    return integer(1, MAX_CLIENTS_PER_ROUND, allow_null=True, help_text=CLIENTS_PER_ROUND_HELP, **kwargs)


def client_fraction_field(**kwargs) -> serializers.FloatField:
    """``client_fraction``: a finite number or null (the service checks its range,
    :data:`~controlplane.common.limits.CLIENT_FRACTION`)."""
    return number(allow_null=True, help_text=CLIENT_FRACTION_HELP, **kwargs)


def client_sampling_field(**kwargs) -> ChoiceField:
    """``client_sampling``: ``uniform`` or ``weighted``."""
    return ChoiceField(choices=CLIENT_SAMPLING_RULES, help_text=CLIENT_SAMPLING_HELP, **kwargs)


class ExperimentCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=200)
    description = StrictCharField(required=False, allow_blank=True, default="", max_length=10_000)
    tasks = id_list()
    devices = id_list()
    rounds = bounded(ROUNDS)
    local_epochs = bounded(LOCAL_EPOCHS, default=1)
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
    seed = bounded(SEED, default=0)
    sample_counts = SampleCountSerializer(many=True, required=False, default=None, allow_null=True)
    device_retries = bounded(DEVICE_RETRIES, default=0, help_text=DEVICE_RETRIES_HELP)
    deadline_factor = number(required=False, allow_null=True, default=None, help_text=DEADLINE_FACTOR_HELP)
    lr_scaling = ChoiceField(choices=LR_SCALING_RULES, default=DEFAULT_LR_SCALING, help_text=LR_SCALING_HELP)
    untrusted_predictor = ChoiceField(
        choices=UNTRUSTED_PREDICTOR_CHOICES, default="plan", help_text=UNTRUSTED_PREDICTOR_HELP
    )
    aggregation = aggregation_field(default="fedavg")
    aggregation_params = aggregation_params_field(required=False, default=None)
    task_aggregation = task_aggregation_field(required=False, default=None)
    clients_per_round = clients_per_round_field(required=False, default=None)
    client_fraction = client_fraction_field(required=False, default=None)
    client_sampling = client_sampling_field(default="uniform")
    keep_device_weights = keep_device_weights_field(default=False)
    keep_last_checkpoints = keep_last_checkpoints_field(default=None)


class ExperimentUpdateSerializer(StrictSerializer):
    name = StrictCharField(max_length=200, required=False)
    description = StrictCharField(required=False, allow_blank=True, max_length=10_000)
    rounds = bounded(ROUNDS, required=False)
    local_epochs = bounded(LOCAL_EPOCHS, required=False)
    device_retries = bounded(DEVICE_RETRIES, required=False, help_text=DEVICE_RETRIES_HELP)
    deadline_factor = number(required=False, allow_null=True, help_text=DEADLINE_FACTOR_HELP)
    untrusted_predictor = ChoiceField(
        choices=UNTRUSTED_PREDICTOR_CHOICES, required=False, help_text=UNTRUSTED_PREDICTOR_HELP
    )
    aggregation = aggregation_field(required=False)
    aggregation_params = aggregation_params_field(required=False)
    task_aggregation = task_aggregation_field(required=False)
    clients_per_round = clients_per_round_field(required=False)
    client_fraction = client_fraction_field(required=False)
    client_sampling = client_sampling_field(required=False)
    keep_device_weights = keep_device_weights_field(required=False)
    keep_last_checkpoints = keep_last_checkpoints_field(required=False)
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
            "lr_scaling",
        )
    }


class PlannerCheckSerializer(serializers.Serializer):
    """:func:`controlplane.experiments.services.planner_check.planner_check`."""

    untrusted_predictor = serializers.ChoiceField(
        choices=UNTRUSTED_PREDICTOR_CHOICES, help_text="what a vres_* run of the experiment does about the warnings"
    )
    warnings = serializers.ListField(
        child=serializers.CharField(),
        help_text="one sentence per reason a device's predictor is not trusted (empty: all are), or the message "
        "of a device that has no fitted predictor",
    )
    max_rmsle = serializers.FloatField(
        help_text="MTFL_PREDICTOR_MAX_RMSLE: the held-out RMSLE above which a predictor is not trusted"
    )
    predictors_ready = serializers.BooleanField(
        help_text="every device has a fitted predictor (false: a vres_* run is refused until one is fitted)"
    )


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
        help_text=f"{ROUNDS.span}; default {DEFAULT_ROUNDS}",
    )
    local_epochs = serializers.IntegerField(
        required=False,
        error_messages={"invalid": "must be an integer"},
        help_text=f"{LOCAL_EPOCHS.span}; default {DEFAULT_LOCAL_EPOCHS}",
    )
    dirichlet_alpha = number(
        required=False,
        help_text="Dirichlet concentration of the data volumes per task and "
        f"device, in {DIRICHLET_ALPHA.interval}; smaller skews more; default {DEFAULT_DIRICHLET_ALPHA}",
    )
    seed = serializers.IntegerField(
        required=False, error_messages={"invalid": "must be an integer"}, help_text=f"{SEED.span}; default 0"
    )
    dataset = StrictCharField(
        required=False,
        allow_null=True,
        help_text="a registered data set (built-ins: digits, cifar10); default: cifar10 when MTFL_CIFAR10_ROOT holds "
        "it, digits otherwise",
    )
    lr_scaling = ChoiceField(choices=LR_SCALING_RULES, required=False, help_text=LR_SCALING_HELP)
    untrusted_predictor = ChoiceField(
        choices=UNTRUSTED_PREDICTOR_CHOICES, required=False, help_text=UNTRUSTED_PREDICTOR_HELP
    )
    aggregation = aggregation_field(required=False)
    aggregation_params = aggregation_params_field(required=False)
    task_aggregation = task_aggregation_field(
        required=False,
        help_text='per-task overrides of the aggregator: {task: {"aggregation": name, "aggregation_params": '
        "{...}}}, the task named by one of the template's architectures (e.g. resnet18), its name or its id",
    )
    clients_per_round = clients_per_round_field(required=False)
    client_fraction = client_fraction_field(required=False)
    client_sampling = client_sampling_field(required=False)
    keep_device_weights = keep_device_weights_field(required=False)
    keep_last_checkpoints = keep_last_checkpoints_field(required=False)
    execution_mode = ChoiceField(choices=EXECUTION_MODES, required=False, help_text=EXECUTION_MODE_HELP)
    precision = ChoiceField(choices=PRECISIONS, required=False, help_text=PRECISION_HELP)
    channels_last = StrictBooleanField(required=False, help_text=CHANNELS_LAST_HELP)


# --- the lab: queue, pools, an admin's pause ------------------------------------------------


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            {"type": "string", "minLength": 1, "maxLength": 63},
        ]
    }
)
class IdOrNameField(serializers.Field):
    """An object given by its id (an integer) or its name (a string), e.g. a pool or a device;
    the services look it up (an unknown one is a 400 naming the field)."""

    default_error_messages = {
        "invalid": "must be an id (an integer from 1) or a name (a string of 1 to 63 characters)",
    }

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, int):
            if not 1 <= data <= MAX_ID:
                self.fail("invalid")
            return data
        if isinstance(data, str) and 1 <= len(data) <= 63 and data.strip() == data:
            return data
        self.fail("invalid")

    def to_representation(self, value):
        return value


class QueueHolderSerializer(serializers.Serializer):
    """The round holding a device."""

    run = serializers.IntegerField(read_only=True)
    run_strategy = serializers.CharField(read_only=True)
    experiment = serializers.IntegerField(read_only=True)
    experiment_name = serializers.CharField(read_only=True)
    owner = serializers.CharField(read_only=True, allow_null=True, help_text="the experiment owner's user name")
    round = serializers.IntegerField(read_only=True)
    round_index = serializers.IntegerField(read_only=True)
    since = serializers.DateTimeField(read_only=True, help_text="when the device was leased to the round")
    expected_free_at = serializers.DateTimeField(
        read_only=True,
        help_text="the round's start plus its predicted round time (else its run's last round's wall time, else "
        "MTFL_ROUND_DEADLINE_S)",
    )


class QueueBlockerSerializer(serializers.Serializer):
    """A device a waiting round needs that it cannot have now."""

    device = serializers.CharField(read_only=True)
    paused = serializers.BooleanField(read_only=True, help_text="an admin paused it")
    paused_reason = serializers.CharField(read_only=True, help_text="the admin's reason, when paused")
    holder_run = serializers.IntegerField(read_only=True, allow_null=True)
    holder_owner = serializers.CharField(read_only=True, allow_null=True)
    since = serializers.DateTimeField(read_only=True, allow_null=True)
    expected_free_at = serializers.DateTimeField(read_only=True, allow_null=True)
    profiling_sweep = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="the profiling sweep pending or running on it, if any"
    )


class QueueWaitingSerializer(serializers.Serializer):
    """A round waiting (``queued``) for its devices."""

    position = serializers.IntegerField(read_only=True, help_text="1: served first by the policy")
    round = serializers.IntegerField(read_only=True)
    round_index = serializers.IntegerField(read_only=True)
    run = serializers.IntegerField(read_only=True)
    run_strategy = serializers.CharField(read_only=True)
    experiment = serializers.IntegerField(read_only=True)
    experiment_name = serializers.CharField(read_only=True)
    owner = serializers.CharField(read_only=True, allow_null=True)
    priority = serializers.IntegerField(read_only=True, help_text=f"{PRIORITY.span}; higher first")
    queued_at = serializers.DateTimeField(read_only=True, allow_null=True)
    waited_s = serializers.FloatField(read_only=True, allow_null=True, help_text="seconds queued so far")
    devices = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="the first 5 devices it needs; [] for a pool round"
    )
    devices_count = serializers.IntegerField(read_only=True, help_text="devices it needs (a pool round: its slots)")
    pool = serializers.CharField(read_only=True, allow_null=True, help_text="a pool round's pool")
    slots = serializers.IntegerField(read_only=True, allow_null=True, help_text="devices of the pool it fills")
    expected_s = serializers.FloatField(read_only=True, help_text="its expected round time, seconds")
    estimated_start = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="replaying the scheduler's passes as held devices come free; null: no pass can start it (a "
        "paused device, or more devices than its pool has)",
    )
    blockers = QueueBlockerSerializer(many=True, read_only=True, help_text="the first 5 devices it waits for")
    blockers_count = serializers.IntegerField(read_only=True)


class QueueProfilingSerializer(serializers.Serializer):
    sweep = serializers.IntegerField(read_only=True)
    since = serializers.DateTimeField(read_only=True)
    expected_end = serializers.DateTimeField(read_only=True, help_text="its start plus its budget")


class QueueDeviceSerializer(serializers.Serializer):
    """A device that is held, paused, or needed by a waiting round."""

    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    pool = serializers.CharField(read_only=True, allow_null=True)
    paused = serializers.BooleanField(read_only=True)
    paused_reason = serializers.CharField(read_only=True)
    paused_at = serializers.DateTimeField(read_only=True, allow_null=True)
    holder = QueueHolderSerializer(read_only=True, allow_null=True)
    profiling = QueueProfilingSerializer(
        read_only=True, allow_null=True, help_text="a profiling sweep pending or running on it: no round gets it"
    )
    waiting = serializers.ListField(
        child=serializers.IntegerField(), read_only=True, help_text="ids of the first 10 rounds waiting for it"
    )
    waiting_count = serializers.IntegerField(read_only=True)
    next_start = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="the estimated start of the first round waiting for it"
    )


class QueuePoolSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    devices = serializers.IntegerField(read_only=True)
    held = serializers.IntegerField(read_only=True)
    paused = serializers.IntegerField(read_only=True)
    free = serializers.IntegerField(read_only=True)
    waiting = serializers.IntegerField(read_only=True, help_text="rounds of its runs waiting")


class QueueSerializer(serializers.Serializer):
    """The shared lab's queue (``controlplane.lab.selectors.queue_state``)."""

    policy = serializers.ChoiceField(
        choices=("fifo", "fair"),
        read_only=True,
        help_text="MTFL_SCHEDULER_POLICY: fifo (arrival) or fair (least weighted device-seconds in the window)",
    )
    fair_window_s = serializers.FloatField(read_only=True)
    now = serializers.DateTimeField(read_only=True)
    waiting = QueueWaitingSerializer(many=True, read_only=True, help_text="in the order the policy serves them")
    waiting_total = serializers.IntegerField(read_only=True)
    devices = QueueDeviceSerializer(many=True, read_only=True, help_text="by name, at most 200")
    devices_listed = serializers.IntegerField(read_only=True)
    devices_involved = serializers.IntegerField(read_only=True, help_text="held, paused or waited for")
    devices_held = serializers.IntegerField(read_only=True)
    devices_paused = serializers.IntegerField(read_only=True)
    devices_total = serializers.IntegerField(read_only=True)
    pools = QueuePoolSerializer(many=True, read_only=True)


class LabDeviceSerializer(DeviceSerializer):
    """A device with its pool and pause."""

    pool = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta(DeviceSerializer.Meta):
        fields = [*DeviceSerializer.Meta.fields, "pool", "paused", "paused_reason", "paused_at"]
        read_only_fields = fields


class DevicePauseSerializer(StrictSerializer):
    reason = StrictCharField(
        max_length=200, allow_blank=True, required=False, default="", help_text="why (shown on the queue page)"
    )


class DeviceResumeSerializer(StrictSerializer):
    """No fields."""


class PoolSerializer(serializers.Serializer):
    """A device pool: devices of one device class that runs may name instead of devices."""

    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    devices = serializers.SerializerMethodField()
    device_names = serializers.SerializerMethodField()
    runs = serializers.IntegerField(source="run_count", read_only=True, help_text="runs that name it")
    created_at = serializers.DateTimeField(read_only=True)
    warnings = serializers.SerializerMethodField(
        help_text="after a create or change: running runs of pools that lost a device (their next rounds train on "
        "fewer devices)"
    )

    def get_warnings(self, pool) -> list[str]:
        return list(getattr(pool, "warnings", []))

    def get_devices(self, pool) -> list[int]:
        return [d.id for d in pool.devices.all()]

    def get_device_names(self, pool) -> list[str]:
        return [d.name for d in pool.devices.all()]


POOL_DEVICES_HELP = (
    "its devices by id or name, all of one device class (a device of another pool moves to this one); "
    "PATCH: the pool's devices from now on"
)


class PoolCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=63, help_text="a slug: letters, digits, - and _")
    description = StrictCharField(max_length=2000, allow_blank=True, required=False, default="")
    devices = serializers.ListField(
        child=IdOrNameField(), max_length=MAX_LIST, required=False, default=list, help_text=POOL_DEVICES_HELP
    )


class PoolUpdateSerializer(StrictSerializer):
    fixed_fields = {
        "name": "a pool's name cannot change: runs name it",
        "description": "a pool's description is set when it is created",
    }

    devices = serializers.ListField(
        child=IdOrNameField(), max_length=MAX_LIST, required=False, help_text=POOL_DEVICES_HELP
    )


# --- runs ----------------------------------------------------------------------------------


WARNINGS_HELP = (
    "what the planner's guard found before the run started (an untrusted predictor, a mix outside what it was "
    "fitted on) and what the run did about it; empty: nothing"
)


class RunSerializer(serializers.ModelSerializer):
    queue = serializers.SerializerMethodField()
    raw_speedup = serializers.SerializerMethodField()
    warnings = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=WARNINGS_HELP)
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
            "restarts",
            "last_restart_at",
            "finished_at",
            "error",
            "raw_throughput_sps",
            "fair_throughput",
            "fl_throughput_sps",
            "raw_speedup",
            "fair_speedup",
            "warnings",
            "pool",
            "priority",
            "queue",
        ]
        read_only_fields = fields

    @extend_schema_field(QueueWaitingSerializer(allow_null=True))
    def get_queue(self, run: Run) -> dict | None:
        """Where the run's waiting round stands in the lab's queue (position, estimated start,
        the devices it waits for and who holds them); null unless a round of it is queued. A
        page of runs reads the queue once."""
        if run.status != Run.Status.RUNNING:
            return None
        # Replaying the queue is the costly part: only for a run with a round waiting in it.
        if "queued_runs" not in self.context:
            self.context["queued_runs"] = queued_run_ids()
        if run.id not in self.context["queued_runs"]:
            return None
        if "queue_state" not in self.context:
            self.context["queue_state"] = queue_state()
        entry = run_queue_entry(run, self.context["queue_state"])
        return None if entry is None else QueueWaitingSerializer(entry).data

    def _speedups(self, run: Run) -> dict:
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
    batch_size = bounded(BATCH_SIZE)
    active_thread_percentage = bounded(ACTIVE_THREAD_PERCENTAGE)


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
    replan = ChoiceField(
        choices=REPLAN_POLICIES,
        required=False,
        help_text="every_round (closed loop: before every round after the first, replan from what the run "
        "measured; each device's decision is in the round's replan) or never (open loop: the first plan in "
        "every round); default every_round",
    )


class RunOptionsSerializer(PlannerOptionsSerializer):
    """A run's options: the ``vres_*`` planners' settings, and for any strategy the run's own
    aggregator (an algorithm comparison on one experiment's devices, data and seed)."""

    aggregation = RegisteredField(
        AGGREGATOR_REGISTRY.names,
        required=False,
        help_text="this run's aggregator instead of the experiment's (a task the experiment overrides keeps its "
        "own): " + AGGREGATION_HELP,
    )
    aggregation_params = serializers.DictField(
        child=number(),
        required=False,
        help_text="its parameters (given alone: the experiment's aggregator's), checked as the experiment's; "
        'left-out ones take their defaults, e.g. {"server_learning_rate": 0.01}',
    )


class RunCreateSerializer(StrictSerializer):
    strategy = RegisteredField(STRATEGY_REGISTRY.names)
    plan = ManualPlanEntrySerializer(many=True, required=False, default=None, allow_null=True, max_length=MAX_LIST)
    options = RunOptionsSerializer(required=False, default=None, allow_null=True)
    pool = IdOrNameField(
        required=False,
        default=None,
        allow_null=True,
        help_text="a device pool (id or name, GET /api/pools/): each round is placed on the experiment's free "
        "devices of the pool instead of fixed devices; default: the experiment's devices",
    )
    priority = bounded(
        PRIORITY,
        required=False,
        default=0,
        help_text=f"{PRIORITY.span}: the lab scheduler serves higher first (default 0)",
    )


class ComparisonCreateSerializer(StrictSerializer):
    options = RunOptionsSerializer(
        required=False,
        default=None,
        allow_null=True,
        help_text="the planners' settings, and an aggregator for every run of the comparison",
    )
    strategies = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        default=None,
        allow_null=True,
        max_length=64,
        help_text="strategies to run, in order, including the baseline 'temporal' (default: every compared "
        "strategy, plug-ins included)",
    )
    repeats = bounded(
        REPEATS,
        default=1,
        help_text="how many times every strategy runs, in interleaved orders (as given, reversed, as given...); "
        "every figure is then a mean with its 95 % confidence interval",
    )
    targets = serializers.DictField(
        child=number(),
        required=False,
        allow_null=True,
        default=None,
        help_text=f"test accuracy to reach per task, by task id or name, each in {TARGET_ACCURACY.interval}, "
        'e.g. {"3": 0.8}; a task '
        "left out takes the lowest final accuracy any run of the comparison reached",
    )
    pool = IdOrNameField(
        required=False,
        default=None,
        allow_null=True,
        help_text="a device pool (id or name) every run of the comparison is placed in, as for a run",
    )
    priority = bounded(
        PRIORITY, required=False, default=0, help_text=f"{PRIORITY.span}: the priority of every run of the comparison"
    )


class ComparisonSerializer(serializers.ModelSerializer):
    runs = serializers.SerializerMethodField()

    class Meta:
        model = Comparison
        fields = [
            "id",
            "experiment",
            "strategies",
            "repeats",
            "targets",
            "status",
            "created_at",
            "finished_at",
            "runs",
        ]
        read_only_fields = fields

    def get_runs(self, comparison: Comparison) -> list[dict]:
        """The comparison's runs in start order: ``{id, strategy, repeat, status}``."""
        return [
            {"id": r.id, "strategy": r.strategy, "repeat": r.repeat, "status": r.status}
            for r in sorted(comparison.runs.all(), key=lambda r: r.id)
        ]


class EstimateSerializer(serializers.Serializer):
    mean = serializers.FloatField(allow_null=True, help_text="the mean over the succeeded repeats")
    low = serializers.FloatField(allow_null=True, help_text="95 % Student-t interval's lower end (null below 2)")
    high = serializers.FloatField(allow_null=True, help_text="its upper end")
    n = serializers.IntegerField(help_text="how many repeats have the figure")


class ComparisonReportSerializer(serializers.Serializer):
    """:func:`controlplane.experiments.selectors.comparison_report` (its docstring defines each
    part; :mod:`controlplane.planning.metrics` each figure)."""

    comparison = serializers.IntegerField()
    repeats = serializers.IntegerField()
    baseline = serializers.CharField(help_text="the strategy every speedup is taken against, per repeat")
    confidence = serializers.FloatField()
    targets = serializers.ListField(
        child=serializers.DictField(),
        help_text="per task: {task, task_name, target, source ('given' or 'lowest final accuracy')}",
    )
    strategies = serializers.ListField(
        child=serializers.DictField(),
        help_text="per strategy: {strategy, runs, succeeded, raw_throughput_sps, fair_throughput, "
        "fl_throughput_sps, raw_speedup, fair_speedup, fl_speedup, tasks: [{task, task_name, final_accuracy, "
        "time_to_accuracy_s, wall_time_to_accuracy_s, rounds_to_accuracy, samples_to_accuracy, reached}]}, "
        "each figure {mean, low, high, n}",
    )
    runs = serializers.ListField(
        child=serializers.DictField(),
        help_text="per run in start order: {run, strategy, repeat, status, the figures, tasks: [...]} (null: "
        "not measured, or the target not reached)",
    )
    verdicts = serializers.ListField(
        child=serializers.DictField(),
        help_text="per planned strategy and figure: {strategy, figure, task_name, against (the best baseline "
        "by mean), verdict (better, worse, not distinguishable at 95 %), difference {mean, low, high}}",
    )


class ComparisonDetailSerializer(ComparisonSerializer):
    report = serializers.SerializerMethodField()

    class Meta(ComparisonSerializer.Meta):
        fields = [*ComparisonSerializer.Meta.fields, "report"]
        read_only_fields = fields

    @extend_schema_field(ComparisonReportSerializer)
    def get_report(self, comparison: Comparison) -> dict:
        """Every figure of the comparison: per strategy (mean and 95 % interval over repeats), per
        run, the accuracy target of each task with time and rounds to reach it, and verdicts."""
        return comparison_report(comparison)


class ReplanDecisionSerializer(serializers.Serializer):
    """One device's decision in ``Round.replan`` (:class:`controlplane.planning.closed_loop.DeviceDecision`);
    for the schema only: the stored JSON is answered as it is."""

    device_id = serializers.IntegerField()
    device = serializers.CharField(help_text="the device's name")
    action = serializers.ChoiceField(
        choices=["moved", "kept", "new", "slack"],
        help_text="moved: to the new plan, predicted better beyond the uncertainty; kept: its best measured "
        "configuration; new: nothing measured yet; slack (vres_sync): a slower plan with more optimizer steps "
        "that still ends within the round's slack (its gain is negative by design)",
    )
    reason = serializers.CharField(help_text="why, in one sentence")
    predicted_gain = serializers.FloatField(
        allow_null=True,
        help_text="log ratio of the new plan's corrected objective over the kept configuration's measured one "
        "(positive: better; percent = 100·(exp(g)−1)); null without a measured configuration",
    )
    objective = serializers.CharField(
        allow_null=True,
        required=False,
        help_text="what predicted_gain compares: round_time (the device's, positive: faster), raw or fair throughput",
    )
    uncertainty = serializers.FloatField(allow_null=True, help_text="standard deviation of predicted_gain (log)")
    offset_scale = serializers.FloatField(allow_null=True, help_text="σ_off of the device's residual model")
    shape_scale = serializers.FloatField(allow_null=True, help_text="σ_loc of the device's residual model")
    residual_rms = serializers.FloatField(
        allow_null=True, help_text="root mean square of the device's measured log residuals"
    )


class ReplanSerializer(serializers.Serializer):
    """``Round.replan``: closed-loop replanning before a round; for the schema only."""

    measured_rounds = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="the rounds whose measurements it used"
    )
    predicted_round_time_s = serializers.FloatField(required=False, allow_null=True)
    decisions = ReplanDecisionSerializer(many=True, help_text="one per device of the new plan")
    note = serializers.CharField(required=False, help_text="why there are no decisions, when there are none")


@extend_schema_field(ReplanSerializer(allow_null=True))
class ReplanField(serializers.JSONField):
    """``Round.replan`` as stored (null: the run's first plan, a baseline, or ``replan: never``)."""


class RoundSerializer(serializers.ModelSerializer):
    participants = serializers.ListField(
        child=serializers.IntegerField(),
        allow_null=True,
        read_only=True,
        help_text="ids of the devices drawn to train this round (partial participation: the experiment's "
        "clients_per_round or client_fraction), in id order; null: every device of the experiment",
    )
    replan = ReplanField(
        read_only=True,
        help_text="closed-loop replanning before this round: per device, whether it moved to a new plan or kept "
        "its best measured one, why, and the predicted gain ± its uncertainty; null: the run's first plan, a "
        "baseline, or options.replan never",
    )

    class Meta:
        model = Round
        fields = [
            "id",
            "run",
            "index",
            "status",
            "queued_at",
            "queue_s",
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
            "replan",
            "participants",
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
    # Declared: a read-only model field loses allow_blank, and the schema would then refuse the
    # "" of an assignment whose trainer has not reported yet.
    execution_mode = serializers.ChoiceField(
        choices=EXECUTED_MODES,
        allow_blank=True,
        read_only=True,
        help_text="how the trainer ran its steps (eager or graphs); empty until it reports",
    )

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
            "predicted_throughput_sps",
            "standalone_throughput_sps",
            # what the trainer measured, as the round's recorder copies it (one declaration)
            *ASSIGNMENT_RESULT_COLUMNS.values(),
            "status",
            "error",
            "weights_deleted_at",
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
            "evaluation_status",
            "evaluation_error",
            "evaluated_at",
            "kept_previous",
            "deleted_at",
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


class ExperimentStorageSerializer(serializers.Serializer):
    """What one experiment's runs hold in the artifact store."""

    experiment = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    files = serializers.IntegerField(read_only=True)
    bytes = serializers.IntegerField(read_only=True, help_text="a file with several hard links counted once")


class StorageSerializer(serializers.Serializer):
    """The artifact store (``ARTIFACT_ROOT``): its size, its file system's free space against the
    threshold below which rounds refuse to start, and each visible experiment's share."""

    artifact_root = serializers.CharField(read_only=True)
    files = serializers.IntegerField(read_only=True, help_text="every file in ARTIFACT_ROOT (runs, predictors, ...)")
    bytes = serializers.IntegerField(read_only=True)
    free_bytes = serializers.IntegerField(read_only=True, help_text="free space of ARTIFACT_ROOT's file system")
    min_free_bytes = serializers.IntegerField(
        read_only=True, help_text="MTFL_MIN_FREE_BYTES: below this much free space, rounds refuse to start"
    )
    problem = serializers.CharField(
        read_only=True, allow_null=True, help_text="why rounds refuse to start now; null: enough free space"
    )
    experiments = ExperimentStorageSerializer(
        many=True, read_only=True, help_text="the experiments the caller may see, largest first"
    )


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
            "ops_per_step",
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
        return sweep_progress(sweep)


class SweepExecutionSerializer(StrictSerializer):
    """How every trainer of a sweep runs its steps (:class:`workers.protocol.messages.ExecutionOptions`)."""

    mode = ChoiceField(
        choices=EXECUTION_MODES,
        default=ExecutionOptions().mode,
        help_text="graphs (each step captured as a CUDA graph; a GPU backend only), eager, or auto (graphs on a GPU "
        "backend, eager on cpu)",
    )
    precision = ChoiceField(
        choices=PRECISIONS, default=ExecutionOptions().precision, help_text="fp32, or bf16 (a GPU backend only)"
    )
    channels_last = StrictBooleanField(default=ExecutionOptions().channels_last)


class ProfileSweepCreateSerializer(StrictSerializer):
    budget_s = number()
    architectures = serializers.ListField(
        child=RegisteredField(MODEL_REGISTRY.names), required=False, allow_empty=False, max_length=64
    )
    batch_sizes = serializers.ListField(child=bounded(BATCH_SIZE), required=False, allow_empty=False, max_length=64)
    max_mix = integer(1, 8, required=False)
    seed = bounded(SEED, default=0)
    tasks = id_list(
        required=False,
        help_text="task ids: their architectures are profiled at each task's own classes and input shape "
        "(a plug-in model on non-image data, say), beside `architectures`",
    )
    execution = SweepExecutionSerializer(
        required=False,
        help_text="how the profiled trainers run their steps (default auto, fp32); profile with the options the "
        "rounds will use, since a predictor learns what was measured. graphs or bf16 on a cpu device is a 400",
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
            "execution_mode",
            "host_step_s",
            "gpu_busy_fraction",
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
