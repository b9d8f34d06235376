"""Profiling: workloads, sweeps, samples and predictors (``/api/profile-sweeps/``, ``/api/predictors/``, ...)."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.api.fast_lists import FastReadListSerializer
from controlplane.api.serializers.common import (
    ChoiceField,
    RegisteredField,
    StrictBooleanField,
    StrictCharField,
    StrictSerializer,
    bounded,
    id_list,
    integer,
    number,
)
from controlplane.common.limits import (
    BATCH_SIZE,
    SEED,
    SWEEP_BUDGET,
    SWEEP_BUDGET_SELF_SERVE,
)
from controlplane.experiments.models import (
    EXECUTION_MODES,
    PRECISIONS,
)
from controlplane.profiling.models import (
    ModelWorkload,
    Predictor,
    ProfileSample,
    ProfileSweep,
)
from controlplane.profiling.selectors import sweep_progress
from workers.protocol.messages import ExecutionOptions
from workers.registry.backends import BACKEND_REGISTRY
from workers.registry.models import MODEL_REGISTRY

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
    started_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="who started it; null: the lab's operator (mtfl profile, a script)",
    )

    class Meta:
        model = ProfileSweep
        fields = [
            "id",
            "device",
            "backend",
            "budget_s",
            "request",
            "status",
            "started_by",
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
    budget_s = number(
        help_text=f"seconds of measuring: {SWEEP_BUDGET_SELF_SERVE.span} for a researcher, {SWEEP_BUDGET.span} for "
        "lab staff (no round gets the device meanwhile; a larger budget than yours is a 403)"
    )
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
