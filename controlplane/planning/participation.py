"""Partial participation: which devices train in a round (pure NumPy, no Django).

At a few thousand devices FL trains a sample of the clients per round, not all of them
(McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized
Data", Algorithm 1: ``m ← max(C·K, 1)`` clients drawn at random each round). An experiment sets
how many (a count, or a fraction ``C`` of its ``K`` devices) and how they are drawn:

* ``uniform`` — ``m`` of the ``K`` devices without replacement, each equally likely;
* ``weighted`` — ``m`` devices without replacement with probability proportional to each
  device's data volume ``n_j = Σ_i |D_ij|`` (its samples over the experiment's tasks), drawn one
  after another, each draw among the devices not drawn yet with ``p_j = n_j / Σ_{k left} n_k``
  (successive sampling; NumPy's ``Generator.choice(replace=False, p=...)``). A device holding
  no data has ``p_j = 0`` and is drawn only when fewer than ``m`` devices hold data: the draw then
  takes every device that holds data and fills the rest uniformly from those that hold none.

Each round's draw is seeded by ``(experiment seed, round index)`` through NumPy's
``SeedSequence``, so it is the same every time it is made (a resumed run, a retried round, the
run page) and independent of every other round's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from controlplane.common.limits import CLIENT_FRACTION, bound_text
from controlplane.planning.types import Plan

SAMPLING_RULES: tuple[str, ...] = ("uniform", "weighted")
"""How a round's participants are drawn (``Experiment.client_sampling``)."""

PARTICIPATION_STREAM = 23
"""First word of every participation draw's seed, so that the draw never shares a stream with
another use of the experiment's seed (data partitioning, model initialisation)."""


def participant_count(devices: int, *, clients_per_round: int | None, client_fraction: float | None) -> int:
    """How many devices train in a round: ``clients_per_round``, or ``⌈client_fraction × devices⌉``
    (at least 1; McMahan et al. 2017, Algorithm 1, ``m = max(⌈C·K⌉, 1)``), never more than
    ``devices``; ``devices`` when neither is set.

    The product is rounded to 9 decimals before the ceiling, so that a fraction whose binary
    value lies a hair above the decimal one (``0.1 × 30 = 3.0000000000000004``) still gives 3.

    Args:
        devices: ``K``, the experiment's devices (≥ 0).
        clients_per_round: a count ≥ 1, or ``None``.
        client_fraction: ``C`` in :data:`~controlplane.common.limits.CLIENT_FRACTION`, or ``None``.

    Raises:
        ValueError: ``clients_per_round`` below 1 or ``client_fraction`` outside its range
            (the field named), or both set.
    """
    if clients_per_round is not None and client_fraction is not None:
        raise ValueError("clients_per_round and client_fraction are exclusive: set one of them")
    if clients_per_round is not None:
        if clients_per_round < 1:
            raise ValueError(f"clients_per_round={clients_per_round} is out of range: at least 1")
        return min(int(clients_per_round), devices)
    if client_fraction is not None:
        if not CLIENT_FRACTION.contains(client_fraction):
            raise ValueError(
                f"client_fraction={client_fraction} is out of range: greater than {bound_text(CLIENT_FRACTION.low)} "
                f"and at most {bound_text(CLIENT_FRACTION.high)}"
            )
        return min(devices, max(1, math.ceil(round(client_fraction * devices, 9))))
    return devices


def round_rng(seed: int, round_index: int) -> np.random.Generator:
    """The generator of round ``round_index``'s draw: ``SeedSequence([stream, seed, index])``."""
    return np.random.default_rng([PARTICIPATION_STREAM, int(seed), int(round_index)])


def draw_participants(
    device_ids: Sequence[int],
    *,
    count: int,
    rule: str,
    seed: int,
    round_index: int,
    volumes: Mapping[int, int] | None = None,
) -> list[int]:
    """Draw ``count`` distinct devices of ``device_ids`` for round ``round_index``.

    Args:
        device_ids: the experiment's devices (any order: they are sorted first, so the draw
            does not depend on the order a query returned them in).
        count: how many to draw (:func:`participant_count`), 1 to ``len(device_ids)``.
        rule: ``uniform`` or ``weighted`` (see the module's docstring).
        seed: the experiment's seed.
        round_index: the round (0-based).
        volumes: ``{device_id: samples}`` for ``weighted`` (a device left out holds none).

    Returns:
        The drawn ids in increasing order.

    Raises:
        ValueError: an unknown rule (allowed ones listed), ``count`` outside 1..len(device_ids),
            a negative volume.
    """
    if rule not in SAMPLING_RULES:
        raise ValueError(f"client_sampling={rule!r} is not allowed; allowed: {', '.join(SAMPLING_RULES)}")
    ids = np.array(sorted(int(d) for d in device_ids), dtype=np.int64)
    if not 1 <= count <= len(ids):
        raise ValueError(f"cannot draw {count} participants from {len(ids)} devices")
    rng = round_rng(seed, round_index)
    if rule == "uniform":
        return sorted(int(d) for d in rng.choice(ids, size=count, replace=False))
    weights = np.array([float((volumes or {}).get(int(d), 0)) for d in ids])
    if (weights < 0).any():
        raise ValueError("a device's data volume is negative")
    holding = ids[weights > 0]
    if len(holding) <= count:
        # Every device with data trains; the devices without any fill the remaining places.
        rest = ids[weights == 0]
        filled = rng.choice(rest, size=count - len(holding), replace=False)
        return sorted(int(d) for d in [*holding, *filled])
    p = weights / weights.sum()
    return sorted(int(d) for d in rng.choice(ids, size=count, replace=False, p=p))


def plan_of_devices(plan: Plan, device_ids: Collection[int], *, local_epochs: int) -> Plan:
    """The part of ``plan`` a round's participants train: their assignments only, with the
    predicted round time recomputed over them, ``max_j max_i t_ij`` (each assignment's predicted
    seconds; ``E·|D_ij| / P_ij`` where a stored plan has none, docs/DESIGN.md §1; ``None`` when
    an assignment has no prediction, as for the baselines).

    Args:
        plan: a plan of (at least) every participant, e.g. the one a ``vres_*`` run stored at
            creation for every device.
        device_ids: the participants.
        local_epochs: ``E``.
    """
    wanted = set(device_ids)
    kept = tuple(a for a in plan.assignments if a.device_id in wanted)
    predicted = None
    if plan.predicted_round_time_s is not None and kept and all(a.predicted_throughput_sps for a in kept):
        predicted = max(
            a.predicted_seconds
            if a.predicted_seconds is not None
            else local_epochs * a.samples / float(a.predicted_throughput_sps or 1.0)
            for a in kept
        )
    return Plan(
        strategy=plan.strategy,
        partitioning=plan.partitioning,
        assignments=kept,
        predicted_round_time_s=predicted,
        notes=plan.notes,
    )
