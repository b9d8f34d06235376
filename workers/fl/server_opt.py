"""Server-side optimisers: FedAvgM (Hsu et al. 2019) and FedAdagrad, FedAdam, FedYogi (Reddi et
al. 2021), on NumPy state dicts (no torch), so the control plane aggregates with them as it does
with FedAvg.

Each round the devices' models are averaged exactly as FedAvg does
(:class:`~workers.fl.fedavg.FedAvgAccumulator`: sample-weighted, one device model in memory at a
time, a device with 0 samples weighs nothing), in float64, and the server takes an optimiser
step from the previous global model ``W`` along the **pseudo-gradient**

    ``Δ = Σ_j n_j (W_j − W) / Σ_j n_j = mean − W``

(Reddi et al. 2021, "Adaptive Federated Optimization", ICLR, Algorithm 2, line "Δ_t = …"; with
this sign ``Δ`` points the way the devices moved, so every optimiser *adds* its step). FedAvg is
``W ← W + Δ``; the optimisers here replace that step:

- ``fedavgm`` (Hsu, Qi and Brown 2019, "Measuring the Effects of Non-Identical Data Distribution
  for Federated Visual Classification", §3 "FedAvgM"): ``v ← β v + Δ``, ``W ← W + η v``. The
  paper writes ``Δw = W − mean`` (a descent direction), ``v ← β v + Δw`` and ``W ← W − v``:
  the same update with ``Δ = −Δw``, ``η = 1``. With ``v = 0`` and ``η = 1`` the first round is
  FedAvg's.
- ``fedadagrad``, ``fedadam``, ``fedyogi`` (Reddi et al. 2021, Algorithm 2), per element:
  ``m_t = β1 m_{t−1} + (1 − β1) Δ_t``; then ``v_t = v_{t−1} + Δ_t²`` (FedAdagrad),
  ``v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)`` (FedYogi) or
  ``v_t = β2 v_{t−1} + (1 − β2) Δ_t²`` (FedAdam); ``W_{t+1} = W_t + η m_t / (√v_t + τ)``.
  **No bias correction**: Algorithm 2 has none, and none is added (with ``β1 = 0.9`` and
  ``β2 = 0.99`` the two biases of the first FedAdam step cancel: ``m_0 = 0.1 Δ`` and
  ``√v_0 ≈ 0.1 |Δ|``, so the step is about ``η sign(Δ)``). Initial state: ``m_{−1} = 0`` and
  ``v_{−1} = τ²``, the smallest value Algorithm 2's initialisation (``v_{−1} ≥ τ²``) allows.

Two conventions, each a parameter of the adaptive ones (the defaults are Reddi et al.'s):

- ``initial_v``: ``"tau_squared"`` (default: ``v_{−1} = τ²``, Reddi et al. 2021, Algorithm 2) or
  ``"zero"`` (``v_{−1} = 0``, as Flower's ``FedAdam``, ``FedYogi`` and ``FedAdagrad`` start it,
  ``flwr/server/strategy/fedadam.py`` etc., 1.x: ``np.zeros_like``). ``m_{−1} = 0`` in both.
- ``bias_correction`` (FedAdam and FedYogi; default off, as Algorithm 2): the step's rate is
  ``η_t = η·√(1 − β2^(t+1)) / (1 − β1^(t+1))`` with ``t`` the server step (1 for the first
  aggregation of the task), exactly Flower's FedAdam (``eta_norm``, its ``server_round``
  counting from 1; Kingma and Ba 2015, "Adam", the line before §2.1, write the same with ``t``
  where Flower writes ``t + 1``). Flower's FedYogi has no bias correction; here FedYogi may take
  FedAdam's, since its ``m`` is the same moving average and, from ``v_{−1} = 0``, its ``v`` grows
  as Adam's does while ``v < Δ²``. FedAdagrad takes none: its ``v`` is a sum, not a moving
  average, so it has no bias toward its start to correct (nor has Flower's FedAdagrad). With
  bias correction on, the server state also holds ``"t"``, the server steps taken (0-d int64).
  ``t`` counts the task's *aggregations*, not rounds: a round in which no device that succeeded
  trained the task (every count 0, no contribution) keeps the previous model and server state
  (the control plane flags the round), so ``t`` stays, while
  Flower's ``server_round`` advances every round, aggregated or not (its FedAdam returns early
  when ``aggregate_fit`` has no results, and the next round's ``eta_norm`` uses the next
  ``server_round``). The two agree while every round aggregates the task; after ``k`` such
  rounds Flower's rate is that of step ``t + k``. Here the rate follows the steps the moments
  ``m`` and ``v`` actually took, which is what Adam's correction is for.
  So Flower's FedAdam is ``bias_correction=true, initial_v=zero``; its FedYogi and FedAdagrad
  (``beta1 = 0`` for the latter, which Flower fixes) are ``initial_v=zero``.

Which tensors are optimised. Only floating tensors that are *not* BatchNorm running statistics.
Integer tensors (BatchNorm's ``num_batches_tracked``) and the running statistics
(``running_mean``, ``running_var``: keys ending ``.running_mean`` / ``.running_var``, torch's
names) take the FedAvg result (integers rounded half to even, exactly as FedAvg) and get no
server state. Flower treats every float array alike; here the statistics are left out because
they are not parameters the loss is minimised over but estimates of the activations' statistics
under the current weights, which every trainer re-estimates on its shard after training
(:func:`workers.training.trainer.recalibrate_batchnorm`). The server holds no data to
re-estimate them under its new weights, so the devices' mean is the estimate it has; momentum
or an adaptive step of size ``≈ η`` would move them away from any measured value, and a variance
pushed below 0 makes the model's evaluation NaN.

Numbers. Every step is computed in float64 from the previous model, the float64 device mean and
the state; the new model is cast back to each tensor's dtype. The server state is a flat dict
``"momentum/<key>"`` (FedAvgM) or ``"m/<key>"`` and ``"v/<key>"`` (the adaptive ones), each the
tensor's shape, stored as float32 (or the tensor's dtype when wider, float64): the control plane
writes it as safetensors beside each round's global model (:func:`workers.fl.fedavg.save_state`)
and hands it back the next round (:attr:`AggregationContext.state
<workers.registry.aggregators.AggregationContext.state>`). A state whose keys or shapes do not
match the model is refused with a ``ValueError`` naming the key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import numpy as np

from workers.fl.fedavg import FedAvgAccumulator, cast_mean

StateLoader = Callable[[], Mapping[str, np.ndarray]]

INITIAL_V = ("tau_squared", "zero")
"""The adaptive optimisers' starts of ``v``: ``τ²`` (Reddi et al. 2021) or 0 (Flower)."""

BATCHNORM_STATISTICS = ("running_mean", "running_var")
"""The last component of the keys of BatchNorm's floating running statistics (torch's names)."""


def is_optimised(key: str, dtype: np.dtype) -> bool:
    """Whether a server optimiser steps tensor ``key``: floating, and not a BatchNorm running
    statistic (``<module>.running_mean`` / ``<module>.running_var``); see the module docstring.

    Args:
        key: the state dict key (``"layer1.0.bn1.running_var"``).
        dtype: the tensor's dtype.
    """
    return bool(np.issubdtype(dtype, np.floating)) and key.rsplit(".", 1)[-1] not in BATCHNORM_STATISTICS


def state_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a tensor's server state is stored in: float32, or ``dtype`` when it is wider."""
    return np.promote_types(dtype, np.float32)


class ServerOptimizerAggregation(ABC):
    """One task's aggregation in one round with a server optimiser: FedAvg's sample-weighted
    mean, then an optimiser step from the previous global model along the pseudo-gradient
    ``Δ = mean − W`` (Reddi et al. 2021, Algorithm 2).

    ``add`` each device's state dict and sample count, then :meth:`result` (the new global
    model), then :meth:`server_state` (the state to hand back next round). Subclasses say which
    state slots they keep (:attr:`slots`), how a slot starts (:meth:`initial`) and the step
    (:meth:`step`).

    Args:
        previous: loads the previous global state dict ``W`` (called once, in :meth:`result`).
        state: loads the server state of the task's last aggregation, ``{}`` before the first
            (called once, in :meth:`result`).

    Raises:
        ValueError: from :meth:`add`, as :class:`~workers.fl.fedavg.FedAvgAccumulator`; from
            :meth:`result`, a previous model or a server state that does not match the devices'
            states (naming the key).
        workers.fl.fedavg.NoSamplesError: from :meth:`result`, every count was 0 (the caller
            keeps the previous model and the previous state).
    """

    slots: tuple[str, ...] = ()
    """The server state's prefixes: a key ``"<slot>/<tensor key>"`` per slot and optimised tensor."""

    name = "server optimiser"

    @property
    def counters(self) -> tuple[str, ...]:
        """The server state's whole-model keys besides the slots: each a 0-d int64 that
        :meth:`begin` reads and updates (an adaptive optimiser's step count ``"t"``)."""
        return ()

    def __init__(self, previous: StateLoader, state: StateLoader) -> None:
        self._previous = previous
        self._state = state
        self._mean = FedAvgAccumulator()
        self._server_state: dict[str, np.ndarray] | None = None

    def add(self, state: Mapping[str, np.ndarray], count: int) -> None:
        """Add one device's state dict trained on ``count >= 0`` samples (a device with 0
        samples weighs nothing; its tensors are checked, not read).

        Raises:
            ValueError: see the class.
        """
        self._mean.add(state, count)

    def result(self) -> dict[str, np.ndarray]:
        """The new global state dict: optimised tensors stepped (:meth:`step`), the others the
        FedAvg result. Same keys, shapes and dtypes as the states added.

        Raises:
            ValueError, workers.fl.fedavg.NoSamplesError: see the class.
            RuntimeError: called a second time.
        """
        dtypes = self._mean.dtypes
        means = self._mean.means()
        previous = self._previous()
        _check_previous(previous, means, dtypes)
        optimised = [key for key in means if is_optimised(key, dtypes[key])]
        saved = self._checked_state(self._state(), optimised, means)
        new_state: dict[str, np.ndarray] = self.begin(saved)
        out: dict[str, np.ndarray] = {}
        for key, mean in means.items():
            dtype = dtypes[key]
            if key not in optimised:
                out[key] = cast_mean(mean, dtype)
                continue
            weights = np.asarray(previous[key], dtype=np.float64)
            delta = mean - weights  # the pseudo-gradient Δ (Reddi et al. 2021, Algorithm 2)
            slots = {
                # A copy: the steps update slots in place, and the caller's state stays as it was.
                slot: np.array(saved[f"{slot}/{key}"], dtype=np.float64) if saved else self.initial(slot, weights.shape)
                for slot in self.slots
            }
            step = self.step(delta, slots)
            out[key] = (weights + step).astype(dtype)
            for slot, value in slots.items():
                new_state[f"{slot}/{key}"] = value.astype(state_dtype(dtype))
        self._server_state = new_state
        return out

    def server_state(self) -> dict[str, np.ndarray]:
        """The server state after this round (``"<slot>/<tensor key>"`` → array of the
        tensor's shape, float32 or wider), to be handed back as the next round's state.

        Raises:
            RuntimeError: :meth:`result` has not given a result.
        """
        if self._server_state is None:
            raise RuntimeError(f"{self.name}: server_state() is only known after result() succeeded")
        return dict(self._server_state)

    def begin(self, saved: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Called once per round before the tensors' steps, with the checked saved state
        (``{}`` before the first round): returns this round's :attr:`counters` (0-d int64 arrays,
        part of the new server state). By default there are none."""
        return {}

    @abstractmethod
    def initial(self, slot: str, shape: tuple[int, ...]) -> np.ndarray:
        """A slot's value before the first round (float64, ``shape``)."""

    @abstractmethod
    def step(self, delta: np.ndarray, slots: dict[str, np.ndarray]) -> np.ndarray:
        """The server step for one tensor, float64, added to the previous weights.

        Args:
            delta: the pseudo-gradient ``Δ = mean − W``, float64.
            slots: the state slots of this tensor (float64), updated in place or replaced in the
                dict with this round's values.
        """

    def _checked_state(
        self, saved: Mapping[str, np.ndarray], optimised: list[str], means: Mapping[str, np.ndarray]
    ) -> Mapping[str, np.ndarray]:
        if not saved:
            return {}
        expected: dict[str, tuple[int, ...]] = {counter: () for counter in self.counters}
        expected.update({f"{slot}/{key}": means[key].shape for key in optimised for slot in self.slots})
        for state_key in sorted(set(saved) - set(expected)):
            raise ValueError(
                f"{self.name}: server state key {state_key!r} matches no optimised tensor of the model "
                "(a state from another model or another aggregator)"
            )
        for state_key, shape in expected.items():
            if state_key not in saved:
                raise ValueError(f"{self.name}: server state has no {state_key!r} for the model's tensor")
            got = np.asarray(saved[state_key]).shape
            if got != shape:
                raise ValueError(
                    f"{self.name}: server state key {state_key!r} has shape {got} but the model's tensor has {shape}"
                )
        return saved


class FedAvgM(ServerOptimizerAggregation):
    """FedAvg with server momentum (Hsu, Qi and Brown 2019, §3): ``v ← β v + Δ``,
    ``W ← W + η v``, ``v`` starting at 0 (module docstring for the sign). No bias correction
    (the paper has none). State: ``"momentum/<key>"``.

    Args:
        previous, state: see :class:`ServerOptimizerAggregation`.
        server_learning_rate: ``η > 0``.
        server_momentum: ``β`` in ``[0, 1)``.
    """

    slots = ("momentum",)
    name = "fedavgm"

    def __init__(
        self, previous: StateLoader, state: StateLoader, *, server_learning_rate: float, server_momentum: float
    ) -> None:
        super().__init__(previous, state)
        self.eta = float(server_learning_rate)
        self.beta = float(server_momentum)

    def initial(self, slot: str, shape: tuple[int, ...]) -> np.ndarray:
        """``v = 0``."""
        return np.zeros(shape, dtype=np.float64)

    def step(self, delta: np.ndarray, slots: dict[str, np.ndarray]) -> np.ndarray:
        """``v ← β v + Δ``; the step ``η v``."""
        velocity = slots["momentum"]
        velocity *= self.beta
        velocity += delta  # v ← β v + Δ (Hsu et al. 2019, §3, with Δ = −Δw)
        return self.eta * velocity  # W ← W + η v


class AdaptiveServerOptimizer(ServerOptimizerAggregation):
    """Reddi et al. 2021, Algorithm 2, the part the three share: ``m_t = β1 m_{t−1} + (1 − β1)
    Δ_t``, then the variant's ``v_t`` (:meth:`second_moment`), then ``W_{t+1} = W_t + η_t m_t /
    (√v_t + τ)``. By default (Reddi et al.) ``m_{−1} = 0``, ``v_{−1} = τ²`` and ``η_t = η`` (no
    bias correction); ``initial_v="zero"`` and ``bias_correction=True`` give Flower's conventions
    (module docstring). State: ``"m/<key>"`` and ``"v/<key>"``, and ``"t"`` with bias correction.

    Args:
        previous, state: see :class:`ServerOptimizerAggregation`.
        server_learning_rate: ``η > 0``.
        beta1: ``β1`` in ``[0, 1)``.
        beta2: ``β2`` in ``[0, 1)`` (unused by FedAdagrad).
        tau: ``τ > 0``, the adaptivity (a smaller ``τ``: a more adaptive step).
        initial_v: ``"tau_squared"`` (``v_{−1} = τ²``) or ``"zero"`` (``v_{−1} = 0``).
        bias_correction: ``η_t = η·√(1 − β2^(t+1)) / (1 − β1^(t+1))`` (Flower's FedAdam) instead
            of ``η``; only for the optimisers that declare it (:attr:`corrects_bias`).

    Raises:
        ValueError: an ``initial_v`` other than the two names, or ``bias_correction`` for an
            optimiser that takes none.
    """

    slots = ("m", "v")
    corrects_bias = True
    """Whether ``bias_correction`` applies (FedAdam, FedYogi: moving averages; not FedAdagrad)."""

    def __init__(
        self,
        previous: StateLoader,
        state: StateLoader,
        *,
        server_learning_rate: float,
        beta1: float,
        tau: float,
        beta2: float = 0.0,
        initial_v: str = "tau_squared",
        bias_correction: bool = False,
    ) -> None:
        super().__init__(previous, state)
        if initial_v not in INITIAL_V:
            raise ValueError(f"{self.name}: initial_v must be one of {', '.join(INITIAL_V)}, got {initial_v!r}")
        if bias_correction and not self.corrects_bias:
            raise ValueError(f"{self.name}: takes no bias correction (its v is a sum, not a moving average)")
        self.eta = float(server_learning_rate)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.tau = float(tau)
        self.initial_v = initial_v
        self.bias_correction = bool(bias_correction)
        self.rate = self.eta
        """This round's ``η_t`` (set by :meth:`begin`)."""

    @property
    def counters(self) -> tuple[str, ...]:
        """``("t",)`` with bias correction (the step count it needs), else none."""
        return ("t",) if self.bias_correction else ()

    def begin(self, saved: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This round's rate: ``η``, or with bias correction ``η_t = η·√(1 − β2^(t+1)) /
        (1 − β1^(t+1))`` (Flower's FedAdam, ``eta_norm``) where ``t`` is this server step (the
        saved ``"t"`` plus one; 1 in the first round). ``t`` advances only when the task is
        aggregated (a round that keeps the previous model keeps its state), whereas Flower's
        ``server_round`` advances every round (module docstring). Returns ``{"t": t}`` with bias
        correction."""
        if not self.bias_correction:
            self.rate = self.eta
            return {}
        t = int(np.asarray(saved["t"])) + 1 if saved else 1
        # Flower: eta * np.sqrt(1 - np.power(beta_2, server_round + 1.0)) / (1 - np.power(beta_1, ...)).
        self.rate = float(self.eta * np.sqrt(1 - np.power(self.beta2, t + 1.0)) / (1 - np.power(self.beta1, t + 1.0)))
        return {"t": np.array(t, dtype=np.int64)}

    def initial(self, slot: str, shape: tuple[int, ...]) -> np.ndarray:
        """``m_{−1} = 0``; ``v_{−1} = τ²`` (Algorithm 2's initialisation: ``v_{−1} ≥ τ²``) or 0
        (``initial_v="zero"``, Flower's)."""
        start = self.tau**2 if slot == "v" and self.initial_v == "tau_squared" else 0.0
        return np.full(shape, start, dtype=np.float64)

    def step(self, delta: np.ndarray, slots: dict[str, np.ndarray]) -> np.ndarray:
        """``m_t``, ``v_t`` and the step ``η_t m_t / (√v_t + τ)``."""
        m = slots["m"]
        m *= self.beta1
        m += (1.0 - self.beta1) * delta  # m_t = β1 m_{t−1} + (1 − β1) Δ_t (Algorithm 2)
        v = slots["v"] = self.second_moment(slots["v"], delta * delta)
        step: np.ndarray = self.rate * m / (np.sqrt(v) + self.tau)  # x_{t+1} = x_t + η_t m_t / (√v_t + τ)
        return step

    @abstractmethod
    def second_moment(self, v: np.ndarray, delta_sq: np.ndarray) -> np.ndarray:
        """``v_t`` from ``v_{t−1}`` and ``Δ_t²`` (float64; ``v`` may be updated in place)."""


class FedAdagrad(AdaptiveServerOptimizer):
    """FedAdagrad (Reddi et al. 2021, Algorithm 2): ``v_t = v_{t−1} + Δ_t²``; see
    :class:`AdaptiveServerOptimizer`."""

    name = "fedadagrad"
    corrects_bias = False

    def second_moment(self, v: np.ndarray, delta_sq: np.ndarray) -> np.ndarray:
        """``v_t = v_{t−1} + Δ_t²``."""
        v += delta_sq
        return v


class FedAdam(AdaptiveServerOptimizer):
    """FedAdam (Reddi et al. 2021, Algorithm 2): ``v_t = β2 v_{t−1} + (1 − β2) Δ_t²``; see
    :class:`AdaptiveServerOptimizer`."""

    name = "fedadam"

    def second_moment(self, v: np.ndarray, delta_sq: np.ndarray) -> np.ndarray:
        """``v_t = β2 v_{t−1} + (1 − β2) Δ_t²``."""
        v *= self.beta2
        v += (1.0 - self.beta2) * delta_sq
        return v


class FedYogi(AdaptiveServerOptimizer):
    """FedYogi (Reddi et al. 2021, Algorithm 2; Yogi: Zaheer et al. 2018):
    ``v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)``; see :class:`AdaptiveServerOptimizer`.
    ``v`` stays positive: it only shrinks while ``v_{t−1} > Δ_t²``, and then by less than
    ``v_{t−1}``."""

    name = "fedyogi"

    def second_moment(self, v: np.ndarray, delta_sq: np.ndarray) -> np.ndarray:
        """``v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)``."""
        updated: np.ndarray = v - (1.0 - self.beta2) * delta_sq * np.sign(v - delta_sq)
        return updated


def _check_previous(
    previous: Mapping[str, np.ndarray], means: Mapping[str, np.ndarray], dtypes: Mapping[str, np.dtype]
) -> None:
    """The previous global model must have the devices' keys, shapes and dtypes."""
    missing = sorted(set(means) - set(previous))
    extra = sorted(set(previous) - set(means))
    if missing or extra:
        raise ValueError(
            f"the previous global model has different keys than the device models: missing {missing[:5]}, "
            f"extra {extra[:5]}"
        )
    for key, mean in means.items():
        value = np.asarray(previous[key])
        if value.shape != mean.shape:
            raise ValueError(
                f"state key {key!r} has shape {value.shape} in the previous global model but {mean.shape} "
                "in the device models"
            )
        if value.dtype != dtypes[key]:
            raise ValueError(
                f"state key {key!r} has dtype {value.dtype} in the previous global model but {dtypes[key]} "
                "in the device models"
            )
