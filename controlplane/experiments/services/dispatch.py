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


def _fan_out(device_task: str, requests, callback: str, watchdog: str, key: int, deadline_s: float) -> None:
    """One ``device_task`` per device request on its ``device.<name>`` queue, joined by a
    chord into ``callback(results, key)`` on ``control``, plus ``watchdog(key)`` after
    ``deadline_s`` so a device that never answers cannot hold the run."""
    header = [
        app.signature(device_task, args=[r.model_dump(mode="json")], queue=device_queue(r.device)) for r in requests
    ]
    chord(header)(app.signature(callback, args=[key], queue=CONTROL_QUEUE))
    app.send_task(watchdog, args=[key], queue=CONTROL_QUEUE, countdown=deadline_s)


def send_standalone(run_id: int, requests: list[StandaloneRequest], *, deadline_s: float) -> None:
    """Measure ``P_alone`` on every device (``MEASURE_STANDALONE``), then call back
    ``STANDALONE_RECORDED``; ``STANDALONE_WATCHDOG`` at the deadline."""
    _fan_out(TaskName.MEASURE_STANDALONE, requests, TaskName.STANDALONE_RECORDED, TaskName.STANDALONE_WATCHDOG,
             run_id, deadline_s)


def send_round(round_id: int, requests: list[TrainRoundRequest], *, deadline_s: float) -> None:
    """Dispatch a round: ``TRAIN_ROUND`` per device → ``ROUND_FINISH``; ``ROUND_WATCHDOG`` at the
    deadline, so a round never waits for ever."""
    _fan_out(TaskName.TRAIN_ROUND, requests, TaskName.ROUND_FINISH, TaskName.ROUND_WATCHDOG, round_id, deadline_s)


def send_round_start(run_id: int, index: int) -> None:
    """Queue ``ROUND_START`` of round ``index`` of a run on ``control``."""
    app.send_task(TaskName.ROUND_START, args=[run_id, index], queue=CONTROL_QUEUE)
