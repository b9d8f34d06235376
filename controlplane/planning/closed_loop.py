"""Closed-loop replanning: a predictor-driven run replans before every round with a predictor
corrected by what the run itself measured, and a device moves to a new plan only when the
predicted gain is larger than the corrected predictor's uncertainty.

Notation as in :mod:`controlplane.planning.planner`. For a device ``j`` with tasks ``i`` the
fitted predictor gives ``P̂_ij(c)`` for a configuration ``c`` (every task's batch size and share).
After a round the run knows, for the configuration ``c_j`` the device trained, each task's
measured throughput ``P_ij``. The **residual** ``r_ij(c) = log P_ij(c) − log P̂_ij(c)`` is
modelled per device and task by a Gaussian process (Rasmussen & Williams 2006, §2.2, Eq. 2.25–
2.26; scikit-learn's :class:`~sklearn.gaussian_process.GaussianProcessRegressor`) over the
configuration's features ``x = (log2 B_1 … log2 B_I, R_1/100 … R_I/100)``, with the kernel

    k(x, x') = σ_off² + σ_loc²·exp(−½ Σ_d (x_d − x'_d)² / ℓ_d²)

and measurement noise ``σ_n²`` on the diagonal. ``σ_off²`` is a constant offset shared by every
configuration of the task on that device: a device slower or faster than the one the predictor
was fitted on moves every prediction alike. Its scale is the root mean square of the residuals
measured on this device (at least the held-out RMSLE): what the run says. ``σ_loc²`` is the
error of the predictor's *shape*, local to configurations near the measured ones (length scales
:data:`LENGTH_SCALE_LOG2_BATCH`, :data:`LENGTH_SCALE_SHARE`); its scale is the predictor's
held-out RMSLE (what its own cross-validation says; at least :data:`MIN_SHAPE_ERROR`). One
measured round thus learns the offset, and the uncertainty left at a configuration far from
any measured one is about the held-out error. The corrected prediction is
``P̂_ij(c)·exp(μ_ij(c))`` with ``μ`` the posterior mean; the **uncertainty** of a prediction is
the posterior standard deviation ``s_ij(c)`` of the log residual (noise excluded). ``σ_n``
(:data:`MEASUREMENT_NOISE`) is the spread of one configuration's throughput from round to round.

**Seconds.** An assignment's seconds are a fixed part plus ``E·|D_ij| / P_ij``
(:mod:`controlplane.planning.seconds`); the fixed part is refitted before every replan on every
measured assignment's seconds, so the planner's round time learns what the devices measured,
not only their throughput.

**Decisions.** After replanning with the corrected predictors and seconds, each device compares
the new configuration with the best configuration *measured* on it (the fallback): the run's
own rounds and the experiment's finished baseline runs on the same device and tasks (the
``strategy`` of a :class:`MeasuredConfiguration`), a configuration measured several times
judged by its mean:

* A strategy whose ``clock`` is ``round_time`` (``vres_sync``) judges a device by its round time
  ``T_j = max_i t_ij`` (lower is better; measured ``t_ij`` are the trainers' seconds); one whose
  ``clock`` is ``throughput`` (``vres_greedy``) by its objective, raw ``Σ_i P_ij`` or fair
  ``Σ_i P_ij / P_ij^alone`` (higher is better).
* A device whose plan of the run's last measured round measured worse than the best measured
  on it goes **back** to that one (action ``kept``, the reason says so); a new plan that is a
  configuration already measured is judged by its measurement.
* Otherwise the predicted gain is the log ratio of the new configuration's predicted figure to
  the fallback's measured one; its uncertainty is the new configuration's ``s`` (for ``T_j`` the
  ``s`` of the task that sets ``T_j``; for a sum, ``sqrt(Σ (P_i s_i)²) / Σ P_i``, the delta
  method). The device **moves** when ``gain > Z·uncertainty`` (:data:`Z`), otherwise it
  **keeps** its fallback. A device with nothing measured yet takes the new plan.
* A strategy whose record declares ``slack`` (``vres_sync``), on the round-time clock and with
  the run's slack policy, lets a device off the critical path take a slower plan with more
  optimizer steps: it does when its new configuration's time, pessimistic by ``Z·s``, stays
  within the slack margin of the round time the chosen configurations set.

How a run is replanned is read from its strategy's record alone
(:class:`~controlplane.planning.strategies.Strategy`: its ``plan``, ``clock`` and ``slack``), so
a plug-in strategy is replanned as it declares, never as a built-in.

Pure: NumPy and scikit-learn only (no Django, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel

from controlplane.planning.planner import SLACK_MARGIN, Clock, PlannerContext
from controlplane.planning.predictor import EncodedMixes, ThroughputPredictor
from controlplane.planning.seconds import MeasuredSeconds, SecondsModel, SecondsModels, fit_device_seconds
from controlplane.planning.strategies import get_strategy, make_plan
from controlplane.planning.types import Partitioning, Plan, PlannedAssignment, PlanningInput

FloatArray = np.ndarray[Any, np.dtype[np.float64]]

MEASUREMENT_NOISE = 0.05
"""``σ_n``: standard deviation of a configuration's log throughput from one round to the next
(repeatability measurements of the cpu backend and the simulated backend's 3 % noise are below
it)."""

MIN_SHAPE_ERROR = 0.05
"""Floor of ``σ_loc``: no predictor's shape is trusted to better than 5 % away from measurements."""

LENGTH_SCALE_LOG2_BATCH = 1.0
"""``ℓ`` of a batch size, in doublings: a residual measured at batch 64 says much about 128."""

LENGTH_SCALE_SHARE = 0.25
"""``ℓ`` of a share, as a fraction of the device."""

Z = 1.0
"""A device moves when the predicted gain exceeds ``Z`` standard deviations of its uncertainty."""

Action = Literal["moved", "kept", "new", "slack"]


@dataclass(frozen=True)
class MeasuredConfiguration:
    """One device's configuration in one round of the run, and what it measured.

    Attributes:
        device_id: the device.
        round_index: the round it was measured in.
        task_ids: the device's tasks, in the experiment's task order.
        batch_size: ``B_ij`` per task.
        active_thread_percentage: ``R_ij`` per task, percent.
        throughput_sps: measured ``P_ij`` per task, samples/s (all > 0).
        seconds: measured seconds per task (the trainer's span after ``GO``); ``None``: not
            recorded.
        partitioning: how the device was shared (``timeslice`` configurations teach the
            seconds model but not the throughput predictor's residuals: it predicts shares).
        strategy: ``None`` for the replanned run's own rounds; the strategy of another run of
            the same experiment (a baseline's) whose measurement it is.
    """

    device_id: int
    round_index: int
    task_ids: tuple[int, ...]
    batch_size: tuple[int, ...]
    active_thread_percentage: tuple[int, ...]
    throughput_sps: tuple[float, ...]
    seconds: tuple[float, ...] | None = None
    partitioning: Partitioning = "mps"
    strategy: str | None = None


@dataclass(frozen=True)
class DeviceDecision:
    """What replanning did on one device, and why.

    Attributes:
        device_id: the device.
        action: ``moved`` (to the new plan, predicted better beyond the uncertainty), ``kept``
            (its best measured configuration), ``new`` (nothing measured yet: the new plan),
            ``slack`` (``vres_sync``: a slower new plan with more optimizer steps, taken because
            even pessimistically it ends within the round's slack; its gain is negative by design).
        reason: one sentence a researcher reads on the run page.
        predicted_gain: log ratio of the new plan's corrected objective over the fallback's
            measured one (positive: better), ``None`` without a fallback.
        objective: what the gain compares: ``round_time`` (the device's, inverted so that
            positive is faster), ``raw`` or ``fair`` throughput (``vres_greedy``).
        uncertainty: the new plan's standard deviation of that log ratio.
        offset_scale: ``σ_off`` used for this device.
        shape_scale: ``σ_loc`` used for this device.
        residual_rms: root mean square of this device's measured log residuals (``None``: none).
    """

    device_id: int
    action: Action
    reason: str
    predicted_gain: float | None = None
    objective: str | None = None
    uncertainty: float | None = None
    offset_scale: float | None = None
    shape_scale: float | None = None
    residual_rms: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The decision as plain JSON (for ``Round.replan``)."""
        return {
            "device_id": self.device_id,
            "action": self.action,
            "reason": self.reason,
            "predicted_gain": self.predicted_gain,
            "objective": self.objective,
            "uncertainty": self.uncertainty,
            "offset_scale": self.offset_scale,
            "shape_scale": self.shape_scale,
            "residual_rms": self.residual_rms,
        }


def configuration_features(batch: FloatArray, share: FloatArray) -> FloatArray:
    """GP inputs ``(m, 2I)``: ``log2`` of each batch size and each share as a fraction.

    Args:
        batch: ``(m, I)`` batch sizes (≥ 1).
        share: ``(m, I)`` shares, percent.
    """
    x: FloatArray = np.concatenate([np.log2(np.maximum(batch, 1.0)), share / 100.0], axis=1)
    return x


@dataclass
class DeviceResidual:
    """The Gaussian-process model of one device's log residuals (module docstring).

    Attributes:
        architectures: the device's models in its slot order (length ``I``).
        offset_scale: ``σ_off``.
        shape_scale: ``σ_loc``.
        noise: ``σ_n``.
        x: ``(n, 2I)`` features of the measured configurations.
        residual: ``(n, I)`` log residuals.
    """

    architectures: tuple[str, ...]
    offset_scale: float
    shape_scale: float
    noise: float
    x: FloatArray
    residual: FloatArray
    _models: list[GaussianProcessRegressor] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        k = len(self.architectures)
        scales = [LENGTH_SCALE_LOG2_BATCH] * k + [LENGTH_SCALE_SHARE] * k
        kernel = ConstantKernel(self.offset_scale**2, "fixed") + ConstantKernel(self.shape_scale**2, "fixed") * RBF(
            scales, "fixed"
        )
        for i in range(k):
            gp = GaussianProcessRegressor(kernel=kernel, alpha=self.noise**2, optimizer=None, normalize_y=False)
            gp.fit(self.x, self.residual[:, i])
            self._models.append(gp)

    def predict(self, batch: FloatArray, share: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Posterior mean and standard deviation of the log residual, ``(m, I)`` each.

        Args:
            batch: ``(m, I)`` batch sizes in the device's slot order.
            share: ``(m, I)`` shares, percent.
        """
        x = configuration_features(batch, share)
        mean = np.empty(batch.shape)
        std = np.empty(batch.shape)
        for i, gp in enumerate(self._models):
            mean[:, i], std[:, i] = gp.predict(x, return_std=True)
        return mean, std


@dataclass
class CorrectedPredictor(ThroughputPredictor):
    """A device's predictor with its measured residuals applied to the device's own mix.

    Predictions of configurations that are exactly the device's mix (its models in its slot
    order, nothing else) are multiplied by ``exp(μ)``; every other configuration (each task
    alone, other mixes) is predicted as the base predictor does.
    """

    correction: DeviceResidual | None = None

    def _matching(self, enc: EncodedMixes) -> tuple[np.ndarray, int]:
        assert self.correction is not None
        archs = self.correction.architectures
        k = len(archs)
        index = np.array([self.space.architectures.index(a) for a in archs])
        present = enc.present
        rows = (present.sum(axis=1) == k) & np.all(enc.arch[:, :k] == index[None, :], axis=1)
        return np.flatnonzero(rows), k

    def predict_arrays(self, enc: EncodedMixes) -> FloatArray:
        """As :meth:`ThroughputPredictor.predict_arrays`, corrected on the device's mix."""
        out = super().predict_arrays(enc)
        if self.correction is None:
            return out
        rows, k = self._matching(enc)
        if len(rows):
            mean, _ = self.correction.predict(enc.batch[rows, :k], enc.share[rows, :k])
            out[rows, :k] = out[rows, :k] * np.exp(mean)
        return out

    def uncertainty_arrays(self, enc: EncodedMixes) -> FloatArray:
        """Standard deviation of the log prediction, ``(n, slots)``; the prior's
        ``sqrt(σ_off² + σ_loc²)`` outside the device's mix (nothing measured says more there),
        ``nan`` in empty slots."""
        assert self.correction is not None
        prior = math.hypot(self.correction.offset_scale, self.correction.shape_scale)
        out = np.where(enc.present, prior, np.nan)
        rows, k = self._matching(enc)
        if len(rows):
            _, std = self.correction.predict(enc.batch[rows, :k], enc.share[rows, :k])
            out[rows, :k] = std
        result: FloatArray = out
        return result


def _encode(predictor: ThroughputPredictor, archs: Sequence[str], batch: FloatArray, share: FloatArray) -> EncodedMixes:
    """Configurations of one mix (``archs`` in slot order; ``(m, I)`` batches and shares)."""
    m, k = batch.shape
    # As wide as the mix: the predictor pads to its own slots (empty slots change nothing).
    arch = np.full((m, k), -1, dtype=np.int64)
    b = np.zeros((m, k))
    r = np.zeros((m, k))
    arch[:, :k] = [predictor.space.architectures.index(a) for a in archs]
    b[:, :k], r[:, :k] = batch, share
    return EncodedMixes(predictor.space.architectures, arch, b, r)


def device_residual(
    predictor: ThroughputPredictor,
    archs: Sequence[str],
    history: Sequence[MeasuredConfiguration],
    *,
    heldout_rmsle: float | None,
    noise: float = MEASUREMENT_NOISE,
) -> DeviceResidual:
    """Fit a device's residual model from its measured configurations (module docstring).

    Args:
        predictor: the device's fitted (uncorrected) predictor.
        archs: the device's models in its slot order, length ``I``.
        history: that device's measured configurations, each with ``I`` tasks.
        heldout_rmsle: the predictor's held-out RMSLE (``None``: unknown, taken as 0).

    Raises:
        ValueError: ``history`` is empty or a configuration does not hold ``I`` tasks.
    """
    if not history:
        raise ValueError("a residual model needs at least one measured configuration")
    k = len(archs)
    if any(len(h.throughput_sps) != k for h in history):
        raise ValueError(f"every measured configuration must hold the device's {k} tasks")
    batch = np.array([h.batch_size for h in history], dtype=float)
    share = np.array([h.active_thread_percentage for h in history], dtype=float)
    measured = np.array([h.throughput_sps for h in history], dtype=float)
    base = predictor.predict_arrays(_encode(predictor, archs, batch, share))[:, :k]
    residual = np.log(measured) - np.log(base)
    rms = float(np.sqrt(np.mean(residual**2)))
    shape = max(float(heldout_rmsle or 0.0), MIN_SHAPE_ERROR)
    offset = max(rms, shape)
    return DeviceResidual(tuple(archs), offset, shape, noise, configuration_features(batch, share), residual)


def corrected_context(
    spec: PlanningInput,
    ctx: PlannerContext,
    history: Sequence[MeasuredConfiguration],
    heldout_rmsle: Mapping[int, float | None],
) -> tuple[PlannerContext, dict[int, CorrectedPredictor]]:
    """The planner context with every measured device's predictor corrected.

    Args:
        heldout_rmsle: ``device_id → held-out RMSLE`` of its predictor.

    Returns:
        The new context and ``device_id → CorrectedPredictor`` for the devices corrected.
    """
    by_device: dict[int, list[MeasuredConfiguration]] = {}
    for h in history:
        if h.task_ids == spec.tasks_on(h.device_id):
            by_device.setdefault(h.device_id, []).append(h)
    devices = dict(ctx.devices)
    corrected: dict[int, CorrectedPredictor] = {}
    for device_id, measured in by_device.items():
        if device_id not in devices:
            continue
        capacity = devices[device_id]
        base = capacity.predictor
        archs = [ctx.architectures[t] for t in spec.tasks_on(device_id)]
        residual = device_residual(base, archs, measured, heldout_rmsle=heldout_rmsle.get(device_id))
        predictor = CorrectedPredictor(base.family, base.space, base.model, base.memory, correction=residual)
        corrected[device_id] = predictor
        devices[device_id] = replace(capacity, predictor=predictor)
    return replace(ctx, devices=devices), corrected


def _history_seconds(spec: PlanningInput, history: Sequence[MeasuredConfiguration]) -> list[MeasuredSeconds]:
    """Every measured assignment with its seconds, for the seconds model's fit."""
    out = []
    for h in history:
        if h.seconds is None:
            continue
        for t, b, p, sec in zip(h.task_ids, h.batch_size, h.throughput_sps, h.seconds, strict=True):
            n = spec.samples_of(h.device_id, t)
            out.append(MeasuredSeconds(h.device_id, b, n, p, sec, spec.local_epochs))
    return out


ConfigurationKey = tuple[str, tuple[int, ...], tuple[int, ...]]
"""A device configuration: ``(partitioning, batch sizes, shares)``, tasks in order."""


@dataclass
class _Measured:
    """One configuration of a device and every measurement of it (means over its rounds)."""

    key: ConfigurationKey
    rounds: list[MeasuredConfiguration]
    value: float = 0.0

    @property
    def throughput(self) -> FloatArray:
        out: FloatArray = np.mean([h.throughput_sps for h in self.rounds], axis=0)
        return out

    @property
    def seconds(self) -> FloatArray | None:
        rows = [h.seconds for h in self.rounds if h.seconds is not None]
        return np.mean(rows, axis=0) if rows else None

    @property
    def label(self) -> str:
        """Where it was measured: ``round 2`` (the run's own), ``temporal's plan (rounds 0, 1)``
        (another run's), or both joined by ``and``; each round index once (repeats of a
        baseline measure the same rounds)."""
        parts = []
        for strategy in [None, *sorted({h.strategy for h in self.rounds if h.strategy})]:
            indices = sorted({h.round_index for h in self.rounds if h.strategy == strategy})
            if not indices:
                continue
            where = f"round{'s' if len(indices) > 1 else ''} {', '.join(str(i) for i in indices)}"
            parts.append(f"{strategy}'s plan ({where})" if strategy else where)
        return " and ".join(parts)


def _key(h: MeasuredConfiguration) -> ConfigurationKey:
    return (h.partitioning, tuple(h.batch_size), tuple(h.active_thread_percentage))


def _plan_key(plan: Plan, items: Sequence[PlannedAssignment]) -> ConfigurationKey:
    part = plan.partitioning_of(items[0].device_id)
    return (part, tuple(a.batch_size for a in items), tuple(a.active_thread_percentage for a in items))


def _value(
    clock: Clock, objective: str, seconds: FloatArray, throughput: FloatArray, alone: FloatArray | None
) -> float:
    """A configuration's figure on the clock, log scale, higher is better: ``−log T_j`` with
    ``T_j = max_i t_ij``, or the log objective."""
    if clock == "round_time":
        return -math.log(float(np.max(seconds)))
    weights = throughput / alone if objective == "fair" and alone is not None else throughput
    return math.log(float(np.sum(weights)))


def _uncertainty(clock: Clock, predicted: Sequence[PlannedAssignment], std: FloatArray, objective: str) -> float:
    """The new plan's standard deviation of its log figure: the ``s`` of the task that sets
    ``T_j``, or ``sqrt(Σ (P_i s_i)²) / Σ P_i`` for a sum (the delta method)."""
    if clock == "round_time":
        i = int(np.argmax([a.predicted_seconds or 0.0 for a in predicted]))
        return float(std[i])
    P = np.array([a.predicted_throughput_sps or 0.0 for a in predicted])
    return float(np.sqrt(np.sum((P * std) ** 2))) / float(P.sum())


def replan(
    strategy: str,
    spec: PlanningInput,
    ctx: PlannerContext,
    history: Sequence[MeasuredConfiguration],
    *,
    heldout_rmsle: Mapping[int, float | None],
) -> tuple[Plan, list[DeviceDecision]]:
    """Plan the next round of a predictor-driven run from its measurements so far.

    The seconds model (:mod:`~controlplane.planning.seconds`) is fitted on every measured
    assignment of ``history`` with ``ctx.seconds``'s default as its prior, and the throughput
    predictors are corrected on the ``mps`` configurations (module docstring); the strategy then
    plans with both (and so never below a baseline's predicted plan:
    :func:`~controlplane.planning.planner.never_worse`). Each device then keeps its best measured
    configuration or moves to the new plan (:meth:`_DeviceJudge.decide`), and a device kept only
    for the new plan's uncertainty may still take it within the round's slack
    (:func:`_take_slack`).

    Args:
        strategy: the run's strategy (a registered one with ``needs_predictor``): its record's
            ``plan`` makes the new plan, its ``clock`` says how a device's configurations are
            judged and its ``slack`` whether the run's slack policy applies.
        spec: the experiment as the planner sees it.
        ctx: the run's planner context (uncorrected predictors; seconds models as priors).
        history: every measured configuration of the run's earlier rounds (devices whose
            whole round succeeded), and of the experiment's finished baseline runs on the same
            devices and tasks (``strategy`` set): a device whose last plan measured slower than
            the best configuration measured on it goes back to that one.
        heldout_rmsle: ``device_id → held-out RMSLE`` of the device's predictor.

    Returns:
        The plan (each device either on the new plan or on its best measured configuration,
        predicted from its measurements) and one decision per planned device.

    Raises:
        PlanningError: the strategy cannot plan (as :func:`~controlplane.planning.strategies.make_plan`).
    """
    record = get_strategy(strategy)
    clock = record.clock
    uses_slack = clock == "round_time" and record.slack and ctx.slack == "smaller_batches"
    seconds = fit_device_seconds(_history_seconds(spec, history), prior=ctx.seconds.default)
    corrected_ctx, corrected = corrected_context(
        spec, replace(ctx, seconds=seconds), [h for h in history if h.partitioning == "mps"], heldout_rmsle
    )
    candidate = make_plan(strategy, spec, planner=corrected_ctx)
    judge = _DeviceJudge(clock, ctx, candidate, seconds, corrected, heldout_rmsle, spec.local_epochs)
    chosen: dict[int, tuple[PlannedAssignment, ...]] = {}
    decisions: dict[int, DeviceDecision] = {}
    pessimistic_time: dict[int, float] = {}
    slack_candidates: dict[int, tuple[float, tuple[PlannedAssignment, ...]]] = {}
    # One pass over the history, not one per device (it holds every device's every round).
    history_of: dict[int, list[MeasuredConfiguration]] = {}
    for h in history:
        history_of.setdefault(h.device_id, []).append(h)
    for device_id in spec.device_ids:
        new = candidate.on_device(device_id)
        if not new:
            continue
        task_ids = tuple(a.task_id for a in new)
        measured = [h for h in history_of.get(device_id, ()) if h.task_ids == task_ids]
        if not measured:
            chosen[device_id] = new
            decisions[device_id] = DeviceDecision(device_id, "new", "nothing measured on this device yet: new plan")
            continue
        chosen[device_id], decisions[device_id], slack_time = judge.decide(device_id, new, measured)
        if uses_slack and slack_time is not None:
            slack_candidates[device_id] = (slack_time, new)
        pessimistic_time[device_id] = _pessimistic_time(chosen[device_id], decisions[device_id])
    _take_slack(chosen, decisions, slack_candidates, pessimistic_time)
    assignments = tuple(a for d in spec.device_ids for a in chosen.get(d, ()))
    predicted = [a.predicted_seconds for a in assignments if a.predicted_seconds is not None]
    plan = Plan(
        strategy=candidate.strategy,
        partitioning=candidate.partitioning,
        assignments=assignments,
        predicted_round_time_s=max(predicted) if predicted else candidate.predicted_round_time_s,
        notes=candidate.notes,
    )
    return plan, [decisions[d] for d in spec.device_ids if d in decisions]


def _take_slack(
    chosen: dict[int, tuple[PlannedAssignment, ...]],
    decisions: dict[int, DeviceDecision],
    slack_candidates: Mapping[int, tuple[float, tuple[PlannedAssignment, ...]]],
    pessimistic_time: Mapping[int, float],
) -> None:
    """The declared slack (vres_sync's): a device whose new (slower, more steps) plan still ends
    well within the round the chosen configurations set takes it. ``slack_candidates``: device →
    (the new plan's pessimistic time [s], the new plan); ``chosen`` and ``decisions`` are updated
    in place."""
    if slack_candidates and pessimistic_time:
        round_time = max(pessimistic_time.values())
        for device_id, (time_hi, new) in slack_candidates.items():
            steps_new = sum(math.ceil(a.samples / a.batch_size) for a in new)
            steps_kept = sum(math.ceil(a.samples / a.batch_size) for a in chosen[device_id])
            if steps_new > steps_kept and time_hi <= SLACK_MARGIN * round_time:
                chosen[device_id] = new
                decisions[device_id] = replace(
                    decisions[device_id],
                    action="slack",
                    reason=f"uses the round's slack: more optimizer steps ({steps_new} against {steps_kept}), "
                    f"predicted to end within {SLACK_MARGIN:.0%} of the round even {Z:g} standard deviation(s) slower",
                )


@dataclass(frozen=True)
class _DeviceJudge:
    """What :func:`replan` weighs each measured device's configurations with: the strategy's
    clock, the run's context (uncorrected predictors, objective), the new plan, the fitted
    seconds models and the corrected predictors."""

    clock: Clock
    ctx: PlannerContext
    candidate: Plan
    seconds: SecondsModels
    corrected: Mapping[int, CorrectedPredictor]
    heldout_rmsle: Mapping[int, float | None]
    epochs: int

    @property
    def fair(self) -> bool:
        return self.clock == "throughput" and self.ctx.objective == "fair"

    def decide(
        self, device_id: int, new: tuple[PlannedAssignment, ...], measured: Sequence[MeasuredConfiguration]
    ) -> tuple[tuple[PlannedAssignment, ...], DeviceDecision, float | None]:
        """Keep the device's best measured configuration or move it to the new plan ``new``.

        The new plan moves in only when its predicted gain over the best measured configuration
        exceeds ``Z`` times its uncertainty, it was not itself measured, and the device's last
        plan did not measure worse than the best (then it goes back to the best). Returns the
        chosen assignments, the decision and, for a device kept only for the new plan's
        uncertainty, the new plan's pessimistic time [s] (its slowest task ``Z`` standard
        deviations slower; else ``None``).
        """
        clock, ctx = self.clock, self.ctx
        objective = ctx.objective if clock == "throughput" else "round_time"
        archs = [ctx.architectures[a.task_id] for a in new]
        samples = np.array([a.samples for a in new], dtype=float)
        configurations = self._configurations(device_id, measured, archs, samples)
        best = max(configurations.values(), key=lambda m: m.value)
        own = [h for h in measured if h.strategy is None]
        last = configurations[_key(max(own, key=lambda h: h.round_index))] if own else None
        new_key = _plan_key(self.candidate, new)
        t_new, value_new, std_new, info_scales = self._new_plan_figures(device_id, new, archs, samples)
        gain = value_new - best.value
        info: dict[str, Any] = dict(predicted_gain=gain, objective=objective, uncertainty=std_new, **info_scales)
        fallback = _measured_plan(best, new, self.candidate, self.seconds.of(device_id), self.epochs)
        what = "s" if clock == "round_time" else objective
        if last is not None and last.key != best.key and last.value < best.value:
            return (
                fallback,
                DeviceDecision(
                    device_id,
                    "kept",
                    f"its plan of {last.label} measured {_figure(clock, last.value)} {what} against "
                    f"{_figure(clock, best.value)} {what} for {best.label}, the best measured on it: back to that plan",
                    **info,
                ),
                None,
            )
        if new_key == best.key:
            return (
                fallback,
                DeviceDecision(device_id, "kept", "the new plan is the best configuration measured so far", **info),
                None,
            )
        if new_key in configurations:
            again = configurations[new_key]
            return (
                fallback,
                DeviceDecision(
                    device_id,
                    "kept",
                    f"the new plan measured {_figure(clock, again.value)} {what} in {again.label}, against "
                    f"{_figure(clock, best.value)} {what} for {best.label}: kept the best measured configuration",
                    **info,
                ),
                None,
            )
        if gain > Z * std_new:
            return (
                new,
                DeviceDecision(
                    device_id,
                    "moved",
                    f"predicted {_percent(gain)} better than the best measured configuration ({best.label}), "
                    f"beyond the prediction's uncertainty ±{_percent(std_new)}",
                    **info,
                ),
                None,
            )
        return (
            fallback,
            DeviceDecision(
                device_id,
                "kept",
                f"kept the best measured configuration ({best.label}): the new plan's predicted "
                f"gain {_percent(gain)} does not exceed its uncertainty ±{_percent(std_new)}",
                **info,
            ),
            float(np.max(t_new)) * math.exp(Z * std_new),
        )

    def _configurations(
        self, device_id: int, measured: Sequence[MeasuredConfiguration], archs: Sequence[str], samples: FloatArray
    ) -> dict[ConfigurationKey, _Measured]:
        """The device's measured configurations of these tasks, each with its figure on the clock
        (:func:`_value`; seconds not recorded are the seconds model's, from the measured
        throughput)."""
        base = self.ctx.devices[device_id].predictor
        configurations: dict[ConfigurationKey, _Measured] = {}
        for h in measured:
            configurations.setdefault(_key(h), _Measured(_key(h), [])).rounds.append(h)
        model = self.seconds.of(device_id)
        for m in configurations.values():
            batch = np.array(m.key[1], dtype=float)
            alone = _alone(base, archs, batch) if self.fair else None
            # Seconds not recorded: the seconds model's, from the measured throughput.
            times = m.seconds if m.seconds is not None else model.seconds(batch, samples, m.throughput, self.epochs)
            m.value = _value(self.clock, self.ctx.objective, times, m.throughput, alone)
        return configurations

    def _new_plan_figures(
        self, device_id: int, new: tuple[PlannedAssignment, ...], archs: Sequence[str], samples: FloatArray
    ) -> tuple[FloatArray, float, float, dict[str, Any]]:
        """The new plan's predicted seconds per task, its figure on the clock, that figure's
        standard deviation (from the corrected predictor's uncertainty, or the prior's from the
        held-out error where nothing was measured under shares) and the correction's scales for
        the decision."""
        base = self.ctx.devices[device_id].predictor
        predictor = self.corrected.get(device_id)
        b_new = np.array([[a.batch_size for a in new]], dtype=float)
        r_new = np.array([[a.active_thread_percentage for a in new]], dtype=float)
        scorer = predictor or base
        if predictor is not None and predictor.correction is not None:
            s_new = predictor.uncertainty_arrays(_encode(predictor, archs, b_new, r_new))[0, : len(archs)]
            info_scales: dict[str, Any] = dict(
                offset_scale=predictor.correction.offset_scale,
                shape_scale=predictor.correction.shape_scale,
                residual_rms=float(np.sqrt(np.mean(predictor.correction.residual**2))),
            )
        else:
            # Nothing measured under shares: the prior's sqrt(σ_off² + σ_loc²), both at the held-out error.
            s_new = np.full(len(archs), math.sqrt(2.0) * max(self.heldout_rmsle.get(device_id) or 0.0, MIN_SHAPE_ERROR))
            info_scales = {}
        P_new = np.array([a.predicted_throughput_sps or 0.0 for a in new])
        t_new = np.array([a.predicted_seconds or 0.0 for a in new])
        if not all(a.predicted_seconds for a in new):
            t_new = self.seconds.of(device_id).seconds(b_new[0], samples, P_new, self.epochs)
        alone_new = _alone(scorer, archs, b_new[0]) if self.fair else None
        value_new = _value(self.clock, self.ctx.objective, t_new, P_new, alone_new)
        std_new = _uncertainty(self.clock, new, s_new, self.ctx.objective)
        return t_new, value_new, std_new, info_scales


def _figure(clock: Clock, log_value: float) -> str:
    """A log figure of :func:`_value` back in its units (seconds for the round-time clock)."""
    return f"{math.exp(-log_value):.2f}" if clock == "round_time" else f"{math.exp(log_value):.4g}"


def _percent(log_ratio: float) -> str:
    return f"{100 * math.expm1(log_ratio):+.0f} %" if log_ratio < 0 else f"{100 * math.expm1(log_ratio):.0f} %"


def _alone(predictor: ThroughputPredictor, archs: Sequence[str], batch: FloatArray) -> FloatArray:
    """``P_alone`` ``(I,)``: each task alone on the whole device at its batch size ``batch`` ``(I,)``."""
    k = len(archs)
    arch = np.full((k, 1), -1, dtype=np.int64)
    b = np.zeros((k, 1))
    r = np.zeros((k, 1))
    arch[:, 0] = [predictor.space.architectures.index(a) for a in archs]
    b[:, 0], r[:, 0] = batch, 100.0
    out: FloatArray = predictor.predict_arrays(EncodedMixes(predictor.space.architectures, arch, b, r))[:, 0]
    return out


def _measured_plan(
    best: _Measured,
    new: tuple[PlannedAssignment, ...],
    candidate: Plan,
    seconds: SecondsModel,
    epochs: int,
) -> tuple[PlannedAssignment, ...]:
    """The best measured configuration as assignments, predicted from its measurements: each
    task's mean measured throughput and seconds (the seconds model's where none were recorded)."""
    part, batch, share = best.key
    P = best.throughput
    t = best.seconds
    if t is None:
        t = seconds.seconds(np.array(batch, dtype=float), np.array([a.samples for a in new], dtype=float), P, epochs)
    return tuple(
        replace(
            a,
            batch_size=batch[i],
            active_thread_percentage=share[i],
            partitioning=None if part == candidate.partitioning else part,  # type: ignore[arg-type]
            predicted_throughput_sps=float(P[i]),
            predicted_seconds=float(t[i]),
        )
        for i, a in enumerate(new)
    )


def _pessimistic_time(chosen: tuple[PlannedAssignment, ...], decision: DeviceDecision) -> float:
    times = [a.predicted_seconds for a in chosen if a.predicted_seconds is not None]
    return max(times, default=0.0) * math.exp(Z * (decision.uncertainty or 0.0))
