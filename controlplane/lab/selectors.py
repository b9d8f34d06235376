"""Reads of the shared lab's queue: who holds which device, which rounds wait and when they are
expected to start (the queue page, ``GET /api/queue/``, ``mtfl queue``, a run's queued banner).

The order is the scheduler's (:func:`controlplane.planning.scheduling.order_waiting` with the
lab's policy and each owner's device-seconds in the window) and the expected starts replay its
passes (:func:`controlplane.planning.scheduling.estimate_starts`) from when each held device is
expected to come free: its round's start plus its predicted round time, else the wall time of
the run's previous round, else :data:`~controlplane.planning.scheduling.DEFAULT_ROUND_S` (what
the scheduler itself assumes of a round nothing predicts, so a holder and a waiting round are
expected alike; a holder past its expected end is expected free any moment).

Bounded at any fleet size: a fixed number of queries (no query per device, round or run), and
only devices that are held, paused or named by a waiting round are listed, at most
:data:`MAX_DEVICES_LISTED` of them (the rest are counted).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Prefetch, Q, QuerySet
from django.utils import timezone

from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Round, Run
from controlplane.fleet.models import Device, DevicePool
from controlplane.lab.services.leases import held_leases
from controlplane.lab.services.scheduler import lab_usage, waiting_rounds
from controlplane.planning.scheduling import DEFAULT_ROUND_S, WaitingRound, estimate_starts, order_waiting
from controlplane.profiling.selectors import sweeps_in_progress

MAX_DEVICES_LISTED = 200
"""The most device rows a queue answer lists (held and paused devices first, then those the
first rounds in the queue wait for); ``devices_listed`` / ``devices_involved`` say how many."""

MAX_WAITING_LISTED = 500
"""The most waiting rounds a queue answer lists, in queue order; ``waiting_total`` counts all."""

MAX_NAMES = 5
"""Device names given per waiting round, and blockers per round; counts say how many more."""

MAX_WAITING_PER_DEVICE = 10
"""Waiting rounds named per device row (in queue order); ``waiting_count`` counts all."""

_FINISHED = (Round.Status.SUCCEEDED, Round.Status.PARTIAL)


def _ts(value: float | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromtimestamp(value, tz=dt.UTC)


def _holders(now: dt.datetime) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """The held devices and the rounds holding them.

    Returns:
        ``({device id: {"round", "granted_at"}}, {round id: holder dict})``; a holder dict has
        the run, its strategy, experiment (id, name), owner id, round index, ``since`` (the
        first lease's grant) and ``expected_free_at`` (see the module).
    """
    by_device: dict[int, dict[str, Any]] = {}
    first_grant: dict[int, dt.datetime] = {}
    for device_id, round_id, granted_at in held_leases().values_list("device_id", "round_id", "granted_at"):
        by_device[device_id] = {"round": round_id, "granted_at": granted_at}
        first_grant[round_id] = min(granted_at, first_grant.get(round_id, granted_at))
    round_ids = set(first_grant)
    rounds = (
        Round.objects.filter(id__in=round_ids)
        .select_related("run__experiment")
        .only(
            "id",
            "index",
            "started_at",
            "predicted_round_time_s",
            "run__id",
            "run__strategy",
            "run__experiment__id",
            "run__experiment__name",
            "run__experiment__owner_id",
        )
    )
    rounds = list(rounds)
    last_wall = _previous_wall_times(rounds)
    holders: dict[int, dict[str, Any]] = {}
    for rnd in rounds:
        since = first_grant.get(rnd.id, now)
        started = rnd.started_at or since
        expected = rnd.predicted_round_time_s or last_wall.get(rnd.run_id) or DEFAULT_ROUND_S
        holders[rnd.id] = {
            "run": rnd.run_id,
            "run_strategy": rnd.run.strategy,
            "experiment": rnd.run.experiment_id,
            "experiment_name": rnd.run.experiment.name,
            "owner_id": rnd.run.experiment.owner_id,
            "round": rnd.id,
            "round_index": rnd.index,
            "since": since,
            "expected_free_at": started + dt.timedelta(seconds=float(expected)),
        }
    return by_device, holders


def _previous_wall_times(rounds: Iterable[Round]) -> dict[int, float]:
    """Per run, the wall time of the round before each of ``rounds`` when it finished (one
    query reading one row per round)."""
    previous = Q()
    for rnd in rounds:
        if rnd.index > 0:
            previous |= Q(run_id=rnd.run_id, index=rnd.index - 1)
    if not previous:
        return {}
    rows = Round.objects.filter(previous, status__in=_FINISHED, wall_time_s__gt=0).values_list("run_id", "wall_time_s")
    return {run_id: float(wall_s) for run_id, wall_s in rows}


def _usernames(user_ids: Iterable[int | None]) -> dict[int, str]:
    ids = {u for u in user_ids if u is not None}
    if not ids:
        return {}
    return dict(get_user_model().objects.filter(id__in=ids).values_list("id", "username"))


def _profiling(now: dt.datetime) -> dict[int, dict[str, Any]]:
    """``{device id: {"sweep", "since", "expected_end"}}`` of the devices with a profiling sweep
    pending or running (the lab scheduler grants them to no round); the expected end is the
    sweep's start (or creation) plus its budget, never before ``now``."""
    out: dict[int, dict[str, Any]] = {}
    for sweep_id, device_id, created_at, started_at, budget_s in sweeps_in_progress().values_list(
        "id", "device_id", "created_at", "started_at", "budget_s"
    ):
        since = started_at or created_at
        end = max(now, since + dt.timedelta(seconds=float(budget_s)))
        out[device_id] = {"sweep": sweep_id, "since": since, "expected_end": end}
    return out


@dataclass(frozen=True)
class _Schedule:
    """The scheduler's view of the lab now, which every part of a queue answer reads.

    ``held`` and ``holders`` are :func:`_holders`'s; ``profiling`` is :func:`_profiling`'s;
    ``free_at`` is when each held or profiled device is expected free (seconds since the epoch);
    ``starts`` is :func:`~controlplane.planning.scheduling.estimate_starts`'s answer (round id →
    seconds since the epoch, or None).
    """

    now: dt.datetime
    policy: str
    ordered: list[WaitingRound]
    held: dict[int, dict[str, Any]]
    holders: dict[int, dict[str, Any]]
    paused: set[int]
    profiling: dict[int, dict[str, Any]]
    free_at: dict[int, float]
    starts: dict[int, float | None]

    def busy(self, device_id: int) -> bool:
        """Whether the device is held, paused or being profiled."""
        return device_id in self.held or device_id in self.paused or device_id in self.profiling


def _schedule(now: dt.datetime) -> _Schedule:
    """The waiting rounds in the policy's order, who holds what, and the replayed starts."""
    policy = str(mtfl_setting("SCHEDULER_POLICY"))
    waiting = waiting_rounds()
    usage: dict[int | None, float]
    weights: dict[int | None, float]
    usage, weights = lab_usage(now=now) if policy == "fair" and waiting else ({}, {})
    ordered = order_waiting(waiting, policy=policy, usage=usage, weights=weights)
    held, holders = _holders(now)
    paused = set(Device.objects.filter(paused=True).values_list("id", flat=True))
    pool_ids = {r.pool for r in waiting if r.pool is not None}
    pool_devices: dict[int, list[int]] = defaultdict(list)
    for device_id, pool_id in Device.objects.filter(pool_id__in=pool_ids).values_list("id", "pool_id"):
        pool_devices[pool_id].append(device_id)
    free_at = {d: holders[h["round"]]["expected_free_at"].timestamp() for d, h in held.items() if h["round"] in holders}
    profiling = _profiling(now)
    for d, sweep in profiling.items():
        # The scheduler grants no round a device whose sweep is pending or running: it is free
        # for them when the sweep's budget has run out (or later, if a round holds it too).
        free_at[d] = max(free_at.get(d, 0.0), sweep["expected_end"].timestamp())
    starts = estimate_starts(
        ordered,
        free_at=free_at,
        now=now.timestamp(),
        pool_devices=pool_devices,
        paused=paused,
        policy=policy,
        usage=usage,
        weights=weights,
    )
    return _Schedule(now, policy, ordered, held, holders, paused, profiling, free_at, starts)


def _waiting_details(listed_rounds: list[WaitingRound]) -> dict[int, Round]:
    """The listed waiting rounds' rows (index, arrival, run, experiment, pool), by round id."""
    return {
        r.id: r
        for r in Round.objects.filter(id__in=[w.key for w in listed_rounds])
        .select_related("run__experiment", "run__pool")
        .only(
            "id",
            "index",
            "queued_at",
            "run__id",
            "run__strategy",
            "run__priority",
            "run__pool__name",
            "run__experiment__id",
            "run__experiment__name",
        )
    }


def _devices_to_list(s: _Schedule) -> tuple[dict[int, list[int]], set[int], list[int]]:
    """``(waited_by, involved, chosen)``: the round ids waiting for each named device (queue
    order), every device held, paused, profiled or waited for, and the (at most
    :data:`MAX_DEVICES_LISTED`) of them to list."""
    waited_by: dict[int, list[int]] = defaultdict(list)
    for w in s.ordered:
        for d in sorted(w.devices or ()):
            waited_by[d].append(w.key)
    involved = set(s.held) | s.paused | set(s.profiling) | set(waited_by)
    # Held, paused and profiling devices first, then those the earliest rounds wait for.
    position = {w.key: i for i, w in enumerate(s.ordered)}
    first_wait = {d: position[keys[0]] for d, keys in waited_by.items()}
    chosen = sorted(
        involved,
        key=lambda d: (0 if s.busy(d) else 1, first_wait.get(d, 0), d),
    )[:MAX_DEVICES_LISTED]
    return waited_by, involved, chosen


def _blocker_ids(s: _Schedule, listed_rounds: list[WaitingRound]) -> dict[int, list[int]]:
    """Per listed round, its devices held by another round, profiling, or paused: paused first,
    then by when they are expected free."""
    blocker_ids: dict[int, list[int]] = {}
    for w in listed_rounds:
        needed = w.devices if w.devices is not None else w.candidates
        blocked = [d for d in needed if s.busy(d)]
        blocked.sort(key=lambda d: (d not in s.paused, s.free_at.get(d, float("inf")), d))
        blocker_ids[w.key] = blocked
    return blocker_ids


def _holder_of(s: _Schedule, users: dict[int, str], device_id: int) -> dict[str, Any] | None:
    """The holder dict of the round holding ``device_id`` (owner as a username), or None."""
    h = s.held.get(device_id)
    info = s.holders.get(h["round"]) if h else None
    if info is None:
        return None
    return {k: v for k, v in info.items() if k != "owner_id"} | {"owner": users.get(info["owner_id"])}


def _waiting_row(
    s: _Schedule,
    *,
    position: int,
    w: WaitingRound,
    rnd: Round,
    blockers: list[int],
    rows: dict[int, dict[str, Any]],
    names: dict[int, str],
    users: dict[int, str],
) -> dict[str, Any]:
    """One entry of a queue answer's ``waiting`` (see :func:`queue_state`); ``rows`` and ``names``
    are the named devices' rows and names, by id."""
    return {
        "position": position,
        "round": w.key,
        "round_index": rnd.index,
        "run": rnd.run_id,
        "run_strategy": rnd.run.strategy,
        "experiment": rnd.run.experiment_id,
        "experiment_name": rnd.run.experiment.name,
        "owner": users.get(w.owner) if w.owner is not None else None,
        "priority": w.priority,
        "queued_at": rnd.queued_at,
        "waited_s": max(0.0, (s.now - rnd.queued_at).total_seconds()) if rnd.queued_at else None,
        "devices": sorted(names.get(d, str(d)) for d in sorted(w.devices or ())[:MAX_NAMES]),
        "devices_count": w.width,
        "pool": rnd.run.pool.name if rnd.run.pool_id else None,
        "slots": w.slots if w.pool is not None else None,
        "expected_s": w.round_s,
        "estimated_start": _ts(s.starts.get(w.key)),
        "blockers": sorted(
            (
                {
                    "device": names.get(d, str(d)),
                    "paused": d in s.paused,
                    "paused_reason": rows[d]["paused_reason"] if d in s.paused and d in rows else "",
                    "profiling_sweep": s.profiling[d]["sweep"] if d in s.profiling else None,
                    **_blocker_holder(_holder_of(s, users, d), s.profiling.get(d)),
                }
                for d in blockers[:MAX_NAMES]
            ),
            key=lambda b: (not b["paused"], b["expected_free_at"] or s.now, b["device"]),
        ),
        "blockers_count": len(blockers),
    }


def _device_row(s: _Schedule, d: int, row: dict[str, Any], keys: list[int], users: dict[int, str]) -> dict[str, Any]:
    """One entry of a queue answer's ``devices`` (see :func:`queue_state`); ``keys`` are the
    rounds waiting for it, in queue order."""
    next_starts = [s.starts.get(k) for k in keys]
    return {
        "id": d,
        "name": row["name"],
        "pool": row["pool__name"],
        "paused": row["paused"],
        "paused_reason": row["paused_reason"],
        "paused_at": row["paused_at"],
        "holder": _holder_of(s, users, d),
        "profiling": s.profiling.get(d),
        "waiting": keys[:MAX_WAITING_PER_DEVICE],
        "waiting_count": len(keys),
        "next_start": _ts(next_starts[0]) if next_starts else None,
    }


def queue_state(*, now: dt.datetime | None = None) -> dict[str, Any]:
    """The lab's queue as the scheduler sees it now.

    Returns:
        A dictionary:

        - ``policy`` (``fifo`` | ``fair``), ``fair_window_s``, ``now``;
        - ``waiting``: the waiting rounds in the order the policy serves them (at most
          :data:`MAX_WAITING_LISTED`), each ``{"position" (1-based), "round", "round_index",
          "run", "run_strategy", "experiment", "experiment_name", "owner" (username or None),
          "priority", "queued_at", "waited_s", "devices" (up to :data:`MAX_NAMES` names of the
          devices it needs; ``[]`` for a pool round), "devices_count", "pool" (name or None),
          "slots", "expected_s" (its expected round time, seconds), "estimated_start"
          (datetime, or None when no replayed pass can start it: it needs a paused device or
          more devices than its pool has), "blockers": [{"device", "paused", "holder_run",
          "holder_owner", "since", "expected_free_at", "paused_reason", "profiling_sweep"}] (its devices that are
          held by another round, profiling or paused, up to :data:`MAX_NAMES`),
          "blockers_count"}``; ``waiting_total``;
        - ``devices``: one row per listed device, by name: ``{"id", "name", "pool", "paused",
          "paused_reason", "paused_at", "holder" (None or {"run", "run_strategy",
          "experiment", "experiment_name", "owner", "round", "round_index", "since",
          "expected_free_at"}), "profiling" (None or {"sweep", "since", "expected_end"}: a
          profiling sweep pending or running on it, which no round may share), "waiting" (round
          ids needing it, queue order, up to
          :data:`MAX_WAITING_PER_DEVICE`), "waiting_count", "next_start" (the first of those
          rounds' estimated start)}``; ``devices_listed``, ``devices_involved`` (held, paused
          or waited for), ``devices_held``, ``devices_paused``, ``devices_total``;
        - ``pools``: ``{"id", "name", "devices", "held", "paused", "free", "waiting"
          (rounds of its runs waiting)}`` per pool, by name.
    """
    s = _schedule(now or timezone.now())
    listed_rounds = s.ordered[:MAX_WAITING_LISTED]
    details = _waiting_details(listed_rounds)
    waited_by, involved, chosen = _devices_to_list(s)
    blocker_ids = _blocker_ids(s, listed_rounds)
    named = set(chosen)
    for w in listed_rounds:
        named |= set(sorted(w.devices or ())[:MAX_NAMES])
        named |= set(blocker_ids[w.key][:MAX_NAMES])
    rows = {
        row["id"]: row
        for row in Device.objects.filter(id__in=named).values(
            "id", "name", "pool__name", "paused", "paused_reason", "paused_at"
        )
    }
    names = {d: row["name"] for d, row in rows.items()}
    users = _usernames(
        [h["owner_id"] for h in s.holders.values()] + [w.owner for w in listed_rounds]  # type: ignore[list-item]
    )
    waiting_rows = [
        _waiting_row(
            s, position=position, w=w, rnd=rnd, blockers=blocker_ids[w.key], rows=rows, names=names, users=users
        )
        for position, w in enumerate(listed_rounds, start=1)
        if (rnd := details.get(w.key)) is not None  # else granted or ended between the reads
    ]
    device_rows = [_device_row(s, d, rows[d], waited_by.get(d, []), users) for d in chosen if d in rows]
    device_rows.sort(key=lambda r: r["name"])
    return {
        "policy": s.policy,
        "fair_window_s": float(mtfl_setting("FAIR_WINDOW_S")),
        "now": s.now,
        "waiting": waiting_rows,
        "waiting_total": len(s.ordered),
        "devices": device_rows,
        "devices_listed": len(device_rows),
        "devices_involved": len(involved),
        "devices_held": len(s.held),
        "devices_paused": len(s.paused),
        "devices_total": Device.objects.count(),
        "pools": _pool_rows(held=set(s.held), paused=s.paused, waiting=s.ordered, profiling=set(s.profiling)),
    }


def _blocker_holder(holder: dict[str, Any] | None, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    if holder is None:
        return {
            "holder_run": None,
            "holder_owner": None,
            "since": sweep["since"] if sweep else None,
            "expected_free_at": sweep["expected_end"] if sweep else None,
        }
    return {
        "holder_run": holder["run"],
        "holder_owner": holder["owner"],
        "since": holder["since"],
        "expected_free_at": holder["expected_free_at"],
    }


def _pool_rows(
    *, held: set[int], paused: set[int], waiting: list[WaitingRound], profiling: set[int]
) -> list[dict[str, Any]]:
    """Per pool: its devices, how many are held and paused (a paused device a round still
    holds counts in both, as in the queue's totals), how many are free (neither, nor being
    profiled), and its waiting rounds."""
    pools = list(DevicePool.objects.annotate(n=Count("devices")).order_by("name").values("id", "name", "n"))
    if not pools:
        return []
    members: dict[int, set[int]] = defaultdict(set)
    if held or paused or profiling:
        busy = held | paused | profiling
        for device_id, pool_id in Device.objects.filter(Q(id__in=busy) & Q(pool_id__isnull=False)).values_list(
            "id", "pool_id"
        ):
            members[pool_id].add(device_id)
    waiting_by_pool: dict[int, int] = defaultdict(int)
    for w in waiting:
        if w.pool is not None:
            waiting_by_pool[w.pool] += 1
    rows = []
    for p in pools:
        in_pool = members[p["id"]]
        n_held = len(in_pool & held)
        n_paused = len(in_pool & paused)
        rows.append(
            {
                "id": p["id"],
                "name": p["name"],
                "devices": p["n"],
                "held": n_held,
                "paused": n_paused,
                "free": max(0, p["n"] - len(in_pool)),
                "waiting": waiting_by_pool[p["id"]],
            }
        )
    return rows


def queued_run_ids() -> set[int]:
    """Ids of the runs with a round waiting (``queued``) for its devices."""
    return set(Round.objects.filter(status=Round.Status.QUEUED).values_list("run_id", flat=True))


def run_queue_entry(run: Run, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Where a run's waiting round stands in the queue: its entry of ``queue_state()["waiting"]``
    (position, estimated start, blockers...), or ``None`` when none of its rounds waits.

    Args:
        state: a :func:`queue_state` answer to read (a page of runs reads the queue once).
    """
    if run.status != Run.Status.RUNNING:
        return None
    state = state if state is not None else queue_state()
    return next((w for w in state["waiting"] if w["run"] == run.id), None)


def pool_by_ref(value: int | str, *, field: str = "pool") -> DevicePool:
    """The pool whose id (an integer, or a string of digits) or name is ``value``.

    Raises:
        ApplicationError: no such pool (400 naming ``field``, with the pools there are).
    """
    pool = None
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        pool = DevicePool.objects.filter(id=int(value)).first()
    if pool is None and isinstance(value, str):
        pool = DevicePool.objects.filter(name=value).first()
    if pool is None:
        known = ", ".join(DevicePool.objects.order_by("name").values_list("name", flat=True)[:20]) or "none"
        raise ApplicationError(f"no device pool {value!r}; pools: {known}", field=field)
    return pool


def pool_list() -> QuerySet[DevicePool]:
    """Every pool by name, annotated with ``run_count`` (runs that name it), its devices
    prefetched by name (two queries for any number of pools)."""
    return (
        DevicePool.objects.annotate(run_count=Count("runs"))
        .prefetch_related(Prefetch("devices", queryset=Device.objects.order_by("name").only("id", "name", "pool_id")))
        .order_by("name")
    )


def runs_queue_entries(runs: Iterable[Run]) -> dict[int, dict[str, Any] | None]:
    """Each of ``runs``' :func:`run_queue_entry` by run id, the queue read once: replaying it is
    the costly part, so only when a running one of ``runs`` has a round waiting in it."""
    runs = list(runs)
    out: dict[int, dict[str, Any] | None] = {run.id: None for run in runs}
    running = [run for run in runs if run.status == Run.Status.RUNNING]
    queued = queued_run_ids() if running else set()
    waiting = [run for run in running if run.id in queued]
    if waiting:
        state = queue_state()
        out.update({run.id: run_queue_entry(run, state) for run in waiting})
    return out
