"""Experiments, their templates and planner check (``/api/experiments/``, ``/api/experiment-templates/``)."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.api.serializers.common import (
    MAX_ID,
    MAX_LIST,
    ChoiceField,
    ParamValueField,
    RegisteredField,
    StrictBooleanField,
    StrictCharField,
    StrictSerializer,
    bounded,
    id_list,
    integer,
    number,
)
from controlplane.api.serializers.tasks import CHANNELS_LAST_HELP, EXECUTION_MODE_HELP, PRECISION_HELP
from controlplane.common.limits import (
    CLIENT_FRACTION,
    DEADLINE_FACTOR,
    DEVICE_RETRIES,
    DIRICHLET_ALPHA,
    KEEP_LAST_CHECKPOINTS,
    LOCAL_EPOCHS,
    ROUNDS,
    SEED,
)
from controlplane.experiments.models import (
    CLIENT_SAMPLING_RULES,
    EXECUTION_MODES,
    PRECISIONS,
    Experiment,
    Shard,
)
from controlplane.experiments.services.catalog import partition_rules
from controlplane.experiments.services.templates import (
    DEFAULT_DIRICHLET_ALPHA,
    DEFAULT_LOCAL_EPOCHS,
    DEFAULT_ROUNDS,
    MAX_NAME_LENGTH,
    TEMPLATES,
)
from controlplane.planning.guard import UNTRUSTED_PREDICTOR_CHOICES
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING, LR_SCALING_RULES
from workers.registry.aggregators import AGGREGATOR_REGISTRY
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY

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
    warnings = serializers.SerializerMethodField(
        help_text="what the partition leaves without data: each device holding 0 samples of a task (it trains "
        "only the others) and the devices holding no data of any task (left out of training in every round); "
        "empty: every device holds data of every task"
    )

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
            "warnings",
        ]
        read_only_fields = fields

    def get_warnings(self, experiment: Experiment) -> list[str]:
        """What the partition leaves without data, read once for the page by the view
        (:func:`controlplane.experiments.selectors.experiments_data_warnings`)."""
        return self.context["experiment_warnings"][experiment.id]


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
    'the aggregator\'s hyper-parameters by name, e.g. {"server_learning_rate": 0.01}, {"mu": 0.01} or '
    '{"bias_correction": true, "initial_v": "zero"} (docs/extending.md lists each aggregator\'s parameters, '
    "ranges and defaults); left-out ones take their defaults"
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
        child=ParamValueField(), required=False, allow_null=True, help_text=AGGREGATION_PARAMS_HELP
    )


MAX_CLIENTS_PER_ROUND = 1_000_000
"""The serializer's bound on ``clients_per_round`` (the service checks it against the devices)."""


def aggregation_field(**kwargs) -> RegisteredField:
    """``aggregation``: a registered aggregator."""
    return RegisteredField(AGGREGATOR_REGISTRY.names, help_text=AGGREGATION_HELP, **kwargs)


def aggregation_params_field(**kwargs) -> serializers.DictField:
    """``aggregation_params``: values by parameter name (numbers, booleans, names; the service
    checks names, kinds and ranges)."""
    return serializers.DictField(child=ParamValueField(), allow_null=True, help_text=AGGREGATION_PARAMS_HELP, **kwargs)


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
