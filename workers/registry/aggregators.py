"""The aggregator registry: how a task's device models become the next global model.

An aggregator is started once per task and round with the previous global model available, gets
every device's state dict with its sample count (one at a time, so only one device model is in
memory), and gives the new global state dict. Built-in: ``fedavg`` (McMahan et al. 2017),
``fedprox`` (Li et al. 2020: FedAvg on the server, a proximal term in every trainer's loss) and
the server optimisers of :mod:`workers.fl.server_opt` (``fedavgm``, ``fedadagrad``, ``fedadam``,
``fedyogi``). A server-side optimiser (FedAdam and kin, Reddi et al. 2021) uses ``previous`` to
form the pseudo-gradient and keeps a *server state* (momentum, ``m``, ``v``: a flat dict of
arrays the control plane stores beside each round's global model and hands back the next
round); FedAvg ignores both. An aggregator declares its hyper-parameters (:class:`Parameter`, checked
by :meth:`Aggregator.check_params`), and may ask every device's trainer for something: its
``trainer_options`` turn the checked parameters into options the assignment carries
(:attr:`AssignmentSpec.client_options <workers.protocol.messages.AssignmentSpec.client_options>`,
beside the aggregator's name), and its ``client_term`` builds, in the trainer, what each training
step adds to the gradients from them (FedProx: ``{"mu": μ}`` and the proximal term of
:mod:`workers.fl.fedprox`). The trainer finds the term through this registry
(:func:`build_client_term`), so it holds no aggregator's name, and a new client-side algorithm is
one plug-in (installed on the agents too). Plug-ins register in the ``mtfl.aggregators`` group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from workers.fl import server_opt
from workers.fl.fedavg import FedAvgAccumulator
from workers.registry.base import Parameter, ParamValue, Registry

if TYPE_CHECKING:
    import torch

StateDict = Mapping[str, np.ndarray]

TrainerOption = bool | int | float | str
"""A value of an aggregator's trainer options (what :attr:`AssignmentSpec.client_options
<workers.protocol.messages.AssignmentSpec.client_options>` carries: plain JSON scalars)."""


class Aggregation(Protocol):
    """One task's aggregation in one round (the object an :class:`Aggregator` starts)."""

    def add(self, state: StateDict, count: int) -> None:
        """Add one device's state dict, trained on ``count`` samples (``count >= 0``).

        Raises:
            ValueError: a count below 0 or a state that does not match the others.
        """

    def result(self) -> dict[str, np.ndarray]:
        """The new global state dict (same keys, shapes and dtypes as the states added).

        Raises:
            workers.fl.fedavg.NoSamplesError: every count added was 0.
        """


class StatefulAggregation(Aggregation, Protocol):
    """An aggregation whose aggregator keeps a server state across rounds (``stateful``)."""

    def server_state(self) -> dict[str, np.ndarray]:
        """The server state after this round (called after :meth:`result`): a flat dict of
        arrays (e.g. ``"m/<tensor key>"``), handed back as :attr:`AggregationContext.state`
        the next time this task is aggregated."""


class ClientTerm(Protocol):
    """What an aggregator adds to every training step of a device's trainer, after the loss's
    backward pass and before the optimiser step (FedProx's proximal gradient).

    :meth:`add_gradient` must read nothing back to the host (no ``.item()``, no data-dependent
    branches): a GPU trainer captures it with the rest of the step in a CUDA graph
    (:class:`workers.training.execution.StepRunner`), and one that cannot be captured makes the
    trainer fall back to eager steps.
    """

    def add_gradient(self) -> None:
        """Add the term's gradient to every trained parameter's ``.grad``, in place."""


class ClientTermFactory(Protocol):
    """``(model, options) -> ClientTerm | None``, called once per assignment in the trainer after
    the global weights are loaded and before the first step: ``model`` is on its device,
    ``options`` the assignment's ``client_options`` (what the record's ``trainer_options``
    gave). ``None``: nothing to add this round (FedProx with ``μ = 0``), so the trainer runs
    exactly a plain round's operations.

    Raises:
        ValueError: an option it cannot use (the assignment fails with the message).
    """

    def __call__(self, model: torch.nn.Module, options: Mapping[str, TrainerOption], /) -> ClientTerm | None:
        """Build the term for one assignment."""


@dataclass(frozen=True)
class AggregationContext:
    """What an aggregator may read when it starts.

    Attributes:
        previous: loads the previous global state dict (called only by aggregators that need it).
        options: the aggregator's parameters, checked (:meth:`Aggregator.check_params`: every
            declared parameter present, defaults filled in).
        state: loads the server state the aggregator left after the task's last aggregation
            (``{}`` before the first, and always for aggregators that are not ``stateful``).
    """

    previous: Callable[[], dict[str, np.ndarray]]
    options: Mapping[str, Any]
    state: Callable[[], dict[str, np.ndarray]] = dict


@dataclass(frozen=True)
class Aggregator:
    """A registered aggregator.

    Attributes:
        name: stored on a run and carried in messages (``"fedavg"``).
        label: one line for forms and docs.
        start: ``AggregationContext -> Aggregation``.
        uses_previous: the aggregation reads the previous global model, so an all-unchanged
            round cannot be short-cut to "keep the previous file".
        parameters: the hyper-parameters it takes (``aggregation_params``), with their ranges
            and defaults.
        stateful: its aggregations are :class:`StatefulAggregation`: the control plane stores
            their server state with each global model and passes it back.
        trainer_options: ``checked params -> {option: value}``, the options every device's
            trainer of the task is sent for its ``client_term`` (``AssignmentSpec.client_options``;
            FedProx: ``{"mu": μ}``); ``None``: none. A record without a ``client_term`` keeps
            what its ``trainer_options`` meant before client terms existed: ``AssignmentSpec``
            fields, of which there was only ``proximal_mu`` (read as FedProx's term), so a
            plug-in written then still works.
        client_term: builds, in the trainer, what every training step adds from those options
            (:class:`ClientTermFactory`; FedProx's proximal term); ``None``: plain local steps.
            The trainer finds it by the record's name, so the plug-in must be installed on the
            agents too.
    """

    name: str
    label: str
    start: Callable[[AggregationContext], Aggregation]
    uses_previous: bool = False
    parameters: tuple[Parameter, ...] = ()
    stateful: bool = False
    trainer_options: Callable[[Mapping[str, ParamValue]], Mapping[str, TrainerOption]] | None = None
    client_term: ClientTermFactory | None = None

    def assignment_options(self, params: Mapping[str, ParamValue]) -> dict[str, Any]:
        """What every device's assignment of a task aggregated by this record carries, as
        ``AssignmentSpec`` fields: ``{"aggregator": name, "client_options": trainer_options(params)}``
        for a record with a ``client_term`` (the trainer finds the term by that name); an older
        plug-in's ``trainer_options`` as they are for a record with only those (see
        :attr:`trainer_options`); ``{}`` for a record that asks nothing of trainers (the
        assignment is then what it was before aggregators could ask, and agents need not have
        the plug-in).

        Args:
            params: the checked parameters (:meth:`check_params`).
        """
        options = dict(self.trainer_options(params)) if self.trainer_options is not None else {}
        if self.client_term is None:
            return options
        return {"aggregator": self.name, "client_options": options}

    def check_params(self, params: Mapping[str, object] | None) -> dict[str, ParamValue]:
        """``params`` checked against :attr:`parameters`, defaults filled in.

        Raises:
            ValueError: naming ``aggregation_params.<name>`` and the allowed range or names, for
                an unknown name, a missing required value or a value out of range.
        """
        given = dict(params or {})
        declared = {p.name: p for p in self.parameters}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            allowed = ", ".join(declared) or "none"
            raise ValueError(
                f"aggregation_params.{unknown[0]}: {self.name} takes no parameter of that name; allowed: {allowed}"
            )
        checked: dict[str, ParamValue] = {}
        for name, parameter in declared.items():
            if name in given:
                checked[name] = parameter.check(given[name], group="aggregation_params")
            elif parameter.default is not None:
                checked[name] = parameter.default
            else:
                raise ValueError(f"aggregation_params.{name}: required for {self.name}; {parameter.allowed}")
        return checked


AGGREGATOR_REGISTRY: Registry[Aggregator] = Registry("aggregator", "mtfl.aggregators", Aggregator)


def build_client_term(
    aggregator: str | None, options: Mapping[str, TrainerOption], model: torch.nn.Module
) -> ClientTerm | None:
    """The client term an assignment asks for: the ``client_term`` of the aggregator record
    ``aggregator`` (the assignment's :attr:`~workers.protocol.messages.AssignmentSpec.aggregator`),
    built on ``model`` from ``options``; ``None`` when the assignment names no aggregator or its
    record has no client term.

    Raises:
        workers.registry.base.UnknownEntryError: the aggregator is not installed on this host.
        ValueError: as the record's factory, for options it cannot use.
    """
    if aggregator is None:
        return None
    record = AGGREGATOR_REGISTRY.get(aggregator, field="aggregator")
    return record.client_term(model, options) if record.client_term is not None else None


def _fedavg(_ctx: AggregationContext) -> Aggregation:
    return FedAvgAccumulator()


AGGREGATOR_REGISTRY.register(
    Aggregator("fedavg", "FedAvg — the sample-weighted mean of the device models (McMahan et al. 2017)", _fedavg)
)


# Server optimisers (workers.fl.server_opt). Defaults: β1 = 0.9 and β2 = 0.99, the values Reddi
# et al. 2021 fix in their experiments and Flower's. τ = 1e-3: Reddi et al. tune τ (and η) per
# task; 1e-3 is large enough that a tensor the devices barely moved (|Δ| ≪ τ) gets a step ≪ η,
# where Flower's 1e-9 gives it a step of about η, noise amplified to a full step. η = 0.01:
# with v_{−1} = τ² the first adaptive step moves each weight by about η (FedAdam, FedYogi:
# m_0 / √v_0 ≈ sign Δ; FedAdagrad with β1 = 0 alike). Measured on digits (ShuffleNetV2, 3
# devices × 300 samples, batch 32, SGD at 0.05, 8 rounds): η = 0.1 (Flower's) makes FedAdam,
# FedYogi and FedAdagrad diverge (test loss 45 to 6e4 after one round), η = 0.03 throws FedAdam's
# loss to 250 by round 4, η = 0.01 stays bounded in every round (loss ≤ 3.6). FedAdagrad's β1
# defaults to 0: Adagrad (Duchi et al. 2011) has no momentum, nor has Flower's FedAdagrad;
# Algorithm 2 allows one.
#
# FedAvgM: η = 0.5, β = 0.5. Hsu et al. 2019 (§3) read η / (1 − β) as the effective learning
# rate; these defaults keep it at FedAvg's 1. Measured in the same setting: η = 1, β = 0.9
# (effective 10) diverges (test loss 1458 after round 2); η = 0.1, β = 0.9 (effective 1, but
# the momentum takes ~10 rounds to build) reaches 17 % accuracy by round 8; η = 0.5, β = 0.5
# reaches 93 %, FedAvg 90 %.
_SERVER_LEARNING_RATE = "η, the server learning rate"
_BETA1 = Parameter("beta1", "β1, the decay of the first moment m (momentum)", "float", 0.0, 0.999, default=0.9)
_BETA2 = Parameter("beta2", "β2, the decay of the second moment v", "float", 0.0, 0.999, default=0.99)
_TAU = Parameter(
    "tau", "τ, the adaptivity (smaller: more adaptive)", "float", 0.0, 1.0, minimum_open=True, default=1e-3
)
_ADAPTIVE_ETA = Parameter(
    "server_learning_rate", _SERVER_LEARNING_RATE, "float", 0.0, 10.0, minimum_open=True, default=0.01
)
# The two conventions where Flower (1.x, flwr/server/strategy/fedadam.py, fedyogi.py, fedadagrad.py)
# differs from Reddi et al. 2021's Algorithm 2 (workers.fl.server_opt's docstring gives both and
# why FedAdagrad takes no bias correction). The defaults are Algorithm 2's, so an experiment
# stored before these parameters existed aggregates as it did.
_INITIAL_V = Parameter(
    "initial_v",
    "v₋₁, where the second moment starts: tau_squared (τ², Reddi et al. 2021) or zero (Flower)",
    "choice",
    choices=server_opt.INITIAL_V,
    default="tau_squared",
)
_BIAS_CORRECTION = Parameter(
    "bias_correction",
    "Adam's bias correction η·√(1−β2^(t+1))/(1−β1^(t+1)) as Flower's FedAdam (off: Reddi et al. 2021, none)",
    "bool",
    default=False,
)


def _server_optimizer(name: str) -> Callable[[AggregationContext], Aggregation]:
    """A ``start`` for the server optimiser ``name`` of :mod:`workers.fl.server_opt`; its options
    are checked again against the record (so an unchecked ``{}`` gets the defaults)."""

    def start(ctx: AggregationContext) -> Aggregation:
        classes: dict[str, Callable[..., Aggregation]] = {
            "fedavgm": server_opt.FedAvgM,
            "fedadagrad": server_opt.FedAdagrad,
            "fedadam": server_opt.FedAdam,
            "fedyogi": server_opt.FedYogi,
        }
        options = AGGREGATOR_REGISTRY.get(name).check_params(ctx.options)
        return classes[name](ctx.previous, ctx.state, **options)

    return start


AGGREGATOR_REGISTRY.register(
    Aggregator(
        "fedavgm",
        "FedAvgM — FedAvg with server momentum: v ← βv + Δ, W ← W + ηv (Hsu et al. 2019)",
        _server_optimizer("fedavgm"),
        uses_previous=True,
        parameters=(
            replace(_ADAPTIVE_ETA, default=0.5),
            Parameter("server_momentum", "β, the server momentum", "float", 0.0, 0.999, default=0.5),
        ),
        stateful=True,
    )
)
AGGREGATOR_REGISTRY.register(
    Aggregator(
        "fedadagrad",
        "FedAdagrad — Adagrad on the server over the mean device update (Reddi et al. 2021)",
        _server_optimizer("fedadagrad"),
        uses_previous=True,
        parameters=(_ADAPTIVE_ETA, replace(_BETA1, default=0.0), _TAU, _INITIAL_V),
        stateful=True,
    )
)
AGGREGATOR_REGISTRY.register(
    Aggregator(
        "fedadam",
        "FedAdam — Adam on the server over the mean device update (Reddi et al. 2021)",
        _server_optimizer("fedadam"),
        uses_previous=True,
        parameters=(_ADAPTIVE_ETA, _BETA1, _BETA2, _TAU, _BIAS_CORRECTION, _INITIAL_V),
        stateful=True,
    )
)
AGGREGATOR_REGISTRY.register(
    Aggregator(
        "fedyogi",
        "FedYogi — Yogi on the server over the mean device update (Reddi et al. 2021)",
        _server_optimizer("fedyogi"),
        uses_previous=True,
        parameters=(_ADAPTIVE_ETA, _BETA1, _BETA2, _TAU, _BIAS_CORRECTION, _INITIAL_V),
        stateful=True,
    )
)


def fedprox_trainer_options(params: Mapping[str, ParamValue]) -> dict[str, TrainerOption]:
    """FedProx's trainer options: its ``mu``, as a float."""
    return {"mu": float(params["mu"])}


def proximal_client_term(model: torch.nn.Module, options: Mapping[str, TrainerOption]) -> ClientTerm | None:
    """FedProx's client term (:func:`workers.fl.fedprox.proximal_term`): ``μ/2·||w − w_global||²``
    with ``μ = options["mu"]``, ``None`` for ``μ = 0``. A plug-in aggregator whose devices should
    train FedProx's way declares it as its ``client_term`` too."""
    # deferred: torch, imported only in a trainer (the control plane reads this registry too).
    from workers.fl.fedprox import proximal_term

    return proximal_term(model, options)


# FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks", MLSys): the
# devices minimise F_k(w) + μ/2 ||w − w_global||² (eq. 2, Algorithm 2); the server averages as
# FedAvg does. The paper tunes μ over {0.001, 0.01, 0.1, 1} per data set; 0.01 is the middle of that grid.
AGGREGATOR_REGISTRY.register(
    Aggregator(
        "fedprox",
        "FedProx — FedAvg with the proximal term μ/2·||w − w_global||² in every device's loss (Li et al. 2020)",
        _fedavg,
        parameters=(Parameter("mu", "μ, the weight of the proximal term", "float", 0.0, 1000.0, default=0.01),),
        trainer_options=fedprox_trainer_options,
        client_term=proximal_client_term,
    )
)
