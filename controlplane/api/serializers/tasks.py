"""Tasks of the lab's catalogue (``/api/tasks/``)."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.api.serializers.common import (
    ChoiceField,
    RegisteredField,
    StrictBooleanField,
    StrictCharField,
    StrictSerializer,
    bounded,
    number,
)
from controlplane.api.serializers.profiling import ModelWorkloadSerializer
from controlplane.common.limits import (
    NUM_CLASSES,
)
from controlplane.experiments.models import (
    EXECUTION_MODES,
    PRECISIONS,
    Task,
)
from workers.protocol.messages import OPTIMIZERS, ExecutionOptions
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY

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
        # Read, not looked up: the view passes each task's workload by id as ``task_workloads``
        # (controlplane.profiling.selectors.task_workloads).
        workload = self.context["task_workloads"][task.id]
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
