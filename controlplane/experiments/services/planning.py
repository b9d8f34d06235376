"""The planners' inputs from the database, and plans stored on a run.

``vres_greedy`` and ``vres_sync`` (controlplane.planning.planner) need, per device, the newest
ready throughput predictor of its backend and device class and its memory; per task, its model.
A run stores the plan they made (:func:`plan_to_json`) so every round trains the same plan and
the dashboard can compare predicted with measured throughput; :func:`run_plan` gives the plan a
round of a run trains.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from controlplane.common.errors import ApplicationError
from controlplane.experiments import selectors
from controlplane.experiments.models import Experiment, Run
from controlplane.fleet.selectors import device_class
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES, DeviceCapacity, PlannerContext
from controlplane.planning.strategies import make_plan
from controlplane.planning.types import Plan, PlannedAssignment
from controlplane.profiling.services.predictors import predictor_current, predictor_load

DEFAULT_OPTIONS = {"objective": "raw", "slack": "smaller_batches"}
"""Planner settings of a ``vres_*`` run when the researcher gives none."""


def planner_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Check a run's planner options and fill in the defaults.

    Raises:
        ApplicationError: an unknown key, or a value outside the allowed ones (field named).
    """
    given = dict(options or {})
    unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ApplicationError(
            f"options.{unknown[0]} is unknown; allowed: {', '.join(DEFAULT_OPTIONS)}", field="options"
        )
    merged = {**DEFAULT_OPTIONS, **given}
    for key, allowed in (("objective", OBJECTIVES), ("slack", SLACK_POLICIES)):
        if merged[key] not in allowed:
            raise ApplicationError(
                f"options.{key}={merged[key]!r} is not allowed; allowed: {', '.join(allowed)}", field="options"
            )
    return merged


PROFILE_BUDGET_HINT_S = 600
"""The ``--budget`` (seconds) the hint after a missing predictor suggests for ``mtfl profile``;
the dashboard's predictors page (``templates/dashboard/predictors.html``) suggests the same."""


def planner_context(*, experiment: Experiment, options: Mapping[str, str]) -> PlannerContext:
    """Predictors, memory and models of an experiment's devices and tasks.

    Raises:
        ApplicationError: a device whose backend and class have no ready predictor (400, with
            the commands that make one), or a predictor whose artifact fails its check (409).
    """
    loaded: dict[int, Any] = {}
    capacities = {}
    for device in experiment.devices.order_by("id"):
        cls = device_class(device)
        row = predictor_current(backend=device.backend, device_class=cls)
        if row is None:
            raise ApplicationError(
                f"no fitted throughput predictor for device {device.name} (backend {device.backend}, class {cls}): "
                f"profile a device of that class (`mtfl profile --device {shlex.quote(device.name)} --budget "
                f"{PROFILE_BUDGET_HINT_S}`) and fit one (`mtfl fit-predictor --backend {shlex.quote(device.backend)} "
                f"--device-class {shlex.quote(cls)}`) first",
                field="strategy",
            )
        if row.id not in loaded:
            loaded[row.id] = predictor_load(row)
        memory = device.inventory.get("memory_bytes")
        capacities[device.id] = DeviceCapacity(predictor=loaded[row.id], memory_bytes=float(memory) if memory else None)
    return PlannerContext(
        architectures={t.id: t.architecture for t in experiment.tasks.all()},
        devices=capacities,
        objective=options["objective"],
        slack=options["slack"],
        seed=experiment.seed,
    )


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """A plan as JSON for ``Run.planned``."""
    return {
        "strategy": plan.strategy,
        "partitioning": plan.partitioning,
        "predicted_round_time_s": plan.predicted_round_time_s,
        "assignments": [
            {
                "device_id": a.device_id,
                "task_id": a.task_id,
                "batch_size": a.batch_size,
                "active_thread_percentage": a.active_thread_percentage,
                "samples": a.samples,
                "predicted_throughput_sps": a.predicted_throughput_sps,
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
    )


def run_plan(run: Run) -> Plan:
    """The plan a round of ``run`` trains: the one stored when the run was created (strategies
    with ``needs_predictor`` plan once, with the predictors of that moment), otherwise the
    strategy's plan of the experiment as it is (the baselines and ``manual`` plan the same
    every round).

    Raises:
        controlplane.planning.types.PlanningError: the strategy cannot plan the experiment
            (the field at fault named).
    """
    if run.planned:
        return plan_from_json(run.planned)
    return make_plan(run.strategy, selectors.planning_input(run.experiment), manual_entries=run.manual_plan)
