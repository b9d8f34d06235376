"""The planners' inputs from the database, and plans stored on a run.

``vres_greedy`` and ``vres_sync`` (controlplane.planning.planner) need, per device, the newest
ready throughput predictor of its backend and device class and its memory; per task, its model.
A run stores the plan they made when it was created (:func:`plan_to_json`), after the guard
(:func:`guarded_plan`, :mod:`controlplane.planning.guard`) had its say; round 0 trains it
(:func:`run_plan`) and every later round replans from what the run measured
(:func:`round_plan`, :mod:`controlplane.planning.closed_loop`) unless the run says otherwise.

Both plan an assignment's seconds with a fixed part learned from measured seconds
(:mod:`controlplane.planning.seconds`): a run's first plan from the experiment's finished runs,
each replan from the run's own rounds and the experiment's finished baseline runs, which are
also the configurations a device may go back to (:func:`measured_configurations`).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping
from typing import Any

from django.db.models import Max

from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Experiment, Run
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class
from controlplane.planning import closed_loop
from controlplane.planning.closed_loop import MeasuredConfiguration
from controlplane.planning.guard import FALLBACK_BASELINE, PredictorFacts, predictor_warnings
from controlplane.planning.participation import plan_of_devices
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES, DeviceCapacity, PlannerContext
from controlplane.planning.seconds import MeasuredSeconds, SecondsModel, SecondsModels, fit_device_seconds
from controlplane.planning.strategies import STRATEGY_REGISTRY, make_plan
from controlplane.planning.types import Partitioning, Plan, PlannedAssignment
from controlplane.profiling.models import Predictor, ProfileSample
from controlplane.profiling.selectors import experiment_regime_warnings
from controlplane.profiling.services.predictors import predictor_current, predictor_load
from workers.registry.backends import BACKEND_REGISTRY

DEFAULT_OPTIONS = {"objective": "raw", "slack": "smaller_batches", "replan": "every_round"}
"""Planner settings of a ``vres_*`` run when the researcher gives none: ``replan`` is
``every_round`` (closed loop, :mod:`controlplane.planning.closed_loop`) or ``never`` (the
first plan for every round, open loop)."""

REPLAN_POLICIES: tuple[str, ...] = ("every_round", "never")

AGGREGATION_OPTIONS: tuple[str, ...] = ("aggregation", "aggregation_params")
"""Keys of a run's options that are not the planner's: the run's own aggregator
(:func:`.runs.run_aggregation_options` checks them); :func:`planner_options` passes over them."""


def planner_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Check a run's planner options and fill in the defaults (its aggregator, also in a run's
    options, is left out: :data:`AGGREGATION_OPTIONS`).

    Raises:
        ApplicationError: an unknown key, or a value outside the allowed ones (field named).
    """
    given = {k: v for k, v in (options or {}).items() if k not in AGGREGATION_OPTIONS}
    unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ApplicationError(
            f"options.{unknown[0]} is unknown; allowed: {', '.join(DEFAULT_OPTIONS)}", field="options"
        )
    merged = {**DEFAULT_OPTIONS, **given}
    for key, allowed in (("objective", OBJECTIVES), ("slack", SLACK_POLICIES), ("replan", REPLAN_POLICIES)):
        if merged[key] not in allowed:
            raise ApplicationError(
                f"options.{key}={merged[key]!r} is not allowed; allowed: {', '.join(allowed)}", field="options"
            )
    return merged


PROFILE_BUDGET_HINT_S = 600
"""The ``--budget`` (seconds) the hint after a missing predictor suggests for ``mtfl profile``;
the dashboard's predictors page (``templates/dashboard/predictors.html``) suggests the same."""


def device_predictors(experiment: Experiment, *, device_ids: Collection[int] | None = None) -> dict[int, Predictor]:
    """``device_id → `` the newest ready predictor of each device's backend and class.

    Args:
        device_ids: only these devices (a round's participants); ``None``: every device.

    Raises:
        ApplicationError: a device whose backend and class have no ready predictor (400, with
            the commands that make one).
    """
    rows: dict[int, Predictor] = {}
    current: dict[tuple[str, str], Predictor | None] = {}  # one look-up per backend and class
    # Only what a device's class is made of, not its whole inventory (10,000 of them at scale).
    listed = experiment.devices.order_by("id").values_list(
        "id", "name", "backend", "inventory__accelerator", "inventory__cores"
    )
    if device_ids is not None:
        wanted = set(device_ids)
        if len(wanted) <= selectors.DEVICE_FILTER_LIMIT:
            listed = listed.filter(id__in=wanted)
    for device_id, name, backend, accelerator, cores in listed:
        if device_ids is not None and device_id not in wanted:
            continue
        device = Device(
            id=device_id, name=name, backend=backend, inventory={"accelerator": accelerator, "cores": cores}
        )
        cls = device_class(device)
        if (device.backend, cls) not in current:
            current[(device.backend, cls)] = predictor_current(backend=device.backend, device_class=cls)
        row = current[(device.backend, cls)]
        if row is None:
            raise ApplicationError(
                f"no fitted throughput predictor for device {device.name} (backend {device.backend}, class {cls}): "
                f"profile a device of that class (`mtfl profile --device {shlex.quote(device.name)} --budget "
                f"{PROFILE_BUDGET_HINT_S}`) and fit one (`mtfl fit-predictor --backend {shlex.quote(device.backend)} "
                f"--device-class {shlex.quote(cls)}`) first",
                field="strategy",
            )
        rows[device.id] = row
    return rows


def planner_context(
    *,
    experiment: Experiment,
    options: Mapping[str, str],
    rows: Mapping[int, Predictor] | None = None,
    device_ids: Collection[int] | None = None,
    fit_seconds: bool = True,
) -> PlannerContext:
    """Predictors, memory, partitionings, seconds models and models of an experiment's devices
    and tasks.

    Args:
        rows: the devices' predictor rows when the caller has them (:func:`device_predictors`).
        device_ids: only these devices (a round's participants); ``None``: every device.
        fit_seconds: fit the seconds models on the experiment's finished runs
            (:func:`experiment_seconds`); ``False``: the prior only (the closed loop fits them
            on the history it is given).

    Raises:
        ApplicationError: a device whose backend and class have no ready predictor (400, with
            the commands that make one), or a predictor whose artifact fails its check (409).
    """
    rows = rows if rows is not None else device_predictors(experiment, device_ids=device_ids)
    loaded: dict[int, Any] = {}
    capacities = {}
    for device in selectors.experiment_devices(experiment, device_ids=device_ids):
        row = rows[device.id]
        if row.id not in loaded:
            loaded[row.id] = predictor_load(row)
        memory = device.inventory.get("memory_bytes")
        backend = BACKEND_REGISTRY.get(device.backend) if device.backend in BACKEND_REGISTRY else None
        capacities[device.id] = DeviceCapacity(
            predictor=loaded[row.id],
            memory_bytes=float(memory) if memory else None,
            partitionings=backend.partitionings if backend is not None else ("mps",),
        )
    prior = SecondsModel.prior(int(mtfl_setting("WARMUP_ITERATIONS")))
    seconds = (
        fit_device_seconds(experiment_seconds(experiment, device_ids=device_ids), prior=prior)
        if fit_seconds
        else SecondsModels(default=prior)
    )
    return PlannerContext(
        architectures={t.id: t.architecture for t in experiment.tasks.all()},
        devices=capacities,
        objective=options["objective"],
        slack=options["slack"],
        seed=experiment.seed,
        seconds=seconds,
    )


def experiment_seconds(experiment: Experiment, *, device_ids: Collection[int] | None = None) -> list[MeasuredSeconds]:
    """Every succeeded assignment with a throughput and seconds of the experiment's finished
    runs (any strategy): what the seconds model of a run's first plan is fitted on.

    Args:
        device_ids: only these devices' (a round's participants); ``None``: every device's.
    """
    rows = selectors.device_filtered(
        Assignment.objects.filter(
            round__run__experiment=experiment,
            round__run__status=Run.Status.SUCCEEDED,
            status=Assignment.Status.SUCCEEDED,
            throughput_sps__gt=0,
            seconds__gt=0,
        ),
        device_ids,
    ).values_list("device_id", "batch_size", "samples", "throughput_sps", "seconds")
    epochs = experiment.local_epochs
    wanted = None if device_ids is None else set(device_ids)
    return [
        MeasuredSeconds(d, b, n, float(p), float(t), epochs) for d, b, n, p, t in rows if wanted is None or d in wanted
    ]


def _fitted_on(row: Predictor) -> tuple[int, set[str]]:
    """The largest mix a predictor's backend and class were profiled at, and the models
    profiled beside another task (from the stored profile samples)."""
    samples = ProfileSample.objects.filter(backend=row.backend, device_class=row.device_class)
    largest = samples.aggregate(m=Max("mix_size"))["m"] or 1
    colocated = set(samples.filter(mix_size__gte=2).values_list("architecture", flat=True).distinct())
    return int(largest), colocated


def predictor_guard(experiment: Experiment) -> list[str]:
    """The guard's warnings for a predictor-driven run of ``experiment``
    (:func:`controlplane.planning.guard.predictor_warnings`), empty when every device's
    predictor is trusted.

    Raises:
        ApplicationError: as :func:`device_predictors`.
    """
    rows = device_predictors(experiment)
    spec = selectors.planning_input(experiment)
    architectures = {t.id: t.architecture for t in experiment.tasks.all()}
    names = dict(experiment.devices.values_list("id", "name"))
    fitted: dict[int, tuple[int, set[str]]] = {}
    facts = []
    for device_id in spec.device_ids:
        tasks = spec.tasks_on(device_id)
        if not tasks:
            continue
        row = rows[device_id]
        if row.id not in fitted:
            fitted[row.id] = _fitted_on(row)
        largest, colocated = fitted[row.id]
        facts.append(
            PredictorFacts(
                device=names[device_id],
                predictor=f"v{row.version} ({row.backend}, {row.device_class})",
                heldout_rmsle=row.heldout_rmsle,
                mix=[architectures[t] for t in tasks],
                largest_fitted_mix=largest,
                colocated_models=colocated,
            )
        )
    return predictor_warnings(facts, max_rmsle=float(mtfl_setting("PREDICTOR_MAX_RMSLE")))


def best_baseline(experiment: Experiment) -> str:
    """The baseline an untrusted run falls back to: among the registered baselines that give
    each task a share (``mps`` partitioning, no predictor), the one with the highest measured
    FL throughput in the experiment's finished runs, else
    :data:`~controlplane.planning.guard.FALLBACK_BASELINE`."""
    names = [
        s.name for s in STRATEGY_REGISTRY if s.partitioning == "mps" and not s.needs_predictor and not s.takes_plan
    ]
    best = (
        Run.objects.filter(
            experiment=experiment, strategy__in=names, status=Run.Status.SUCCEEDED, fl_throughput_sps__isnull=False
        )
        .order_by("-fl_throughput_sps")
        .values_list("strategy", flat=True)
        .first()
    )
    return best or FALLBACK_BASELINE


def guarded_plan(*, experiment: Experiment, plan: Plan) -> tuple[Plan, dict[str, Any], list[str]]:
    """Apply the guard to a predictor-driven plan before its run is saved.

    Returns:
        ``(plan to store, extra keys for Run.planned, warnings for Run.warnings)``. With
        warnings and ``experiment.untrusted_predictor`` ``baseline`` or ``measure``, the plan
        stored is the best baseline's (:func:`best_baseline`) and the extra keys say so
        (``{"fallback": "baseline"|"measure", "baseline": name}``); with ``plan``, the plan is
        kept and the warnings say it was planned anyway. The devices the guard finds host-bound
        (:func:`~controlplane.profiling.selectors.experiment_regime_warnings`) are said last, as
        advice: they never make a run fall back.

    Raises:
        ApplicationError: as :func:`device_predictors`.
    """
    warnings = predictor_guard(experiment)
    advice = experiment_regime_warnings(experiment)
    if not warnings:
        return plan, {}, advice
    choice = experiment.untrusted_predictor
    if choice == "plan":
        return plan, {}, [*warnings, "planned anyway (the experiment's untrusted_predictor is plan)", *advice]
    name = best_baseline(experiment)
    fallback = make_plan(name, selectors.planning_input(experiment))
    fallback = Plan(strategy=plan.strategy, partitioning=fallback.partitioning, assignments=fallback.assignments)
    then = (
        "in every round (the experiment's untrusted_predictor is baseline)"
        if choice == "baseline"
        else "in round 0, then replans from what round 0 measured (the experiment's untrusted_predictor is measure)"
    )
    return (
        fallback,
        {"fallback": choice, "baseline": name},
        [*warnings, f"the run trains {name}'s plan {then}", *advice],
    )


def measured_configurations(
    run: Run, *, before: int, device_ids: Collection[int] | None = None
) -> list[MeasuredConfiguration]:
    """Every device configuration the run measured in its rounds before ``before``, then every
    one the experiment's finished baseline runs measured (``strategy`` set: a registered
    strategy that needs no predictor and takes no plan): a device counts only when all its
    assignments of the round succeeded with a throughput (the rule of
    :mod:`controlplane.planning.metrics`), tasks in id order, with their seconds when every one
    was recorded and the device's partitioning in that round (:func:`round_partitionings`).

    Args:
        device_ids: only these devices' (a round's participants); ``None``: every device's.
    """
    own = Assignment.objects.filter(round__run=run, round__index__lt=before)
    first = run_plan(run)
    out = _configurations(
        own,
        device_ids=device_ids,
        partitionings=_run_partitionings(run, first, before),
        default=first.partitioning,
        strategy=None,
    )
    baselines = {r.name: r.partitioning for r in STRATEGY_REGISTRY if not r.needs_predictor and not r.takes_plan}
    finished = Run.objects.filter(
        experiment_id=run.experiment_id, status=Run.Status.SUCCEEDED, strategy__in=list(baselines)
    ).exclude(id=run.id)
    for other_id, strategy in finished.order_by("id").values_list("id", "strategy"):
        rows = Assignment.objects.filter(round__run_id=other_id)
        part: Partitioning = "timeslice" if baselines[strategy] == "timeslice" else "mps"
        out += _configurations(rows, device_ids=device_ids, partitionings={}, default=part, strategy=strategy)
    return out


def _run_partitionings(run: Run, first: Plan, before: int) -> dict[int, dict[int, Partitioning]]:
    """``round index → device_id → partitioning`` of the run's rounds before ``before`` where it
    is not ``first``'s partitioning: a replanned round's record says (:func:`round_partitionings`),
    any other round trained ``first`` (the run's stored plan)."""
    trained_first = {a.device_id: a.partitioning for a in first.assignments if a.partitioning is not None}
    out: dict[int, dict[int, Partitioning]] = {}
    for index, record in run.rounds.filter(index__lt=before).values_list("index", "replan"):
        out[index] = round_partitionings(record) if record and "partitionings" in record else trained_first
    return out


def round_partitionings(replan: Mapping[str, Any] | None) -> dict[int, Partitioning]:
    """The devices a round's replanning record (``Round.replan``) gave a partitioning other
    than its plan's (a baseline's ``timeslice`` plan kept on a device), ``device_id → partitioning``."""
    stored = (replan or {}).get("partitionings") or {}
    return {int(d): "timeslice" if p == "timeslice" else "mps" for d, p in stored.items()}


def round_timesliced_devices(rnd: Any) -> set[int]:
    """The devices a predictor-driven run's round ``rnd`` time-sliced although its plan shares
    by ``mps`` (a ``timeslice`` baseline's plan kept there): their tasks did not run at their
    shares. Empty for any other run (its plan has one partitioning)."""
    record = STRATEGY_REGISTRY.get(rnd.run.strategy) if rnd.run.strategy in STRATEGY_REGISTRY else None
    if record is None or not record.needs_predictor:
        return set()
    if rnd.replan and "partitionings" in rnd.replan:
        overrides = round_partitionings(rnd.replan)
    else:
        overrides = {a.device_id: a.partitioning for a in run_plan(rnd.run).assignments if a.partitioning}
    return {d for d, p in overrides.items() if p == "timeslice"}


def round_partitioning(rnd: Any, device_id: int) -> Partitioning:
    """How ``device_id`` is shared in round ``rnd`` (what a retry of the device's part must send
    again): a replanned round's record says (its override, else the plan's partitioning); any
    other round trains the run's stored plan."""
    first = run_plan(rnd.run)
    if rnd.replan and "partitionings" in rnd.replan:
        return round_partitionings(rnd.replan).get(device_id, first.partitioning)
    return first.partitioning_of(device_id)


def _configurations(
    queryset: Any,
    *,
    device_ids: Collection[int] | None,
    partitionings: Mapping[int, Mapping[int, Partitioning]],
    default: Partitioning,
    strategy: str | None,
) -> list[MeasuredConfiguration]:
    """The succeeded device configurations of ``queryset``'s assignments, each device's
    partitioning ``partitionings[round index][device_id]``, else ``default``."""
    rows = (
        selectors.device_filtered(queryset, device_ids)
        .order_by("round__index", "device_id", "task_id")
        .values_list(
            "round__index",
            "device_id",
            "task_id",
            "batch_size",
            "active_thread_percentage",
            "status",
            "throughput_sps",
            "seconds",
        )
    )
    wanted = None if device_ids is None else set(device_ids)
    grouped: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for row in rows:
        if wanted is None or row[1] in wanted:
            grouped.setdefault((row[0], row[1]), []).append(row)
    out = []
    for (index, device_id), items in grouped.items():
        if not all(r[5] == Assignment.Status.SUCCEEDED and r[6] and r[6] > 0 for r in items):
            continue
        part = partitionings.get(index, {}).get(device_id, default)
        seconds = tuple(float(r[7]) for r in items) if all(r[7] and r[7] > 0 for r in items) else None
        out.append(
            MeasuredConfiguration(
                device_id=device_id,
                round_index=index,
                task_ids=tuple(r[2] for r in items),
                batch_size=tuple(r[3] for r in items),
                active_thread_percentage=tuple(r[4] for r in items),
                throughput_sps=tuple(float(r[6]) for r in items),
                seconds=seconds,
                partitioning=part,
                strategy=strategy,
            )
        )
    return out


def round_plan(
    run: Run, index: int, *, device_ids: Collection[int] | None = None
) -> tuple[Plan, dict[str, Any] | None]:
    """The plan round ``index`` of ``run`` trains, and the replanning record for ``Round.replan``.

    With ``device_ids`` (the round's participants,
    :func:`.participation.round_participants`) only those devices are planned, replanned and
    read: their shards, predictors and measured history, never the rest of the federation's.

    Round 0, the baselines, ``manual``, a run with ``replan: never`` and a run that fell back
    to a baseline (``untrusted_predictor: baseline``) train :func:`run_plan`'s plan, with no
    record. A predictor-driven run otherwise replans before every later round from what it has
    measured (:func:`controlplane.planning.closed_loop.replan`), and so does a run that
    measured first (``untrusted_predictor: measure``).

    Raises:
        controlplane.planning.types.PlanningError: the strategy cannot plan the experiment.
        ApplicationError: a device lost its predictor since the run was created.
    """
    first = run_plan(run, device_ids=device_ids)
    planned = run.planned or {}
    if index == 0 or "assignments" not in planned or planned.get("fallback") == "baseline":
        return first, None
    options = planner_options(run.options)
    if options["replan"] == "never" and planned.get("fallback") != "measure":
        return first, None
    experiment = run.experiment
    history = measured_configurations(run, before=index, device_ids=device_ids)
    if not history:
        return first, {"decisions": [], "note": "no device has a measured round yet: the first plan again"}
    names = {d.id: d.name for d in selectors.experiment_devices(experiment, device_ids=device_ids, fields=["name"])}
    rows = device_predictors(experiment, device_ids=device_ids)
    # The closed loop fits the seconds model on the history (the experiment's baseline runs are in it).
    ctx = planner_context(experiment=experiment, options=options, rows=rows, device_ids=device_ids, fit_seconds=False)
    heldout = {d: row.heldout_rmsle for d, row in rows.items()}
    plan, decisions = closed_loop.replan(
        run.strategy, selectors.planning_input(experiment, device_ids=device_ids), ctx, history, heldout_rmsle=heldout
    )
    devices = sorted({a.device_id for a in plan.assignments})
    return plan, {
        "measured_rounds": sorted({h.round_index for h in history if h.strategy is None}),
        "predicted_round_time_s": plan.predicted_round_time_s,
        "decisions": [{**d.as_json(), "device": names.get(d.device_id, str(d.device_id))} for d in decisions],
        "partitionings": {
            str(d): plan.partitioning_of(d) for d in devices if plan.partitioning_of(d) != plan.partitioning
        },
        "notes": list(plan.notes),
    }


def plan_to_json(plan: Plan, **extra: Any) -> dict[str, Any]:
    """A plan as JSON for ``Run.planned`` (``extra``: keys stored beside it, e.g. the guard's
    ``fallback``)."""
    return {
        **extra,
        "strategy": plan.strategy,
        "partitioning": plan.partitioning,
        "predicted_round_time_s": plan.predicted_round_time_s,
        "notes": list(plan.notes),
        "assignments": [
            {
                "device_id": a.device_id,
                "task_id": a.task_id,
                "batch_size": a.batch_size,
                "active_thread_percentage": a.active_thread_percentage,
                "samples": a.samples,
                "predicted_throughput_sps": a.predicted_throughput_sps,
                "predicted_seconds": a.predicted_seconds,
                **({"partitioning": a.partitioning} if a.partitioning else {}),
            }
            for a in plan.assignments
        ],
    }


def plan_from_json(data: Mapping[str, Any]) -> Plan:
    """The plan :func:`plan_to_json` stored."""
    return Plan(
        strategy=data["strategy"],
        partitioning=data["partitioning"],
        predicted_round_time_s=data.get("predicted_round_time_s"),
        assignments=tuple(PlannedAssignment(**a) for a in data["assignments"]),
        notes=tuple(data.get("notes", ())),
    )


def run_plan(run: Run, *, device_ids: Collection[int] | None = None) -> Plan:
    """The plan a round of ``run`` trains: the one stored when the run was created (strategies
    with ``needs_predictor`` plan once, with the predictors of that moment), otherwise the
    strategy's plan of the experiment as it is (the baselines and ``manual`` plan the same
    every round).

    Args:
        device_ids: the round's participants: a stored plan is cut down to them
            (:func:`controlplane.planning.participation.plan_of_devices`, its predicted round
            time taken over them); a baseline plans them alone; a ``manual`` plan keeps their
            entries. ``None``: every device.

    Raises:
        controlplane.planning.types.PlanningError: the strategy cannot plan the experiment
            (the field at fault named).
    """
    experiment = run.experiment
    if run.planned and "assignments" in run.planned:  # not only a pending round's plan
        if device_ids is None:
            return plan_from_json(run.planned)
        wanted = set(device_ids)
        # Only the participants' entries become PlannedAssignments (30,000 entries at 10,000 devices).
        stored = {**run.planned, "assignments": [a for a in run.planned["assignments"] if a["device_id"] in wanted]}
        return plan_of_devices(plan_from_json(stored), wanted, local_epochs=experiment.local_epochs)
    entries = run.manual_plan
    if entries is not None and device_ids is not None:
        wanted = set(device_ids)
        entries = [e for e in entries if e.get("device_id") in wanted]
    return make_plan(run.strategy, selectors.planning_input(experiment, device_ids=device_ids), manual_entries=entries)
