"""Reads of profiling state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db.models import Count, F, Max, OuterRef, Q, QuerySet, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from controlplane.common.execution import runs_gpu_options
from controlplane.planning.guard import RegimeFacts, host_bound_warnings
from controlplane.profiling.models import ModelWorkload, Predictor, ProfileSample, ProfileSweep
from controlplane.profiling.services.workloads import workload_get
from workers.registry.backends import BACKEND_REGISTRY

if TYPE_CHECKING:  # the experiments app imports the planning guard; profiling reads it only by duck typing
    from controlplane.experiments.models import Experiment, Task

REGIME_SAMPLES = 200
"""How many of a device's latest samples with a host time or GPU busy fraction say its regime
(:func:`device_regimes`): recent enough to follow a change of trainer, enough for a median."""


def sweeps_in_progress() -> QuerySet[ProfileSweep]:
    """Sweeps pending or running: each holds its device's agent, so the lab scheduler grants
    that device to no round."""
    return ProfileSweep.objects.filter(status__in=[ProfileSweep.Status.PENDING, ProfileSweep.Status.RUNNING])


def sweep_progress(sweep: ProfileSweep) -> float:
    """Fraction of a sweep's time budget spent, in [0, 1] (1 once it ended)."""
    if sweep.ended:
        return 1.0
    if sweep.started_at is None:
        return 0.0
    return min(1.0, (timezone.now() - sweep.started_at).total_seconds() / sweep.budget_s)


def predictor_history(*, backend: str, device_class: str) -> list[Predictor]:
    """Ready predictors of a device class, oldest first (how the error changes as it learns)."""
    return list(
        Predictor.objects.filter(backend=backend, device_class=device_class, status=Predictor.Status.READY).order_by(
            "version"
        )
    )


def device_regimes(device_ids: Iterable[int] | QuerySet[Any]) -> list[RegimeFacts]:
    """The regime facts (:class:`~controlplane.planning.guard.RegimeFacts`) of the GPU devices
    among ``device_ids`` (ids, or a query of them), by device name: their latest
    :data:`REGIME_SAMPLES` profile samples (sweeps and FL rounds) that measured a host time or a
    GPU busy fraction, of the execution mode of the latest one (a device profiled eager, then
    with graphs, is judged on graphs).

    Devices of the ``cpu`` backend are left out: there the host does the work, so a step's host
    time is the whole step and says nothing about launch overhead. On the ``simulated`` backend
    only samples of a modelled GPU (with a GPU busy fraction) count. Devices without such samples
    are left out too. One query whatever the number of devices: the experiment page asks for
    every device of an experiment.
    """
    ids = device_ids if isinstance(device_ids, QuerySet) else list(device_ids)
    gpu = [b.name for b in BACKEND_REGISTRY if b.gpu]
    timed = Q(gpu_busy_fraction__isnull=False) | Q(host_step_s__isnull=False, device__backend__in=gpu)
    latest_mode = (
        ProfileSample.objects.filter(timed, device_id=OuterRef("device_id"))
        .order_by("-id")
        .values("execution_mode")[:1]
    )
    rows = (
        ProfileSample.objects.filter(timed, device_id__in=ids, device__backend__in=_gpu_option_backends())
        .annotate(
            latest_mode=Subquery(latest_mode),
            recency=Window(RowNumber(), partition_by=[F("device_id"), F("execution_mode")], order_by=F("id").desc()),
        )
        .filter(execution_mode=F("latest_mode"), recency__lte=REGIME_SAMPLES)
        .values_list(
            "device__name", "execution_mode", "gpu_busy_fraction", "host_step_s", "throughput_sps", "batch_size"
        )
    )
    by_device: dict[str, tuple[str, list[float], list[float]]] = {}
    for name, mode, busy, host_step_s, throughput_sps, batch_size in rows:
        _, busy_fractions, shares = by_device.setdefault(name, (mode, [], []))
        if busy is not None:
            busy_fractions.append(busy)
        if host_step_s is not None and throughput_sps and batch_size:
            shares.append(host_step_s * throughput_sps / batch_size)  # host seconds × steps per second
    return [RegimeFacts(name, busy, shares, mode) for name, (mode, busy, shares) in sorted(by_device.items())]


def _gpu_option_backends() -> list[str]:
    """The registered backends that run (or, ``simulated``, model) a GPU's execution options."""
    return [b.name for b in BACKEND_REGISTRY if runs_gpu_options(b.name)]


def regime_warnings(device_ids: Iterable[int] | QuerySet[Any]) -> list[str]:
    """The guard's host-bound warnings (:func:`controlplane.planning.guard.host_bound_warnings`)
    for the devices ``device_ids``: advice shown beside the predictor's warnings, never a reason
    to distrust it."""
    return host_bound_warnings(device_regimes(device_ids))


def experiment_regime_warnings(experiment: Experiment) -> list[str]:
    """:func:`regime_warnings` of the devices holding some of ``experiment``'s data (those a run
    of it trains on): shown by the planner check and stored on a predictor-driven run's warnings."""
    return regime_warnings(experiment.shards.filter(num_samples__gt=0).values("device_id"))


def predictor_list() -> QuerySet[Predictor]:
    """Every predictor version, newest first."""
    return Predictor.objects.order_by("-id")


def sweep_list() -> QuerySet[ProfileSweep]:
    """Every profiling sweep, newest first, with its device and who started it joined."""
    return ProfileSweep.objects.select_related("device", "started_by").order_by("-id")


def task_workloads(tasks: Iterable[Task]) -> dict[int, ModelWorkload | None]:
    """Each task's model workload features at its classes and input shape, by task id (``None``
    until the control worker has computed them): :func:`~.services.workloads.workload_get`."""
    return {
        task.id: workload_get(
            architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape
        )
        for task in tasks
    }


def sampled_device_classes() -> list[dict[str, Any]]:
    """Every ``(backend, device class)`` that has profile samples, newest sampled first:
    ``{"backend", "device_class", "samples"}`` (what a predictor can be fitted on, for the
    dashboard's fit form)."""
    rows = (
        ProfileSample.objects.values("backend", "device_class")
        .annotate(samples=Count("id"), newest=Max("id"))
        .order_by("-newest")
    )
    return [{"backend": r["backend"], "device_class": r["device_class"], "samples": r["samples"]} for r in rows]


def sweep_configurations(sweep: ProfileSweep, *, limit: int = 200) -> list[dict[str, Any]]:
    """What a sweep measured, one entry per configuration in the order measured (the first
    ``limit``): ``{"config_key", "repeat_of", "tasks": [{"architecture", "batch_size",
    "active_thread_percentage", "throughput_sps", "standalone_sps"}]}``, throughputs in samples/s
    (``standalone_sps``: the task alone on the device, ``None`` if not measured)."""
    # A configuration has at most 8 tasks (ProfileSweepRequest.max_mix): 8 rows per one shown.
    samples = ProfileSample.objects.filter(sweep=sweep).order_by("id")[: max(0, limit) * 8]
    out: dict[str, dict[str, Any]] = {}
    for s in samples:
        entry = out.setdefault(s.config_key, {"config_key": s.config_key, "repeat_of": s.repeat_of, "tasks": []})
        entry["tasks"].append(
            {
                "architecture": s.architecture,
                "batch_size": s.batch_size,
                "active_thread_percentage": s.active_thread_percentage,
                "throughput_sps": s.throughput_sps,
                "standalone_sps": s.standalone_sps,
            }
        )
    return list(out.values())[:limit]
