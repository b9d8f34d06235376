"""API serializers: shapes and types only; every rule about values lives in the services."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.experiments.models import Assignment, Checkpoint, Experiment, Round, Run, Shard, Task
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_effective_status
from controlplane.planning.strategies import STRATEGIES
from workers.messages import ARCHITECTURES, BACKENDS, DATASETS, OPTIMIZERS


class ChoiceField(serializers.ChoiceField):
    """A choice field whose error lists the allowed values."""

    def to_internal_value(self, data):
        if data == "" and self.allow_blank:
            return ""
        if str(data) not in self.choice_strings_to_values:
            allowed = ", ".join(map(str, self.choices))
            raise serializers.ValidationError(f"{data!r} is not allowed; allowed: {allowed}")
        return self.choice_strings_to_values[str(data)]


# --- devices -------------------------------------------------------------------------------


class DeviceSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(read_only=True)
    status = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = ["id", "name", "backend", "queue", "status", "inventory", "last_heartbeat_at", "created_at"]
        read_only_fields = fields

    def get_status(self, device: Device) -> str:
        return device_effective_status(device)


class DeviceCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    backend = ChoiceField(choices=BACKENDS, default="cpu")


class DeviceUpdateSerializer(serializers.Serializer):
    backend = ChoiceField(choices=BACKENDS, required=False)


# --- tasks ---------------------------------------------------------------------------------


class TaskSerializer(serializers.ModelSerializer):
    class Meta:
        model = Task
        fields = [
            "id", "name", "architecture", "dataset", "dataset_root", "num_classes", "optimizer",
            "learning_rate", "momentum", "weight_decay", "created_at",
        ]
        read_only_fields = fields


class TaskWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    architecture = ChoiceField(choices=ARCHITECTURES)
    dataset = ChoiceField(choices=DATASETS, default="digits")
    dataset_root = serializers.CharField(max_length=1024, required=False, allow_blank=True, default="")
    num_classes = serializers.IntegerField(default=10)
    optimizer = ChoiceField(choices=OPTIMIZERS, default="sgd")
    learning_rate = serializers.FloatField(default=0.05)
    momentum = serializers.FloatField(default=0.9)
    weight_decay = serializers.FloatField(default=5e-4)


# --- experiments ---------------------------------------------------------------------------


class ShardSerializer(serializers.ModelSerializer):
    device_name = serializers.CharField(source="device.name", read_only=True)
    task_name = serializers.CharField(source="task.name", read_only=True)

    class Meta:
        model = Shard
        fields = ["device", "device_name", "task", "task_name", "num_samples", "offset"]
        read_only_fields = fields


class ExperimentSerializer(serializers.ModelSerializer):
    tasks = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    devices = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    shards = ShardSerializer(many=True, read_only=True)

    class Meta:
        model = Experiment
        fields = [
            "id", "name", "description", "tasks", "devices", "rounds", "local_epochs",
            "partition_rule", "dirichlet_alpha", "seed", "shards", "created_at",
        ]
        read_only_fields = fields


class SampleCountSerializer(serializers.Serializer):
    device = serializers.IntegerField()
    task = serializers.IntegerField()
    num_samples = serializers.IntegerField()


class ExperimentCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    tasks = serializers.ListField(child=serializers.IntegerField(), allow_empty=False)
    devices = serializers.ListField(child=serializers.IntegerField(), allow_empty=False)
    rounds = serializers.IntegerField()
    local_epochs = serializers.IntegerField(default=1)
    partition_rule = ChoiceField(choices=Experiment.PartitionRule.values, default="iid")
    dirichlet_alpha = serializers.FloatField(required=False, allow_null=True, default=None)
    seed = serializers.IntegerField(default=0)
    sample_counts = SampleCountSerializer(many=True, required=False, default=None, allow_null=True)


class ExperimentUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    rounds = serializers.IntegerField(required=False)
    local_epochs = serializers.IntegerField(required=False)


# --- runs ----------------------------------------------------------------------------------


class RunSerializer(serializers.ModelSerializer):
    raw_speedup = serializers.SerializerMethodField()
    fair_speedup = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "experiment", "strategy", "status", "manual_plan", "created_at", "started_at",
            "finished_at", "error", "raw_throughput_sps", "fair_throughput", "fl_throughput_sps",
            "raw_speedup", "fair_speedup",
        ]
        read_only_fields = fields

    def _speedups(self, run: Run) -> dict:
        from controlplane.experiments.selectors import baseline_run, run_speedups

        cache = self.context.setdefault("baselines", {})
        if run.experiment_id not in cache:
            cache[run.experiment_id] = baseline_run(run.experiment)
        return run_speedups(run, cache[run.experiment_id])

    def get_raw_speedup(self, run: Run) -> float | None:
        """Raw throughput over the experiment's newest succeeded ``temporal`` run."""
        return self._speedups(run)["raw_speedup"]

    def get_fair_speedup(self, run: Run) -> float | None:
        """Fair throughput over the experiment's newest succeeded ``temporal`` run."""
        return self._speedups(run)["fair_speedup"]


class ManualPlanEntrySerializer(serializers.Serializer):
    device = serializers.IntegerField()
    task = serializers.IntegerField()
    batch_size = serializers.IntegerField()
    active_thread_percentage = serializers.IntegerField()


class RunCreateSerializer(serializers.Serializer):
    strategy = ChoiceField(choices=STRATEGIES)
    plan = ManualPlanEntrySerializer(many=True, required=False, default=None, allow_null=True)


class RoundSerializer(serializers.ModelSerializer):
    class Meta:
        model = Round
        fields = [
            "id", "run", "index", "status", "started_at", "finished_at", "round_time_s", "wall_time_s",
            "samples_trained", "fl_throughput_sps", "raw_throughput_sps", "fair_throughput", "error", "flags",
        ]
        read_only_fields = fields


class AssignmentSerializer(serializers.ModelSerializer):
    run = serializers.IntegerField(source="round.run_id", read_only=True)
    round_index = serializers.IntegerField(source="round.index", read_only=True)
    device_name = serializers.CharField(source="device.name", read_only=True)
    task_name = serializers.CharField(source="task.name", read_only=True)

    class Meta:
        model = Assignment
        fields = [
            "id", "run", "round", "round_index", "device", "device_name", "task", "task_name",
            "batch_size", "active_thread_percentage", "samples", "samples_trained", "throughput_sps",
            "standalone_throughput_sps", "seconds", "train_loss", "started_at", "finished_at", "status",
            "error", "weights_path", "weights_sha256",
        ]
        read_only_fields = fields


class CheckpointSerializer(serializers.ModelSerializer):
    round_index = serializers.IntegerField(source="round.index", read_only=True, allow_null=True)
    task_name = serializers.CharField(source="task.name", read_only=True)

    class Meta:
        model = Checkpoint
        fields = [
            "id", "run", "task", "task_name", "round", "round_index", "artifact_path", "sha256",
            "test_accuracy", "test_loss", "kept_previous", "created_at",
        ]
        read_only_fields = fields
