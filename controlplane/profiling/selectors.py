"""Reads of profiling state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet
from django.utils import timezone

from controlplane.common.execution import runs_gpu_options
from controlplane.fleet.models import Device
from controlplane.planning.guard import RegimeFacts, host_bound_warnings
from controlplane.profiling.models import Predictor, ProfileSample, ProfileSweep
from workers.registry.backends import BACKEND_REGISTRY

if TYPE_CHECKING:  # the experiments app imports the planning guard; profiling reads it only by duck typing
    from controlplane.experiments.models import Experiment

REGIME_SAMPLES = 200
"""How many of a device's latest samples with a host time or GPU busy fraction say its regime
(:func:`device_regimes`): recent enough to follow a change of trainer, enough for a median."""


def sweeps_in_progress() -> QuerySet[ProfileSweep]:
    """Sweeps pending or running: each holds its device's agent, so the lab scheduler grants
    that device to no round."""
    return ProfileSweep.objects.filter(status__in=[ProfileSweep.Status.PENDING, ProfileSweep.Status.RUNNING])


def sweep_progress(sweep: ProfileSweep) -> float:
    """Fraction of a sweep's time budget spent, in [0, 1] (1 once it ended)."""
    if sweep.status in (ProfileSweep.Status.SUCCEEDED, ProfileSweep.Status.FAILED):
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


def device_regimes(device_ids: Iterable[int]) -> list[RegimeFacts]:
    """The regime facts (:class:`~controlplane.planning.guard.RegimeFacts`) of the GPU devices
    among ``device_ids``, by device name: their latest :data:`REGIME_SAMPLES` profile samples
    (sweeps and FL rounds) that measured a host time or a GPU busy fraction, of the execution
    mode of the latest one (a device profiled eager, then with graphs, is judged on graphs).

    Devices of the ``cpu`` backend are left out: there the host does the work, so a step's host
    time is the whole step and says nothing about launch overhead. On the ``simulated`` backend
    only samples of a modelled GPU (with a GPU busy fraction) count. Devices without such samples
    are left out too.
    """
    out = []
    for device in Device.objects.filter(id__in=list(device_ids)).order_by("name").only("id", "name", "backend"):
        if not runs_gpu_options(device.backend):
            continue
        gpu = device.backend in BACKEND_REGISTRY and BACKEND_REGISTRY.get(device.backend).gpu
        timed = Q(gpu_busy_fraction__isnull=False)
        if gpu:
            timed |= Q(host_step_s__isnull=False)
        measured = ProfileSample.objects.filter(device=device).filter(timed)
        latest = measured.order_by("-id").values_list("execution_mode", flat=True).first()
        if latest is None:
            continue
        rows = (
            measured.filter(execution_mode=latest)
            .order_by("-id")
            .values_list("gpu_busy_fraction", "host_step_s", "throughput_sps", "batch_size")[:REGIME_SAMPLES]
        )
        busy = [b for b, _, _, _ in rows if b is not None]
        shares = [h * p / batch for _, h, p, batch in rows if h is not None and p and batch]
        out.append(RegimeFacts(device.name, busy, shares, latest))
    return out


def regime_warnings(device_ids: Iterable[int]) -> list[str]:
    """The guard's host-bound warnings (:func:`controlplane.planning.guard.host_bound_warnings`)
    for the devices ``device_ids``: advice shown beside the predictor's warnings, never a reason
    to distrust it."""
    return host_bound_warnings(device_regimes(device_ids))


def experiment_regime_warnings(experiment: Experiment) -> list[str]:
    """:func:`regime_warnings` of the devices holding some of ``experiment``'s data (those a run
    of it trains on): shown by the planner check and stored on a predictor-driven run's warnings."""
    holding = experiment.shards.filter(num_samples__gt=0).values_list("device_id", flat=True).distinct()
    return regime_warnings(holding)
