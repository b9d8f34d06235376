"""How long an assignment takes: a fixed part and a per-sample part, learned from measured seconds.

A round's seconds are not ``samples / throughput``: ``throughput_sps`` is the trainer's steady
state (the iterations after the warm-up), while ``Assignment.seconds`` is its whole span after
``GO``: the warm-up iterations (one-off allocation and cache costs), the epoch's short last batch,
BatchNorm's re-estimation pass over the shard (``workers.training.trainer.recalibrate_batchnorm``)
and saving the weights. With few iterations (batch 512 on 1,431 samples: 3 of them) the fixed
costs are a large part of the round. The model, for task ``i`` on device ``j`` trained with
batch ``B_ij`` on ``|D_ij|`` samples for ``E`` epochs at throughput ``P_ij`` (samples/s)::

    t_ij = a_ij + E·|D_ij| / P_ij
    a_ij = (w · min(K, n_ij) · min(B_ij, |D_ij|)  +  β · |D_ij|) / P_ij  +  c_j

with ``n_ij = E·⌈|D_ij| / B_ij⌉`` iterations and ``K`` the configured warm-up iterations. The
first term is ``w`` step times per warm-up iteration (``step_time(B) = B / P``), the second the
BatchNorm pass (a forward pass over the shard, ``β`` of a training step's cost per sample), the
third a per-device constant in seconds. A device's round time is ``T_j = max_i t_ij``.

**Prior** (before anything is measured): ``w = 1/K``, one step in all over the ``K`` untimed
iterations (a warm-up iteration runs about as fast as a timed one, whose samples ``E·|D|/P``
already counts; what the first one adds is its one-off allocation and cache costs, about a step:
:func:`workers.training.trainer.steady_state` leaves it out for that reason), ``β = 1/3`` (a
forward pass is about a third of a training step's FLOPs, backward about twice the forward:
Kaplan et al. 2020, §2.1, ``C_forward ≈ 2N``, ``C_train ≈ 6N``) and ``c = 0``. Measured on the
2-core machine (issue 31): resnet18 at batch 512 on 1,431 samples took 25.9 s where
``|D|/P`` says 19.7 s; the BatchNorm term alone predicts 6.5 s of the 6.2 s difference.

**Fit** (:func:`fit_seconds_model`): the maximum a posteriori estimate of ``θ = (w, β, c)`` in a
Bayesian linear regression (Bishop 2006, §3.3, Eq. 3.53-3.54 with the prior's mean) on the
measured residuals ``r = seconds − E·|D| / P_measured`` with features
``φ = (min(K, n)·min(B, |D|) / P, |D| / P, 1)``: minimise
``Σ_k (r_k − φ_k·θ)² / σ_k² + Σ_d (θ_d − θ0_d)² / τ_d²``, each measurement's noise ``σ_k``
:data:`RELATIVE_NOISE` of its seconds (at least :data:`MIN_NOISE_S`), the prior's widths
:data:`PRIOR_WIDTH`. ``w`` and ``β`` are kept non-negative (a fixed cost never speeds training
up). :func:`fit_device_seconds` fits every measured device's model on its own measurements with
the pooled fit over all devices as the prior (widths :data:`DEVICE_PRIOR_WIDTH`), so a device
measured once borrows the others' slopes and learns its own constant.

Pure: NumPy only (no Django, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]

PRIOR_WARMUP_STEPS = 1.0
"""Extra step times of all the warm-up iterations together before any measurement (the first
iteration's one-off costs); ``w = PRIOR_WARMUP_STEPS / K``."""
PRIOR_BN_WEIGHT = 1.0 / 3.0
"""``β`` before any measurement: a forward pass per sample as a fraction of a training step."""
PRIOR_CONSTANT_S = 0.0
"""``c`` before any measurement, seconds."""
PRIOR_WIDTH = (1.0, 0.5, 1.0)
"""``τ`` of ``(w, β, c)``: how far the data may pull each from the prior at equal weight."""
DEVICE_PRIOR_WIDTH = (0.1, 0.05, 1.0)
"""``τ`` of a device's own fit around the pooled one: the slopes are the trainers' and the
models' (shared by every device), the constant is the device's own."""
RELATIVE_NOISE = 0.05
"""``σ_k / seconds_k``: spread of one assignment's measured seconds from round to round."""
MIN_NOISE_S = 0.02
"""Floor of ``σ_k``, seconds (timer and process scheduling jitter)."""
DEFAULT_WARMUP_ITERATIONS = 2
"""``K`` when the caller gives none: the trainers' default (``MTFL_WARMUP_ITERATIONS``)."""
PRIOR_WARMUP_WEIGHT = PRIOR_WARMUP_STEPS / DEFAULT_WARMUP_ITERATIONS
"""``w`` of the default prior (``K`` = :data:`DEFAULT_WARMUP_ITERATIONS`)."""


@dataclass(frozen=True)
class MeasuredSeconds:
    """One measured assignment, as the seconds model needs it.

    Attributes:
        device_id: the device it ran on.
        batch_size: ``B_ij``.
        samples: ``|D_ij|``, the shard.
        throughput_sps: measured steady-state ``P_ij`` (> 0).
        seconds: measured span after ``GO``, seconds (> 0).
        local_epochs: ``E``.
    """

    device_id: int
    batch_size: int
    samples: int
    throughput_sps: float
    seconds: float
    local_epochs: int = 1


@dataclass(frozen=True)
class SecondsModel:
    """``t = a + E·|D| / P`` for one device (module docstring).

    Attributes:
        warmup_weight: ``w``, step times per warm-up iteration.
        bn_weight: ``β``, training-step fractions per shard sample (the BatchNorm pass).
        constant_s: ``c``, seconds per assignment.
        warmup_iterations: ``K``, the trainers' untimed iterations.
        measurements: how many measured assignments the fit saw (0: the prior).
    """

    warmup_weight: float = PRIOR_WARMUP_WEIGHT
    bn_weight: float = PRIOR_BN_WEIGHT
    constant_s: float = PRIOR_CONSTANT_S
    warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS
    measurements: int = 0

    @classmethod
    def prior(cls, warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS) -> SecondsModel:
        """The prior for trainers with ``K = warmup_iterations`` untimed iterations (module
        docstring): ``w = PRIOR_WARMUP_STEPS / K`` (0 when ``K`` is 0), ``β = 1/3``, ``c = 0``."""
        weight = PRIOR_WARMUP_STEPS / warmup_iterations if warmup_iterations > 0 else 0.0
        return cls(weight, PRIOR_BN_WEIGHT, PRIOR_CONSTANT_S, warmup_iterations, 0)

    @property
    def theta(self) -> FloatArray:
        """``(w, β, c)`` as an array."""
        return np.array([self.warmup_weight, self.bn_weight, self.constant_s])

    def fixed_seconds(self, batch: Any, samples: Any, throughput: Any, epochs: int) -> FloatArray:
        """``a = (w·min(K, n)·min(B, |D|) + β·|D|) / P + c``, floored at 0; arrays broadcast.

        Args:
            batch: batch sizes ``B`` (≥ 1).
            samples: shard sizes ``|D|``.
            throughput: throughputs ``P`` (samples/s, > 0).
            epochs: ``E``.
        """
        return fixed_seconds(
            batch,
            samples,
            throughput,
            epochs,
            warmup_weight=self.warmup_weight,
            bn_weight=self.bn_weight,
            constant_s=self.constant_s,
            warmup_iterations=self.warmup_iterations,
        )

    def seconds(self, batch: Any, samples: Any, throughput: Any, epochs: int) -> FloatArray:
        """``t = a + E·|D| / P`` (seconds); arrays broadcast (:meth:`fixed_seconds`)."""
        d = np.asarray(samples, dtype=float)
        p = np.asarray(throughput, dtype=float)
        out: FloatArray = self.fixed_seconds(batch, d, p, epochs) + epochs * d / p
        return out

    def describe(self) -> str:
        """One line for a decision's text: the fitted parts and what they were fitted on."""
        source = f"fitted on {self.measurements} measured assignment(s)" if self.measurements else "prior"
        return (
            f"fixed part {self.warmup_weight:.2f} step(s) per warm-up iteration + {self.bn_weight:.2f} of a step "
            f"per sample for BatchNorm + {self.constant_s:.2f} s ({source})"
        )


def fixed_seconds(
    batch: Any,
    samples: Any,
    throughput: Any,
    epochs: int,
    *,
    warmup_weight: Any,
    bn_weight: Any,
    constant_s: Any,
    warmup_iterations: Any,
) -> FloatArray:
    """``a = (w·min(K, n)·min(B, |D|) + β·|D|) / P + c`` floored at 0, with ``n = E·⌈|D|/B⌉``
    (module docstring); every argument broadcasts, so a planner passes per-device parameters as
    arrays beside ``(m, I)`` configurations."""
    b = np.asarray(batch, dtype=float)
    d = np.asarray(samples, dtype=float)
    p = np.asarray(throughput, dtype=float)
    iterations = epochs * np.ceil(d / np.maximum(b, 1.0))
    warm = np.minimum(np.asarray(warmup_iterations, dtype=float), iterations) * np.minimum(b, d)
    out: FloatArray = np.maximum(0.0, (warmup_weight * warm + bn_weight * d) / p + constant_s)
    return out


def fit_seconds_model(
    measured: Iterable[MeasuredSeconds],
    *,
    prior: SecondsModel | None = None,
    warmup_iterations: int | None = None,
    width: tuple[float, float, float] = PRIOR_WIDTH,
) -> SecondsModel:
    """The MAP fit of ``(w, β, c)`` on measured assignments (module docstring).

    Args:
        measured: measured assignments; those without a positive throughput, seconds or shard
            are left out.
        prior: the prior's mean (default: :meth:`SecondsModel.prior` of ``warmup_iterations``).
        warmup_iterations: ``K`` (default: the prior's).
        width: the prior's ``τ`` of ``(w, β, c)``.

    Returns:
        The fitted model (the prior itself when nothing usable was measured).
    """
    if prior is None:
        prior = SecondsModel.prior(DEFAULT_WARMUP_ITERATIONS if warmup_iterations is None else warmup_iterations)
    k = prior.warmup_iterations if warmup_iterations is None else warmup_iterations
    rows = [m for m in measured if m.throughput_sps > 0 and m.seconds > 0 and m.samples > 0 and m.batch_size > 0]
    if not rows:
        return SecondsModel(prior.warmup_weight, prior.bn_weight, prior.constant_s, k, 0)
    b = np.array([m.batch_size for m in rows], dtype=float)
    d = np.array([m.samples for m in rows], dtype=float)
    p = np.array([m.throughput_sps for m in rows], dtype=float)
    e = np.array([m.local_epochs for m in rows], dtype=float)
    t = np.array([m.seconds for m in rows], dtype=float)
    iterations = e * np.ceil(d / b)
    warm = np.minimum(float(k), iterations) * np.minimum(b, d)
    phi = np.stack([warm / p, d / p, np.ones_like(p)], axis=1)  # (n, 3)
    residual = t - e * d / p
    sigma = np.maximum(RELATIVE_NOISE * t, MIN_NOISE_S)
    tau = np.array(width)
    theta0 = prior.theta
    # Normal equations of the weighted, prior-regularised least squares (Bishop 2006, Eq. 3.54).
    a = phi.T @ (phi / sigma[:, None] ** 2) + np.diag(1.0 / tau**2)
    rhs = phi.T @ (residual / sigma**2) + theta0 / tau**2
    theta = np.linalg.solve(a, rhs)
    free = [0, 1, 2]
    while theta[0] < 0 or theta[1] < 0:
        # Active set: hold each negative slope at 0 and re-solve the rest (c too), until no slope
        # is negative; two slopes, so at most two passes (Lawson & Hanson 1974, NNLS).
        free = [i for i in free if i == 2 or theta[i] > 0]
        theta = np.zeros(3)
        sub = np.ix_(free, free)
        theta[free] = np.linalg.solve(a[sub], rhs[free])
    return SecondsModel(float(theta[0]), float(theta[1]), float(theta[2]), k, len(rows))


@dataclass(frozen=True)
class SecondsModels:
    """Every device's seconds model: a device's own fit where it was measured, else the pooled one.

    Attributes:
        default: the model of a device with no measurement (the pooled fit, or the prior).
        devices: ``device_id → SecondsModel`` for measured devices.
    """

    default: SecondsModel = field(default_factory=SecondsModel)
    devices: Mapping[int, SecondsModel] = field(default_factory=dict)

    def of(self, device_id: int) -> SecondsModel:
        """The device's model (``default`` when it has none of its own)."""
        return self.devices.get(device_id, self.default)


def fit_device_seconds(
    measured: Iterable[MeasuredSeconds], *, prior: SecondsModel | None = None, warmup_iterations: int | None = None
) -> SecondsModels:
    """Pooled fit over all measurements, then each device's fit with the pooled one as its prior.

    Args:
        measured: measured assignments of any devices.
        prior: the prior's mean (default: :class:`SecondsModel`'s).
        warmup_iterations: ``K`` (default: the prior's, else :data:`DEFAULT_WARMUP_ITERATIONS`).
    """
    rows = list(measured)
    pooled = fit_seconds_model(rows, prior=prior, warmup_iterations=warmup_iterations)
    by_device: dict[int, list[MeasuredSeconds]] = {}
    for m in rows:
        by_device.setdefault(m.device_id, []).append(m)
    anchor = replace_measurements(pooled, 0)
    devices = {d: fit_seconds_model(ms, prior=anchor, width=DEVICE_PRIOR_WIDTH) for d, ms in by_device.items()}
    return SecondsModels(default=pooled, devices=devices)


def replace_measurements(model: SecondsModel, measurements: int) -> SecondsModel:
    """``model`` with another measurement count (a fitted model used as a prior counts none)."""
    return SecondsModel(model.warmup_weight, model.bn_weight, model.constant_s, model.warmup_iterations, measurements)


def timeslice_throughput(batch: FloatArray, samples: FloatArray, alone: FloatArray, epochs: int) -> FloatArray:
    """Throughput of each task of a time-sliced device (``temporal``), ``(m, I)``.

    The tasks take turns holding the whole device for one iteration each (the cpu backend's
    per-iteration lock; a GPU's driver time slices), so task ``i`` with ``n_i = E·⌈|D_i|/B_i⌉``
    iterations of mean step time ``s_i = E·|D_i| / (n_i·P_i^alone)`` ends after
    ``F_i = Σ_k min(n_k, n_i)·s_k`` seconds of training (round robin: every other task still
    running takes one step per step of its own), and its throughput including the waits is
    ``E·|D_i| / F_i``. The device's training time is ``max_i F_i = Σ_k n_k·s_k``.

    Args:
        batch: ``(m, I)`` batch sizes.
        samples: ``(m, I)`` or ``(I,)`` shard sizes (0: the task is absent).
        alone: ``(m, I)`` each task's throughput alone on the whole device at its batch size.
        epochs: ``E``.
    """
    b = np.asarray(batch, dtype=float)
    d = np.broadcast_to(np.asarray(samples, dtype=float), b.shape)
    n = epochs * np.ceil(d / np.maximum(b, 1.0))  # (m, I)
    work = epochs * d / np.asarray(alone, dtype=float)  # n·s, seconds alone
    step = np.where(n > 0, work / np.maximum(n, 1.0), 0.0)
    # F_i = Σ_k min(n_k, n_i)·s_k, as (m, I, I) → (m, I); mixes are small (I ≤ 8).
    finish = np.sum(np.minimum(n[:, None, :], n[:, :, None]) * step[:, None, :], axis=2)
    out: FloatArray = np.where(finish > 0, epochs * d / np.where(finish > 0, finish, 1.0), math.inf)
    return out
