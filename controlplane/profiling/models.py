"""Profiling state: what models cost (workload features), what was measured on devices
(profile sweeps and samples), and the predictors fitted on it.

Model and backend names are plain strings checked by the services against their registries
(:mod:`workers.registry`), so a plug-in's names need no migration."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from controlplane.fleet.models import Device


class ModelWorkload(models.Model):
    """Workload features ``F_i`` of a model at an input shape (docs/DESIGN.md §1), computed once
    with ``torch.utils.flop_counter`` and cached (:class:`workers.protocol.messages.WorkloadFeatures`)."""

    architecture = models.CharField(max_length=64)
    num_classes = models.PositiveIntegerField()
    input_shape = models.JSONField(default=list)
    forward_flops_per_sample = models.FloatField()
    train_flops_per_sample = models.FloatField()
    params = models.BigIntegerField()
    param_bytes = models.BigIntegerField()
    activation_bytes_per_sample = models.FloatField()
    ops_per_step = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="operations one training step dispatches (forward, loss, backward, per-parameter SGD step): "
        "the host launch term's count; null: computed before it was counted",
    )
    computed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["architecture", "num_classes", "input_shape"], name="uniq_workload"),
        ]

    def __str__(self) -> str:
        return f"{self.architecture} ({self.num_classes} classes)"


class ProfileSweep(models.Model):
    """A profiling sweep on a device: co-located mixes measured for ``budget_s`` seconds."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ENDED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
    """The statuses a sweep keeps for good (its device's agent is free of it)."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="profile_sweeps")
    backend = models.CharField(max_length=32)
    budget_s = models.FloatField()
    request = models.JSONField(help_text="the ProfileSweepRequest sent to the agent")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="profile_sweeps",
        help_text="who started it (dashboard, API); null: the operator's CLI or a script",
    )
    task_id = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="the device task's id on the agent's queue, under which a cancellation is marked",
    )
    configs = models.PositiveIntegerField(default=0)
    samples = models.PositiveIntegerField(default=0)
    repeat_spread = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_record_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    @property
    def ended(self) -> bool:
        """The sweep succeeded, failed or was cancelled."""
        return self.status in self.ENDED

    @property
    def max_repeat_spread(self) -> float | None:
        """The largest relative difference between two measurements of a repeated configuration."""
        return max(self.repeat_spread) if self.repeat_spread else None


class ProfileSample(models.Model):
    """One task of one measured co-located configuration.

    ``source`` is ``sweep`` (a profiling sweep) or ``run`` (an assignment of an FL round: the
    closed loop, every measured assignment becomes a sample too). ``configuration`` is every
    task of the configuration (``[{"architecture", "batch_size", "active_thread_percentage"}]``)
    and ``task_index`` says which one this sample measures.
    """

    class Source(models.TextChoices):
        SWEEP = "sweep"
        RUN = "run"

    source = models.CharField(max_length=8, choices=Source.choices)
    sweep = models.ForeignKey(
        ProfileSweep, on_delete=models.CASCADE, null=True, blank=True, related_name="profile_samples"
    )
    assignment = models.OneToOneField(
        "experiments.Assignment", on_delete=models.CASCADE, null=True, blank=True, related_name="profile_sample"
    )
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="profile_samples")
    backend = models.CharField(max_length=32)
    device_class = models.CharField(max_length=64, help_text="the device's class when measured (e.g. cpu-2cores)")
    config_key = models.CharField(max_length=64, help_text="same for every task of one measured configuration")
    configuration = models.JSONField()
    mix_size = models.PositiveSmallIntegerField()
    task_index = models.PositiveSmallIntegerField()
    architecture = models.CharField(max_length=64)
    batch_size = models.PositiveIntegerField()
    active_thread_percentage = models.PositiveSmallIntegerField()
    throughput_sps = models.FloatField()
    standalone_sps = models.FloatField(null=True, blank=True)
    simulated = models.BooleanField(default=False, help_text="from the simulated backend's model, not a measurement")
    peak_memory_bytes = models.BigIntegerField(null=True, blank=True)
    speed_index = models.FloatField(
        null=True,
        blank=True,
        help_text="how fast the device's cores ran while this was measured (speed probe, millions of "
        "probe-loop iterations per CPU-second; cpu backend only); the predictor normalises by it",
    )
    cross_core_rtt_ns = models.FloatField(
        null=True,
        blank=True,
        help_text="median round trip of a cache line between the task's cores while this was measured "
        "(core link probe, ns; cpu backend, tasks on 2+ cores); the predictor learns its effect",
    )
    execution_mode = models.CharField(
        max_length=8,
        blank=True,
        default="",
        help_text="how the trainer ran its steps (eager or graphs), as it reported; empty: not reported",
    )
    host_step_s = models.FloatField(
        null=True,
        blank=True,
        help_text="host (CPU) seconds the trainer spent issuing one step, timed window mean: the launch cost on a "
        "GPU; on cpu, where the host does the work, the whole step",
    )
    gpu_busy_fraction = models.FloatField(
        null=True,
        blank=True,
        help_text="fraction (0-1) of the timed window the GPU was busy (NVML, whole device); null on cpu",
    )
    repeat_of = models.CharField(max_length=64, blank=True, default="", help_text="config_key this one repeats")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["backend", "device_class"]), models.Index(fields=["config_key"])]
        constraints = [models.UniqueConstraint(fields=["config_key", "task_index"], name="uniq_profile_sample")]


class Predictor(models.Model):
    """A fitted throughput predictor for a backend and device class, with its held-out
    accuracy per model family (``metrics``) and the kept family's held-out predictions."""

    class Status(models.TextChoices):
        FITTING = "fitting"
        READY = "ready"
        FAILED = "failed"

    version = models.PositiveIntegerField()
    backend = models.CharField(max_length=32)
    device_class = models.CharField(max_length=64, help_text="e.g. cpu-2cores: devices it applies to")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.FITTING)
    feature_spec = models.JSONField(default=dict, blank=True)
    training_samples = models.PositiveIntegerField(default=0)
    training_configurations = models.PositiveIntegerField(default=0)
    kept_family = models.CharField(max_length=32, blank=True, default="")
    heldout_rmsle = models.FloatField(null=True, blank=True)
    heldout_mape = models.FloatField(null=True, blank=True)
    metrics = models.JSONField(
        default=dict, blank=True, help_text="{family: {rmsle, mape, fit_seconds, by_mix_size, by_slice}}"
    )
    heldout = models.JSONField(default=list, blank=True, help_text="held-out predictions of the kept family")
    artifact_path = models.CharField(max_length=512, blank=True, default="")
    sha256 = models.CharField(max_length=64, blank=True, default="")
    fit_seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["backend", "device_class", "version"], name="uniq_predictor_version")
        ]
