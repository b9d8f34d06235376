"""Runs and comparisons: create (checked and planned before anything is dispatched), cancel,
and their ends (failed, finished), which start a comparison's next run.

A run, step by step (docs/DESIGN.md §2), one module per step:

1. :func:`run_create` (web) saves the run and, after commit, queues ``RUN_BEGIN``.
2. :func:`.standalone.run_begin` (control worker) claims it, writes each task's seeded initial
   model, evaluates it, and asks every device for ``P_alone``;
   :func:`.standalone.standalone_record` stores those and starts round 0.
3. :mod:`.rounds` plays each round: :func:`.rounds.enqueue.round_enqueue` queues it for its
   devices, :func:`.rounds.dispatch.round_dispatch` plans and dispatches it,
   :func:`.rounds.settle.round_settle` settles each device's outcome,
   :func:`.rounds.record.round_record` records it (aggregating with
   :func:`.rounds.aggregate.round_aggregate`), and :func:`.rounds.advance.round_advance` enqueues
   the next one or calls :func:`run_finish`.
4. :mod:`.reliability` watches the rounds (deadlines, lost agents, stragglers, retries) and
   resumes runs after a restart; it calls the modules above, which never import it.

Every state change is claimed with one conditional update (``filter(status=...).update(...)``)
so a duplicate delivery, or a watchdog racing a late callback, changes nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.common.errors import ApplicationError
from controlplane.common.limits import PRIORITY, REPEATS, TARGET_ACCURACY, bound_text
from controlplane.common.registered import registered
from controlplane.experiments import selectors
from controlplane.experiments.models import Comparison, Experiment, Round, Run
from controlplane.experiments.services import dispatch, planning
from controlplane.experiments.services.catalog import aggregation_check
from controlplane.experiments.services.execution import experiment_execution_check
from controlplane.experiments.services.plugins import experiment_plugins_check
from controlplane.experiments.services.stop import run_start_undo, run_work_stop
from controlplane.experiments.signals import release_devices
from controlplane.fleet.models import DevicePool
from controlplane.planning import metrics
from controlplane.planning.planner import PlannerContext
from controlplane.planning.strategies import (
    STRATEGY_REGISTRY,
    baseline_strategy,
    compared_strategies,
    get_strategy,
    make_plan,
    planned_strategies,
)
from controlplane.planning.types import PlanningError
from workers.registry.backends import BACKEND_REGISTRY

log = logging.getLogger(__name__)


@transaction.atomic
def run_create(
    *,
    experiment: Experiment,
    strategy: str,
    plan: list[Mapping[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
    pool: DevicePool | int | str | None = None,
    priority: int = 0,
) -> Run:
    """Launch a run of ``strategy`` on an experiment (it starts once the transaction commits).

    Args:
        strategy: a name of :data:`~controlplane.planning.strategies.STRATEGY_REGISTRY`.
        plan: for a strategy that ``takes_plan`` (``manual``) only: ``[{"device": id, "task": id,
            "batch_size": n, "active_thread_percentage": r}, ...]``, one entry per device–task
            pair with data.
        options: for a strategy that ``needs_predictor`` only: ``{"objective": "raw"|"fair",
            "slack": "smaller_batches"|"none"}`` (defaults :data:`.planning.DEFAULT_OPTIONS`);
            for any strategy, the run's own aggregator, ``{"aggregation": name,
            "aggregation_params": {...}}`` (:func:`run_aggregation_options`), so runs of several
            FL algorithms compare on one experiment's devices, data and seed.
        pool: a device pool (the pool, its id or its name) the run's rounds are placed in: each
            round trains the experiment's devices of the pool that the lab scheduler finds free
            (:mod:`controlplane.lab.services.scheduler`); ``None``: the experiment's devices (or each round's drawn
            participants).
        priority: :data:`~controlplane.common.limits.PRIORITY`; a waiting round of a higher-priority run gets free devices first.

    Raises:
        ApplicationError: unknown strategy, a plan for a strategy that takes none, or an invalid
            plan (the field at fault is named); a predictor-driven strategy without a fitted
            predictor for every device, or a plan the planner cannot make (memory, empty shard,
            unknown model); a device whose agent never connected (409); a task's model or
            dataset that a device holding its data, or the control plane, lacks
            (:func:`.plugins.experiment_plugins_check`); a task's ``graphs`` or ``bf16`` execution
            options on a device that is no longer a GPU backend
            (:func:`.execution.experiment_execution_check`); an aggregator override that is not
            allowed (``options.aggregation``, ``options.aggregation_params.<name>``); an unknown
            ``pool`` or one holding none of the experiment's devices; a ``priority`` outside
            :data:`~controlplane.common.limits.PRIORITY`.
    """
    lab = run_lab_options(experiment, pool=pool, priority=priority)
    run = _run_new(experiment=experiment, strategy=strategy, plan=plan, options=options, lab=lab)
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
    repeat: int = 0,
    lab: Mapping[str, Any] | None = None,
) -> Run:
    """Check and save a pending run (planning it now when its strategy needs a predictor)
    without starting it.

    ``planner``: a context already built for these options (a comparison plans several runs
    with the same predictors; loading them once is enough).
    """
    try:
        record = get_strategy(strategy)
    except PlanningError as exc:
        raise ApplicationError(str(exc), field=exc.field) from exc
    _run_devices_check(experiment)
    manual = _manual_entries(plan)
    aggregation = run_aggregation_options(experiment, options)
    options = {k: v for k, v in (options or {}).items() if k not in planning.AGGREGATION_OPTIONS}
    if record.needs_predictor:
        options = planning.planner_options(options)
        planner = planner or planning.planner_context(experiment=experiment, options=options)
    elif options:
        raise ApplicationError(
            f"options.{sorted(options)[0]}: planner options apply to {', '.join(planned_strategies())} only, "
            f"not to {strategy!r} (options.aggregation and options.aggregation_params apply to every strategy)",
            field="options",
        )
    try:
        made = make_plan(strategy, selectors.planning_input(experiment), manual_entries=manual, planner=planner)
    except PlanningError as exc:
        raise ApplicationError(str(exc), field=exc.field) from exc
    _partitioning_check(experiment, strategy, made.partitioning)
    # What the partition leaves without data (the plan already gives each device only the tasks
    # it holds), then what the planner's guard found.
    warnings: list[str] = selectors.experiment_data_warnings(experiment)
    extra: dict[str, Any] = {}
    if record.needs_predictor:
        made, extra, guard_warnings = planning.guarded_plan(experiment=experiment, plan=made)
        warnings += guard_warnings
    return Run.objects.create(
        experiment=experiment,
        strategy=strategy,
        manual_plan=manual,
        options={**(options or {}), **aggregation},
        simulated=experiment.devices.filter(backend__in=[b.name for b in BACKEND_REGISTRY if b.simulated]).exists(),
        planned=planning.plan_to_json(made, **extra) if record.needs_predictor else None,
        comparison=comparison,
        repeat=repeat,
        warnings=warnings,
        **(lab or {}),
    )


def _run_devices_check(experiment: Experiment) -> None:
    """Check that a run can start on the experiment's devices now.

    Raises:
        ApplicationError: (409, ``devices``) a device whose agent never connected; as
            :func:`.plugins.experiment_plugins_check` and :func:`.execution.experiment_execution_check`.
    """
    never_seen = sorted(experiment.devices.filter(last_heartbeat_at__isnull=True).values_list("name", flat=True))
    if never_seen:
        raise ApplicationError(
            f"device {never_seen[0]} has never connected an agent: start `mtfl agent --device {never_seen[0]}` "
            "on its host first",
            field="devices",
            status_code=409,
        )
    experiment_plugins_check(experiment)
    # A device's backend may have changed since the experiment was created (cpu now, say).
    experiment_execution_check(experiment)


def _manual_entries(plan: list[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A manual plan's entries (``{"device", "task", "batch_size", "active_thread_percentage"}``)
    as the planner and ``Run.manual_plan`` read them (``device_id``, ``task_id``, ...)."""
    if plan is None:
        return None
    return [
        {
            "device_id": entry.get("device"),
            "task_id": entry.get("task"),
            "batch_size": entry.get("batch_size"),
            "active_thread_percentage": entry.get("active_thread_percentage"),
        }
        for entry in plan
    ]


def _partitioning_check(experiment: Experiment, strategy: str, partitioning: str) -> None:
    """Raises :class:`ApplicationError` (field ``strategy``) when a device's backend cannot give
    the plan's ``partitioning``, naming the strategies that could run there."""
    for name, backend in experiment.devices.order_by("name").values_list("name", "backend"):
        given = BACKEND_REGISTRY.get(backend, field="backend").partitionings if backend in BACKEND_REGISTRY else ()
        if partitioning not in given:
            usable = [s.name for s in STRATEGY_REGISTRY if s.partitioning in given]
            raise ApplicationError(
                f"{strategy} needs {partitioning} partitioning, which device {name}'s {backend} backend cannot "
                f"give (it has no MPS); run {' or '.join(usable) or 'another strategy'} there, or serve the device "
                "with --backend cuda-mps",
                field="strategy",
            )


def run_lab_options(
    experiment: Experiment, *, pool: DevicePool | int | str | None = None, priority: Any = 0
) -> dict[str, Any]:
    """Check where and how urgently a run is scheduled in the lab: ``{"pool": DevicePool | None,
    "priority": int}``.

    Raises:
        ApplicationError: ``pool`` names no pool, or a pool holding none of the experiment's
            devices; ``priority`` is not an integer in :data:`~controlplane.common.limits.PRIORITY` (400, the
            field named).
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY.contains(priority):
        raise ApplicationError(f"priority must be an integer from {PRIORITY.span}, got {priority!r}", field="priority")
    found: DevicePool | None = None
    if isinstance(pool, DevicePool):
        found = pool
    elif pool is not None and pool != "":
        lookup = {"id": pool} if isinstance(pool, int) and not isinstance(pool, bool) else {"name": str(pool)}
        found = DevicePool.objects.filter(**lookup).first()
        if found is None:
            known = ", ".join(DevicePool.objects.order_by("name").values_list("name", flat=True)[:20]) or "none yet"
            raise ApplicationError(f"pool {pool!r} does not exist (pools: {known})", field="pool")
    if found is not None and not experiment.devices.filter(pool=found).exists():
        raise ApplicationError(
            f"pool {found.name} holds none of experiment {experiment.name}'s devices: its rounds would have nowhere "
            "to train",
            field="pool",
        )
    return {"pool": found, "priority": priority}


def run_aggregation_options(experiment: Experiment, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's override of its experiment's aggregator, checked exactly as the experiment's own
    (:func:`.catalog.aggregation_check`), as ``Run.options`` stores it.

    Args:
        options: the run's options; only ``aggregation`` (a name of
            :data:`~workers.registry.aggregators.AGGREGATOR_REGISTRY`) and ``aggregation_params``
            (its parameters; given alone, they are the experiment's aggregator's) are read.

    Returns:
        ``{}`` when ``options`` name neither (the run uses the experiment's aggregator), else
        ``{"aggregation": name, "aggregation_params": {parameter: value}}`` with every declared
        parameter present (defaults filled in). Each task's experiment override still wins
        (:func:`.rounds.aggregate.task_aggregation_choice`).

    Raises:
        ApplicationError: (400) an unknown aggregator (``options.aggregation``, listing the
            registered ones), parameters that are not an object (``options.aggregation_params``),
            an unknown parameter, a missing required one or a value out of range
            (``options.aggregation_params.<name>``, naming the allowed range).
    """
    given = {k: v for k, v in (options or {}).items() if k in planning.AGGREGATION_OPTIONS}
    if not given:
        return {}
    name, params = aggregation_check(
        given.get("aggregation") or experiment.aggregation, given.get("aggregation_params"), prefix="options."
    )
    return {"aggregation": name, "aggregation_params": params}


@transaction.atomic
def comparison_create(
    *,
    experiment: Experiment,
    options: Mapping[str, Any] | None = None,
    strategies: Sequence[str] | None = None,
    repeats: int = 1,
    targets: Mapping[Any, Any] | None = None,
    pool: DevicePool | int | str | None = None,
    priority: int = 0,
) -> Comparison:
    """Launch strategies on the same experiment, one run after another (same devices, data and
    seeds): by default every strategy of
    :func:`~controlplane.planning.strategies.compared_strategies` (among the built-ins
    ``temporal``, ``isolation``, ``sharing``, ``vres_greedy``, ``vres_sync``, then any plug-in's).

    All runs are checked and planned now, so a missing predictor or an impossible plan is
    refused before anything is dispatched; the first starts once the transaction commits and
    each next one when the previous ends (:func:`_comparison_advance`).

    Args:
        options: planner options for the runs whose strategy needs a predictor, and an
            aggregator for every run (``aggregation``, ``aggregation_params``; see
            :func:`run_create`).
        strategies: a subset to run instead, in this order, which must hold the baseline
            (:func:`~controlplane.planning.strategies.baseline_strategy`, ``temporal``): every
            speedup is taken against it.
        repeats: how many times every strategy runs, :data:`~controlplane.common.limits.REPEATS`, in interleaved
            orders (:func:`~controlplane.planning.metrics.interleaved_orders`: as given, reversed,
            as given...); every figure is then reported over the repeats with its 95 % interval
            (geometric means for throughputs, speedups and times, arithmetic for accuracies).
        targets: the test accuracy each task's time to accuracy is taken to, ``{task id or
            name: accuracy in TARGET_ACCURACY}`` (:mod:`controlplane.common.limits`); a task left out takes the lowest final accuracy any run
            of the comparison reaches (:func:`comparison_targets`).
        pool, priority: where and how urgently every run of the comparison is scheduled in
            the lab, as for :func:`run_create`.

    Raises:
        ApplicationError: as :func:`run_create`, for any of the strategies; ``strategies``
            empty, repeating a name, naming an unknown strategy or lacking the baseline;
            ``repeats`` out of range; a target naming no task of the experiment or out of
            its range; (409) another comparison of the experiment still running.
    """
    strategies = comparison_strategies(strategies)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not REPEATS.contains(repeats):
        raise ApplicationError(f"repeats={repeats!r} is not allowed: an integer from {REPEATS.span}", field="repeats")
    chosen_targets = comparison_targets(experiment, targets)
    lab = run_lab_options(experiment, pool=pool, priority=priority)
    _no_comparison_running(experiment)
    aggregation = run_aggregation_options(experiment, options)
    options = planning.planner_options(options)  # passes over the aggregator
    experiment_plugins_check(experiment)
    # Baselines plan without a predictor: a comparison of baselines only needs none.
    planner = (
        _comparison_planner(experiment, options)
        if any(get_strategy(name).needs_predictor for name in strategies)
        else None
    )
    comparison = Comparison.objects.create(
        experiment=experiment, strategies=list(strategies), repeats=int(repeats), targets=chosen_targets
    )
    runs = _comparison_runs(comparison, options=options, aggregation=aggregation, planner=planner, lab=lab)
    first = runs[0].id
    transaction.on_commit(lambda: dispatch.send_run_begin(first))
    return comparison


def _no_comparison_running(experiment: Experiment) -> None:
    """Raises :class:`ApplicationError` (409, ``experiment``) while another comparison of the
    experiment runs."""
    running = experiment.comparisons.filter(status=Comparison.Status.RUNNING).order_by("id").first()
    if running is not None:
        # Two comparisons of one experiment would interleave their runs on the same devices and
        # stretch each other's wall-clock figures.
        raise ApplicationError(
            f"comparison {running.id} is still running on this experiment: wait for it to end or cancel it "
            f"(POST /api/comparisons/{running.id}/cancel/)",
            field="experiment",
            status_code=409,
        )


def _comparison_runs(
    comparison: Comparison,
    *,
    options: Mapping[str, Any],
    aggregation: Mapping[str, Any],
    planner: PlannerContext | None,
    lab: Mapping[str, Any],
) -> list[Run]:
    """A comparison's pending runs (:func:`_run_new`), every strategy ``comparison.repeats`` times
    in interleaved orders: planner ``options`` for those that need a predictor, the run's
    ``aggregation`` override for all."""
    runs = []
    # Runs start in id order (_comparison_advance), so creating them in the interleaved order
    # is what makes it the order they run in.
    for repeat, order in enumerate(metrics.interleaved_orders(comparison.strategies, comparison.repeats)):
        for strategy in order:
            planned = get_strategy(strategy).needs_predictor
            runs.append(
                _run_new(
                    experiment=comparison.experiment,
                    strategy=strategy,
                    options={**(options if planned else {}), **aggregation} or None,
                    comparison=comparison,
                    planner=planner if planned else None,
                    repeat=repeat,
                    lab=lab,
                )
            )
    return runs


def _comparison_planner(experiment: Experiment, options: Mapping[str, Any]):
    """The planners' context for a comparison's predictor-driven runs; its refusals name
    ``strategies`` (the comparison's field), not a run's ``strategy``."""
    try:
        return planning.planner_context(experiment=experiment, options=options)
    except ApplicationError as exc:
        if exc.field != "strategy":
            raise
        raise ApplicationError(exc.message, field="strategies", status_code=exc.status_code) from None


def comparison_targets(experiment: Experiment, targets: Mapping[Any, Any] | None) -> dict[str, float]:
    """A comparison's accuracy targets checked: ``{task id (a string): accuracy}``.

    Args:
        targets: ``{task id or task name: test accuracy}`` (ids as numbers or strings), each in
            :data:`~controlplane.common.limits.TARGET_ACCURACY`.

    Raises:
        ApplicationError: under ``targets``: not an object, a key that is no task of the
            experiment (listing them), a value that is not a number in that range.
    """
    if targets is None:
        return {}
    if not isinstance(targets, Mapping):
        raise ApplicationError("targets must be an object of task ids or names to accuracies", field="targets")
    tasks = list(experiment.tasks.order_by("id").values_list("id", "name"))
    by_key = {str(task_id): task_id for task_id, _ in tasks} | {name: task_id for task_id, name in tasks}
    out: dict[str, float] = {}
    for key, value in targets.items():
        task_id = by_key.get(str(key))
        if task_id is None:
            known = ", ".join(f"{task_id} ({name})" for task_id, name in tasks)
            raise ApplicationError(
                f"targets: {key!r} is not a task of this experiment; its tasks: {known}", field=f"targets.{key}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not TARGET_ACCURACY.contains(value):
            raise ApplicationError(
                f"targets.{key}: {value!r} is not allowed: a test accuracy greater than "
                f"{bound_text(TARGET_ACCURACY.low)} and at most {bound_text(TARGET_ACCURACY.high)}",
                field=f"targets.{key}",
            )
        out[str(task_id)] = float(value)
    return out


def comparison_strategies(strategies: Sequence[str] | None) -> tuple[str, ...]:
    """The strategies a comparison runs: ``strategies`` checked, or every compared one.

    Raises:
        ApplicationError: under ``strategies``: not a list of names, empty, a repeat, an
            unknown name (listing the registered ones) or the baseline missing.
    """
    if strategies is None:
        return compared_strategies()
    if isinstance(strategies, str) or not isinstance(strategies, Sequence) or not strategies:
        raise ApplicationError("strategies must be a non-empty list of strategy names", field="strategies")
    names = tuple(registered(STRATEGY_REGISTRY, name, field="strategies").name for name in strategies)
    if len(set(names)) != len(names):
        raise ApplicationError("strategies must not repeat a strategy", field="strategies")
    baseline = baseline_strategy().name
    if baseline not in names:
        raise ApplicationError(
            f"strategies must include the baseline {baseline!r}: every speedup is taken against it",
            field="strategies",
        )
    return names


def comparison_cancel(*, comparison: Comparison) -> Comparison:
    """Cancel a comparison: its pending runs never start and the run in flight is cancelled.

    Raises:
        ApplicationError: the comparison has already ended (409).
    """
    updated = Comparison.objects.filter(id=comparison.id, status=Comparison.Status.RUNNING).update(
        status=Comparison.Status.CANCELLED, finished_at=timezone.now()
    )
    if not updated:
        raise ApplicationError(
            f"comparison {comparison.id} has already ended ({comparison.status})", field="status", status_code=409
        )
    stopping = list(Run.objects.filter(comparison=comparison, status=Run.Status.RUNNING).values_list("id", flat=True))
    Run.objects.filter(comparison=comparison, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).update(
        status=Run.Status.CANCELLED, finished_at=timezone.now(), error="comparison cancelled by a user"
    )
    run_work_stop(run_ids=stopping, reason="cancelled: the comparison was cancelled by a user")
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
    """Mark a run failed with its cause (no-op if it already ended); a comparison it belongs to
    moves on to its next run."""
    updated = Run.objects.filter(id=run_id, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).update(
        status=Run.Status.FAILED, error=error[:10_000], finished_at=timezone.now()
    )
    log.warning("run %s failed: %s", run_id, error)
    if updated:
        _run_devices_free(run_id, reason=f"its run failed: {error}"[:200])
        _comparison_advance(run_id)


def _run_devices_free(run_id: int, *, reason: str) -> None:
    """A run that ended gives up its place: its queued rounds are cancelled and its devices'
    leases released, and a scheduling pass hands them on once the transaction commits."""
    cancelled = Round.objects.filter(run_id=run_id, status=Round.Status.QUEUED).update(
        status=Round.Status.CANCELLED, finished_at=timezone.now(), error=reason
    )
    if release_devices(run_id=run_id, reason=reason) or cancelled:
        transaction.on_commit(dispatch.send_lab_schedule)


@transaction.atomic
def run_cancel(*, run: Run) -> Run:
    """Cancel a run: no further round starts, and the work in flight stops
    (:func:`.stop.run_work_stop`): the running round is cancelled (a late result is ignored),
    queued device tasks never run and running trainers are killed.

    Raises:
        ApplicationError: the run has already ended (409).
    """
    updated = Run.objects.filter(id=run.id, status__in=[Run.Status.PENDING, Run.Status.RUNNING]).update(
        status=Run.Status.CANCELLED, finished_at=timezone.now(), error="cancelled by a user"
    )
    if not updated:
        raise ApplicationError(f"run {run.id} has already ended ({run.status})", field="status", status_code=409)
    run_work_stop(run_ids=[run.id], reason="cancelled: the run was cancelled by a user")
    _run_devices_free(run.id, reason="its run was cancelled")
    # Cancelled while starting: its initial models go (run_begin stops at its next step).
    run_start_undo(run_id=run.id)
    _comparison_advance(run.id)
    run.refresh_from_db()
    return run


def run_finish(*, run_id: int) -> Run:
    """Close a run that completed its rounds: its metrics are the means over its rounds that
    did not fail (:func:`controlplane.planning.metrics.run_metrics`)."""
    rounds = list(Round.objects.filter(run_id=run_id).exclude(status=Round.Status.FAILED))
    measured = metrics.run_metrics(rounds)
    updated = Run.objects.filter(id=run_id, status=Run.Status.RUNNING).update(
        status=Run.Status.SUCCEEDED,
        finished_at=timezone.now(),
        raw_throughput_sps=measured.raw_throughput_sps,
        fair_throughput=measured.fair_throughput,
        fl_throughput_sps=measured.fl_throughput_sps,
    )
    if not updated:
        log.info("run %s was not running when its last round finished", run_id)
    else:
        _run_devices_free(run_id, reason="its run finished")
        _comparison_advance(run_id)
    return Run.objects.get(id=run_id)
