"""``flops_share`` (group ``mtfl.strategies``): each task's share of its device in proportion to
its training FLOPs per sample.

A systems researcher's own policy, compared with the paper's in the same comparison: where
``isolation`` gives each of the ``I_j`` tasks on device ``j`` the same ``100 / I_j`` %, this one
gives task ``i``

    R_ij = 100 · F_i / Σ_k F_k        (k over the tasks with data on device j)

rounded to whole percent by the largest-remainder method (every share at least 1 %, the shares of
a device adding up to exactly 100 %), where ``F_i`` is the model's training FLOPs per sample —
the workload feature the throughput predictor was fitted with (counted by
``torch.utils.flop_counter`` on the model itself, ``workers.training.features``). The heavier
model gets more of the device, so, to a first approximation, the tasks finish their epochs
together. Batch sizes are the paper's baselines' ``min(128, |D_ij|)``, so a comparison with
``isolation`` and ``sharing`` differs in the shares only.

The strategy declares ``needs_predictor=True``: the control plane then hands it the planner
context (``ctx.planner``) whose per-device predictor knows every model's ``F_i``; it also
predicts each task's throughput for the plan it made, so the experiment page compares the
prediction with the measurement as it does for ``vres_sync``.

Runs on the control plane only (it imports ``controlplane.planning``, which imports no Django,
Celery or torch); agents never load it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from controlplane.planning.predictor.samples import MixTask, PredictorError
from controlplane.planning.strategies import BASELINE_BATCH_SIZE, MIN_BATCH_SIZE, Strategy, StrategyContext
from controlplane.planning.types import Plan, PlannedAssignment, PlanningError, PlanningInput

TOTAL_SHARE = 100
"""Percent of a device the shares of its tasks add up to."""


def flops_shares(flops: Sequence[float]) -> list[int]:
    """Whole-percent shares in proportion to ``flops``, each at least 1, adding up to 100.

    Largest-remainder (Hamilton) apportionment: every share is first rounded down, then the
    percents left over go, one each, to the largest fractional parts (the earlier task on a tie).

    Args:
        flops: ``F_i`` of the tasks of one device, 1 to 100 positive finite numbers.

    Raises:
        ValueError: no tasks, more than 100, or an ``F_i`` that is not a positive finite number.
    """
    if not 1 <= len(flops) <= TOTAL_SHARE:
        raise ValueError(f"flops: 1 to {TOTAL_SHARE} tasks needed, got {len(flops)}")
    for i, f in enumerate(flops):
        if not (isinstance(f, numbers.Real) and math.isfinite(f) and f > 0):
            raise ValueError(f"flops[{i}]={f!r} is out of range: a positive finite number of FLOPs")
    total = float(sum(float(f) for f in flops))
    exact = [TOTAL_SHARE * float(f) / total for f in flops]
    shares = [max(1, math.floor(e)) for e in exact]
    order = sorted(range(len(flops)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    left = TOTAL_SHARE - sum(shares)
    for i in order[:left] if left > 0 else ():
        shares[i] += 1
    while sum(shares) > TOTAL_SHARE:  # the 1 % floors took more than the remainders left
        largest = max(range(len(shares)), key=lambda i: (shares[i], -i))
        shares[largest] -= 1
    return shares


def plan_flops_share(spec: PlanningInput, ctx: StrategyContext) -> Plan:
    """The ``flops_share`` plan of one round (see the module docstring).

    Raises:
        PlanningError: no planner context, a task whose model the device's predictor was not
            fitted on (``field="strategy"``), or a shard of fewer than 2 samples
            (``field="shards"``).
    """
    if ctx.planner is None:
        raise PlanningError("strategy 'flops_share' needs a fitted throughput predictor", field="strategy")
    assignments: list[PlannedAssignment] = []
    round_time = 0.0
    for device_id in spec.device_ids:
        tasks = spec.tasks_on(device_id)
        if not tasks:
            continue
        predictor = ctx.planner.devices[device_id].predictor
        architectures = [ctx.planner.architectures[t] for t in tasks]
        unknown = sorted({a for a in architectures if a not in predictor.space.workloads})
        if unknown:
            raise PlanningError(
                f"flops_share: device {device_id}'s predictor was not fitted on {', '.join(unknown)}; "
                "profile the model on a device of its class and fit the predictor again",
                field="strategy",
            )
        shares = flops_shares([predictor.space.workloads[a].train_flops_per_sample for a in architectures])
        samples = [spec.samples_of(device_id, t) for t in tasks]
        for task_id, n in zip(tasks, samples, strict=True):
            if n < MIN_BATCH_SIZE:
                raise PlanningError(
                    f"device {device_id} holds {n} sample(s) of task {task_id}: at least {MIN_BATCH_SIZE} needed",
                    field="shards",
                )
        batches = [min(BASELINE_BATCH_SIZE, n) for n in samples]
        mix = [MixTask(a, b, r) for a, b, r in zip(architectures, batches, shares, strict=True)]
        try:
            (predicted,) = predictor.predict([mix])
        except PredictorError as exc:
            raise PlanningError(f"flops_share: {exc}", field="strategy") from None
        for task_id, n, batch, share, sps in zip(tasks, samples, batches, shares, predicted, strict=True):
            assignments.append(
                PlannedAssignment(
                    device_id=device_id,
                    task_id=task_id,
                    batch_size=batch,
                    active_thread_percentage=share,
                    samples=n,
                    predicted_throughput_sps=sps,
                )
            )
            round_time = max(round_time, spec.local_epochs * n / sps)
    return Plan(
        strategy="flops_share",
        partitioning="mps",
        assignments=tuple(assignments),
        predicted_round_time_s=round_time or None,
    )


FLOPS_SHARE = Strategy(
    "flops_share",
    "flops_share — shares in proportion to each task's training FLOPs (mtfl-custom-task)",
    "mps",
    plan_flops_share,
    needs_predictor=True,
)
"""The record the ``mtfl.strategies`` entry point names; a comparison runs it after the built-ins."""
