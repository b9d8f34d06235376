"""Dispatching a round the lab scheduler leased its devices to
(:mod:`controlplane.lab.services.scheduler`): plan its participants, save their
assignments (each with its device's task id and the round's deadline) and dispatch it as a
chord, with its watchdog's first check.

With partial participation (``Experiment.clients_per_round`` or ``client_fraction``) a round
reads, plans, saves and dispatches its participants only (:mod:`..participation`): its cost
follows the number of participants, not the size of the federation. The devices left out have
no assignment in the round, so the aggregate, the metrics and the watchdog (all built on a
round's assignments) never see them.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.common.bulk import bulk_insert
from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run, Task
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.execution import task_execution
from controlplane.experiments.services.planning import plan_from_json, plan_to_json, round_plan
from controlplane.experiments.services.rounds.aggregate import task_trainer_options
from controlplane.experiments.services.rounds.alone import standalone_dispatch
from controlplane.experiments.services.rounds.deadlines import round_check_after_s, round_deadline_s
from controlplane.experiments.services.rounds.requests import RequestedAssignment, round_device_request
from controlplane.experiments.services.runs import run_fail
from controlplane.experiments.services.standalone_cache import standalone_cache_fill
from controlplane.fleet.models import Device
from controlplane.planning.types import Plan, PlannedAssignment, PlanningError
from workers.protocol.messages import TrainRoundRequest


def round_dispatch(*, round_id: int) -> Round | None:
    """Plan a round the lab scheduler has just leased its devices to, save its assignments and
    dispatch it (:mod:`controlplane.lab.services.scheduler` calls this once the
    round is ``running`` with its leases held).

    The round's participants (``Round.participants``: drawn when it was enqueued, or the pool
    devices it was placed on; ``None``: every device) are planned. Predictor-driven runs replan
    from what they measured (:func:`.planning.round_plan`; the decisions are kept in
    ``Round.replan``). A plan the strategy can no longer make fails the run with the planner's
    message. A participant whose ``P_alone`` at its planned batch sizes was measured nowhere yet
    (round 0's devices, one drawn for the first time, or a replanned batch size) is measured
    first on the leased devices (:mod:`.alone`); the round is then dispatched again by
    ``STANDALONE_RECORDED`` and trains the plan kept on the run. The round's deadline counts
    from the training dispatch.

    Returns:
        The round, or ``None`` when the run or the round is no longer running, its planning
        failed, or it was already dispatched (a duplicate delivery).
    """
    rnd = Round.objects.select_related("run__experiment").filter(id=round_id).first()
    if rnd is None or rnd.status != Round.Status.RUNNING or rnd.deadline_at is not None:
        return None
    run = rnd.run
    if run.status != Run.Status.RUNNING:
        return None
    experiment = run.experiment
    index = rnd.index
    participants = rnd.participants
    pending = (run.planned or {}).get("pending_round")
    if pending and pending.get("index") == index:
        # Planned before its missing P_alone were measured: train that plan.
        plan, replan = plan_from_json(pending["plan"]), pending.get("replan")
    else:
        try:
            plan, replan = round_plan(run, index, device_ids=participants)
        except (PlanningError, ApplicationError) as exc:
            run_fail(run_id=run.id, error=f"planning round {index} failed: {exc}")
            return None
        if _await_standalone(run, index, plan, replan, participants):
            return rnd
    inputs = _dispatch_inputs(run, plan)
    deadline_s = round_deadline_s(predicted_round_time_s=plan.predicted_round_time_s, factor=experiment.deadline_factor)
    task_ids = {d.name: dispatch.new_task_id() for d in inputs.devices.values()}
    flags = _unknown_alone_flags(plan, inputs)
    now = timezone.now()
    with transaction.atomic():
        dispatched_now = Round.objects.filter(id=rnd.id, status=Round.Status.RUNNING, deadline_at__isnull=True).update(
            flags=[*rnd.flags, *flags],
            predicted_round_time_s=plan.predicted_round_time_s,
            replan=replan,
            deadline_s=deadline_s,
            deadline_at=now + dt.timedelta(seconds=deadline_s),
        )
        if not dispatched_now:
            return None
        _assignments_save(rnd, plan, inputs, task_ids)
        requests = _device_requests(rnd, plan, inputs)
        dispatched = {r.device: task_ids[r.device] for r in requests}
        transaction.on_commit(
            lambda: dispatch.send_round(
                rnd.id, requests, task_ids=dispatched, check_after_s=round_check_after_s(deadline_s)
            )
        )
    rnd.refresh_from_db()
    return rnd


@dataclass(frozen=True)
class _DispatchInputs:
    """What a round's dispatch reads of its planned devices: ``shards`` (with indices),
    ``tasks`` and ``devices`` by id, ``alone`` (``P_alone`` by ``(device, task, batch size)``) and
    ``latest`` (each task's current global checkpoint)."""

    shards: dict[tuple[int, int], Any]
    tasks: dict[int, Task]
    devices: dict[int, Device]
    alone: dict[tuple[int, int, int], float]
    latest: dict[int, Checkpoint]


def _dispatch_inputs(run: Run, plan: Plan) -> _DispatchInputs:
    """Read what the dispatch of ``plan`` needs, for its planned devices only."""
    experiment = run.experiment
    planned_devices = sorted({a.device_id for a in plan.assignments})
    shards = selectors.experiment_shards(experiment, with_indices=True, device_ids=planned_devices)
    tasks = {t.id: t for t in experiment.tasks.all()}
    devices = {
        d.id: d
        for d in selectors.experiment_devices(experiment, device_ids=planned_devices, fields=["id", "name", "backend"])
    }
    alone = selectors.standalone_table(run, device_ids=planned_devices)
    latest = selectors.latest_checkpoints(run)
    return _DispatchInputs(shards, tasks, devices, alone, latest)


def _unknown_alone_flags(plan: Plan, inputs: _DispatchInputs) -> list[str]:
    """A flag line per planned assignment whose ``P_alone`` is unknown (its device is then left
    out of the round's fair throughput)."""
    names = {
        **{("d", d.id): d.name for d in inputs.devices.values()},
        **{("t", t.id): t.name for t in inputs.tasks.values()},
    }
    return [
        f"P_alone of {names[('t', a.task_id)]} on {names[('d', a.device_id)]} is unknown: fair throughput leaves that device out"
        for a in plan.assignments
        if not inputs.alone.get((a.device_id, a.task_id, a.batch_size))
    ]


def _assignments_save(rnd: Round, plan: Plan, inputs: _DispatchInputs, task_ids: dict[str, str]) -> None:
    """Insert the plan's assignments of ``rnd``, each with its ``P_alone`` and its device's task id."""
    bulk_insert(
        Assignment,
        [
            dict(
                round_id=rnd.id,
                device_id=a.device_id,
                task_id=a.task_id,
                batch_size=a.batch_size,
                active_thread_percentage=a.active_thread_percentage,
                samples=a.samples,
                predicted_throughput_sps=a.predicted_throughput_sps,
                standalone_throughput_sps=inputs.alone.get((a.device_id, a.task_id, a.batch_size)),
                device_task_id=task_ids[inputs.devices[a.device_id].name],
            )
            for a in plan.assignments
        ],
    )


def _device_requests(rnd: Round, plan: Plan, inputs: _DispatchInputs) -> list[TrainRoundRequest]:
    """Each planned device's part of the round (:func:`.requests.round_device_request`), by
    device id, its saved assignments in plan order."""
    run = rnd.run
    # Reloaded: an INSERT run for many rows returns no primary keys.
    id_of = {(d, t): pk for pk, d, t in rnd.assignments.values_list("id", "device_id", "task_id")}
    task_refs = {task_id: selectors.task_ref(task) for task_id, task in inputs.tasks.items()}
    executions = {task_id: task_execution(task) for task_id, task in inputs.tasks.items()}
    warmup_iterations = mtfl_setting("WARMUP_ITERATIONS")
    # Each task's once, not once per device (rnd.run is run).
    trainer_options = {t: task_trainer_options(run, t) for t in {a.task_id for a in plan.assignments}}
    on_device: dict[int, list[PlannedAssignment]] = defaultdict(list)
    for a in plan.assignments:
        on_device[a.device_id].append(a)
    return [
        round_device_request(
            rnd=rnd,
            experiment=run.experiment,
            device=inputs.devices[device_id],
            partitioning=plan.partitioning_of(device_id),
            assignments=[
                RequestedAssignment(
                    id_of[(a.device_id, a.task_id)], a.task_id, a.batch_size, a.active_thread_percentage
                )
                for a in on_device[device_id]
            ],
            shards=inputs.shards,
            latest=inputs.latest,
            task_refs=task_refs,
            executions=executions,
            warmup_iterations=warmup_iterations,
            trainer_options=trainer_options,
        )
        for device_id in sorted(on_device)
    ]


def _await_standalone(
    run: Run, index: int, plan: Plan, replan: dict[str, Any] | None, participants: list[int] | None
) -> bool:
    """Whether round ``index`` must wait for ``P_alone`` of batch sizes its plan gives and
    nothing measured yet (round 0's, a replanned batch size, or a participant drawn for the
    first time: :mod:`.alone`); if so, keep the plan on the run and ask the devices. A (device,
    task, batch size) measured before for this run, even unsuccessfully, is not asked again; one
    the cross-run cache holds (:mod:`..standalone_cache`: same device, workload and environment,
    young enough) is recorded from it and not asked either, so a run whose ``P_alone`` are all
    cached dispatches round 0 at once. Only the participants' rows are read.
    """
    known = set(selectors.standalone_table(run, device_ids=participants))
    missing = [a for a in plan.assignments if (a.device_id, a.task_id, a.batch_size) not in known]
    if missing:
        missing = standalone_cache_fill(run, missing)
    if not missing:
        return False
    planned = dict(run.planned or {})
    planned["pending_round"] = {
        "index": index,
        "plan": plan_to_json(plan),
        "replan": replan,
        "participants": participants,
    }
    Run.objects.filter(id=run.id).update(planned=planned)
    run.planned = planned
    transaction.on_commit(lambda: standalone_dispatch(run, missing, before_round=index))
    return True
