"""Runs and comparisons: create (checked and planned before anything is dispatched), cancel,
and their ends (failed, finished), which start a comparison's next run.

A run, step by step (docs/DESIGN.md §2), one module per step:

1. :func:`run_create` (web) saves the run and, after commit, queues ``RUN_BEGIN``.
2. :func:`.standalone.run_begin` (control worker) claims it, writes each task's seeded initial
   model, evaluates it, and asks every device for ``P_alone``;
   :func:`.standalone.standalone_record` stores those and starts round 0.
3. :mod:`.rounds` plays each round: :func:`.rounds.start.round_start` plans and dispatches it,
   :func:`.rounds.record.round_finish` records, aggregates and evaluates it, and
   :func:`.rounds.advance.round_advance` starts the next one or calls :func:`run_finish`.
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
from controlplane.common.registered import registered
from controlplane.experiments import selectors
from controlplane.experiments.models import Comparison, Experiment, Round, Run
from controlplane.experiments.services import dispatch, planning
from controlplane.experiments.services.plugins import experiment_plugins_check
from controlplane.experiments.services.stop import run_work_stop
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
) -> Run:
    """Launch a run of ``strategy`` on an experiment (it starts once the transaction commits).

    Args:
        strategy: a name of :data:`~controlplane.planning.strategies.STRATEGY_REGISTRY`.
        plan: for a strategy that ``takes_plan`` (``manual``) only: ``[{"device": id, "task": id,
            "batch_size": n, "active_thread_percentage": r}, ...]``, one entry per device–task
            pair with data.
        options: for a strategy that ``needs_predictor`` only: ``{"objective": "raw"|"fair",
            "slack": "smaller_batches"|"none"}`` (defaults :data:`.planning.DEFAULT_OPTIONS`).

    Raises:
        ApplicationError: unknown strategy, a plan for a strategy that takes none, or an invalid
            plan (the field at fault is named); a predictor-driven strategy without a fitted
            predictor for every device, or a plan the planner cannot make (memory, empty shard,
            unknown model); a device whose agent never connected (409); a task's model or
            dataset that a device holding its data, or the control plane, lacks
            (:func:`.plugins.experiment_plugins_check`).
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
    """Check and save a pending run (planning it now when its strategy needs a predictor)
    without starting it.

    ``planner``: a context already built for these options (a comparison plans several runs
    with the same predictors; loading them once is enough).
    """
    try:
        record = get_strategy(strategy)
    except PlanningError as exc:
        raise ApplicationError(str(exc), field=exc.field) from exc
    never_seen = sorted(experiment.devices.filter(last_heartbeat_at__isnull=True).values_list("name", flat=True))
    if never_seen:
        raise ApplicationError(
            f"device {never_seen[0]} has never connected an agent: start `mtfl agent --device {never_seen[0]}` "
            "on its host first",
            field="devices",
            status_code=409,
        )
    experiment_plugins_check(experiment)
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
    if record.needs_predictor:
        options = planning.planner_options(options)
        planner = planner or planning.planner_context(experiment=experiment, options=options)
    elif options:
        raise ApplicationError(
            f"options apply to {', '.join(planned_strategies())} only, not to {strategy!r}", field="options"
        )
    try:
        made = make_plan(strategy, selectors.planning_input(experiment), manual_entries=manual, planner=planner)
    except PlanningError as exc:
        raise ApplicationError(str(exc), field=exc.field) from exc
    for name, backend in experiment.devices.order_by("name").values_list("name", "backend"):
        given = BACKEND_REGISTRY.get(backend, field="backend").partitionings if backend in BACKEND_REGISTRY else ()
        if made.partitioning not in given:
            usable = [s.name for s in STRATEGY_REGISTRY if s.partitioning in given]
            raise ApplicationError(
                f"{strategy} needs {made.partitioning} partitioning, which device {name}'s {backend} backend cannot "
                f"give (it has no MPS); run {' or '.join(usable) or 'another strategy'} there, or serve the device "
                "with --backend cuda-mps",
                field="strategy",
            )
    return Run.objects.create(
        experiment=experiment,
        strategy=strategy,
        manual_plan=manual,
        options=dict(options or {}),
        simulated=experiment.devices.filter(backend__in=[b.name for b in BACKEND_REGISTRY if b.simulated]).exists(),
        planned=planning.plan_to_json(made) if record.needs_predictor else None,
        comparison=comparison,
    )


@transaction.atomic
def comparison_create(
    *, experiment: Experiment, options: Mapping[str, Any] | None = None, strategies: Sequence[str] | None = None
) -> Comparison:
    """Launch strategies on the same experiment, one run after another (same devices, data and
    seeds): by default every strategy of
    :func:`~controlplane.planning.strategies.compared_strategies` (among the built-ins
    ``temporal``, ``isolation``, ``sharing``, ``vres_greedy``, ``vres_sync``, then any plug-in's).

    All runs are checked and planned now, so a missing predictor or an impossible plan is
    refused before anything is dispatched; the first starts once the transaction commits and
    each next one when the previous ends (:func:`_comparison_advance`).

    Args:
        options: planner options for the runs whose strategy needs a predictor (see
            :func:`run_create`).
        strategies: a subset to run instead, in this order, which must hold the baseline
            (:func:`~controlplane.planning.strategies.baseline_strategy`, ``temporal``): every
            speedup is taken against it.

    Raises:
        ApplicationError: as :func:`run_create`, for any of the strategies; ``strategies``
            empty, repeating a name, naming an unknown strategy or lacking the baseline; (409)
            another comparison of the experiment still running.
    """
    strategies = comparison_strategies(strategies)
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
    options = planning.planner_options(options)
    experiment_plugins_check(experiment)
    planner = planning.planner_context(experiment=experiment, options=options)
    comparison = Comparison.objects.create(experiment=experiment, strategies=list(strategies))
    runs = []
    for strategy in strategies:
        planned = get_strategy(strategy).needs_predictor
        runs.append(
            _run_new(
                experiment=experiment,
                strategy=strategy,
                options=options if planned else None,
                comparison=comparison,
                planner=planner if planned else None,
            )
        )
    first = runs[0].id
    transaction.on_commit(lambda: dispatch.send_run_begin(first))
    return comparison


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
        _comparison_advance(run_id)


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
        _comparison_advance(run_id)
    return Run.objects.get(id=run_id)
