"""The lab load test's figures, computed from time intervals (``benchmarks/lab_queue.py``).

Pure functions on intervals ``(start, end)`` in seconds (any common origin), no Django: the
benchmark reads the intervals from the database (``DeviceLease`` rows: who held which device
when; ``Round.queued_at`` / ``started_at``: when a round waited) and these turn them into

- the **contention window** (:func:`all_waiting_window`): the instants at which *every* user had
  at least one round waiting (``queued``);
- each user's **leased device-seconds** inside a window (:func:`leased_seconds`);
- **Jain's fairness index** over those (:func:`jain_index`);
- **device idle time while rounds wait** (:func:`idle_while_waiting`): time a device was free
  while a waiting round could have used it;
- whether a round **found free devices** when it was queued (:func:`found_free`), for the
  dispatch latency.

An interval is half-open, ``[start, end)``; one with ``end <= start`` is empty and ignored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

Interval = tuple[float, float]
K = TypeVar("K", bound=Hashable)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint, non-empty intervals (touching ones merged)."""
    merged: list[list[float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The instants in both ``a`` and ``b`` (each any intervals), as sorted disjoint intervals."""
    left, right = union(a), union(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(left) and j < len(right):
        start = max(left[i][0], right[j][0])
        end = min(left[i][1], right[j][1])
        if end > start:
            out.append((start, end))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The instants in ``a`` and not in ``b``, as sorted disjoint intervals."""
    out: list[Interval] = []
    cut = union(b)
    for start, end in union(a):
        cursor = start
        for s, e in cut:
            if e <= cursor or s >= end:
                continue
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
            if cursor >= end:
                break
        if cursor < end:
            out.append((cursor, end))
    return out


def length(intervals: Iterable[Interval]) -> float:
    """Total length of the union of ``intervals``, seconds."""
    return sum(e - s for s, e in union(intervals))


def all_waiting_window(waiting: Mapping[K, Iterable[Interval]], users: Iterable[K]) -> list[Interval]:
    """The instants at which every one of ``users`` had at least one round waiting.

    Each user's waiting time is the union of their rounds' waiting intervals (``[queued_at,
    started_at)``, or up to its cancellation or the end of the measurement for a round that never
    started); the window is the intersection of those unions over all users. It can be several
    disjoint intervals: a user whose every run is between two rounds (aggregating) has nothing
    waiting for that moment, and the window pauses.

    Args:
        waiting: ``{user: waiting intervals of their rounds}``; a user missing from it never waited.
        users: every user who counts (a user who never waited makes the window empty).

    Returns:
        Sorted disjoint intervals; empty when some user never waited at the same time as the others.
    """
    window: list[Interval] | None = None
    for user in users:
        mine = union(waiting.get(user, ()))
        window = mine if window is None else intersect(window, mine)
        if not window:
            return []
    return window or []


def leased_seconds(leases: Mapping[K, Iterable[Interval]], window: Sequence[Interval]) -> dict[K, float]:
    """Each user's device-seconds leased inside ``window``.

    Args:
        leases: ``{user: one interval per lease}`` (a lease is one device held by one round, so
            leases of one user overlap when they hold several devices: they add up, not merge).
        window: sorted disjoint intervals (:func:`all_waiting_window`).

    Returns:
        ``{user: Σ over the user's leases of |lease ∩ window|}``, seconds.
    """
    return {user: sum(length(intersect([lease], window)) for lease in spans) for user, spans in leases.items()}


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``J = (Σx)² / (n · Σx²)`` (Jain, Chiu and Hawe, DEC-TR-301, 1984).

    1 when every ``x`` is equal; ``1/n`` when one takes everything.

    Raises:
        ValueError: ``values`` is empty, has a negative value, or is all zero (no share to judge).
    """
    if not values:
        raise ValueError("values: need at least one value")
    if any(x < 0 for x in values):
        raise ValueError(f"values must be >= 0, got {min(values)}")
    squares = sum(x * x for x in values)
    if squares == 0:
        raise ValueError("values are all zero: nobody held a device in the window")
    return sum(values) ** 2 / (len(values) * squares)


def idle_while_waiting(
    busy: Mapping[K, Iterable[Interval]],
    waiting: Iterable[tuple[Interval, Iterable[K]]],
    *,
    span: Interval,
    paused: Mapping[K, Iterable[Interval]] | None = None,
) -> dict[K, list[Interval]]:
    """When each device was free while a waiting round could have used it.

    A device is free when it holds no lease and is not paused; a waiting round could use it when
    the device is one the round names (its participants) or one of its pool's candidates. No
    account is taken of whether the round could have started there (a pool round needing two
    devices when one is free counts that one as idle): what the lab wants is no device idle while
    anything waits for it.

    Args:
        busy: ``{device: lease intervals}``; every device of the fleet must be a key.
        waiting: ``(waiting interval, the devices the round could use)`` per waiting round.
        span: the measured span; only instants inside it count.
        paused: ``{device: paused intervals}`` (none by default).

    Returns:
        ``{device: its idle intervals}`` (sorted, disjoint; empty lists included), whose lengths
        summed are the idle time.
    """
    wanted: dict[K, list[Interval]] = {device: [] for device in busy}
    for interval, devices in waiting:
        for device in devices:
            if device in wanted:
                wanted[device].append(interval)
    idle: dict[K, list[Interval]] = {}
    for device, held in busy.items():
        free = subtract([span], [*held, *((paused or {}).get(device, ()))])
        idle[device] = intersect(free, wanted[device])
    return idle


def found_free(busy: Mapping[K, Iterable[Interval]], candidates: Iterable[K], slots: int, at: float) -> bool:
    """Whether at least ``slots`` of ``candidates`` held no lease at instant ``at`` (a round
    queued then could have been granted at once).

    Raises:
        ValueError: ``slots < 1``.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    free = sum(1 for d in candidates if not any(s <= at < e for s, e in busy.get(d, ())))
    return free >= slots
