"""Control-queue Celery tasks of the round protocol: each loads ids and calls a service."""

from __future__ import annotations

from controlplane.celery import app
from controlplane.experiments import services
from workers.queues import TaskName


@app.task(name=TaskName.RUN_BEGIN, ignore_result=True)
def run_begin(run_id: int) -> None:
    services.run_begin(run_id=run_id)


@app.task(name=TaskName.STANDALONE_RECORDED, ignore_result=True)
def standalone_recorded(results: list, run_id: int) -> None:
    services.standalone_record(run_id=run_id, results=results)


@app.task(name=TaskName.STANDALONE_WATCHDOG, ignore_result=True)
def standalone_watchdog(run_id: int) -> None:
    services.standalone_watchdog(run_id=run_id)


@app.task(name=TaskName.ROUND_START, ignore_result=True)
def round_start(run_id: int, index: int) -> None:
    services.round_start(run_id=run_id, index=index)


@app.task(name=TaskName.ROUND_PROGRESS, ignore_result=True)
def round_progress(round_id: int, device: str, phase: str, at: float | None = None) -> None:
    services.round_progress(round_id=round_id, device=device, phase=phase, at=at)


@app.task(name=TaskName.ROUND_FINISH, ignore_result=True)
def round_finish(results: list, round_id: int) -> None:
    services.round_finish(round_id=round_id, results=results)


@app.task(name=TaskName.ROUND_WATCHDOG, ignore_result=True)
def round_watchdog(round_id: int) -> None:
    services.round_watchdog(round_id=round_id)
