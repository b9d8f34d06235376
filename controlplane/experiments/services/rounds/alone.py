"""Asking devices for ``P_alone``: each task alone on the whole device at a batch size, the
denominator of fair throughput (Yu et al. 2022, §5).

Before round 0 every (device, task, batch size) round 0 trains is measured
(:func:`..standalone.run_begin`): every device's, or with partial participation round 0's
participants' only. A later round may train what was measured nowhere yet: a batch size a
replanning run (:mod:`controlplane.planning.closed_loop`) gives, or a participant drawn for the
first time. :func:`.dispatch.round_dispatch` then keeps the round's plan on the run
(``Run.planned["pending_round"]``), asks for the missing ``P_alone`` only, and starts the round
with that plan when they are recorded or at their deadline.

What another run measured on the same device for the same workload and environment is not
measured again (:mod:`..standalone_cache`): :func:`.dispatch.round_dispatch` records it from the
cache first and asks only for what is left, so a run whose ``P_alone`` are all cached dispatches
round 0 at once. What is missing is measured before the round, not beside it: measured while the
round trains on the same cores or GPU, both the measurement and the round would be slowed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.execution import task_execution
from controlplane.experiments.services.rounds.requests import shard_ref
from controlplane.planning.types import PlannedAssignment
from workers.protocol.messages import StandaloneItem, StandaloneRequest
from workers.registry.names import check_names


def standalone_dispatch(run: Run, assignments: Iterable[PlannedAssignment], *, before_round: int) -> None:
    """Ask every device of ``assignments`` for ``P_alone`` of its tasks at their batch sizes,
    then (``STANDALONE_RECORDED``) start round ``before_round``; its watchdog starts the round
    anyway at ``MTFL_ROUND_DEADLINE_S``."""
    experiment = run.experiment
    on_device: dict[int, list[PlannedAssignment]] = defaultdict(list)
    for a in assignments:
        on_device[a.device_id].append(a)
    shards = selectors.experiment_shards(experiment, with_indices=True, device_ids=list(on_device))
    tasks = {t.id: (selectors.task_ref(t), task_execution(t)) for t in experiment.tasks.all()}
    devices = {
        d.id: d
        for d in selectors.experiment_devices(experiment, device_ids=list(on_device), fields=["id", "name", "backend"])
    }
    requests = []
    for device_id in sorted(on_device):
        items = [
            StandaloneItem(
                task=tasks[a.task_id][0],
                batch_size=a.batch_size,
                shard=shard_ref(experiment, shards[(a.device_id, a.task_id)]),
                # The task's own options: P_alone is the denominator of the rounds' fair
                # throughput, so it is measured the way the rounds train.
                execution=tasks[a.task_id][1],
            )
            for a in on_device[device_id]
        ]
        requests.append(  # names checked before the task ids are written
            check_names(
                StandaloneRequest(
                    run_id=run.id,
                    device=devices[device_id].name,
                    backend=devices[device_id].backend,
                    warmup_iterations=mtfl_setting("WARMUP_ITERATIONS"),
                    timed_iterations=mtfl_setting("STANDALONE_TIMED_ITERATIONS"),
                    items=items,
                )
            )
        )
    task_ids = {r.device: dispatch.new_task_id() for r in requests}
    Run.objects.filter(id=run.id).update(standalone_task_ids=task_ids)
    dispatch.send_standalone(
        run.id,
        requests,
        deadline_s=float(mtfl_setting("ROUND_DEADLINE_S")),
        task_ids=task_ids,
        before_round=before_round,
    )
