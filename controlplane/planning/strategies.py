"""Allocation strategies: from an experiment description to a plan (one assignment per device
and task that has data there).

The baselines are the paper's (Yu et al. 2022, §5; docs/DESIGN.md §1), all with batch size 128:

* ``temporal``  — tasks run concurrently without partitioning; the device is time-sliced.
* ``isolation`` — each of the ``I`` tasks on a device gets ``100 / I`` % of it.
* ``sharing``   — each task gets 100 % (MPS's default): they compete for the whole device.

``manual`` takes a researcher's own batch sizes and shares and checks them; ``vres_greedy`` and
``vres_sync`` are the predictor-driven planners of :mod:`controlplane.planning.planner`. A
predictor-driven strategy's plan is never predicted worse than a baseline's on its own clock:
every registered baseline (a strategy that needs no predictor and takes no plan) is planned and
predicted alike, and a device where one is predicted better trains that baseline's plan
(:func:`~controlplane.planning.planner.never_worse`).

Batch sizes are clipped to the shard: a task with 40 samples on a device trains with batch 40,
never with an empty or padded batch. Tasks with no samples on a device are not planned there,
so ``I`` counts only the tasks that run on that device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from controlplane.common.limits import ACTIVE_THREAD_PERCENTAGE, BATCH_SIZE
from controlplane.planning.planner import PLANNERS, Clock, PlannerContext, never_worse
from controlplane.planning.types import (
    Partitioning,
    Plan,
    PlannedAssignment,
    PlanningError,
    PlanningInput,
)
from workers.registry.base import Registry, UnknownEntryError

BASELINE_BATCH_SIZE = 128
"""The paper evaluates every baseline at batch size 128 (Yu et al. 2022, §5)."""

MIN_BATCH_SIZE = int(BATCH_SIZE.low)
"""Training-mode BatchNorm needs at least two samples per batch at the zoo's 1×1 activations."""
MAX_BATCH_SIZE = int(BATCH_SIZE.high)
SHARE_RANGE = (int(ACTIVE_THREAD_PERCENTAGE.low), int(ACTIVE_THREAD_PERCENTAGE.high))


def _baseline(
    spec: PlanningInput,
    *,
    strategy: str,
    partitioning: Partitioning,
    batch_size: int,
    share: Callable[[int], int],
) -> Plan:
    assignments = []
    for device_id in spec.device_ids:
        tasks = spec.tasks_on(device_id)
        for task_id in tasks:
            n = spec.samples_of(device_id, task_id)
            assignments.append(
                PlannedAssignment(
                    device_id=device_id,
                    task_id=task_id,
                    batch_size=min(batch_size, n),
                    active_thread_percentage=share(len(tasks)),
                    samples=n,
                )
            )
    return Plan(strategy=strategy, partitioning=partitioning, assignments=tuple(assignments))


def plan_temporal(spec: PlanningInput, *, batch_size: int = BASELINE_BATCH_SIZE) -> Plan:
    """``temporal``: no partitioning (share recorded as 100 %: each task holds the whole device
    during its time slice), batch ``min(batch_size, |D_ij|)``."""
    return _baseline(spec, strategy="temporal", partitioning="timeslice", batch_size=batch_size, share=lambda _n: 100)


def plan_isolation(spec: PlanningInput, *, batch_size: int = BASELINE_BATCH_SIZE) -> Plan:
    """``isolation``: each of the ``I_j`` tasks on device ``j`` gets ``floor(100 / I_j)`` %
    (so the shares never add up to more than 100 %), batch ``min(batch_size, |D_ij|)``."""
    return _baseline(
        spec, strategy="isolation", partitioning="mps", batch_size=batch_size, share=lambda n: max(1, 100 // n)
    )


def plan_sharing(spec: PlanningInput, *, batch_size: int = BASELINE_BATCH_SIZE) -> Plan:
    """``sharing``: every task gets 100 % (MPS's default), batch ``min(batch_size, |D_ij|)``."""
    return _baseline(spec, strategy="sharing", partitioning="mps", batch_size=batch_size, share=lambda _n: 100)


def plan_manual(spec: PlanningInput, *, entries: Iterable[Mapping[str, int]]) -> Plan:
    """``manual``: the researcher's own batch sizes and shares, checked.

    Args:
        entries: one mapping per (device, task) with keys ``device_id``, ``task_id``,
            ``batch_size`` (2 to the shard size) and ``active_thread_percentage`` (1-100).
            Every device–task pair with data must appear exactly once.

    Raises:
        PlanningError: a missing, duplicate or unknown pair, or a value out of range
            (``field`` names it).
    """
    given: dict[tuple[int, int], Mapping[str, int]] = {}
    for k, entry in enumerate(entries):
        where = f"plan[{k}]"
        try:
            key = (int(entry["device_id"]), int(entry["task_id"]))
            batch_size = int(entry["batch_size"])
            share = int(entry["active_thread_percentage"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanningError(
                f"{where} needs integer device_id, task_id, batch_size and active_thread_percentage",
                field="plan",
            ) from exc
        if key in given:
            raise PlanningError(f"{where}: device {key[0]} and task {key[1]} appear twice", field="plan")
        n = spec.samples_of(*key)
        if key[0] not in spec.device_ids or key[1] not in spec.task_ids or n == 0:
            raise PlanningError(
                f"{where}: device {key[0]} holds no data of task {key[1]} in this experiment",
                field="plan",
            )
        if not MIN_BATCH_SIZE <= batch_size <= min(n, MAX_BATCH_SIZE):
            raise PlanningError(
                f"{where}.batch_size={batch_size} is out of range: allowed {MIN_BATCH_SIZE} to {min(n, MAX_BATCH_SIZE)} "
                f"(the shard holds {n} samples)",
                field="batch_size",
            )
        if not SHARE_RANGE[0] <= share <= SHARE_RANGE[1]:
            raise PlanningError(
                f"{where}.active_thread_percentage={share} is out of range: allowed {ACTIVE_THREAD_PERCENTAGE.span}",
                field="active_thread_percentage",
            )
        given[key] = {"batch_size": batch_size, "active_thread_percentage": share}
    assignments = []
    for device_id in spec.device_ids:
        for task_id in spec.tasks_on(device_id):
            planned = given.get((device_id, task_id))
            if planned is None:
                raise PlanningError(f"the plan has no entry for device {device_id} and task {task_id}", field="plan")
            assignments.append(
                PlannedAssignment(
                    device_id=device_id,
                    task_id=task_id,
                    batch_size=planned["batch_size"],
                    active_thread_percentage=planned["active_thread_percentage"],
                    samples=spec.samples_of(device_id, task_id),
                )
            )
    return Plan(strategy="manual", partitioning="mps", assignments=tuple(assignments))


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy's plan function may use besides the experiment.

    Attributes:
        planner: predictors, models and memory for strategies with ``needs_predictor``.
        manual_entries: the researcher's plan, for strategies with ``takes_plan``.
    """

    planner: PlannerContext | None = None
    manual_entries: Iterable[Mapping[str, int]] | None = None


PlanFunction = Callable[[PlanningInput, StrategyContext], Plan]


@dataclass(frozen=True)
class Strategy:
    """One allocation strategy: everything the services, API, dashboard and CLI ask about it.

    Attributes:
        name: the name stored on a run and accepted by the API (``"vres_sync"``).
        label: one line for forms and legends.
        partitioning: ``"timeslice"`` (no partitioning; the device is time-sliced) or ``"mps"``
            (each task gets its ``active_thread_percentage``).
        plan: ``(PlanningInput, StrategyContext) -> Plan``; raises
            :class:`~controlplane.planning.types.PlanningError`.
        needs_predictor: plans with a fitted throughput predictor (``ctx.planner``); such a
            strategy also takes planner options (objective, slack), its run stores its first plan
            and, unless the run says ``replan: never``, is replanned before every later round by
            :func:`controlplane.planning.closed_loop.replan`, which calls :attr:`plan` again with
            corrected predictors and judges each device's new plan as :attr:`clock` and
            :attr:`slack` declare (nothing else of the record is read, never its name).
        baseline: the reference that speedups are taken against (exactly one strategy).
        compared: run by a comparison (``run_compare``), in registration order.
        takes_plan: the plan comes from the request (``manual``) rather than being computed.
        clock: for ``needs_predictor``, what the planner optimises and its plans are judged by
            (:data:`~controlplane.planning.planner.Clock`), against a baseline's predicted plan
            and, when replanned, against the configurations measured on a device:
            ``round_time`` (``T_j``, lower is better; ``vres_sync``) or ``throughput`` (the
            planner context's objective, raw or fair; ``vres_greedy``).
        slack: on the ``round_time`` clock, the run's slack policy (``options.slack``,
            :attr:`PlannerContext.slack <controlplane.planning.planner.PlannerContext.slack>`)
            applies to its plans: a device off the critical path may keep, or move to, a slower
            plan with more optimizer steps when it still ends within the round's slack
            (``vres_sync``). ``False``: a device is judged by its round time alone.
    """

    name: str
    label: str
    partitioning: Partitioning
    plan: PlanFunction
    needs_predictor: bool = False
    baseline: bool = False
    compared: bool = True
    takes_plan: bool = False
    clock: Clock = "round_time"
    slack: bool = False


STRATEGY_REGISTRY: Registry[Strategy] = Registry("strategy", "mtfl.strategies", Strategy)
"""Every strategy a run may use; plug-ins register in the ``mtfl.strategies`` entry-point group."""


def baseline_plans(spec: PlanningInput) -> list[Plan]:
    """The plans of every registered strategy that needs no predictor and takes no plan (the
    paper's baselines among the built-ins), each with its record's name and partitioning. A
    plug-in baseline that cannot plan this experiment (:class:`PlanningError`) is left out of
    the comparison rather than failing the planner that compares with it."""
    plans = []
    for record in STRATEGY_REGISTRY:
        if record.needs_predictor or record.takes_plan:
            continue
        try:
            made = record.plan(spec, StrategyContext())
        except PlanningError:
            continue
        plans.append(replace(made, strategy=record.name, partitioning=record.partitioning))
    return plans


def _planned(name: str, clock: Clock, *, slack: bool) -> PlanFunction:
    """The plan function of the built-in planner ``name`` (:data:`PLANNERS`), kept never worse
    than a baseline on ``clock`` (with the run's slack policy when ``slack``)."""

    def plan(spec: PlanningInput, ctx: StrategyContext) -> Plan:
        if ctx.planner is None:
            raise PlanningError(f"strategy {name!r} needs a fitted throughput predictor", field="strategy")
        made = PLANNERS[name](spec, ctx.planner)
        return never_worse(made, baseline_plans(spec), spec, ctx.planner, clock=clock, slack=slack)

    return plan


def _manual(spec: PlanningInput, ctx: StrategyContext) -> Plan:
    if ctx.manual_entries is None:
        raise PlanningError("strategy 'manual' needs a plan", field="plan")
    return plan_manual(spec, entries=ctx.manual_entries)


for _strategy in (
    Strategy(
        "temporal",
        "temporal — time slicing, the speedups' baseline",
        "timeslice",
        lambda spec, _ctx: plan_temporal(spec),
        baseline=True,
    ),
    Strategy("isolation", "isolation — each of I tasks gets 100/I %", "mps", lambda spec, _ctx: plan_isolation(spec)),
    Strategy("sharing", "sharing — every task gets 100 % and competes", "mps", lambda spec, _ctx: plan_sharing(spec)),
    Strategy(
        "vres_greedy",
        "vres_greedy — the paper's planner (needs a predictor)",
        "mps",
        _planned("vres_greedy", "throughput", slack=False),
        needs_predictor=True,
        clock="throughput",
    ),
    Strategy(
        "vres_sync",
        "vres_sync — plans the round time (needs a predictor)",
        "mps",
        _planned("vres_sync", "round_time", slack=True),
        needs_predictor=True,
        slack=True,
    ),
    Strategy("manual", "manual — your own batch sizes and shares", "mps", _manual, compared=False, takes_plan=True),
):
    STRATEGY_REGISTRY.register(_strategy)


def get_strategy(name: str, *, field: str = "strategy") -> Strategy:
    """The registered strategy ``name``.

    Raises:
        PlanningError: no such strategy (``field`` names the request field; the message lists
            the allowed names).
    """
    try:
        return STRATEGY_REGISTRY.get(name, field=field)
    except UnknownEntryError as exc:
        raise PlanningError(str(exc), field=field) from None


def baseline_strategy() -> Strategy:
    """The strategy speedups are taken against (``temporal`` among the built-ins)."""
    return next(s for s in STRATEGY_REGISTRY if s.baseline)


def compared_strategies() -> tuple[str, ...]:
    """The strategies a comparison runs, in order: the paper's baselines, then the planners."""
    return tuple(s.name for s in STRATEGY_REGISTRY if s.compared)


def planned_strategies() -> tuple[str, ...]:
    """The predictor-driven strategies (``vres_greedy``, ``vres_sync`` among the built-ins)."""
    return tuple(s.name for s in STRATEGY_REGISTRY if s.needs_predictor)


def make_plan(
    strategy: str,
    spec: PlanningInput,
    *,
    manual_entries: Iterable[Mapping[str, int]] | None = None,
    planner: PlannerContext | None = None,
) -> Plan:
    """Plan one round with the named strategy.

    Args:
        planner: what strategies with ``needs_predictor`` need (predictors, models, memory).

    Raises:
        PlanningError: unknown strategy (``field="strategy"``), a device with no data at all,
            a plan given to a strategy that computes its own or missing for one that takes it,
            a planned strategy without a planner context, or any error of the strategy's plan
            function.
    """
    record = get_strategy(strategy)
    if not spec.device_ids or not spec.task_ids:
        raise PlanningError("the experiment needs at least one device and one task", field="devices")
    if manual_entries is not None and not record.takes_plan:
        raise PlanningError(f"strategy {strategy!r} takes no plan; use 'manual'", field="plan")
    plan = record.plan(spec, StrategyContext(planner=planner, manual_entries=manual_entries))
    if plan.strategy != record.name or plan.partitioning != record.partitioning:
        plan = replace(plan, strategy=record.name, partitioning=record.partitioning)
    return plan
