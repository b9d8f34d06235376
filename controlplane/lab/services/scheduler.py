"""The lab scheduler: rounds wait (``queued``) for their devices, and a scheduling pass grants
free devices to waiting rounds by the lab's policy and dispatches them.

A run's round is *enqueued* by
:func:`controlplane.experiments.services.rounds.enqueue.round_enqueue` (``ROUND_ENQUEUE``: a
run's first round after its initial models, each next round after the previous one's
aggregation); it then holds no device and is ``queued``. :func:`lab_schedule` runs a pass: it
releases leases whose round or run has ended (:func:`.leases.leases_sweep`: a crashed run never
blocks a device for ever), reads the waiting rounds (:func:`waiting_rounds`), lets the pure
policy decide (:func:`controlplane.planning.scheduling.schedule_pass`:
``MTFL_SCHEDULER_POLICY``, priorities, backfilling, AlloX-style placement in pools) and, for
each round it grants, leases all its devices at once (:func:`.leases.leases_claim`), marks it
``running`` with ``queue_s`` (its wait) and dispatches it
(:func:`controlplane.experiments.services.rounds.dispatch.round_dispatch`: plan, ``P_alone`` if
needed, train). Deadlines and straggler detection count from that dispatch, never from the
enqueue.

A pass runs whenever the state it reads changes: a round enqueued, a round's devices released
(its results arrived: :func:`controlplane.experiments.services.rounds.record.round_record`; a
run ended, failed or was cancelled), a device resumed, a control worker (re)started
(:mod:`controlplane.experiments.services.reliability`); each of those sends ``LAB_SCHEDULE`` or
the :data:`controlplane.experiments.signals.schedule_wanted` signal, which calls
:func:`lab_schedule`. Passes are idempotent and safe to run concurrently: a device is claimed by
one conditional insert and a round granted by one conditional update, so two passes cannot give
one device to two rounds or dispatch a round twice.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
from collections import defaultdict

from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Experiment, Round, Run, Shard
from controlplane.experiments.services.rounds.dispatch import round_dispatch
from controlplane.experiments.services.runs import run_fail
from controlplane.fleet.models import Device
from controlplane.lab.models import DeviceLease, UserShare
from controlplane.lab.services.leases import held_leases, leases_claim, leases_sweep
from controlplane.planning.participation import participant_count
from controlplane.planning.scheduling import WaitingRound, owner_usage, schedule_pass
from controlplane.profiling.selectors import sweeps_in_progress

log = logging.getLogger(__name__)

_FINISHED = (Round.Status.SUCCEEDED, Round.Status.PARTIAL)


def profiling_devices() -> set[int]:
    """Ids of the devices with a profiling sweep pending or running: no round is granted them
    (the sweep runs on the same agent and would hold the round up while its deadline runs)."""
    return set(sweeps_in_progress().values_list("device_id", flat=True))


def lab_schedule(*, now: dt.datetime | None = None) -> list[int]:
    """One scheduling pass (see the module): release stale leases, grant free devices to
    waiting rounds by the policy, lease them and dispatch the granted rounds.

    Returns:
        The ids of the rounds granted and dispatched by this pass.
    """
    now = now or timezone.now()
    leases_sweep(now=now)
    waiting = waiting_rounds()
    if not waiting:
        return []
    busy = set(held_leases().values_list("device_id", flat=True))
    busy |= set(Device.objects.filter(paused=True).values_list("id", flat=True))
    busy |= profiling_devices()
    pools = {r.pool for r in waiting if r.pool is not None}
    pool_devices: dict[int, list[int]] = defaultdict(list)
    for device_id, pool_id in Device.objects.filter(pool_id__in=pools).values_list("id", "pool_id"):
        pool_devices[pool_id].append(device_id)
    policy = str(mtfl_setting("SCHEDULER_POLICY"))
    usage, weights = lab_usage(now=now) if policy == "fair" else ({}, {})
    grants = schedule_pass(waiting, busy=busy, pool_devices=pool_devices, policy=policy, usage=usage, weights=weights)
    by_key = {r.key: r for r in waiting}
    granted = [key for key, devices in grants.items() if _grant(by_key[key], devices, now)]
    for key in granted:
        try:
            round_dispatch(round_id=key)
        except Exception as exc:  # noqa: BLE001 - one round's failure must not hold up the others
            log.exception("round %s: dispatch after its lease failed", key)
            rnd = Round.objects.only("run_id", "index").get(id=key)
            run_fail(run_id=rnd.run_id, error=f"round {rnd.index} could not be dispatched: {type(exc).__name__}: {exc}")
    if granted:
        log.info("lab scheduler (%s): granted rounds %s", policy, granted)
    return granted


class _Lost(Exception):
    """The round was granted or ended by someone else between the pass's read and its write."""


def _grant(r: WaitingRound, devices: list[int], now: dt.datetime) -> bool:
    """Lease ``devices`` to round ``r.key`` and mark it running, together or not at all.

    The lease and the round's start are stamped once the claim has been written, not with
    ``now`` (when the scheduling pass began): the claim can only succeed after the previous
    holder's release committed, so a time read after it is never before that release. ``now``
    only bounds it from below (a pass run for a given time, e.g. in tests).
    """
    rnd = Round.objects.only("id", "run_id", "queued_at").get(id=r.key)
    try:
        with transaction.atomic():
            if not leases_claim(rnd=rnd, device_ids=devices, owner_id=r.owner, now=now):
                return False
            now = max(now, timezone.now())
            held_leases().filter(round_id=rnd.id).update(granted_at=now)
            fields: dict[str, object] = {
                "status": Round.Status.RUNNING,
                "started_at": now,
                "queue_s": max(0.0, (now - rnd.queued_at).total_seconds()) if rnd.queued_at else 0.0,
            }
            if r.pool is not None:
                fields["participants"] = sorted(devices)
            if not Round.objects.filter(id=r.key, status=Round.Status.QUEUED).update(**fields):
                raise _Lost
    except _Lost:
        return False
    return True


def waiting_rounds() -> list[WaitingRound]:
    """Every queued round of a running run, as the policy sees it (owner, priority, arrival,
    the devices it needs or the pool slots it fills, and its expected round time: the run's
    last finished round's wall time, else its predicted round time). A handful of queries,
    whatever the number of rounds waiting."""
    rounds = list(
        Round.objects.filter(status=Round.Status.QUEUED, run__status=Run.Status.RUNNING)
        .select_related("run__experiment")
        .only(
            "id",
            "index",
            "queued_at",
            "participants",
            "run__id",
            "run__priority",
            "run__pool_id",
            "run__experiment__id",
            "run__experiment__owner_id",
            "run__experiment__clients_per_round",
            "run__experiment__client_fraction",
        )
        .order_by("queued_at", "id")
    )
    if not rounds:
        return []
    experiment_ids = {r.run.experiment_id for r in rounds}
    members: dict[int, set[int]] = defaultdict(set)
    for experiment_id, device_id in Experiment.devices.through.objects.filter(
        experiment_id__in=experiment_ids
    ).values_list("experiment_id", "device_id"):
        members[experiment_id].add(device_id)
    pool_ids = {r.run.pool_id for r in rounds if r.run.pool_id is not None}
    in_pool: dict[int, set[int]] = defaultdict(set)
    for device_id, pool_id in Device.objects.filter(pool_id__in=pool_ids).values_list("id", "pool_id"):
        in_pool[pool_id].add(device_id)
    expected = _expected_round_s({r.run_id for r in rounds})
    pooled_experiments = {r.run.experiment_id for r in rounds if r.run.pool_id is not None}
    volumes: dict[int, dict[int, float]] = defaultdict(dict)
    for experiment_id, device_id, n in (
        Shard.objects.filter(experiment_id__in=pooled_experiments)
        .values("experiment_id", "device_id")
        .annotate(n=Sum("num_samples"))
        .order_by()
        .values_list("experiment_id", "device_id", "n")
    ):
        volumes[experiment_id][device_id] = float(n or 0)
    waiting = []
    for rnd in rounds:
        run, experiment = rnd.run, rnd.run.experiment
        common = {
            "key": rnd.id,
            "owner": experiment.owner_id,
            "priority": run.priority,
            "queued_at": (rnd.queued_at or timezone.now()).timestamp(),
            "expected_s": expected.get(run.id),
        }
        if run.pool_id is None:
            needed = rnd.participants if rnd.participants is not None else members[experiment.id]
            waiting.append(WaitingRound(devices=frozenset(needed), **common))  # type: ignore[arg-type]
            continue
        candidates = members[experiment.id] & in_pool[run.pool_id]
        slots = participant_count(
            len(candidates), clients_per_round=experiment.clients_per_round, client_fraction=experiment.client_fraction
        )
        waiting.append(
            WaitingRound(
                pool=run.pool_id,
                candidates=frozenset(candidates),
                slots=slots,
                cost_s=_pool_costs(expected.get(run.id), volumes[experiment.id], candidates),
                **common,  # type: ignore[arg-type]
            )
        )
    return waiting


def _pool_costs(expected_s: float | None, volumes: dict[int, float], candidates: set[int]) -> dict[int, float]:
    """Predicted round time of a pool round on each candidate device: its expected round time
    scaled by the device's data volume against the mean (devices of one pool are of one class,
    so what differs between them is how much they train)."""
    if not expected_s or not candidates:
        return {}
    mean = sum(volumes.get(d, 0.0) for d in candidates) / len(candidates)
    if mean <= 0:
        return {}
    return {d: expected_s * volumes.get(d, 0.0) / mean for d in candidates}


def _expected_round_s(run_ids: set[int]) -> dict[int, float]:
    """Per run, how long its next round is expected to hold its devices: the wall time of its
    last finished round, else the predicted round time of its last round that has one."""
    expected: dict[int, float] = {}
    rows = (
        Round.objects.filter(run_id__in=run_ids)
        .filter(Q(status__in=_FINISHED, wall_time_s__isnull=False) | Q(predicted_round_time_s__isnull=False))
        .order_by("run_id", "-index")
        .values_list("run_id", "status", "wall_time_s", "predicted_round_time_s")
    )
    for run_id, status, wall_s, predicted_s in rows:
        if run_id in expected:
            continue
        value = wall_s if status in _FINISHED and wall_s else predicted_s
        if value:
            expected[run_id] = float(value)
    return expected


def lab_usage(*, now: dt.datetime | None = None) -> tuple[dict[int | None, float], dict[int | None, float]]:
    """Each owner's device-seconds leased in the last ``MTFL_FAIR_WINDOW_S`` and each weighted
    user's weight (:class:`UserShare`; others weigh 1): what the ``fair`` policy orders by."""
    now = now or timezone.now()
    window_s = float(mtfl_setting("FAIR_WINDOW_S"))
    start = now - dt.timedelta(seconds=window_s)
    # A round's leases share their grant and release times: one row per (owner, granted,
    # released) with its count, each repeated, instead of 1,000 rows per round of the window.
    leases = (
        DeviceLease.objects.filter(Q(released_at__isnull=True) | Q(released_at__gte=start))
        .values("owner_id", "granted_at", "released_at")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("owner_id", "granted_at", "released_at", "n")
    )
    usage = owner_usage(
        itertools.chain.from_iterable(
            itertools.repeat((owner, granted.timestamp(), released.timestamp() if released else None), n)
            for owner, granted, released, n in leases
        ),
        now=now.timestamp(),
        window_s=window_s,
    )
    weights = {user_id: float(w) for user_id, w in UserShare.objects.values_list("user_id", "weight")}
    return usage, weights  # type: ignore[return-value]
