"""Writes to experiment state (the only place that changes it), one module per concern, each
importing only the ones listed before it:

- :mod:`.dispatch` — the Celery messages the round protocol sends, and what it reads back;
- :mod:`.execution` — a task's execution options (graphs, bf16, channels-last), checked against
  the devices that train it;
- :mod:`.planning` — the planners' inputs and the plan a run's rounds train;
- :mod:`.catalog`, :mod:`.templates` — tasks (checked in a child process, their data's metadata),
  experiments, shards (chosen by a partitioner, with label histograms), built-in templates;
- :mod:`.plugins` — the models and data sets a run needs, on every device and the control plane;
- :mod:`.stop` — stopping work in flight (a cancelled run's rounds and device tasks);
- :mod:`.runs` — runs and comparisons: create, cancel, fail, finish;
- :mod:`.evaluation` — global models evaluated on their test split, beside the next round;
- :mod:`.rounds` — the round protocol, one module per step: enqueue, dispatch, settle, record,
  aggregate, advance (and the requests and deadlines they build on);
- :mod:`.standalone` — a run's beginning: initial models, ``P_alone``, round 0;
- :mod:`.reliability` — the round watchdog, retries, stragglers, resume after a restart.

The public names of all of them are re-exported here.
"""

from controlplane.experiments.services.catalog import (
    experiment_create,
    experiment_update,
    task_create,
    task_metadata_ensure,
    task_update,
)
from controlplane.experiments.services.evaluation import checkpoints_evaluate
from controlplane.experiments.services.plugins import experiment_plugins_check
from controlplane.experiments.services.reliability import round_watchdog, runs_liveness_sweep, runs_resume
from controlplane.experiments.services.rounds.deadlines import round_deadline_s
from controlplane.experiments.services.rounds.dispatch import round_dispatch
from controlplane.experiments.services.rounds.enqueue import round_enqueue
from controlplane.experiments.services.rounds.record import round_progress, round_record
from controlplane.experiments.services.rounds.settle import round_settle
from controlplane.experiments.services.runs import (
    comparison_cancel,
    comparison_create,
    run_cancel,
    run_create,
    run_fail,
    run_finish,
)
from controlplane.experiments.services.standalone import run_begin, standalone_record, standalone_watchdog
from controlplane.experiments.services.stop import run_work_stop
from controlplane.experiments.services.templates import experiment_create_from_template

__all__ = [
    "checkpoints_evaluate",
    "comparison_cancel",
    "comparison_create",
    "experiment_create",
    "experiment_create_from_template",
    "experiment_plugins_check",
    "experiment_update",
    "round_settle",
    "round_deadline_s",
    "round_record",
    "round_progress",
    "round_enqueue",
    "round_dispatch",
    "round_watchdog",
    "run_begin",
    "run_cancel",
    "run_create",
    "run_fail",
    "run_finish",
    "run_work_stop",
    "runs_liveness_sweep",
    "runs_resume",
    "standalone_record",
    "standalone_watchdog",
    "task_create",
    "task_metadata_ensure",
    "task_update",
]
