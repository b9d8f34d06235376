"""Writes to experiment state (the only place that changes it), one module per concern:
:mod:`.catalog` (tasks, experiments, shards), :mod:`.runs` (the round protocol),
:mod:`.dispatch` (the Celery messages it sends), :mod:`.reliability` (deadlines, lost agents,
stragglers, retries, cancel and resume), :mod:`.templates` (the built-in experiment templates)."""

from controlplane.experiments.services.catalog import (
    experiment_create,
    experiment_update,
    task_create,
    task_update,
)
from controlplane.experiments.services.runs import (
    comparison_cancel,
    comparison_create,
    round_finish,
    round_progress,
    round_start,
    run_begin,
    run_cancel,
    run_create,
    run_fail,
    run_finish,
    standalone_record,
    standalone_watchdog,
)
from controlplane.experiments.services.reliability import (
    round_check,
    round_deadline_s,
    round_watchdog,
    run_work_stop,
    runs_resume,
)
from controlplane.experiments.services.templates import experiment_create_from_template

__all__ = [
    "comparison_cancel",
    "comparison_create",
    "experiment_create",
    "experiment_create_from_template",
    "experiment_update",
    "round_check",
    "round_deadline_s",
    "round_finish",
    "round_progress",
    "round_start",
    "round_watchdog",
    "run_begin",
    "run_cancel",
    "run_create",
    "run_fail",
    "run_finish",
    "run_work_stop",
    "runs_resume",
    "standalone_record",
    "standalone_watchdog",
    "task_create",
    "task_update",
]
