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

Apart from trust, the guard says when a GPU device is **host-bound** (:func:`host_bound_warnings`,
issue 31): its profile samples show the GPU mostly idle while training, or the host's time to
issue a step taking most of the step. There the CPU launching operations one by one sets the
pace, time-slicing already interleaves the tasks' mostly idle queues for free, and no share of
the GPU's SMs (MPS, the ``vres_*`` plans) can make a task faster: NVIDIA's guidance is that MPS
pays when each process keeps the GPU busy ("When to use MPS", the MPS documentation). That
warning is advice, not distrust: the run plans as the experiment says.

Pure: no Django, no torch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from statistics import median

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


MAX_HOST_BOUND_GPU_BUSY = 0.5
"""Median GPU busy fraction (NVML utilisation over a timed window) below which a device's GPU
is called mostly idle while training."""

MIN_HOST_BOUND_SHARE = 0.8
"""Median share of a step's wall time the host spends issuing it (``host_step_s`` × iterations/s)
from which a device's steps are called host-bound."""


@dataclass(frozen=True)
class RegimeFacts:
    """What a GPU device's recent profile samples say about where its steps spend their time.

    Attributes:
        device: the device's name (for the message).
        gpu_busy_fractions: each sample's GPU busy fraction (0-1) over its timed window
            (:attr:`workers.protocol.messages.ProfileMeasurement.gpu_busy_fraction`); empty when
            none was measured.
        host_step_shares: each sample's ``host_step_s × throughput_sps / batch_size``: the share
            of its step's wall time the host spent issuing it (may exceed 1 by measurement noise);
            empty when no host time was measured.
        execution_mode: the mode the samples ran in (``eager``, ``graphs``), ``""`` if unreported.
    """

    device: str
    gpu_busy_fractions: Sequence[float]
    host_step_shares: Sequence[float]
    execution_mode: str = ""


def host_bound_warnings(
    facts: Sequence[RegimeFacts],
    *,
    max_gpu_busy: float = MAX_HOST_BOUND_GPU_BUSY,
    min_host_share: float = MIN_HOST_BOUND_SHARE,
) -> list[str]:
    """One sentence per device whose samples are host-bound (module docstring): the median GPU
    busy fraction is below ``max_gpu_busy``, or the median host share of a step is at least
    ``min_host_share``. A device with neither figure measured (no samples from a GPU, or from a
    trainer that did not report them) gets no warning.

    Args:
        facts: one entry per GPU device (the cpu backend's host share is the whole step by
            definition and says nothing about a regime: leave such devices out).
        max_gpu_busy: in ``[0, 1]``.
        min_host_share: in ``[0, 1]``.

    Returns:
        e.g. ``"device gpu-a is host-bound (GPU busy 30 %, host 92 % of each step, eager): ..."``,
        in device order; empty when no device is host-bound.

    Raises:
        ValueError: ``max_gpu_busy`` or ``min_host_share`` outside ``[0, 1]`` (naming it).
    """
    for name, value in (("max_gpu_busy", max_gpu_busy), ("min_host_share", min_host_share)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    out: list[str] = []
    for f in facts:
        busy = median(f.gpu_busy_fractions) if f.gpu_busy_fractions else None
        host = median(f.host_step_shares) if f.host_step_shares else None
        idle = busy is not None and busy < max_gpu_busy
        launching = host is not None and host >= min_host_share
        if not (idle or launching):
            continue
        seen = [
            *([f"GPU busy {100 * busy:.0f} %"] if busy is not None else []),
            *([f"host {100 * host:.0f} % of each step"] if host is not None else []),
            *([f.execution_mode] if f.execution_mode else []),
        ]
        advice = "use execution_mode graphs or larger batches"
        if f.execution_mode == "graphs":
            advice = "use larger batches"  # the launches are already one graph per step
        out.append(
            f"device {f.device} is host-bound ({', '.join(seen)}): co-location cannot gain there, the GPU waits "
            f"for the host to issue each step whatever its share; {advice}"
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
