"""The round protocol: runs, standalone measurements, rounds, FedAvg and checkpoints.

A run, step by step (docs/DESIGN.md §2):

1. :func:`run_create` (web) saves the run and, after commit, queues ``RUN_BEGIN``.
2. :func:`run_begin` (control worker) claims it, writes each task's seeded initial model,
   evaluates it, and asks every device for ``P_alone`` at the planned batch sizes.
3. :func:`standalone_record` stores those and starts round 0.
4. :func:`round_start` plans the round (assignments saved, with each device's task id and its
   deadline) and dispatches a chord: one ``train_round`` per device → ``ROUND_FINISH``, plus
   the round watchdog (:mod:`.reliability`: lost agents, retries, stragglers, the deadline).
5. :func:`round_finish` records every device's measurements, runs FedAvg per task over the
   devices that succeeded, evaluates the global models, writes checkpoints, computes the
   round's metrics, then starts the next round or finishes the run.

Every state change is claimed with one conditional update (``filter(status=...).update(...)``)
so a duplicate delivery, or a watchdog racing a late callback, changes nothing twice.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.common.bulk import bulk_insert, bulk_set, db_value
from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Comparison,
    DeviceTelemetry,
    Experiment,
    Round,
    Run,
    StandaloneThroughput,
)
from controlplane.experiments.services import dispatch, planning, reliability
from controlplane.fleet.models import Device
from controlplane.experiments.services.planning import plan_from_json
from controlplane.experiments.services.weights import weights_problems
from controlplane.planning import metrics
from controlplane.planning.planner import PlannerContext
from controlplane.planning.strategies import COMPARED, PLANNED, STRATEGIES, make_plan
from controlplane.planning.types import Plan, PlanningError
from controlplane.profiling.services import samples_from_round
from workers.artifacts import device_weights_key, get_store, global_weights_key
from workers.fedavg import FedAvgAccumulator, NoSamplesError, load_state, save_state
from workers.messages import (
    BACKEND_PARTITIONINGS,
    AssignmentSpec,
    DeviceRoundResult,
    ShardRef,
    StandaloneItem,
    StandaloneRequest,
    StandaloneResult,
    TrainRoundRequest,
    round_idempotency_key,
)

log = logging.getLogger(__name__)

ROUND_DONE = {Round.Status.SUCCEEDED, Round.Status.PARTIAL, Round.Status.FAILED, Round.Status.CANCELLED}


def _ts(value: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, tz=dt.UTC) if value is not None else None


def _evaluate(task, weights_path) -> tuple[float, float]:
    """:func:`workers.evaluate.evaluate` (torch imported on first use), then, once per
    process, :func:`_freeze_long_lived`."""
    from workers.evaluate import evaluate

    result = evaluate(task, weights_path)
    _freeze_long_lived()
    return result


_FROZEN = False


def _freeze_long_lived() -> None:
    """Keep the garbage collector off the objects the control worker holds for its whole life.

    Evaluating a model imports torch and torchvision: some 400,000 objects that live as long
    as the process. Every full collection walked them again, and recording a round of 1,000
    devices set off several, each a good part of a second: half the control plane's time per
    round. After the first evaluation the garbage is collected once and everything left is
    moved to the permanent generation (``gc.freeze``, what long-lived Python servers do after
    start-up). A round also allocates hundreds of thousands of objects that live until it is
    recorded; with CPython's default thresholds (700, 10, 10) they went through hundreds of
    young collections and were promoted and scanned again, so the young generation is let grow
    to 20,000 objects first (``gc.set_threshold``). Objects made later are collected as before.
    """
    global _FROZEN
    if _FROZEN:
        return
    _FROZEN = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _plan(run: Run) -> Plan:
    """Plan a round of ``run``: the plan stored when a ``vres_*`` run was created, otherwise
    the strategy's (baselines plan the same every round)."""
    if run.planned:
        return plan_from_json(run.planned)
    return make_plan(run.strategy, selectors.planning_input(run.experiment), manual_entries=run.manual_plan)


@transaction.atomic
def run_create(
    *,
    experiment: Experiment,
    strategy: str,
    plan: list[Mapping[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Run:
    """Launch a run of ``strategy`` on an experiment (it starts once the transaction commits).

    Args:
        plan: for ``strategy="manual"`` only: ``[{"device": id, "task": id, "batch_size": n,
            "active_thread_percentage": r}, ...]``, one entry per device–task pair with data.
        options: for ``vres_*`` only: ``{"objective": "raw"|"fair", "slack":
            "smaller_batches"|"none"}`` (defaults :data:`.planning.DEFAULT_OPTIONS`).

    Raises:
        ApplicationError: unknown strategy, a plan for a strategy that takes none, or an invalid
            plan (the field at fault is named); a ``vres_*`` strategy without a fitted predictor
            for every device, or a plan the planner cannot make (memory, empty shard, unknown
            model); a device whose agent never connected (409).
    """
    run = _run_new(experiment=experiment, strategy=strategy, plan=plan, options=options)
    transaction.on_commit(lambda: dispatch.send_run_begin(run.id))
    return run


def _run_new(
    *,
    experiment: Experiment,
    strategy: str,
    plan: list[Mapping[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
    comparison: Comparison | None = None,
    planner: PlannerContext | None = None,
) -> Run:
    """Check and save a pending run (planning it now for ``vres_*``) without starting it.

    ``planner``: a context already built for these options (a comparison plans two runs with
    the same predictors; loading them once is enough).
    """
    if strategy not in STRATEGIES:
        raise ApplicationError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}", field="strategy")
    never_seen = sorted(experiment.devices.filter(last_heartbeat_at__isnull=True).values_list("name", flat=True))
    if never_seen:
        raise ApplicationError(
            f"device {never_seen[0]} has never connected an agent: start `mtfl agent --device {never_seen[0]}` "
            "on its host first",
            field="devices",
            status_code=409,
        )
    manual = None
    if plan is not None:
        manual = [
            {
                "device_id": entry.get("device"),
                "task_id": entry.get("task"),
                "batch_size": entry.get("batch_size"),
                "active_thread_percentage": entry.get("active_thread_percentage"),
            }
            for entry in plan
        ]
    if strategy in PLANNED:
        options = planning.planner_options(options)
        planner = planner or planning.planner_context(experiment=experiment, options=options)
    elif options:
        raise ApplicationError(f"options apply to {', '.join(PLANNED)} only, not to {strategy!r}", field="options")
    try:
        made = make_plan(strategy, selectors.planning_input(experiment), manual_entries=manual, planner=planner)
    except PlanningError as exc:
        raise ApplicationError(str(exc), field=exc.field) from exc
    for name, backend in experiment.devices.order_by("name").values_list("name", "backend"):
        if made.partitioning not in BACKEND_PARTITIONINGS.get(backend, ()):
            raise ApplicationError(
                f"{strategy} needs {made.partitioning} partitioning, which device {name}'s {backend} backend cannot "
                f"give (it has no MPS); run temporal there, or serve the device with --backend cuda-mps",
                field="strategy",
            )
    return Run.objects.create(
        experiment=experiment, strategy=strategy, manual_plan=manual, options=dict(options or {}),
        simulated=experiment.devices.filter(backend="simulated").exists(),
        planned=planning.plan_to_json(made) if strategy in PLANNED else None, comparison=comparison,
    )


@transaction.atomic
def comparison_create(*, experiment: Experiment, options: Mapping[str, Any] | None = None) -> Comparison:
    """Launch every strategy of :data:`~controlplane.planning.strategies.COMPARED` on the same
    experiment, one run after another (same devices, data and seeds): ``temporal``,
    ``isolation``, ``sharing``, ``vres_greedy``, ``vres_sync``.

    All runs are checked and planned now, so a missing predictor or an impossible plan is
    refused before anything is dispatched; the first starts once the transaction commits and
    each next one when the previous ends (:func:`_comparison_advance`).

    Args:
        options: planner options for the ``vres_*`` runs (see :func:`run_create`).

    Raises:
        ApplicationError: as :func:`run_create`, for any of the strategies.
    """
    options = planning.planner_options(options)
    planner = planning.planner_context(experiment=experiment, options=options)
    comparison = Comparison.objects.create(experiment=experiment, strategies=list(COMPARED))
    runs = [
        _run_new(experiment=experiment, strategy=strategy, options=options if strategy in PLANNED else None,
                 comparison=comparison, planner=planner if strategy in PLANNED else None)
        for strategy in COMPARED
    ]
    first = runs[0].id
    transaction.on_commit(lambda: dispatch.send_run_begin(first))
    return comparison


def comparison_cancel(*, comparison: Comparison) -> Comparison:
    """Cancel a comparison: its pending runs never start and the run in flight is cancelled.

    Raises:
        ApplicationError: the comparison has already ended (409).
    """
    updated = Comparison.objects.filter(id=comparison.id, status=Comparison.Status.RUNNING).update(
        status=Comparison.Status.CANCELLED, finished_at=timezone.now()
    )
    if not updated:
        raise ApplicationError(f"comparison {comparison.id} has already ended ({comparison.status})", field="status",
                               status_code=409)
    stopping = list(Run.objects.filter(comparison=comparison, status=Run.Status.RUNNING).values_list("id", flat=True))
    Run.objects.filter(comparison=comparison, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).update(
        status=Run.Status.CANCELLED, finished_at=timezone.now(), error="comparison cancelled by a user"
    )
    reliability.run_work_stop(run_ids=stopping, reason="cancelled: the comparison was cancelled by a user")
    comparison.refresh_from_db()
    return comparison


def _comparison_advance(run_id: int) -> None:
    """After a run of a comparison ended (any way): start its next pending run, or close it.

    A failed run does not stop the comparison: the others still give their figures, and the
    failure is shown on its run.
    """
    run = Run.objects.filter(id=run_id).only("comparison_id").first()
    if run is None or run.comparison_id is None:
        return
    comparison = Comparison.objects.filter(id=run.comparison_id, status=Comparison.Status.RUNNING).first()
    if comparison is None:
        return
    if Run.objects.filter(comparison=comparison, status=Run.Status.RUNNING).exists():
        return
    following = Run.objects.filter(comparison=comparison, status=Run.Status.PENDING).order_by("id").first()
    if following is None:
        Comparison.objects.filter(id=comparison.id, status=Comparison.Status.RUNNING).update(
            status=Comparison.Status.SUCCEEDED, finished_at=timezone.now()
        )
        return
    next_id = following.id
    transaction.on_commit(lambda: dispatch.send_run_begin(next_id))


def run_fail(*, run_id: int, error: str) -> None:
    """Mark a run failed with its cause (no-op if it already ended)."""
    updated = Run.objects.filter(id=run_id, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).update(
        status=Run.Status.FAILED, error=error[:10_000], finished_at=timezone.now()
    )
    log.warning("run %s failed: %s", run_id, error)
    if updated:
        _comparison_advance(run_id)


@transaction.atomic
def run_cancel(*, run: Run) -> Run:
    """Cancel a run: no further round starts, and the work in flight stops
    (:func:`.reliability.run_work_stop`): the running round is cancelled (a late result is
    ignored), queued device tasks never run and running trainers are killed.

    Raises:
        ApplicationError: the run has already ended (409).
    """
    updated = Run.objects.filter(id=run.id, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).update(
        status=Run.Status.CANCELLED, finished_at=timezone.now(), error="cancelled by a user"
    )
    if not updated:
        raise ApplicationError(f"run {run.id} has already ended ({run.status})", field="status", status_code=409)
    reliability.run_work_stop(run_ids=[run.id], reason="cancelled: the run was cancelled by a user")
    _comparison_advance(run.id)
    run.refresh_from_db()
    return run


def run_begin(*, run_id: int, claimant: str = "") -> None:
    """Claim a pending run, write and evaluate the initial models, ask for ``P_alone``.

    Every strategy of an experiment starts from the same initial weights (seeded by the
    experiment's seed), so runs differ only in how devices are shared.

    Args:
        claimant: the control worker's name, kept so a restart of it can begin again a run it
            was preparing (:func:`.reliability.runs_resume`).
    """
    claimed = Run.objects.filter(id=run_id, status=Run.Status.PENDING).update(
        status=Run.Status.RUNNING, started_at=timezone.now(), claimed_by=claimant[:200]
    )
    if not claimed:
        log.info("run %s is not pending; RUN_BEGIN ignored", run_id)
        return
    run = Run.objects.select_related("experiment").get(id=run_id)
    experiment = run.experiment
    store = get_store()
    try:
        from workers.zoo import write_initial_weights

        for task in experiment.tasks.order_by("id"):
            key = global_weights_key(run.id, task.id, None)
            sha = write_initial_weights(task.architecture, task.num_classes, experiment.seed, store.path(key))
            accuracy, loss = _evaluate(selectors.task_ref(task), store.path(key))
            Checkpoint.objects.create(
                run=run, task=task, round=None, artifact_path=key, sha256=sha, test_accuracy=accuracy, test_loss=loss
            )
        plan = _plan(run)
    except Exception as exc:  # noqa: BLE001 - any failure here ends the run, with its cause shown
        run_fail(run_id=run.id, error=f"could not prepare the initial models: {type(exc).__name__}: {exc}")
        return
    shards = selectors.experiment_shards(experiment)
    tasks = {t.id: t for t in experiment.tasks.all()}
    devices = {d.id: d for d in experiment.devices.all()}
    requests = []
    for device_id in sorted({a.device_id for a in plan.assignments}):
        items = [
            StandaloneItem(
                task=selectors.task_ref(tasks[a.task_id]),
                batch_size=a.batch_size,
                shard=_shard_ref(experiment, shards[(a.device_id, a.task_id)]),
            )
            for a in plan.on_device(device_id)
        ]
        requests.append(
            StandaloneRequest(
                run_id=run.id,
                device=devices[device_id].name,
                backend=devices[device_id].backend,
                warmup_iterations=mtfl_setting("WARMUP_ITERATIONS"),
                timed_iterations=mtfl_setting("STANDALONE_TIMED_ITERATIONS"),
                items=items,
            )
        )
    task_ids = {r.device: dispatch.new_task_id() for r in requests}
    Run.objects.filter(id=run.id).update(standalone_task_ids=task_ids)
    dispatch.send_standalone(run.id, requests, deadline_s=float(mtfl_setting("ROUND_DEADLINE_S")), task_ids=task_ids)


def _shard_ref(experiment: Experiment, shard) -> ShardRef:
    return ShardRef(permutation_seed=experiment.seed, offset=shard.offset, count=shard.num_samples)


def standalone_record(*, run_id: int, results: Iterable[Any]) -> None:
    """Store every device's ``P_alone`` measurements, then start round 0.

    A device whose measurement failed gets rows with the error and no throughput; its fair
    throughput is then unknown (shown as missing), but the run goes on.
    """
    with transaction.atomic():
        # The run's row lock serialises a late answer and the watchdog recording the same rows.
        run = Run.objects.select_for_update(of=("self",)).select_related("experiment").get(id=run_id)
        if run.status != Run.Status.RUNNING:
            return
        _standalone_rows_save(run, results)
    round_start(run_id=run_id, index=0)


def _standalone_rows_save(run: Run, results: Iterable[Any] | None) -> None:
    """Insert or update the ``P_alone`` rows of every valid result (three queries in all)."""
    devices = {d.name: d for d in run.experiment.devices.all()}
    plan: Plan | None = None
    # One query to read what is stored, two to write: a redelivered result updates its rows.
    stored = {(s.device_id, s.task_id, s.batch_size): s for s in StandaloneThroughput.objects.filter(run=run)}
    created: dict[tuple[int, int, int], StandaloneThroughput] = {}
    changed: dict[tuple[int, int, int], StandaloneThroughput] = {}
    for raw in results or []:
        try:
            result = StandaloneResult.model_validate(raw)
        except PydanticValidationError as exc:
            log.error("run %s: malformed standalone result ignored: %s", run.id, exc)
            continue
        device = devices.get(result.device)
        if device is None:
            continue
        measurements = [(m.task_id, m.batch_size, m.throughput_sps, m.error or result.error, m.simulated)
                        for m in result.measurements]
        if not measurements:  # the whole device failed: record why against each of its tasks
            plan = plan or _plan(run)
            measurements = [(a.task_id, a.batch_size, None, result.error, False) for a in plan.on_device(device.id)]
        for task_id, batch_size, throughput, error, simulated in measurements:
            key = (device.id, task_id, batch_size)
            values = {"throughput_sps": throughput, "error": error, "simulated": simulated or result.simulated}
            row = created.get(key) or stored.get(key)
            if row is None:
                created[key] = StandaloneThroughput(run=run, device=device, task_id=task_id, batch_size=batch_size,
                                                    **values)
                continue
            for field, value in values.items():
                setattr(row, field, value)
            if key not in created:
                changed[key] = row
    StandaloneThroughput.objects.bulk_create(created.values())
    bulk_set(StandaloneThroughput, list(changed.values()), ["throughput_sps", "error", "simulated"])


def standalone_watchdog(*, run_id: int) -> None:
    """At the deadline of the ``P_alone`` measurements: if the run is still waiting for them,
    record the devices that did not answer and start round 0 anyway (its own deadline then
    fails a device that is really gone; a late answer still fills in ``P_alone``)."""
    run = Run.objects.filter(id=run_id, status=Run.Status.RUNNING).first()
    if run is None or run.rounds.exists():
        return
    deadline_s = float(mtfl_setting("ROUND_DEADLINE_S"))
    # Devices that answered while the chord could not complete (another agent died) are in the
    # result backend under their task ids.
    states = dispatch.device_task_states((run.standalone_task_ids or {}).values())
    answered = [st.result for st in states.values() if st.status == "SUCCESS" and isinstance(st.result, dict)]
    measured = set(StandaloneThroughput.objects.filter(run=run).values_list("device__name", flat=True))
    measured |= {r.get("device") for r in answered}
    missing = [d.name for d in run.experiment.devices.order_by("name") if d.name not in measured]
    results = answered + [
        {"run_id": run.id, "device": name, "status": "failed",
         "error": f"no standalone measurement within the round deadline ({deadline_s:g} s)"}
        for name in missing
    ]
    log.warning("run %s: no P_alone from %s within %g s; starting round 0", run_id, ", ".join(missing), deadline_s)
    standalone_record(run_id=run_id, results=results)


def round_start(*, run_id: int, index: int) -> Round | None:
    """Plan round ``index`` of a running run, save its assignments and dispatch it.

    Returns:
        The round, or ``None`` when the run is no longer running or the round already exists
        (a duplicate delivery).
    """
    run = Run.objects.select_related("experiment").get(id=run_id)
    if run.status != Run.Status.RUNNING:
        return None
    experiment = run.experiment
    try:
        plan = _plan(run)
    except PlanningError as exc:
        run_fail(run_id=run.id, error=f"planning round {index} failed: {exc}")
        return None
    shards = selectors.experiment_shards(experiment)
    tasks = {t.id: t for t in experiment.tasks.all()}
    devices = {d.id: d for d in experiment.devices.only("id", "name", "backend")}
    alone = selectors.standalone_table(run)
    latest = selectors.latest_checkpoints(run)
    deadline_s = reliability.round_deadline_s(predicted_round_time_s=plan.predicted_round_time_s,
                                              factor=experiment.deadline_factor)
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
            run=run, index=index,
            defaults={"status": Round.Status.RUNNING, "started_at": now, "flags": flags,
                      "predicted_round_time_s": plan.predicted_round_time_s, "deadline_s": deadline_s,
                      "deadline_at": now + dt.timedelta(seconds=deadline_s)},
        )
        if not created:
            return None
        bulk_insert(Assignment, [
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
        ])
        # Reloaded: an INSERT run for many rows returns no primary keys.
        id_of = {(d, t): pk for pk, d, t in rnd.assignments.values_list("id", "device_id", "task_id")}
        task_refs = {task_id: selectors.task_ref(task) for task_id, task in tasks.items()}
        warmup_iterations = mtfl_setting("WARMUP_ITERATIONS")
        on_device: dict[int, list] = defaultdict(list)
        for a in plan.assignments:
            on_device[a.device_id].append(a)
        requests = []
        for device_id in sorted(on_device):
            device = devices[device_id]
            specs = [
                AssignmentSpec(
                    assignment_id=id_of[(a.device_id, a.task_id)],
                    task=task_refs[a.task_id],
                    batch_size=a.batch_size,
                    active_thread_percentage=a.active_thread_percentage,
                    shard=_shard_ref(experiment, shards[(a.device_id, a.task_id)]),
                    local_epochs=experiment.local_epochs,
                    global_weights=latest[a.task_id].artifact_path,
                    output_weights=device_weights_key(run.id, index, device.name, a.task_id),
                    seed=experiment.seed * 1000 + index,
                )
                for a in on_device[device_id]
            ]
            requests.append(
                TrainRoundRequest(
                    run_id=run.id,
                    round_id=rnd.id,
                    round_index=index,
                    device=device.name,
                    backend=device.backend,
                    partitioning=plan.partitioning,
                    warmup_iterations=warmup_iterations,
                    assignments=specs,
                    idempotency_key=round_idempotency_key(rnd.id, device.name, 0),
                )
            )
        dispatched = {r.device: task_ids[r.device] for r in requests}
        transaction.on_commit(lambda: dispatch.send_round(rnd.id, requests, task_ids=dispatched,
                                                          check_after_s=reliability.check_after_s(deadline_s)))
    return rnd


def round_progress(*, round_id: int, device: str, phase: str, at: float | None = None) -> int:
    """Record that a device's trainers started (``phase="started"``) a round.

    Returns:
        The number of assignments updated.
    """
    if phase != "started":
        return 0
    # Every device of every round sends one: one prepared statement, no ORM query to build
    # (that took ten times the update itself). The same rows as
    # Assignment.objects.filter(round_id=…, device__name=…, status=PENDING).update(…).
    connection = connections[router.db_for_write(Assignment)]
    started_at = db_value(Assignment, "started_at", _ts(at) or timezone.now(), connection)
    with connection.cursor() as cursor:
        sql = _PROGRESS_SQL.get(connection.vendor) or _PROGRESS_SQL.setdefault(connection.vendor,
                                                                               _progress_sql(connection))
        cursor.execute(sql, [Assignment.Status.RUNNING, started_at, round_id, Assignment.Status.PENDING, device])
        return cursor.rowcount


_PROGRESS_SQL: dict[str, str] = {}
""":func:`_progress_sql` per database vendor (it depends on nothing else)."""


def _progress_sql(connection) -> str:
    """``UPDATE`` of a device's pending assignments of a round to running (see
    :func:`round_progress`); parameters: new status, started_at, round id, pending, device name."""
    q = connection.ops.quote_name
    a, d = Assignment._meta, Device._meta
    status, started_at = q(a.get_field("status").column), q(a.get_field("started_at").column)
    return (
        f"UPDATE {q(a.db_table)} SET {status} = %s, {started_at} = %s "
        f"WHERE {q(a.get_field('round').column)} = %s AND {status} = %s "
        f"AND {q(a.get_field('device').column)} = "
        f"(SELECT {q(d.pk.column)} FROM {q(d.db_table)} WHERE {q(d.get_field('name').column)} = %s)"
    )


def _parse_device_results(
    raw_results: Iterable[Any] | None, *, round_id: int | None = None, attempts: Mapping[str, int] | None = None
) -> tuple[dict[str, DeviceRoundResult], list[str]]:
    """Validate device results; keep one per device, of its current attempt.

    A result for another round, or of an attempt other than ``attempts[device]`` (a retry
    superseded it), or whose idempotency key is not its ``(round, device, attempt)`` key, is
    ignored (logged); of duplicates (a redelivery) the first is kept.
    """
    parsed: dict[str, DeviceRoundResult] = {}
    problems = []
    for raw in raw_results or []:
        try:
            result = DeviceRoundResult.model_validate(raw)
        except PydanticValidationError as exc:
            problems.append(f"malformed device result ignored: {exc.errors()[0]['msg']}")
            continue
        if result.device in parsed:
            continue
        if attempts is not None:
            expected = attempts.get(result.device)
            key = round_idempotency_key(round_id, result.device, result.attempt) if round_id is not None else ""
            if (expected is None or result.attempt != expected or (round_id is not None and result.round_id != round_id)
                    or (result.idempotency_key and key and result.idempotency_key != key)):
                log.warning("round %s: result of device %s attempt %s ignored (current attempt %s)", round_id,
                            result.device, result.attempt, expected)
                continue
        parsed[result.device] = result
    return parsed, problems


def round_finish(
    *,
    round_id: int,
    results: Iterable[Any] | None,
    cause: str = "",
    causes: Mapping[str, str] | None = None,
    notes: Iterable[str] = (),
    claimant: str = "",
) -> Round | None:
    """Record a round's device results, aggregate with FedAvg, evaluate, and move the run on.

    Only a result of a device's current attempt counts (its ``attempt`` and, when set, its
    ``idempotency_key``), once: duplicates and results of superseded attempts are ignored.

    Args:
        results: :class:`workers.messages.DeviceRoundResult` JSON of the devices that reported.
            Devices that did not report have their assignments failed with ``causes[device]``
            or else ``cause``.
        cause: why results are missing (default for every device).
        causes: why each missing device is missing (lost agent, straggler, deadline), and for a
            device that reported, overrides nothing.
        notes: lines added to the round's flags (stragglers left out of the aggregate).
        claimant: the control worker's name, kept with the claim (:func:`.reliability.runs_resume`).

    Returns:
        The finished round, or ``None`` if it was not running (already finished: a duplicate
        delivery or a late callback after the watchdog).
    """
    claimed = Round.objects.filter(id=round_id, status=Round.Status.RUNNING).update(
        status=Round.Status.AGGREGATING, aggregating_at=timezone.now(), claimed_by=claimant[:200]
    )
    if not claimed:
        log.info("round %s is not running; its results were already recorded", round_id)
        return None
    rnd = Round.objects.select_related("run__experiment").get(id=round_id)
    try:
        _record_and_aggregate(rnd, results, cause, causes or {}, list(notes))
    except Exception as exc:  # noqa: BLE001 - the round must end, with its cause, whatever broke
        log.exception("round %s: aggregation failed", round_id)
        Round.objects.filter(id=round_id).update(
            status=Round.Status.FAILED, error=f"aggregation failed: {type(exc).__name__}: {exc}",
            finished_at=timezone.now(),
        )
        run_fail(run_id=rnd.run_id, error=f"round {rnd.index} could not be aggregated: {type(exc).__name__}: {exc}")
        return Round.objects.get(id=round_id)
    rnd.refresh_from_db()
    try:
        samples_from_round(round_id=rnd.id)
    except Exception:  # noqa: BLE001 - the closed loop must never hold up the run
        log.exception("round %s: could not turn its assignments into profile samples", rnd.id)
    _advance(rnd)
    return rnd


def _record_and_aggregate(rnd: Round, raw_results: Iterable[Any] | None, cause: str,
                          causes: Mapping[str, str] | None = None, notes: Iterable[str] = ()) -> None:
    run = rnd.run
    # Devices once (not joined onto each of 3,000 assignments, with their inventories).
    devices = {d.id: d for d in Device.objects.filter(id__in=rnd.assignments.values("device_id")).only("id", "name")}
    assignments = list(rnd.assignments.all())
    by_device: dict[str, list[Assignment]] = defaultdict(list)
    for a in assignments:
        by_device[devices[a.device_id].name].append(a)
    parsed, problems = _parse_device_results(
        raw_results, round_id=rnd.id, attempts={name: rows[0].attempt for name, rows in by_device.items()}
    )

    failed_devices: dict[str, str] = {}
    telemetry: list[DeviceTelemetry] = []
    for device_name, rows in by_device.items():
        result = parsed.get(device_name)
        if result is not None and (result.telemetry or result.mps_restarted):
            telemetry.append(_telemetry_row(rnd, devices[rows[0].device_id], result))
        if result is None:
            why = (causes or {}).get(device_name) or cause or "the device returned no result"
            failed_devices[device_name] = why
            for a in rows:
                a.status, a.error = Assignment.Status.FAILED, why
            continue
        if result.status == "failed":
            failed_devices[device_name] = result.error or "the device reported a failure"
        measured = {r.assignment_id: r for r in result.assignments}
        for a in rows:
            r = measured.get(a.id)
            if r is None:
                a.status = Assignment.Status.FAILED
                a.error = result.error or "no result for this assignment"
                continue
            a.status = Assignment.Status.SUCCEEDED if r.status == "succeeded" else Assignment.Status.FAILED
            a.error = r.error
            a.samples_trained = r.samples_trained
            a.throughput_sps = r.throughput_sps
            a.simulated = r.simulated or result.simulated
            a.seconds = r.seconds
            a.train_loss = r.train_loss
            a.started_at = _ts(r.started_at)
            a.finished_at = _ts(r.finished_at)
            a.weights_path = r.weights or ""
            a.weights_sha256 = r.weights_sha256 or ""
            expected = device_weights_key(run.id, rnd.index, device_name, a.task_id)
            if a.status == Assignment.Status.SUCCEEDED and a.weights_path != expected:
                # The agent was told where to write (output_weights); weights anywhere else were
                # not written under this device's agent token, so they never enter FedAvg.
                a.status = Assignment.Status.FAILED
                a.error = f"weights reported at {a.weights_path!r}, not at this device's key {expected!r}"
                failed_devices[device_name] = f"task {a.task.name}: {a.error}"
            a.peak_memory_bytes = r.peak_memory_bytes
            a.torch_device = r.torch_device or ""
            a.mps_active_thread_percentage = r.mps_active_thread_percentage
            a.mps_verified = r.mps_verified
            a.mps_detail = r.mps_detail[:10_000]

    # FedAvg only over devices whose whole round succeeded: a failed device's weights never
    # enter the global model, even the tasks that finished before the failure.
    usable = [a for a in assignments
              if a.status == Assignment.Status.SUCCEEDED and devices[a.device_id].name not in failed_devices]
    store = get_store()
    latest = selectors.latest_checkpoints(run)
    # A weights file FedAvg cannot use (truncated, not safetensors, another model's) fails its
    # device with the reason, like a trainer crash: the round goes on without that device.
    unusable = weights_problems(store=store, assignments=usable, previous=latest)
    if unusable:
        refused_devices = set()
        for a in usable:
            if a.id in unusable:
                a.status, a.error = Assignment.Status.FAILED, unusable[a.id]
                failed_devices.setdefault(a.device.name, f"task {a.task.name}: {unusable[a.id]}")
                refused_devices.add(a.device_id)
        usable = [a for a in usable if a.device_id not in refused_devices]
    flags: list[str] = [*rnd.flags, *problems, *notes]
    new_checkpoints: list[Checkpoint] = []
    contributions_of: dict[int, list[Assignment]] = defaultdict(list)
    for a in usable:
        contributions_of[a.task_id].append(a)
    for task in run.experiment.tasks.order_by("id"):
        contributions = contributions_of[task.id]
        previous = latest[task.id]
        key = global_weights_key(run.id, task.id, rnd.index)
        try:
            if not contributions:
                raise NoSamplesError("no device that succeeded trained this task")
            path, sha = _global_model(store, contributions, previous, key)
        except NoSamplesError:
            flags.append(
                f"task {task.name}: no device that succeeded trained it this round; the previous global model was kept"
            )
            new_checkpoints.append(
                Checkpoint(
                    run=run, task=task, round=rnd, artifact_path=previous.artifact_path, sha256=previous.sha256,
                    test_accuracy=previous.test_accuracy, test_loss=previous.test_loss, kept_previous=True,
                )
            )
            continue
        if sha == previous.sha256:  # the same model: its test results are the previous ones
            accuracy, loss = previous.test_accuracy, previous.test_loss
        else:
            accuracy, loss = _evaluate(selectors.task_ref(task), store.path(path))
        new_checkpoints.append(
            Checkpoint(run=run, task=task, round=rnd, artifact_path=path, sha256=sha, test_accuracy=accuracy, test_loss=loss)
        )

    device_raw, device_fair = [], []
    for device_name, rows in by_device.items():
        if device_name in failed_devices:
            continue
        p = [a.throughput_sps for a in rows if a.throughput_sps is not None]
        if not p:
            continue
        device_raw.append(metrics.raw_throughput(p))
        alone = [a.standalone_throughput_sps for a in rows]
        if all(a.throughput_sps is not None for a in rows) and all(x is not None and x > 0 for x in alone):
            device_fair.append(metrics.fair_throughput([a.throughput_sps for a in rows], alone))
    spans = [(a.started_at.timestamp(), a.finished_at.timestamp()) for a in usable if a.started_at and a.finished_at]
    round_time_s = metrics.round_time(spans)
    samples_trained = sum(a.samples_trained for a in usable)

    if not failed_devices:
        status = Round.Status.SUCCEEDED
    elif len(failed_devices) < len(by_device):
        status = Round.Status.PARTIAL
    else:
        status = Round.Status.FAILED
    error = "; ".join(f"{name}: {why}" for name, why in sorted(failed_devices.items()))
    now = timezone.now()
    with transaction.atomic():
        bulk_set(
            Assignment, assignments,
            ["status", "error", "samples_trained", "throughput_sps", "simulated", "seconds", "train_loss", "started_at",
             "finished_at", "weights_path", "weights_sha256", "peak_memory_bytes", "torch_device",
             "mps_active_thread_percentage", "mps_verified", "mps_detail"],
        )
        # a redelivered result replaces the series instead of failing on the unique constraint
        DeviceTelemetry.objects.filter(round=rnd, device__in=[t.device for t in telemetry]).delete()
        DeviceTelemetry.objects.bulk_create(telemetry)
        Checkpoint.objects.bulk_create(new_checkpoints)
        Round.objects.filter(id=rnd.id).update(
            status=status,
            error=error[:10_000],
            flags=flags,
            finished_at=now,
            wall_time_s=(now - rnd.started_at).total_seconds() if rnd.started_at else None,
            round_time_s=round_time_s,
            samples_trained=samples_trained,
            fl_throughput_sps=metrics.fl_throughput(samples_trained, round_time_s),
            raw_throughput_sps=metrics.mean_or_none(device_raw),
            fair_throughput=metrics.mean_or_none(device_fair),
        )


def _global_model(store, contributions: list[Assignment], previous: Checkpoint, key: str) -> tuple[str, str]:
    """FedAvg of one task's contributions (``W ← Σ_j n_j W_j / Σ_j n_j``, ``n_j`` the shard
    size), written under ``key``; returns the global model's artifact key and SHA-256.

    Weights files with the same SHA-256 hold the same tensors, so each distinct one is read
    once, weighted by the sum of its devices' samples, and added to a running sum
    (:class:`workers.fedavg.FedAvgAccumulator`: one model in memory at a time, not one per
    device). When every device reports the previous global model unchanged (the ``simulated``
    backend passes it through), the average is that model: the previous file is kept and
    nothing is read or written. Devices that trained (different digests, in device order)
    are summed exactly as :func:`workers.fedavg.fedavg` would.

    Raises:
        NoSamplesError: every contribution has 0 samples.
        FileNotFoundError, ValueError: a weights file is missing or does not match the others.
    """
    groups: dict[str, list[Assignment]] = {}
    for a in contributions:
        groups.setdefault(a.weights_sha256 or f"path:{a.weights_path}", []).append(a)
    if sum(a.samples for a in contributions) == 0:
        raise NoSamplesError("every device that trained this task holds 0 samples of it")
    if len(groups) == 1 and contributions[0].weights_sha256 and contributions[0].weights_sha256 == previous.sha256:
        return previous.artifact_path, previous.sha256
    accumulator = FedAvgAccumulator()
    for members in groups.values():
        accumulator.add(load_state(store.path(members[0].weights_path)), sum(a.samples for a in members))
    return key, save_state(accumulator.result(), store.path(key))


def _telemetry_row(rnd: Round, device, result: DeviceRoundResult) -> DeviceTelemetry:
    """One device's NVML series of a round as parallel lists, in time order."""
    samples = sorted(result.telemetry, key=lambda g: g.t)
    totals = [g.memory_total_bytes for g in samples if g.memory_total_bytes]
    return DeviceTelemetry(
        round=rnd, device=device, t=[g.t for g in samples], gpu_util_percent=[g.gpu_util_percent for g in samples],
        memory_used_bytes=[g.memory_used_bytes for g in samples], memory_total_bytes=max(totals) if totals else None,
        mps_restarted=result.mps_restarted,
    )


def _advance(rnd: Round) -> None:
    """After a round: start the next one, or end the run."""
    run = Run.objects.select_related("experiment").get(id=rnd.run_id)
    if run.status != Run.Status.RUNNING:
        return
    if rnd.status == Round.Status.FAILED:
        run_fail(run_id=run.id, error=f"round {rnd.index} failed on every device: {rnd.error}")
        return
    if rnd.index + 1 < run.experiment.rounds:
        transaction.on_commit(lambda: dispatch.send_round_start(run.id, rnd.index + 1))
    else:
        run_finish(run_id=run.id)


def run_finish(*, run_id: int) -> Run:
    """Close a run that completed its rounds: its metrics are the means over its rounds."""
    rounds = list(Round.objects.filter(run_id=run_id).exclude(status=Round.Status.FAILED))
    updated = Run.objects.filter(id=run_id, status=Run.Status.RUNNING).update(
        status=Run.Status.SUCCEEDED,
        finished_at=timezone.now(),
        raw_throughput_sps=metrics.mean_or_none(r.raw_throughput_sps for r in rounds),
        fair_throughput=metrics.mean_or_none(r.fair_throughput for r in rounds),
        fl_throughput_sps=metrics.mean_or_none(r.fl_throughput_sps for r in rounds),
    )
    if not updated:
        log.info("run %s was not running when its last round finished", run_id)
    else:
        _comparison_advance(run_id)
    return Run.objects.get(id=run_id)
