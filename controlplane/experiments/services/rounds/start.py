"""Starting a round: plan it, save its assignments (each with its device's task id and the
round's deadline) and dispatch it as a chord, with its watchdog's first check."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.db import transaction
from django.utils import timezone

from controlplane.common.bulk import bulk_insert
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.planning import run_plan
from controlplane.experiments.services.rounds.deadlines import round_check_after_s, round_deadline_s
from controlplane.experiments.services.rounds.requests import RequestedAssignment, round_device_request
from controlplane.experiments.services.runs import run_fail
from controlplane.planning.types import PlannedAssignment, PlanningError


def round_start(*, run_id: int, index: int) -> Round | None:
    """Plan round ``index`` of a running run, save its assignments and dispatch it.

    A plan the strategy can no longer make fails the run with the planner's message.

    Returns:
        The round, or ``None`` when the run is no longer running, its planning failed, or the
        round already exists (a duplicate delivery).
    """
    run = Run.objects.select_related("experiment").get(id=run_id)
    if run.status != Run.Status.RUNNING:
        return None
    experiment = run.experiment
    try:
        plan = run_plan(run)
    except PlanningError as exc:
        run_fail(run_id=run.id, error=f"planning round {index} failed: {exc}")
        return None
    shards = selectors.experiment_shards(experiment, with_indices=True)
    tasks = {t.id: t for t in experiment.tasks.all()}
    devices = {d.id: d for d in experiment.devices.only("id", "name", "backend")}
    alone = selectors.standalone_table(run)
    latest = selectors.latest_checkpoints(run)
    deadline_s = round_deadline_s(predicted_round_time_s=plan.predicted_round_time_s, factor=experiment.deadline_factor)
    task_ids = {d.name: dispatch.new_task_id() for d in devices.values()}
    names = {**{("d", d.id): d.name for d in devices.values()}, **{("t", t.id): t.name for t in tasks.values()}}
    flags = [
        f"P_alone of {names[('t', a.task_id)]} on {names[('d', a.device_id)]} is unknown: fair throughput leaves that device out"
        for a in plan.assignments
        if not alone.get((a.device_id, a.task_id, a.batch_size))
    ]
    now = timezone.now()
    with transaction.atomic():
        rnd, created = Round.objects.get_or_create(
            run=run,
            index=index,
            defaults={
                "status": Round.Status.RUNNING,
                "started_at": now,
                "flags": flags,
                "predicted_round_time_s": plan.predicted_round_time_s,
                "deadline_s": deadline_s,
                "deadline_at": now + dt.timedelta(seconds=deadline_s),
            },
        )
        if not created:
            return None
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
                    standalone_throughput_sps=alone.get((a.device_id, a.task_id, a.batch_size)),
                    device_task_id=task_ids[devices[a.device_id].name],
                )
                for a in plan.assignments
            ],
        )
        # Reloaded: an INSERT run for many rows returns no primary keys.
        id_of = {(d, t): pk for pk, d, t in rnd.assignments.values_list("id", "device_id", "task_id")}
        task_refs = {task_id: selectors.task_ref(task) for task_id, task in tasks.items()}
        warmup_iterations = mtfl_setting("WARMUP_ITERATIONS")
        on_device: dict[int, list[PlannedAssignment]] = defaultdict(list)
        for a in plan.assignments:
            on_device[a.device_id].append(a)
        requests = [
            round_device_request(
                rnd=rnd,
                experiment=experiment,
                device=devices[device_id],
                partitioning=plan.partitioning,
                assignments=[
                    RequestedAssignment(
                        id_of[(a.device_id, a.task_id)], a.task_id, a.batch_size, a.active_thread_percentage
                    )
                    for a in on_device[device_id]
                ],
                shards=shards,
                latest=latest,
                task_refs=task_refs,
                warmup_iterations=warmup_iterations,
            )
            for device_id in sorted(on_device)
        ]
        dispatched = {r.device: task_ids[r.device] for r in requests}
        transaction.on_commit(
            lambda: dispatch.send_round(
                rnd.id, requests, task_ids=dispatched, check_after_s=round_check_after_s(deadline_s)
            )
        )
    return rnd
