"""Runs, comparisons, rounds, assignments, telemetry and checkpoints (``/api/runs/``, ``/api/comparisons/``, ...)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.api.fast_lists import FastReadListSerializer
from controlplane.api.serializers.common import (
    MAX_ID,
    MAX_LIST,
    ChoiceField,
    IdOrNameField,
    ParamValueField,
    RegisteredField,
    StrictSerializer,
    bounded,
    integer,
    number,
)
from controlplane.api.serializers.experiments import AGGREGATION_HELP
from controlplane.api.serializers.lab import QueueWaitingSerializer
from controlplane.common.limits import (
    ACTIVE_THREAD_PERCENTAGE,
    BATCH_SIZE,
    PRIORITY,
    REPEATS,
    TARGET_ACCURACY,
)
from controlplane.experiments.models import (
    ASSIGNMENT_RESULT_COLUMNS,
    Assignment,
    Checkpoint,
    Comparison,
    DeviceTelemetry,
    Round,
    Run,
)
from controlplane.experiments.selectors import comparison_report
from controlplane.experiments.services.planning import REPLAN_POLICIES
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES
from controlplane.planning.strategies import STRATEGY_REGISTRY
from workers.protocol.messages import EXECUTED_MODES
from workers.registry.aggregators import AGGREGATOR_REGISTRY

# --- runs ----------------------------------------------------------------------------------


WARNINGS_HELP = (
    "what the planner's guard found before the run started (an untrusted predictor, a mix outside what it was "
    "fitted on) and what the run did about it; empty: nothing"
)


class RunSerializer(serializers.ModelSerializer):
    # (No docstring: it would become the schema's description.) A run's queue entry and speedups
    # are read, not computed: the view passes each run's entries by id as the serializer's
    # context, ``run_queues`` (controlplane.lab.selectors.runs_queue_entries) and
    # ``run_speedups`` (controlplane.experiments.selectors.runs_speedups).
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
        the devices it waits for and who holds them); null unless a round of it is queued."""
        entry = self.context["run_queues"][run.id]
        return None if entry is None else QueueWaitingSerializer(entry).data

    def get_raw_speedup(self, run: Run) -> float | None:
        """Raw throughput over the baseline (``temporal``) run of the run's comparison, or for a
        run outside a comparison the experiment's newest succeeded one."""
        return self.context["run_speedups"][run.id]["raw_speedup"]

    def get_fair_speedup(self, run: Run) -> float | None:
        """Fair throughput over the same baseline run as ``raw_speedup``."""
        return self.context["run_speedups"][run.id]["fair_speedup"]


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
        child=ParamValueField(),
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
        "every figure is then summarised over the repeats with its 95 % confidence interval: throughputs, "
        "speedups, times, rounds and samples as geometric means (log scale), final accuracies as arithmetic means",
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
        help_text="per strategy: {strategy, runs, succeeded, alone_measured_runs (its runs that measured P_alone "
        "themselves: their wall clock includes it), raw_throughput_sps, fair_throughput, "
        "fl_throughput_sps, raw_speedup, fair_speedup, fl_speedup, tasks: [{task, task_name, final_accuracy, "
        "time_to_accuracy_s (FL round-time clock: the sum of round times), wall_time_to_accuracy_s (wall clock: "
        "from the run's start until the round that reached the target was aggregated), rounds_to_accuracy, "
        "samples_to_accuracy, reached}]}, each figure {mean, low, high, n, values (each repeat's value), scale "
        "('log': geometric mean, 95 % interval exp(mean log ± t·s/√n), never below 0; 'linear': mean ± "
        "t·s/√n, accuracies clipped to [0, 1])}",
    )
    runs = serializers.ListField(
        child=serializers.DictField(),
        help_text="per run in the order they ran (interleaved): {run, strategy, repeat, status, alone_measured "
        "(P_alone measurements it made: its wall clock includes them), alone_cached (taken from the cross-run "
        "cache), the figures, tasks: [...]} (null: not measured, or the target not reached)",
    )
    clocks = serializers.DictField(
        child=serializers.CharField(),
        help_text="the two clocks of time to accuracy, {figure: label}: time_to_accuracy_s 'FL round time', "
        "wall_time_to_accuracy_s 'wall-clock from the run's start'",
    )
    small_n_note = serializers.CharField(
        allow_blank=True,
        help_text="'n = 2: interval wide' (or 'n = 1: no interval') when a strategy with succeeded runs has "
        "fewer than 3, else empty",
    )
    verdicts = serializers.ListField(
        child=serializers.DictField(),
        help_text="per planned strategy and figure (times to accuracy per task, on both clocks): {strategy, "
        "figure, task_name, against (the best baseline by mean), verdict (better, worse, not distinguishable at "
        "95 %), difference {mean, low, high, kind ('ratio' candidate/reference on the log scale, or "
        "'difference'), method ('paired t': repeat k against repeat k, or 'Welch'), n}}",
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
