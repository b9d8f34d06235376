"""Celery queue and task names shared by the control plane and the device agents.

The control plane and the agents are two Celery apps on the same broker; they address each
other's tasks by name only, so every name lives here and nowhere else.
"""

from __future__ import annotations

import re

CONTROL_QUEUE = "control"
"""Queue served by the control-plane worker: round bookkeeping, FedAvg, evaluation."""

DEVICE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
"""Allowed device names: lower-case letters, digits, ``-`` and ``_``; 1 to 63 characters."""


def device_queue(device_name: str) -> str:
    """Return the Celery queue a device agent serves, ``device.<name>``.

    Raises:
        ValueError: if ``device_name`` does not match :data:`DEVICE_NAME_RE`.
    """
    if not DEVICE_NAME_RE.match(device_name):
        raise ValueError(f"device name {device_name!r} is invalid: use 1-63 lower-case letters, digits, '-' or '_'")
    return f"device.{device_name}"


def cancel_marker_id(task_id: str) -> str:
    """The result-backend id under which the control plane marks a device task cancelled.

    The control plane stores ``{"reason": ...}`` there in state :data:`CANCELLED_STATE` (run
    cancelled, a straggler past the round deadline, an attempt superseded by a retry); the
    agent checks it before starting the task and while it runs, and kills the task's trainers
    when it appears. A key of its own, because the task's own state is overwritten as it runs.
    """
    return f"{task_id}.cancel"


CANCELLED_STATE = "CANCELLED"
"""Result-backend state of a :func:`cancel_marker_id` record."""


class TaskName:
    """Registered Celery task names (the ``name=`` of every ``@app.task``).

    Plain ``str`` constants, not an enum: Celery treats any object with a ``.name`` attribute
    as a task instance, which an enum member would be mistaken for.
    """

    # served by device agents on device.<name>
    TRAIN_ROUND = "mtfl.train_round"
    MEASURE_STANDALONE = "mtfl.measure_standalone"
    PROFILE_SWEEP = "mtfl.profile_sweep"
    # served by the control worker on "control"
    DEVICE_REGISTER = "mtfl.device_register"
    DEVICE_HEARTBEAT = "mtfl.device_heartbeat"
    RUN_BEGIN = "mtfl.run_begin"
    STANDALONE_RECORDED = "mtfl.standalone_recorded"
    STANDALONE_WATCHDOG = "mtfl.standalone_watchdog"
    ROUND_ENQUEUE = "mtfl.round_enqueue"
    ROUND_PROGRESS = "mtfl.round_progress"
    ROUND_SETTLE = "mtfl.round_settle"
    ROUND_WATCHDOG = "mtfl.round_watchdog"
    CHECKPOINTS_EVALUATE = "mtfl.checkpoints_evaluate"
    RUN_RETENTION = "mtfl.run_retention"
    RUNS_RESUME = "mtfl.runs_resume"
    LAB_SCHEDULE = "mtfl.lab_schedule"
    PROFILE_RECORD = "mtfl.profile_record"
    PROFILE_DONE = "mtfl.profile_done"
    PROFILE_SWEEP_WATCHDOG = "mtfl.profile_sweep_watchdog"
    PREDICTOR_FIT = "mtfl.predictor_fit"
    TASK_FEATURES = "mtfl.task_features"
