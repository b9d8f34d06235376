"""The lab scheduler's decisions, pure: which waiting rounds get which free devices.

Many researchers' runs share one fleet. A round needs all its devices at once (a synchronous FL
round trains them together), so the control plane leases them together
(:mod:`controlplane.lab.services`); this module decides, at each *scheduling pass*
(a round enqueued, a round's devices released, a device resumed), which waiting rounds start
now and on which devices. Data in, decisions out: no Django, no clock.

Policies (``MTFL_SCHEDULER_POLICY``):

- ``fifo`` — waiting rounds in arrival order (``queued_at``).
- ``fair`` — *least weighted attained service first*: the round of the owner with the fewest
  device-seconds leased in the last ``MTFL_FAIR_WINDOW_S`` seconds, divided by the owner's
  weight (:class:`~controlplane.experiments.models.UserShare`), goes first. This is Tiresias's
  least-attained-service rule (Gu et al., NSDI 2019) applied per user instead of per job, with
  weights as in weighted max-min fairness. Why not Themis's finish-time fairness (Mahajan et
  al., NSDI 2020): it needs every run's finish time alone and shared, estimated from the
  predictor, and a wrong estimate (the planner's predictor is not trusted everywhere, issue 22)
  turns into unfairness; attained service is measured, not predicted, and FL rounds are short
  (seconds to minutes), so decisions are frequent and device-time shares converge to the weights
  while every user has work waiting. Within one pass, a round granted counts its predicted
  device-seconds to its owner at once, so a pass that frees many devices shares them out instead
  of giving all to the owner who was behind.

In both, a higher run ``priority`` goes first, and a round whose devices are not all free is
passed over for the next one that fits (backfilling: a device never idles while a round it
could serve waits), so a round needing a busy device cannot hold the others back.

Pools. A round of a run that names a device pool needs ``slots`` devices out of ``candidates``
(the experiment's devices in the pool). The rounds a pass picks (in policy order) are placed on
the pool's free devices by a min-cost bipartite matching of their slots to devices, the cost of a
device being the round's predicted round time on it — AlloX's formulation (Le et al., EuroSys
2020, §4: jobs matched to machines by a min-cost matching of processing times, solved with the
Hungarian method; here :func:`scipy.optimize.linear_sum_assignment`), fairness being the order in
which rounds are admitted to the matching and its tie-breaker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

POLICIES = ("fifo", "fair")
"""The scheduling policies (``MTFL_SCHEDULER_POLICY``)."""

DEFAULT_ROUND_S = 60.0
"""Device-seconds a round is expected to hold each device when nothing predicts it."""

_TIE_S = 1e-3
"""Matching cost added per rank of the round in policy order (seconds): breaks ties between
devices of equal predicted time towards the round that is ahead, without outweighing a real
difference in predicted round time."""


@dataclass(frozen=True)
class WaitingRound:
    """A round waiting for devices.

    Attributes:
        key: the round's id.
        owner: the user its device-time counts to (``None``: nobody's; such rounds share one
            account).
        priority: in :data:`~controlplane.common.limits.PRIORITY`; higher first.
        queued_at: when it was enqueued, seconds since the epoch.
        devices: the exact devices it needs (a run on named devices, or its drawn participants);
            ``None`` for a pool round.
        pool: the pool a pool round is placed in; ``None`` otherwise.
        candidates: a pool round's devices it may train on (the experiment's devices in the pool).
        slots: how many of ``candidates`` a pool round needs (its participants per round).
        cost_s: predicted round time on each candidate device, seconds (missing: ``expected_s``).
        expected_s: predicted round time, seconds (``None``: unknown, :data:`DEFAULT_ROUND_S`).
    """

    key: int
    owner: int | None
    priority: int
    queued_at: float
    devices: frozenset[int] | None = None
    pool: int | None = None
    candidates: frozenset[int] = frozenset()
    slots: int = 0
    cost_s: Mapping[int, float] = field(default_factory=dict)
    expected_s: float | None = None

    @property
    def width(self) -> int:
        """How many devices it holds while it runs."""
        return len(self.devices) if self.devices is not None else self.slots

    @property
    def round_s(self) -> float:
        """Its expected round time, seconds: ``expected_s``, or :data:`DEFAULT_ROUND_S` when unknown."""
        return self.expected_s if self.expected_s and self.expected_s > 0 else DEFAULT_ROUND_S

    @property
    def device_seconds(self) -> float:
        """Device-seconds it is expected to hold: width × expected round time."""
        return self.width * self.round_s


def owner_usage(
    leases: Iterable[tuple[int | None, float, float | None]], *, now: float, window_s: float
) -> dict[int | None, float]:
    """Device-seconds each owner held in the window ``[now - window_s, now]``.

    Args:
        leases: ``(owner, granted_at, released_at)`` per lease, seconds since the epoch;
            ``released_at`` ``None`` while held (counted up to ``now``).

    Returns:
        ``{owner: device-seconds}`` for owners with time in the window.
    """
    start = now - window_s
    usage: dict[int | None, float] = {}
    for owner, granted, released in leases:
        held = min(now, released if released is not None else now) - max(start, granted)
        if held > 0:
            usage[owner] = usage.get(owner, 0.0) + held
    return usage


def _fifo_key(r: WaitingRound) -> tuple[float, ...]:
    return (-r.priority, r.queued_at, r.key)


def order_waiting(
    waiting: Sequence[WaitingRound],
    *,
    policy: str,
    usage: Mapping[int | None, float] | None = None,
    weights: Mapping[int | None, float] | None = None,
) -> list[WaitingRound]:
    """Waiting rounds in the order ``policy`` serves them, were every device free (the queue's
    order as a page shows it): ``fifo`` by priority then arrival; ``fair`` by priority then
    weighted attained service (``usage / weight``, each round served adding its expected
    device-seconds to its owner), then arrival.

    Raises:
        ValueError: an unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "fifo":
        return sorted(waiting, key=_fifo_key)
    served = dict(usage or {})
    left = sorted(waiting, key=_fifo_key)
    ordered: list[WaitingRound] = []
    while left:
        best = min(left, key=lambda r: (-r.priority, _share(served, weights, r.owner), r.queued_at, r.key))
        left.remove(best)
        ordered.append(best)
        served[best.owner] = served.get(best.owner, 0.0) + best.device_seconds
    return ordered


def _share(usage: Mapping[int | None, float], weights: Mapping[int | None, float] | None, owner: int | None) -> float:
    weight = (weights or {}).get(owner, 1.0)
    return usage.get(owner, 0.0) / (weight if weight > 0 else 1.0)


def schedule_pass(
    waiting: Sequence[WaitingRound],
    *,
    busy: Iterable[int],
    pool_devices: Mapping[int, Iterable[int]] | None = None,
    policy: str,
    usage: Mapping[int | None, float] | None = None,
    weights: Mapping[int | None, float] | None = None,
) -> dict[int, list[int]]:
    """Which waiting rounds start now, and on which devices.

    Rounds are considered one at a time in ``policy`` order (:func:`order_waiting`, the fair
    order recomputed as rounds are granted); a round on named devices starts when all of them
    are free, a pool round when its slots can be matched to free candidates together with the
    pool rounds admitted before it (:func:`place_pool_rounds`); a round that cannot start is
    passed over (backfilling).

    Args:
        busy: devices that cannot be leased now (held, or paused by an admin).
        pool_devices: ``{pool: its devices}`` (paused ones included; ``busy`` rules them out).

    Returns:
        ``{round key: device ids}`` for the rounds to lease now (device ids sorted).

    Raises:
        ValueError: an unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    taken = set(busy)
    served = dict(usage or {})
    left = list(order_waiting(waiting, policy="fifo"))
    granted: dict[int, list[int]] = {}
    admitted: dict[int, list[WaitingRound]] = {}
    placed: dict[int, dict[int, list[int]]] = {}
    pools = {p: set(ds) for p, ds in (pool_devices or {}).items()}
    while left:
        if policy == "fair":
            r = min(left, key=lambda r: (-r.priority, _share(served, weights, r.owner), r.queued_at, r.key))
        else:
            r = left[0]
        left.remove(r)
        if r.devices is not None:
            # The devices of the pool rounds admitted before it are theirs: the pool's matching
            # may move them within the pool, never hand them to a round served later.
            reserved = {d for placement in placed.values() for ds in placement.values() for d in ds}
            if not r.devices or r.devices & (taken | reserved):
                continue
            taken |= r.devices
            granted[r.key] = sorted(r.devices)
        else:
            if r.pool is None or r.slots < 1:
                continue
            # A device is in one pool at most, so only named-device rounds take from this one.
            free = sorted(pools.get(r.pool, set()) - taken)
            trial = place_pool_rounds([*admitted.get(r.pool, []), r], free)
            if trial is None:
                continue
            admitted.setdefault(r.pool, []).append(r)
            placed[r.pool] = trial
        served[r.owner] = served.get(r.owner, 0.0) + r.device_seconds
    for placement in placed.values():
        granted.update(placement)
    return granted


def place_pool_rounds(rounds: Sequence[WaitingRound], free: Sequence[int]) -> dict[int, list[int]] | None:
    """Place pool rounds on free devices by a min-cost bipartite matching (AlloX, Le et al. 2020).

    Each round contributes ``slots`` rows, each free device a column; the cost of a row of round
    ``r`` at device ``d`` is ``r.cost_s[d]`` (its predicted round time there; ``r.expected_s`` or
    :data:`DEFAULT_ROUND_S` when not predicted) plus ``rank × 1 ms`` (the earlier-admitted round
    wins a tie), and a device not among ``r.candidates`` cannot take it. Solved exactly with
    :func:`scipy.optimize.linear_sum_assignment` (the Hungarian method's successor, O(n³) in
    the pool's size).

    Returns:
        ``{round key: its devices, sorted}``, or ``None`` when not every slot of every round can
        be given a distinct free candidate.
    """
    rows = [(rank, r) for rank, r in enumerate(rounds) for _ in range(r.slots)]
    if not rows:
        return {}
    if len(rows) > len(free):
        return None
    infeasible = 1e12
    cost = np.full((len(rows), len(free)), infeasible)
    for i, (rank, r) in enumerate(rows):
        fallback = r.round_s
        for j, device in enumerate(free):
            if device in r.candidates:
                cost[i, j] = float(r.cost_s.get(device, fallback)) + rank * _TIE_S
    row_index, col_index = linear_sum_assignment(cost)
    if np.any(cost[row_index, col_index] >= infeasible):
        return None
    placement: dict[int, list[int]] = {r.key: [] for r in rounds}
    for i, j in zip(row_index, col_index, strict=True):
        placement[rows[i][1].key].append(free[j])
    return {key: sorted(devices) for key, devices in placement.items()}


def estimate_starts(
    waiting: Sequence[WaitingRound],
    *,
    free_at: Mapping[int, float],
    now: float,
    pool_devices: Mapping[int, Iterable[int]] | None = None,
    paused: Iterable[int] = (),
    policy: str,
    usage: Mapping[int | None, float] | None = None,
    weights: Mapping[int | None, float] | None = None,
) -> dict[int, float | None]:
    """When each waiting round is expected to start, by replaying :func:`schedule_pass` at each
    time a device is expected to come free (held devices at ``free_at``, a started round's
    devices after its ``expected_s``), with nothing else arriving.

    Args:
        free_at: ``{device: expected release time}`` of the held devices, seconds since the epoch
            (a time in the past means any moment now).
        now: the current time, seconds since the epoch.
        paused: devices no round gets until an admin resumes them.

    Returns:
        ``{round key: expected start (seconds since the epoch)}``; ``None`` for a round that no
        replayed pass can start (it needs a paused device, or more devices than its pool has).
    """
    busy_until = {d: max(now, t) for d, t in free_at.items()}
    blocked = set(paused)
    served = dict(usage or {})
    left = list(waiting)
    starts: dict[int, float | None] = {}
    clock = now
    for _ in range(len(waiting) + len(busy_until) + 1):
        if not left:
            break
        busy = blocked | {d for d, t in busy_until.items() if t > clock}
        granted = schedule_pass(
            left, busy=busy, pool_devices=pool_devices, policy=policy, usage=served, weights=weights
        )
        by_key = {r.key: r for r in left}
        for key, devices in granted.items():
            r = by_key[key]
            starts[key] = clock
            for d in devices:
                busy_until[d] = clock + r.round_s
            served[r.owner] = served.get(r.owner, 0.0) + r.device_seconds
        left = [r for r in left if r.key not in granted]
        later = [t for d, t in busy_until.items() if t > clock and d not in blocked]
        if not later:
            break
        clock = min(later)
    for r in left:
        starts[r.key] = None
    return starts
