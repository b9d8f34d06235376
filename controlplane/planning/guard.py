"""The planner's guard: before a predictor-driven run starts, say where its predictor is not to
be trusted, so a researcher does not read a plan made from a poor model as the method's result.

A device's predictor is **untrusted** when

* its held-out RMSLE (the fitted family's cross-validated error,
  :mod:`controlplane.planning.predictor.fit`) is above ``max_rmsle`` (the setting
  ``MTFL_PREDICTOR_MAX_RMSLE``, default :data:`DEFAULT_MAX_RMSLE`), or unknown; or
* the device's mix is outside what the predictor was fitted on: more tasks than any profiled
  configuration held, or (for two or more tasks) a model that was never profiled beside
  another one — the predictor then extrapolates the contention it has never seen.

What the run does about it is the experiment's choice (``Experiment.untrusted_predictor``):

* ``plan`` — plan anyway; the warnings are stored on the run and shown.
* ``baseline`` — run the best baseline's plan instead (the baseline with the highest measured FL
  throughput among the experiment's finished runs, else ``sharing``, MPS's default).
* ``measure`` — run that baseline's plan in round 0, then replan from round 1 on with the
  predictor corrected by what round 0 measured (:mod:`controlplane.planning.closed_loop`).

Pure: no Django, no torch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

UNTRUSTED_PREDICTOR_CHOICES: tuple[str, ...] = ("plan", "baseline", "measure")
"""What a predictor-driven run may do when its predictor is untrusted (module docstring)."""

DEFAULT_MAX_RMSLE = 0.2
"""Held-out RMSLE above which a predictor is untrusted (``MTFL_PREDICTOR_MAX_RMSLE``)."""

FALLBACK_BASELINE = "sharing"
"""The baseline run when no baseline of the experiment has been measured yet: every task gets
the whole device, MPS's default, the best baseline in the paper's measurements (Yu et al. 2022,
Fig. 4) and in ours."""


@dataclass(frozen=True)
class PredictorFacts:
    """What the guard needs to know about one device's predictor and mix.

    Attributes:
        device: the device's name (for the message).
        predictor: the predictor's label, e.g. ``"v3 (simulated-titan-v)"``.
        heldout_rmsle: its held-out RMSLE, ``None`` if unknown.
        mix: the models the device trains together in this experiment.
        largest_fitted_mix: the most tasks any configuration it was fitted on held.
        colocated_models: the models profiled in at least one configuration of 2+ tasks.
    """

    device: str
    predictor: str
    heldout_rmsle: float | None
    mix: Sequence[str]
    largest_fitted_mix: int
    colocated_models: Collection[str]


def predictor_warnings(facts: Sequence[PredictorFacts], *, max_rmsle: float = DEFAULT_MAX_RMSLE) -> list[str]:
    """One sentence per reason a device's predictor is untrusted (module docstring).

    Predictors shared by several devices are reported once for their error, and once per
    distinct mix outside what they were fitted on.

    Args:
        facts: one entry per planned device.
        max_rmsle: the held-out RMSLE above which a predictor is untrusted.

    Returns:
        The warnings, in device order; empty when every predictor is trusted.
    """
    out: list[str] = []
    said: set[tuple[str, ...]] = set()
    for f in facts:
        if f.heldout_rmsle is None or f.heldout_rmsle > max_rmsle:
            key: tuple[str, ...] = ("rmsle", f.predictor)
            if key not in said:
                said.add(key)
                error = "unknown" if f.heldout_rmsle is None else f"{f.heldout_rmsle:.3f}"
                out.append(
                    f"predictor {f.predictor} of device {f.device} has a held-out RMSLE of {error}, above the "
                    f"threshold {max_rmsle:g} (MTFL_PREDICTOR_MAX_RMSLE): its plans may be far from what the "
                    "device does; profile longer (`mtfl profile --budget`) and refit"
                )
        mix = tuple(sorted(f.mix))
        if len(mix) > f.largest_fitted_mix:
            key = ("size", f.predictor, *mix)
            if key not in said:
                said.add(key)
                out.append(
                    f"device {f.device} trains {len(mix)} tasks together but predictor {f.predictor} was fitted on "
                    f"configurations of at most {f.largest_fitted_mix}: the contention of larger mixes is "
                    "extrapolated; profile with a larger --max-mix"
                )
        elif len(mix) >= 2:
            unseen = sorted(set(mix) - set(f.colocated_models))
            key = ("unseen", f.predictor, *unseen)
            if unseen and key not in said:
                said.add(key)
                out.append(
                    f"device {f.device}: predictor {f.predictor} never saw {', '.join(unseen)} beside another "
                    "task, so its contention with the others is extrapolated; profile those models together"
                )
    return out


def untrusted_choice(value: str) -> str:
    """Check an ``untrusted_predictor`` value.

    Raises:
        ValueError: not one of :data:`UNTRUSTED_PREDICTOR_CHOICES` (the message names them).
    """
    if value not in UNTRUSTED_PREDICTOR_CHOICES:
        raise ValueError(
            f"untrusted_predictor={value!r} is not allowed; allowed: {', '.join(UNTRUSTED_PREDICTOR_CHOICES)}"
        )
    return value
