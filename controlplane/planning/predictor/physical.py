"""The physical model's fit: every parameter of the baseline
``P_i = P_solo(model_i, B_i, g_i, passive_i) · ρ_i(w) · exp(−γ·x_i)`` from the measured tasks.

``P_solo`` is :class:`~controlplane.planning.predictor.solo.SoloTable`'s per-iteration time law;
``g_i``, ``ρ_i``, ``passive_i`` and ``x_i`` come from the device's physics
(:mod:`controlplane.planning.predictor.physics`), which this module only calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from controlplane.planning.predictor.encoding import EncodedMixes, FeatureSpace
from controlplane.planning.predictor.physics import granted_fraction
from controlplane.planning.predictor.samples import (
    MAX_MIX,
    BoolArray,
    FloatArray,
    IntArray,
    ModelWorkload,
    ProfiledTask,
)
from controlplane.planning.predictor.solo import (
    SoloTable,
    law_from_curve,
    slice_throughput,
)

ALPHA_PRIOR = (1.0, 0.2)
"""(mean, weight) of each ``α``: a slice's speed ∝ its size unless data say otherwise."""
BETA_PRIOR = (0.5, 0.1)
"""(mean, weight) of each ``β``: the per-iteration overhead half parallel unless data say
otherwise (weaker than ``α``'s: on two sweeps weight 0.1 gave held-out RMSLE 0.161 and 0.165
against 0.166 and 0.166 at 0.2)."""
ESCAPE_PRIOR = (0.2, 1.0)
"""(mean, weight) of ``escape_weight``: see :func:`fit_physical`."""
LINK_PRIOR = (0.0, 0.1)
"""(mean, weight) of ``γ``: no placement effect unless data say otherwise."""
PASSIVE_START = math.log(0.3)
"""``log κ`` where the fit starts."""
LOSS_SCALE = 0.15
"""Log error beyond which a residual counts linearly (soft L1): disturbed measurements weigh less."""
LOG_TIME_BOUND = 60.0
"""Bound on the fitted log times ``log t0``, ``log t1`` during the solve (e^60 s is far past any
real per-sample time), so trial steps never overflow."""
TINY_THROUGHPUT = 1e-300
"""Floor under a modelled throughput before its log (samples/s), so the residuals stay finite."""


def fit_sharing_weight(space: FeatureSpace, enc: EncodedMixes, measured: FloatArray) -> float:
    """``w`` of the physics' sharing rate: the value on the grid ``0.05, 0.10, …, 1``
    minimising the squared log error of the baseline ``P_solo · ρ_i(w)`` over the measured
    tasks of the multi-task configurations ``enc`` (``measured`` ``(n, w)`` samples/s in
    ``enc``'s order, ``nan`` where not measured); 1 when the physics has no weighted sharing
    or without such tasks."""
    sel = ~np.isnan(measured) & enc.present & (enc.present.sum(axis=1) > 1)[:, None]
    if not space.physics.weighted_sharing or not sel.any():
        return 1.0
    log_measured = np.log(np.where(sel, measured, 1.0))
    best, best_loss = 1.0, math.inf
    for w in np.linspace(0.05, 1.0, 20):
        trial = FeatureSpace(space.architectures, space.workloads, space.solo, space.cores, space.placement, float(w))
        baseline = trial.slot_arrays(enc)["baseline"]
        loss = float(np.mean((log_measured[sel] - np.log(np.clip(baseline[sel], 1e-9, None))) ** 2))
        if loss < best_loss - 1e-12:
            best, best_loss = float(w), loss
    return best


def fit_physical(space: FeatureSpace, enc: EncodedMixes, measured: FloatArray) -> FeatureSpace:
    """Refit the physical model on every measured task at once (nonlinear least squares).

    The model is the baseline's, ``log P_i = log B_i − log(t_0·g_i^(−β) + t_1·B_i·g_i^(−α) +
    κ·t_0·[passive_i]) + log ρ_i(w) − γ·x_i`` (:meth:`SoloTable.lookup`, the physics'
    ``sharing_rate``, ``link_log_ratio`` and ``slot_terms().passive``), with per model ``t_0``,
    ``t_1`` (the per-iteration time law), ``α`` (how the per-sample time scales with the
    granted fraction ``g``) and ``β`` (how the per-iteration overhead does), the sharing
    weights ``w`` and ``escape_weight`` (fitted only when the physics has weighted sharing),
    one ``γ`` for all models (the placement term; fitted only when some measured task has
    ``x ≠ 0``, under a weak prior toward 0, bounds ``[-0.5, 3]``), and one ``κ`` for all models
    (what a task waiting passively loses per iteration, as a fraction of its ``t_0``; fitted
    only when some measured task waits passively, bounds ``[1e-4, 10]``, no prior).

    :func:`fit_space`'s tables fit a simpler form (one exponent) one part after another, each
    from its own subset (standalone points, then tasks alone on their units, then the mixes);
    here all parts are fitted jointly to all measured tasks of ``enc`` (``measured``
    ``(n, w)`` samples/s in ``enc``'s order, ``nan`` where not measured), so every mix
    informs every model's speed — what a whole model held out of the standalone measurements
    needs — and one noisy standalone point no longer sets a model's speed at its batch size.
    The loss is soft-L1 in log space (scale :data:`LOSS_SCALE`) with weak priors pulling each
    ``α`` to 1 and, weaker, each ``β`` to 0.5, and a firmer one pulling ``escape_weight`` to
    0.2: the configurations that inform it (on the cpu backend, a multi-threaded task beside
    single-threaded ones all on one core) are few, and grouped cross-validation often holds
    them all out. Starts from ``space``'s tables, ``β`` at ``α``, ``escape_weight`` at the
    prior's mean (``scipy.optimize.least_squares``, bounded: ``α, β ∈ [-1, 1.5]``,
    ``w ∈ [0.05, 1]``, ``escape_weight ∈ [0.01, 1]``; the problem: :class:`_JointFit`).

    ``κ`` is a cost of the iteration, like ``t_0``, not of its samples: on the cpu backend a
    sleeping thread takes a wake-up at every barrier. Without the term the joint fit bent each
    model's ``α``, ``β`` to explain its shared 2-thread tasks and predicted its 2-thread speed
    alone from them when its 1-task mixes were held out. One ``κ`` for all models
    (``δ_i = κ·t_0,i``: both scale with the operators run per iteration): one per model, each
    under a prior tying it to ``t_0``, scored the same on the kept sweeps.

    Returns:
        A new :class:`FeatureSpace` whose :class:`SoloTable` has ``laws``, ``exponents`` and
        ``overhead_exponents`` for every model measured in ``enc`` (the others keep
        ``space``'s), with the fitted ``w``, ``escape_weight``, ``link_exponent`` and
        ``passive_ratio``, and ``space``'s references; ``space`` itself when nothing was
        measured.
    """
    # deferred: scipy.optimize is heavy to import and only fitting the physical laws needs it.
    from scipy.optimize import least_squares

    mask = ~np.isnan(measured) & enc.present
    fitted = sorted({int(a) for a in enc.arch[mask]})
    if not fitted:
        return space
    problem = _JointFit(space, enc, measured, mask, fitted)
    theta0 = problem.pinned_start()
    solution = least_squares(
        problem.residuals,
        theta0,
        jac=problem.jacobian,
        bounds=(problem.lower, problem.upper),
        loss="soft_l1",
        f_scale=LOSS_SCALE,
    )
    return problem.fitted_space(solution.x)


class _JointFit:
    """:func:`fit_physical`'s least-squares problem over the measured tasks of ``enc``.

    Parameters ``θ``, ``4k + 4`` of them for the ``k`` models measured (in the order of
    ``fitted``): ``log t_0`` (``k``), ``log t_1`` (``k``), ``α`` (``k``), ``β`` (``k``), ``w``,
    ``escape_weight``, ``γ``, ``log κ``. Residuals: the log errors of the measured tasks
    (row-major over ``mask``), then the priors' (``α`` ``k``, ``β`` ``k``, ``escape_weight``,
    ``γ``). ``lower`` and ``upper`` are the bounds, pinned by :meth:`pinned_start` where a
    parameter is not fitted.
    """

    def __init__(
        self, space: FeatureSpace, enc: EncodedMixes, measured: FloatArray, mask: BoolArray, fitted: list[int]
    ) -> None:
        self.space = space
        self.physics = space.physics
        self.names = [space.architectures[a] for a in fitted]
        slot = np.full(len(space.architectures) + 1, -1)
        slot[fitted] = np.arange(len(fitted))
        self.k = k = len(fitted)
        rows: BoolArray = np.asarray(mask.any(axis=1))
        self.enc = enc = enc.rows(rows)
        self.mask = mask = mask[rows]
        self.log_measured = np.log(np.where(mask, measured[rows], 1.0))
        self.arch_slot: IntArray = slot[np.where(mask, enc.arch, -1)]
        self.batch = np.where(mask, enc.batch, 1.0)
        self.granted = np.where(mask, granted_fraction(enc.share, space.cores), 1.0)
        self.link_x = space.link_log_ratio(enc)
        self.weighted = self.physics.weighted_sharing
        self.link = bool(np.any(self.link_x[mask] != 0))
        self.passive = self.physics.slot_terms(enc.share, enc.present, space.cores).passive & mask
        self.lower = np.concatenate([np.full(2 * k, -np.inf), np.full(2 * k, -1.0), [0.05, 0.01, -0.5, math.log(1e-4)]])
        self.upper = np.concatenate([np.full(2 * k, np.inf), np.full(2 * k, 1.5), [1.0, 1.0, 3.0, math.log(10.0)]])
        self.data_rows, data_slots = np.nonzero(mask)  # the order of ``(…)[mask]`` in residuals (row-major)
        self.data_arch = self.arch_slot[self.data_rows, data_slots]
        self.data_batch, self.data_link, self.log_g = self.batch[mask], self.link_x[mask], np.log(self.granted[mask])
        self.data_passive = self.passive[mask]

    def pinned_start(self) -> FloatArray:
        """Where the solve starts: ``space``'s tables (a model without a curve from its
        ``alone`` speed at batch 32), ``β`` at ``α``, ``escape_weight`` at the prior's mean, inside
        the bounds. Pins the bounds (in place) of what is not fitted: the sharing weights where
        the physics has no weighted sharing, ``κ`` where no task waited passively, ``γ`` where no
        measured placement is away from the reference."""
        space, names, k, lower, upper = self.space, self.names, self.k, self.lower, self.upper
        start = []
        for name in names:
            pts = space.solo.curves.get(name)
            if pts:
                start.append(law_from_curve(pts))
            else:
                p = float(space.solo.alone(name, np.array([32.0]), space.workloads)[0])
                start.append((16.0 / p, 0.5 / p))
        start_theta = np.concatenate(
            [
                np.log([t for t, _ in start]),
                np.log([t for _, t in start]),
                [np.clip(space.solo.exponent(n), -1.0, 1.5) for n in names],  # α
                [np.clip(space.solo.exponent(n), -1.0, 1.5) for n in names],  # β starts at α
                [np.clip(space.sharing_weight, 0.05, 1.0)],
                [ESCAPE_PRIOR[0] if space.escape_weight is None else np.clip(space.escape_weight, 0.01, 1.0)],
                [space.link_exponent],  # γ
                [math.log(space.passive_ratio) if space.passive_ratio > 0 else PASSIVE_START],  # log κ
            ]
        )
        theta0: FloatArray = np.clip(start_theta, lower + 1e-9, upper - 1e-9)
        weights = slice(4 * k, 4 * k + 2)
        if not self.weighted:  # the weights only matter where the physics weighs its sharing
            lower[weights], upper[weights] = theta0[weights] - 1e-9, theta0[weights] + 1e-9
        if not self.passive.any():  # no task waited passively: κ stays where it is
            lower[4 * k + 3], upper[4 * k + 3] = theta0[4 * k + 3] - 1e-9, theta0[4 * k + 3] + 1e-9
        if not self.link:  # no measured placement away from the reference: γ stays where it is
            lower[4 * k + 2], upper[4 * k + 2] = theta0[4 * k + 2] - 1e-9, theta0[4 * k + 2] + 1e-9
        return theta0

    def unpack(
        self, theta: FloatArray
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, float, float, float, float]:
        """``(t_0, t_1, α, β, w, escape_weight, γ, κ)`` from ``θ``."""
        k = self.k
        return (
            # The solver's trial steps can reach exponents that overflow; clipping keeps every
            # residual finite (the optimum is far inside: times in seconds per sample).
            np.exp(np.clip(theta[:k], -LOG_TIME_BOUND, LOG_TIME_BOUND)),
            np.exp(np.clip(theta[k : 2 * k], -LOG_TIME_BOUND, LOG_TIME_BOUND)),
            theta[2 * k : 3 * k],
            theta[3 * k : 4 * k],
            float(theta[4 * k]),
            float(theta[4 * k + 1]),
            float(theta[4 * k + 2]),
            math.exp(theta[4 * k + 3]),
        )

    def log_rate(self, w: float, escape: float) -> FloatArray:
        """``log ρ`` of every slot, shape ``(n, w)``, with these sharing weights."""
        rate: FloatArray = np.log(
            self.physics.sharing_rate(self.enc.share, self.enc.present, self.space.cores, w, escape)
        )
        return rate

    def residuals(self, theta: FloatArray) -> FloatArray:
        """The residuals at ``θ`` (see the class)."""
        t0, t1, alpha, beta, w, escape, gamma, kappa = self.unpack(theta)
        j = np.maximum(self.arch_slot, 0)
        d = np.where(self.passive, kappa * t0[j], 0.0)
        throughput = slice_throughput(self.batch, self.granted, t0[j], t1[j], alpha[j], beta[j], d)
        log_p = np.log(np.maximum(throughput, TINY_THROUGHPUT)) - gamma * self.link_x
        log_p = log_p + self.log_rate(w, escape)
        alpha_mean, alpha_weight = ALPHA_PRIOR
        beta_mean, beta_weight = BETA_PRIOR
        escape_mean, escape_weight = ESCAPE_PRIOR
        link_mean, link_weight = LINK_PRIOR
        out: FloatArray = np.concatenate(
            [
                (log_p - self.log_measured)[self.mask],
                alpha_weight * (alpha - alpha_mean),
                beta_weight * (beta - beta_mean),
                [escape_weight * (escape - escape_mean)],
                [link_weight * (gamma - link_mean)],
            ]
        )
        return out

    def jacobian(self, theta: FloatArray) -> FloatArray:
        """``∂ residuals / ∂ θ``, dense ``(residuals, 4k + 4)``: analytic in the per-model
        parameters, ``γ`` and ``κ`` (with ``u = t_0·g^(−β)``, ``v = t_1·B·g^(−α)``,
        ``d = κ·t_0`` for a task waiting passively, else 0, ``S = u + v + d``:
        ``∂ log P/∂ log t_0 = −(u + d)/S``, ``∂/∂ log t_1 = −v/S``, ``∂/∂α = v·ln g / S``,
        ``∂/∂β = u·ln g / S``, ``∂/∂γ = −x``, ``∂/∂ log κ = −d/S``), one-sided differences for
        the two sharing weights (the physics' sharing rate, piecewise rational in them). A
        residual depends on one model's four parameters only, so this costs about three
        residual evaluations where scipy's finite differences over all ``4k + 4`` parameters
        cost ``4k + 4``."""
        k, data_arch, log_g = self.k, self.data_arch, self.log_g
        t0, t1, alpha, beta, w, escape, _gamma, kappa = self.unpack(theta)
        u = t0[data_arch] * np.exp(-beta[data_arch] * log_g)
        v = t1[data_arch] * self.data_batch * np.exp(-alpha[data_arch] * log_g)
        d = np.where(self.data_passive, kappa * t0[data_arch], 0.0)
        total = u + v + d
        n_data = len(self.data_rows)
        jac = np.zeros((n_data + 2 * k + 2, 4 * k + 4))
        at = np.arange(n_data)
        jac[at, data_arch] = -(u + d) / total
        jac[at, k + data_arch] = -v / total
        jac[at, 2 * k + data_arch] = v * log_g / total
        jac[at, 3 * k + data_arch] = u * log_g / total
        jac[:n_data, 4 * k + 2] = -self.data_link
        jac[:n_data, 4 * k + 3] = -d / total
        if self.weighted:
            base = self.log_rate(w, escape)[self.mask]
            for column in (4 * k, 4 * k + 1):  # w, escape_weight
                step = 1e-6 * max(1.0, abs(theta[column]))
                step = -step if theta[column] + step > self.upper[column] else step
                shifted = theta.copy()
                shifted[column] += step
                jac[:n_data, column] = (self.log_rate(*self.unpack(shifted)[4:6])[self.mask] - base) / step
        jac[n_data + np.arange(k), 2 * k + np.arange(k)] = ALPHA_PRIOR[1]
        jac[n_data + k + np.arange(k), 3 * k + np.arange(k)] = BETA_PRIOR[1]
        jac[n_data + 2 * k, 4 * k + 1] = ESCAPE_PRIOR[1]
        jac[n_data + 2 * k + 1, 4 * k + 2] = LINK_PRIOR[1]
        return jac

    def fitted_space(self, theta: FloatArray) -> FeatureSpace:
        """The :class:`FeatureSpace` of the solution ``θ`` (what :func:`fit_physical` returns)."""
        space, names = self.space, self.names
        t0, t1, alpha, beta, w, escape, gamma, kappa = self.unpack(theta)
        solo = SoloTable(
            curves=dict(space.solo.curves),
            exponents={**space.solo.exponents, **dict(zip(names, map(float, alpha), strict=True))},
            flop_rate=space.solo.flop_rate,
            default_exponent=space.solo.default_exponent,
            laws={**space.solo.laws, **{n: (float(a), float(b)) for n, a, b in zip(names, t0, t1, strict=True)}},
            overhead_exponents={**space.solo.overhead_exponents, **dict(zip(names, map(float, beta), strict=True))},
        )
        return FeatureSpace(
            space.architectures,
            space.workloads,
            solo,
            space.cores,
            space.placement,
            w if self.weighted else space.sharing_weight,
            escape if self.weighted else space.escape_weight,
            space.reference_speed_index,
            space.reference_cross_core_rtt_ns,
            gamma if self.link else space.link_exponent,
            kappa if self.passive.any() else space.passive_ratio,
        )


def fit_space(
    samples: Sequence[ProfiledTask],
    architectures: tuple[str, ...],
    workloads: dict[str, ModelWorkload],
    cores: int,
    placement: str,
    enc: EncodedMixes,
    measured: FloatArray,
    reference_rtt: float | None = None,
    host_s_per_op: float | None = None,
) -> FeatureSpace:
    """The feature space with its physical tables fitted on ``samples`` / the configurations
    ``enc`` (measured throughputs ``measured``, ``enc``'s order): the :class:`SoloTable`, then
    the sharing weight on it, then the SoloTable again with that weight (it only changes the
    speeds inferred for models never measured alone), then all of them refined jointly on every
    measured task (:func:`fit_physical`), the link exponent with them when ``reference_rtt``
    (the placement predictions are for) is given. The space's design matrix has ``enc``'s
    width in slots (:attr:`FeatureSpace.slots`), it answers for up to :data:`MAX_MIX` tasks
    and records the largest configuration of ``enc`` (:attr:`FeatureSpace.max_fitted_mix`) and
    the device class's host seconds per operation (:attr:`FeatureSpace.host_s_per_op`: with it
    the design matrix has the host launch term; ``None``, the columns of before issue 31).

    Raises:
        PredictorError: an unknown ``placement``.
    """
    solo = SoloTable.from_samples(samples, workloads, cores, placement=placement)
    space = FeatureSpace(architectures, workloads, solo, cores, placement)
    weight = fit_sharing_weight(space, enc, measured)
    if weight != 1.0:
        solo = SoloTable.from_samples(samples, workloads, cores, placement=placement, sharing_weight=weight)
    space = FeatureSpace(
        architectures, workloads, solo, cores, placement, weight, reference_cross_core_rtt_ns=reference_rtt
    )
    space = fit_physical(space, enc, measured)
    space.slots = enc.width
    space.max_mix = MAX_MIX
    space.max_fitted_mix = int(enc.mix_sizes.max()) if len(enc.arch) else None
    space.host_s_per_op = host_s_per_op
    return space
