"""Benchmark: latency of the API's list endpoints under concurrent clients, with 10,000 rounds
and 100,000 assignments in the database.

    python benchmarks/api_load.py [--database sqlite|postgres] [--connections 16] [--think-ms 1000]
                                  [--duration 10] [--workers 3]

Steps: (1) a throwaway database: SQLite in a temporary ``MTFL_HOME`` (the embedded default), or
with ``--database postgres`` a database created on the PostgreSQL server at 127.0.0.1:5432 (user
``postgres``, ``--postgres-url`` to change) and dropped at the end; (2) migrations, then, in
bulk, a researcher's experiment of 10 runs × 1,000 rounds × 5 devices × 2 tasks (10,000 rounds,
100,000 assignments, 20,000 checkpoints), 5,000 profile samples, and another researcher's
experiment the first must not see; (3) the web app served by gunicorn on loopback, as the
Dockerfile and docker-compose.yml run it (``--workers`` sync workers; compose's
``WEB_CONCURRENCY`` default is 3); (4) for each list endpoint, ``--connections`` clients request
its first page (the default 100 rows) for ``--duration`` seconds, authenticated with the
researcher's API token, each client waiting ``--think-ms`` (± 50 %) between an answer and its
next request (0: as fast as it can): client processes (Python, one request at a time each), or ``wrk`` (when it is installed and the
clients do not wait; its latency distribution read by a small Lua script). Before the load the
database gets its planner statistics (``ANALYZE``; ``VACUUM ANALYZE`` on PostgreSQL), as a
database in service has them.

It prints requests per second and the p50/p95/p99 latency of each endpoint, and last
``api_list_p99_ms=<the worst p99>`` (issue 7's target: < 100 ms). The clients share the
machine's cores with the server: on a small machine the figures include their own cost, and
other work on the machine shows in the tail.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RUNS, ROUNDS_PER_RUN, DEVICES, TASKS = 10, 1000, 5, 2
TARGET_MS = 100.0
T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)

WRK_SCRIPT = """
local think_ms = THINK_MS
delay = function()
  if think_ms <= 0 then return 0 end
  return math.random(think_ms / 2, think_ms * 3 / 2)
end
done = function(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read
                 + summary.errors.write + summary.errors.timeout
  io.write(string.format('{"requests": %d, "seconds": %f, "errors": %d, "p50": %f, "p95": %f, "p99": %f}\\n',
    summary.requests, summary.duration / 1e6, errors,
    latency:percentile(50) / 1000, latency:percentile(95) / 1000, latency:percentile(99) / 1000))
end
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def populate() -> dict:
    """The researcher's data (see the module docstring), written in bulk; returns the ids the
    endpoints are asked with and the researcher's token."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from controlplane.common.bulk import bulk_insert
    from controlplane.experiments.models import (
        Assignment,
        Checkpoint,
        Comparison,
        Experiment,
        Round,
        Run,
        Shard,
        StandaloneThroughput,
        Task,
    )
    from controlplane.fleet.models import Device
    from controlplane.planning.strategies import compared_strategies
    from controlplane.profiling.models import ProfileSample

    strategies = compared_strategies()

    users = get_user_model().objects
    owner = users.create_user("load-owner", password="unused-pass")
    other = users.create_user("load-other", password="unused-pass")
    Device.objects.bulk_create(
        Device(name=f"load-{k}", backend="simulated", last_heartbeat_at=T0, inventory={"accelerator": "titan-v"})
        for k in range(DEVICES)
    )
    devices = list(Device.objects.order_by("name"))
    tasks = [Task.objects.create(name=f"load-task-{k}", architecture="resnet18", owner=owner) for k in range(TASKS)]

    def experiment(name, who, devs, tsks, runs, rounds):
        exp = Experiment.objects.create(name=name, rounds=rounds, owner=who, partition_rule="explicit")
        exp.devices.set(devs)
        exp.tasks.set(tsks)
        Shard.objects.bulk_create(
            Shard(experiment=exp, device=d, task=t, num_samples=50, offset=50 * k)
            for k, (d, t) in enumerate((d, t) for d in devs for t in tsks)
        )
        comparison = Comparison.objects.create(experiment=exp, strategies=list(strategies), status="succeeded")
        Run.objects.bulk_create(
            Run(
                experiment=exp,
                strategy=strategies[k % len(strategies)],
                status="succeeded",
                started_at=T0,
                finished_at=T0,
                raw_throughput_sps=100.0 + k,
                fair_throughput=1.0,
                fl_throughput_sps=10.0,
                simulated=True,
                comparison=comparison if k < len(strategies) else None,
            )
            for k in range(runs)
        )
        made = list(exp.runs.order_by("id"))
        bulk_insert(
            Round,
            [
                dict(
                    run_id=run.id,
                    index=r,
                    status="succeeded",
                    started_at=T0,
                    finished_at=T0,
                    round_time_s=1.0,
                    raw_throughput_sps=100.0,
                    fair_throughput=1.0,
                    flags=["a flag"],
                )
                for run in made
                for r in range(rounds)
            ],
        )
        ids = list(Round.objects.filter(run__in=made).values_list("id", "run_id", "index"))
        pairs = [(d, t) for d in devs for t in tsks]
        bulk_insert(
            Assignment,
            [
                dict(
                    round_id=rid,
                    device_id=d.id,
                    task_id=t.id,
                    batch_size=50,
                    active_thread_percentage=50,
                    samples=50,
                    samples_trained=50,
                    status="succeeded",
                    throughput_sps=40.0 + k,
                    standalone_throughput_sps=80.0,
                    started_at=T0 + dt.timedelta(seconds=i),
                    finished_at=T0 + dt.timedelta(seconds=i + 2),
                    simulated=True,
                )
                for rid, _run, i in ids
                for k, (d, t) in enumerate(pairs)
            ],
        )
        bulk_insert(
            Checkpoint,
            [
                dict(
                    run_id=run_id,
                    task_id=t.id,
                    round_id=rid,
                    artifact_path="x",
                    sha256="0" * 64,
                    test_accuracy=0.5,
                    test_loss=1.0,
                )
                for rid, run_id, _i in ids
                for t in tsks
            ],
        )
        bulk_insert(
            StandaloneThroughput,
            [
                dict(run_id=run.id, device_id=d.id, task_id=t.id, batch_size=50, throughput_sps=80.0)
                for run in made
                for d, t in pairs
            ],
        )
        return exp, made

    big, runs = experiment("load big", owner, devices, tasks, RUNS, ROUNDS_PER_RUN)
    experiment("load theirs", other, devices[:2], tasks[:1], 1, 3)
    rows = (
        Assignment.objects.filter(round__run=runs[2])
        .order_by("id")
        .values_list("id", "device_id", "round_id", "task_id")[:5000]
    )
    bulk_insert(
        ProfileSample,
        [
            dict(
                source="run",
                assignment_id=aid,
                device_id=did,
                backend="simulated",
                device_class="simulated-titan-v",
                config_key=f"round-{rid}-{did}",
                configuration=[{"architecture": "resnet18"}],
                mix_size=2,
                task_index=tid % 2,
                architecture="resnet18",
                batch_size=50,
                active_thread_percentage=50,
                throughput_sps=40.0,
                simulated=True,
            )
            for aid, did, rid, tid in rows
        ],
        ignore_conflicts=True,
    )
    token, _ = Token.objects.get_or_create(user=owner)
    return {
        "token": token.key,
        "experiment": big.id,
        "run": runs[3].id,
        "rounds": Round.objects.count(),
        "assignments": Assignment.objects.count(),
    }


def endpoints(ids: dict) -> list[tuple[str, str]]:
    """``(label, path)`` of every list endpoint, first page; the worst p99 is over these."""
    return [
        ("runs", "/api/runs/"),
        ("rounds", "/api/rounds/"),
        ("assignments", "/api/assignments/"),
        ("checkpoints", "/api/checkpoints/"),
        ("experiments", "/api/experiments/"),
        ("devices", "/api/devices/"),
        ("comparisons", "/api/comparisons/"),
        ("profile-samples", "/api/profile-samples/"),
        ("assignments ?run=", f"/api/assignments/?run={ids['run']}"),
        ("rounds ?experiment=", f"/api/rounds/?experiment={ids['experiment']}"),
    ]


def wait_ready(url: str, token: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the server did not answer {url} within {timeout_s:g} s")


def load_wrk(url: str, token: str, connections: int, duration: float, script: Path) -> dict:
    done = subprocess.run(
        [
            "wrk",
            "-t",
            str(min(2, connections)),
            "-c",
            str(connections),
            "-d",
            f"{duration:g}s",
            "--timeout",
            "10s",
            "-H",
            f"Authorization: Token {token}",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("{"))
    return json.loads(line)


def _client(url: str, token: str, stop_at: float, think_ms: int, seed: int) -> tuple[list[float], int]:
    """One client: requests one at a time until ``stop_at`` (``time.time()``), waiting
    ``think_ms`` ± 50 % between an answer and the next request; returns the latencies (ms) and
    the number of errors."""
    import random

    rng = random.Random(seed)
    latencies: list[float] = []
    errors = 0
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
    if think_ms > 0:
        # Pollers that started at different times: without a random phase every client would
        # send its first request in the same millisecond, and that one burst of
        # ``connections`` requests queued on the workers would be the measured tail.
        time.sleep(rng.uniform(0, think_ms * 1.5) / 1000)
    while time.time() < stop_at:
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
                ok = response.status == 200
        except OSError:
            ok = False
        latencies.append((time.perf_counter() - t0) * 1000)
        errors += 0 if ok else 1
        if think_ms > 0:
            time.sleep(rng.uniform(think_ms / 2, think_ms * 1.5) / 1000)
    return latencies, errors


def load_processes(url: str, token: str, connections: int, duration: float, think_ms: int = 0) -> dict:
    """The fallback without wrk: ``connections`` client processes, each one request at a time.

    Processes, not threads: threads of one Python process wait for each other's GIL at every
    ``recv`` of a response (up to the 5 ms switch interval each time), which put up to 100 ms
    of the client's own waiting into the p99 of the larger pages (measured against gunicorn's
    own request times)."""
    import multiprocessing

    stop_at = time.time() + duration
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(connections) as pool:
        done = pool.starmap(_client, [(url, token, stop_at, think_ms, k) for k in range(connections)])
    latencies = [x for lat, _errors in done for x in lat]
    errors = sum(e for _lat, e in done)
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "requests": len(latencies),
        "seconds": time.perf_counter() - started,
        "errors": errors,
        "p50": q[49],
        "p95": q[94],
        "p99": q[98],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--postgres-url",
        default="postgres://postgres@127.0.0.1:5432",
        help="server to create the throwaway database on (default: %(default)s)",
    )
    parser.add_argument("--connections", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument(
        "--think-ms",
        type=int,
        default=1000,
        help="each client waits this long on average (uniform ±50 %%) between an answer and its "
        "next request (default 1000: 16 clients polling about once a second; 0: as fast as "
        "they can, which measures the server's saturation, not its latency)",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per endpoint (default 20)")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn sync workers (compose's default: 3)")
    parser.add_argument(
        "--client",
        choices=["auto", "wrk", "processes"],
        default="auto",
        help="auto: wrk for clients that do not wait (--think-ms 0), client processes otherwise "
        "(wrk's latencies with waits between requests on gunicorn's closed connections "
        "carried half-second stalls that no client saw)",
    )
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="mtfl-apiload-"))
    env = {k: v for k, v in os.environ.items() if k not in {"MTFL_ENV", "DATABASE_URL", "DEBUG"}}
    env.update(
        MTFL_HOME=str(home),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        CELERY_BROKER_URL="memory://",
        CELERY_RESULT_BACKEND="cache+memory://",
        PYTHONPATH=str(REPO),
    )
    dbname = None
    if args.database == "postgres":
        import psycopg

        dbname = f"mtfl_apiload_{os.getpid()}"
        with psycopg.connect(f"{args.postgres_url}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        env["DATABASE_URL"] = f"{args.postgres_url}/{dbname}"
    os.environ.clear()
    os.environ.update(env)
    server = None
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", interactive=False, verbosity=0)
        t0 = time.perf_counter()
        ids = populate()
        # Planner statistics, as a database in service has them (autovacuum on PostgreSQL).
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
        print(
            f"{connection.vendor} database ({dbname or home / 'mtfl.sqlite3'}): {ids['rounds']:,} rounds, "
            f"{ids['assignments']:,} assignments (written in {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        connection.close()

        port = _free_port()
        gunicorn = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or shutil.which("gunicorn")
        if gunicorn is None:
            print("gunicorn is not installed: pip install -e '.[deploy]'")
            return 2
        server = subprocess.Popen(
            [
                gunicorn,
                "controlplane.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(args.workers),
                "--timeout",
                "300",
                "--log-level",
                "warning",
            ],
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/api/devices/", ids["token"])
        client = args.client
        if client == "auto":
            client = "wrk" if shutil.which("wrk") and args.think_ms <= 0 else "processes"
        script = home / "report.lua"
        script.write_text(WRK_SCRIPT.replace("THINK_MS", str(args.think_ms)))
        think = (
            f"each waiting {args.think_ms} ms ± 50 % between requests" if args.think_ms > 0 else "as fast as they can"
        )
        print(
            f"gunicorn, {args.workers} sync workers, on 127.0.0.1:{port}; {args.connections} concurrent clients "
            f"({client}) {think}, {args.duration:g} s per endpoint; load average {os.getloadavg()[0]:.2f}\n",
            flush=True,
        )
        print(f"{'endpoint':<22}{'req/s':>8}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")
        # Warm-up: every worker serves every endpoint once before anything is measured (a
        # worker's first request imports the serializers, filters and renderers).
        for _label, path in endpoints(ids):
            load_processes(base + path, ids["token"], 2 * args.workers, 1.0)
        worst = 0.0
        for label, path in endpoints(ids):
            if client == "wrk":
                r = load_wrk(base + path, ids["token"], args.connections, args.duration, script)
            else:
                r = load_processes(base + path, ids["token"], args.connections, args.duration, args.think_ms)
            worst = max(worst, r["p99"])
            print(
                f"{label:<22}{r['requests'] / r['seconds']:>8.1f}{r['errors']:>8d}{r['p50']:>9.1f}{r['p95']:>9.1f}"
                f"{r['p99']:>9.1f}",
                flush=True,
            )
        print(
            f"\nworst p99 {worst:.1f} ms (target < {TARGET_MS:g} ms: ratio {worst / TARGET_MS:.2f}); "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        print(f"api_list_p99_ms={worst:.1f}")
        return 0
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        if dbname:
            from django.db import connections

            connections.close_all()
            import psycopg

            with psycopg.connect(f"{args.postgres_url}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
