"""The Celery boundary of the round protocol: every message the control plane sends, and what it
reads back from the result backend.

Tasks are addressed by name (:class:`workers.protocol.queues.TaskName`) because agents run their own
Celery app. Callers send only after their transaction commits (``transaction.on_commit``), so
a worker never sees an id whose row is not yet visible.

Every request reaching here was checked against the control plane's registries where it was
built (:func:`workers.registry.names.check_names` in :mod:`.rounds.requests` and
:mod:`.rounds.alone`: its model, data set, backend and aggregator names; the wire schema checks
only their shape), inside the transaction that stores the round, so an unknown name rolls the
round back instead of failing in an on-commit send.

Device tasks get their Celery ids here before they are sent (:func:`new_task_id`), so the ids
are stored with the round first: the round watchdog reads results by id
(:func:`device_task_states`) when a chord cannot complete (an agent died with its task), and
cancelling a run or dropping a straggler marks the ids cancelled (:func:`cancel_device_tasks`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import chord

from controlplane.celery import app
from workers.protocol.messages import StandaloneRequest, TrainRoundRequest
from workers.protocol.queues import CANCELLED_STATE, CONTROL_QUEUE, TaskName, cancel_marker_id, device_queue

log = logging.getLogger(__name__)


def new_task_id() -> str:
    """A fresh Celery task id (what Celery itself would pick)."""
    return str(uuid.uuid4())


def send_run_begin(run_id: int) -> None:
    """Queue :data:`TaskName.RUN_BEGIN` on ``control``."""
    app.send_task(TaskName.RUN_BEGIN, args=[run_id], queue=CONTROL_QUEUE)


def _fan_out(
    device_task: str,
    requests,
    callback: str,
    key: int,
    task_ids: Mapping[str, str],
    callback_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """One ``device_task`` per device request on its ``device.<name>`` queue, with the id
    ``task_ids[device]``, joined by a chord into ``callback(results, key, **callback_kwargs)``
    on ``control``."""
    header = [
        app.signature(
            device_task,
            args=[r.model_dump(mode="json")],
            queue=device_queue(r.device),
            task_id=task_ids[r.device],
        )
        for r in requests
    ]
    chord(header)(app.signature(callback, args=[key], kwargs=dict(callback_kwargs or {}), queue=CONTROL_QUEUE))


def send_standalone(
    run_id: int,
    requests: list[StandaloneRequest],
    *,
    deadline_s: float,
    task_ids: Mapping[str, str],
    before_round: int = 0,
) -> None:
    """Measure ``P_alone`` on every device (``MEASURE_STANDALONE``, ids ``task_ids[device]``),
    then call back ``STANDALONE_RECORDED`` (which starts round ``before_round``);
    ``STANDALONE_WATCHDOG`` at the deadline."""
    _fan_out(
        TaskName.MEASURE_STANDALONE,
        requests,
        TaskName.STANDALONE_RECORDED,
        run_id,
        task_ids,
        callback_kwargs={"before_round": before_round},
    )
    send_standalone_watchdog(run_id, countdown_s=deadline_s, before_round=before_round)


def send_standalone_watchdog(run_id: int, *, countdown_s: float, before_round: int = 0) -> None:
    """Queue ``STANDALONE_WATCHDOG`` of a run, to run after ``countdown_s`` seconds."""
    app.send_task(
        TaskName.STANDALONE_WATCHDOG,
        args=[run_id],
        kwargs={"before_round": before_round},
        queue=CONTROL_QUEUE,
        countdown=max(0.0, countdown_s),
    )


def send_round(
    round_id: int, requests: list[TrainRoundRequest], *, task_ids: Mapping[str, str], check_after_s: float
) -> None:
    """Dispatch a round: ``TRAIN_ROUND`` per device (ids ``task_ids[device]``) → ``ROUND_SETTLE``;
    the first ``ROUND_WATCHDOG`` check after ``check_after_s`` (each check re-arms the next until
    the round ends, so a round never waits for ever)."""
    _fan_out(TaskName.TRAIN_ROUND, requests, TaskName.ROUND_SETTLE, round_id, task_ids)
    send_round_watchdog(round_id, countdown_s=check_after_s)


def send_device_round(request: TrainRoundRequest, *, task_id: str) -> None:
    """Send one device's part of a round again (a retry, outside the round's chord: the round
    watchdog collects its result by ``task_id``)."""
    app.send_task(
        TaskName.TRAIN_ROUND,
        args=[request.model_dump(mode="json")],
        queue=device_queue(request.device),
        task_id=task_id,
    )


def send_round_watchdog(round_id: int, *, countdown_s: float) -> None:
    """Queue a ``ROUND_WATCHDOG`` check of a round after ``countdown_s`` seconds."""
    app.send_task(TaskName.ROUND_WATCHDOG, args=[round_id], queue=CONTROL_QUEUE, countdown=max(0.0, countdown_s))


def send_lab_schedule() -> None:
    """Queue a lab scheduling pass (``LAB_SCHEDULE``) on ``control``: devices were released or
    resumed, so a waiting round may start."""
    app.send_task(TaskName.LAB_SCHEDULE, queue=CONTROL_QUEUE)


def send_checkpoints_evaluate(checkpoint_ids: Iterable[int]) -> None:
    """Queue :data:`TaskName.CHECKPOINTS_EVALUATE` of ``checkpoint_ids`` on ``control``: their
    evaluation runs beside the next round (:mod:`.evaluation`)."""
    app.send_task(TaskName.CHECKPOINTS_EVALUATE, args=[sorted(checkpoint_ids)], queue=CONTROL_QUEUE)


def send_run_retention(run_id: int, round_index: int) -> None:
    """Queue :data:`TaskName.RUN_RETENTION` on ``control``: the retention policy after round
    ``round_index`` of a run ended (:func:`.storage.retention_after_round`), beside the next
    round's training instead of in the task that recorded the round."""
    app.send_task(TaskName.RUN_RETENTION, args=[run_id, round_index], queue=CONTROL_QUEUE)


def send_round_enqueue(run_id: int, index: int) -> None:
    """Queue ``ROUND_ENQUEUE`` of round ``index`` of a run on ``control``."""
    app.send_task(TaskName.ROUND_ENQUEUE, args=[run_id, index], queue=CONTROL_QUEUE)


@dataclass(frozen=True)
class TaskState:
    """What the result backend knows of a device task.

    Attributes:
        status: Celery's state: ``PENDING`` (unknown: queued, lost, or expired), ``STARTED``,
            ``SUCCESS``, ``FAILURE``, ``REVOKED``, ...
        result: the task's return value when ``SUCCESS`` (plain JSON), else ``None``.
        pid: the agent process that started it (``STARTED``), else ``None``.
        hostname: that process's host (``STARTED``), else ``""``.
    """

    status: str
    result: Any = None
    pid: int | None = None
    hostname: str = ""


def _state(meta: Mapping[str, Any] | None) -> TaskState:
    meta = meta or {}
    status = str(meta.get("status") or "PENDING")
    result = meta.get("result")
    if status == "STARTED" and isinstance(result, Mapping):
        pid = result.get("pid")
        return TaskState(status, None, pid if isinstance(pid, int) else None, str(result.get("hostname") or ""))
    return TaskState(status, result if status == "SUCCESS" else None)


def device_task_states(task_ids: Iterable[str]) -> dict[str, TaskState]:
    """Read device tasks' states and results from the result backend, by id.

    Returns:
        ``{task_id: TaskState}`` for every id asked; a backend that cannot be read is logged
        and every id comes back ``PENDING`` (the round then waits for its deadline).
    """
    ids = [t for t in dict.fromkeys(task_ids) if t]
    if not ids:
        return {}
    backend = app.backend
    try:
        if type(backend).__name__ == "RedisBackend":  # one round trip (MGET) for all devices
            values = backend.mget([backend.get_key_for_task(t) for t in ids])
            return {t: _state(backend.decode_result(v) if v else None) for t, v in zip(ids, values, strict=True)}
        return {t: _state(backend.get_task_meta(t)) for t in ids}
    except Exception:  # noqa: BLE001 - see docstring
        log.warning("could not read %d device task states from the result backend", len(ids), exc_info=True)
        return {t: TaskState("PENDING") for t in ids}


def cancel_device_tasks(task_ids: Iterable[str], *, reason: str) -> int:
    """Cancel device tasks: queued ones never run, running ones have their trainers killed.

    Two mechanisms, both Celery's own: ``revoke`` (live agents drop the ids when their message
    comes up) and a cancel marker per id in the result backend
    (:func:`workers.protocol.queues.cancel_marker_id`), which an agent checks before it starts a task and
    every few seconds while it runs — it survives agent restarts and reaches an agent busy in its
    solo pool, which a broadcast does not. Best effort: a broker that cannot be reached is
    logged (the round's deadline still bounds the work).

    Returns:
        How many ids were marked.
    """
    ids = [t for t in dict.fromkeys(task_ids) if t]
    if not ids:
        return 0
    marked = 0
    backend = app.backend
    for task_id in ids:
        try:
            backend.store_result(cancel_marker_id(task_id), {"reason": reason}, CANCELLED_STATE)
            marked += 1
        except Exception:  # noqa: BLE001 - see docstring
            log.warning("could not mark device task %s cancelled", task_id, exc_info=True)
    try:
        app.control.revoke(ids)
    except Exception:  # noqa: BLE001 - see docstring
        log.warning("could not broadcast the revocation of %d device tasks", len(ids), exc_info=True)
    return marked
