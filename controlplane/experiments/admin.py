from django.contrib import admin

from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Experiment,
    Round,
    Run,
    Shard,
    StandaloneCacheEntry,
    StandaloneThroughput,
    Task,
)


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ["name", "architecture", "dataset", "num_classes", "optimizer", "learning_rate"]
    list_filter = ["architecture", "dataset"]
    search_fields = ["name"]


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "rounds", "local_epochs", "partition_rule", "partition_params", "seed", "created_at"]
    filter_horizontal = ["tasks", "devices"]
    inlines = [ShardInline]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "experiment", "strategy", "status", "raw_throughput_sps", "fair_throughput", "created_at"]
    list_filter = ["strategy", "status"]


@admin.register(Round)
class RoundAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "index", "status", "round_time_s", "fl_throughput_sps"]
    list_filter = ["status"]


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "round",
        "device",
        "task",
        "batch_size",
        "active_thread_percentage",
        "throughput_sps",
        "status",
    ]
    list_filter = ["status"]
    list_select_related = ["round", "device", "task"]


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "task", "round", "test_accuracy", "test_loss", "created_at"]


@admin.register(StandaloneThroughput)
class StandaloneThroughputAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "device", "task", "batch_size", "throughput_sps", "source"]


@admin.register(StandaloneCacheEntry)
class StandaloneCacheEntryAdmin(admin.ModelAdmin):
    """P_alone kept across runs; deleting an entry makes the next run on its device measure it."""

    list_display = ["id", "device", "backend", "batch_size", "throughput_sps", "code_version", "measured_at"]
    list_filter = ["backend"]
    list_select_related = ["device"]
