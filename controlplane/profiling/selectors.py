"""Reads of profiling state."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.profiling.models import Predictor, ProfileSweep


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
