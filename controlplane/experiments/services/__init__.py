"""Writes to experiment state (the only place that changes it), one module per concern:
:mod:`.catalog` (tasks, experiments, shards), :mod:`.runs` (the round protocol),
:mod:`.dispatch` (the Celery messages it sends)."""

from controlplane.experiments.services.catalog import (
    experiment_create,
    experiment_update,
    task_create,
    task_update,
)
from controlplane.experiments.services.runs import (
    round_finish,
    round_progress,
    round_start,
    round_watchdog,
    run_begin,
    run_cancel,
    run_create,
    run_fail,
    run_finish,
    standalone_record,
    standalone_watchdog,
)

__all__ = [
    "experiment_create",
    "experiment_update",
    "round_finish",
    "round_progress",
    "round_start",
    "round_watchdog",
    "run_begin",
    "run_cancel",
    "run_create",
    "run_fail",
    "run_finish",
    "standalone_record",
    "standalone_watchdog",
    "task_create",
    "task_update",
]
