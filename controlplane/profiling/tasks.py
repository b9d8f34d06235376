"""Control-queue Celery tasks of profiling: each calls a service."""

from __future__ import annotations

from controlplane.celery import app
from controlplane.profiling import services
from workers.protocol.queues import TaskName


@app.task(name=TaskName.TASK_FEATURES, ignore_result=True)
def task_features(architecture: str, num_classes: int, input_shape: list[int] | None = None) -> None:
    services.workload_ensure(architecture=architecture, num_classes=num_classes, input_shape=input_shape)


@app.task(name=TaskName.PROFILE_RECORD, ignore_result=True)
def profile_record(result: dict) -> None:
    services.profile_record(result=result)


@app.task(name=TaskName.PROFILE_DONE, ignore_result=True)
def profile_done(summary: dict) -> None:
    services.profile_done(summary=summary)


@app.task(name=TaskName.PROFILE_SWEEP_WATCHDOG, ignore_result=True)
def profile_sweep_watchdog(sweep_id: int) -> None:
    services.sweep_watchdog(sweep_id=sweep_id)


@app.task(name=TaskName.PREDICTOR_FIT, ignore_result=True, soft_time_limit=3600, time_limit=3900)
def predictor_fit(predictor_id: int) -> None:
    services.predictor_fit(predictor_id=predictor_id)
