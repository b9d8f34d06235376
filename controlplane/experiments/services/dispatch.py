"""The Celery boundary of the round protocol: every message the control plane sends.

Tasks are addressed by name (:class:`workers.queues.TaskName`) because agents run their own
Celery app. Callers send only after their transaction commits (``transaction.on_commit``), so
a worker never sees an id whose row is not yet visible.
"""

from __future__ import annotations

from celery import chord

from controlplane.celery import app
from workers.messages import StandaloneRequest, TrainRoundRequest
from workers.queues import CONTROL_QUEUE, TaskName, device_queue


def send_run_begin(run_id: int) -> None:
    """Queue :data:`TaskName.RUN_BEGIN` on ``control``."""
    app.send_task(TaskName.RUN_BEGIN, args=[run_id], queue=CONTROL_QUEUE)


def send_standalone(run_id: int, requests: list[StandaloneRequest], *, deadline_s: float) -> None:
    """Measure ``P_alone`` on every device, then call back ``STANDALONE_RECORDED``.

    A chord: one ``measure_standalone`` per device on ``device.<name>``, callback on ``control``,
    plus ``STANDALONE_WATCHDOG`` after ``deadline_s`` so a device that never answers cannot hold
    the run before its first round.
    """
    header = [
        app.signature(TaskName.MEASURE_STANDALONE, args=[r.model_dump(mode="json")], queue=device_queue(r.device))
        for r in requests
    ]
    body = app.signature(TaskName.STANDALONE_RECORDED, args=[run_id], queue=CONTROL_QUEUE)
    chord(header)(body)
    app.send_task(TaskName.STANDALONE_WATCHDOG, args=[run_id], queue=CONTROL_QUEUE, countdown=deadline_s)


def send_round(round_id: int, requests: list[TrainRoundRequest], *, deadline_s: float) -> None:
    """Dispatch a round: a chord of ``train_round`` per device → ``ROUND_FINISH`` on ``control``,
    plus ``ROUND_WATCHDOG`` after ``deadline_s`` so a round never waits for ever."""
    header = [
        app.signature(TaskName.TRAIN_ROUND, args=[r.model_dump(mode="json")], queue=device_queue(r.device))
        for r in requests
    ]
    body = app.signature(TaskName.ROUND_FINISH, args=[round_id], queue=CONTROL_QUEUE)
    chord(header)(body)
    app.send_task(TaskName.ROUND_WATCHDOG, args=[round_id], queue=CONTROL_QUEUE, countdown=deadline_s)


def send_round_start(run_id: int, index: int) -> None:
    """Queue ``ROUND_START`` of round ``index`` of a run on ``control``."""
    app.send_task(TaskName.ROUND_START, args=[run_id, index], queue=CONTROL_QUEUE)
