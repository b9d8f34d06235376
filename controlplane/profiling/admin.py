from django.contrib import admin

from controlplane.profiling.models import ModelWorkload, Predictor, ProfileSample, ProfileSweep


@admin.register(ModelWorkload)
class ModelWorkloadAdmin(admin.ModelAdmin):
    list_display = [
        "architecture",
        "num_classes",
        "input_shape",
        "train_flops_per_sample",
        "params",
        "activation_bytes_per_sample",
        "ops_per_step",
    ]


@admin.register(ProfileSweep)
class ProfileSweepAdmin(admin.ModelAdmin):
    list_display = ["id", "device", "backend", "budget_s", "status", "configs", "samples", "created_at"]
    list_filter = ["status", "backend"]


@admin.register(ProfileSample)
class ProfileSampleAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "source",
        "device",
        "architecture",
        "batch_size",
        "active_thread_percentage",
        "mix_size",
        "throughput_sps",
        "execution_mode",
        "host_step_s",
        "gpu_busy_fraction",
    ]
    list_filter = ["source", "backend", "architecture", "mix_size"]


@admin.register(Predictor)
class PredictorAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "backend",
        "device_class",
        "version",
        "status",
        "kept_family",
        "heldout_rmsle",
        "training_samples",
        "created_at",
    ]
    list_filter = ["backend", "status"]
