"""Benchmark: the five strategies side by side on the light mix, measured on local agents.

    python benchmarks/compare.py --backend cpu [--budget 240] [--rounds 2] [--devices 2]
    python benchmarks/compare.py --backend simulated      # the same on simulated Titan Vs

Steps, all in one process tree on the embedded stack (an embedded Redis, a control worker and
``--devices`` local device agents as child processes, a fresh database in a temporary
``MTFL_HOME``): (1) a profiling sweep of ``--budget`` seconds on the first device over the light
mix's models (``POST /api/devices/{id}/profile/``'s service); (2) a predictor fitted on it
(``mtfl fit-predictor``'s service); (3) the built-in ``light`` template (resnet18 +
mobilenet_v3_large + shufflenet_v2_x1_0, Dirichlet-skewed data volumes, digits); (4) a
comparison (``mtfl compare``'s service): ``temporal``, ``isolation``, ``sharing``,
``vres_greedy``, ``vres_sync`` one after another on the same devices, data and seeds.

It prints, per strategy, the measured raw and fair throughput (means over rounds and devices),
the speedups over ``temporal``, the FL throughput (samples trained per second of round time)
and, for the planners, the predicted and measured round time; last,
``vres_sync_vs_best_baseline=<vres_sync FL throughput / best baseline FL throughput>``
(issue 4's target on the cpu backend: ≥ 1.10).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIGHT = ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        default="cpu",
        choices=["cpu", "simulated"],
        help="execution backend of the local agents (simulated: the Titan V model, labelled so)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="profiling seconds (default 240 on cpu, 1800 simulated seconds on simulated)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="FL rounds per run (default 2)")
    parser.add_argument("--devices", type=int, default=2, help="local devices (default 2)")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha of the data volumes (default 0.5)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run (default 1800)")
    parser.add_argument("--home", default=None, help="MTFL_HOME to use (default: a new temporary folder)")
    args = parser.parse_args()

    home = Path(args.home or tempfile.mkdtemp(prefix="mtfl-compare-"))
    os.environ["MTFL_HOME"] = str(home)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()

    from controlplane.core.cli_support import follow_runs, prepare_database
    from controlplane.core.stack import LocalStack
    from controlplane.experiments.models import Run
    from controlplane.experiments.services import comparison_create, experiment_create_from_template
    from controlplane.fleet.models import Device
    from controlplane.planning.metrics import speedup
    from controlplane.planning.strategies import STRATEGY_REGISTRY, baseline_strategy
    from controlplane.profiling import services as profiling
    from controlplane.profiling.models import ProfileSweep
    from controlplane.profiling.selectors import sweep_progress

    budget = args.budget if args.budget is not None else (240.0 if args.backend == "cpu" else 1800.0)
    started = time.monotonic()
    prepare_database()
    names = [f"bench-{chr(ord('a') + i)}" for i in range(args.devices)]
    print(f"MTFL_HOME={home}")
    with LocalStack(agents=names, backend=args.backend, log=lambda line: print(f"  {line}", flush=True)) as stack:
        stack.wait_ready()
        devices = list(Device.objects.filter(name__in=names).order_by("name"))

        sweep = profiling.sweep_start(
            device=devices[0],
            budget_s=budget,
            architectures=LIGHT,
            batch_sizes=[16, 32, 64, 128, 256],
            max_mix=3,
            seed=0,
        )
        print(f"profiling {devices[0].name} for {budget:g} s (sweep {sweep.id})", flush=True)
        while sweep.status not in (ProfileSweep.Status.SUCCEEDED, ProfileSweep.Status.FAILED):
            time.sleep(5)
            stack.children.check_alive()
            sweep.refresh_from_db()
            print(
                f"  {100 * sweep_progress(sweep):3.0f} % · {sweep.configs} configurations · {sweep.samples} samples",
                flush=True,
            )
        if sweep.status == ProfileSweep.Status.FAILED:
            print(f"sweep failed: {sweep.error}")
            return 1
        predictor = profiling.predictor_fit(backend=args.backend)
        print(
            f"predictor v{predictor.version} ({predictor.device_class}): kept {predictor.kept_family}, "
            f"held-out RMSLE {predictor.heldout_rmsle:.3f} on {predictor.training_samples} samples"
        )

        experiment = experiment_create_from_template(
            template="light",
            device_ids=[d.id for d in devices],
            rounds=args.rounds,
            dirichlet_alpha=args.alpha,
            dataset="digits",
        )
        print(
            f"experiment {experiment.name}: shards "
            + ", ".join(
                f"{s.device.name}/{s.task.architecture}={s.num_samples}"
                for s in experiment.shards.select_related("device", "task").order_by("device__name", "task_id")
            )
        )
        comparison = comparison_create(experiment=experiment)
        runs = follow_runs(
            lambda run: run,
            list(comparison.runs.order_by("id")),
            timeout_s=args.timeout,
            check=stack.children.check_alive,
            label=lambda run: run.strategy,
        )

    reference = next((r for r in runs if r.strategy == baseline_strategy().name), None)

    def fmt(value, spec, suffix=""):
        return "—" if value is None else format(value, spec) + suffix

    print(
        f"\n{'strategy':<13}{'status':<11}{'raw sps':>9}{'fair':>7}{'raw ×':>7}{'fair ×':>8}{'FL sps':>9}"
        f"{'round s':>9}{'pred. s':>9}"
    )
    for run in runs:
        rounds = list(run.rounds.order_by("index"))
        measured = [r.round_time_s for r in rounds if r.round_time_s]
        predicted = [r.predicted_round_time_s for r in rounds if r.predicted_round_time_s]
        print(
            f"{run.strategy:<13}{run.status:<11}{fmt(run.raw_throughput_sps, '.1f'):>9}"
            f"{fmt(run.fair_throughput, '.2f'):>7}"
            f"{fmt(speedup(run.raw_throughput_sps, reference and reference.raw_throughput_sps), '.2f', '×'):>7}"
            f"{fmt(speedup(run.fair_throughput, reference and reference.fair_throughput), '.2f', '×'):>8}"
            f"{fmt(run.fl_throughput_sps, '.1f'):>9}"
            f"{fmt(sum(measured) / len(measured) if measured else None, '.1f'):>9}"
            f"{fmt(sum(predicted) / len(predicted) if predicted else None, '.1f'):>9}"
        )
        if run.error:
            print(f"    {run.error}")
    by_strategy = {r.strategy: r for r in runs if r.status == Run.Status.SUCCEEDED}
    # the paper's baselines: the compared strategies that plan without a predictor
    baselines = [
        by_strategy[s.name].fl_throughput_sps
        for s in STRATEGY_REGISTRY
        if s.compared and not s.needs_predictor and s.name in by_strategy and by_strategy[s.name].fl_throughput_sps
    ]
    sync = by_strategy.get("vres_sync")
    print(f"\nbenchmark took {time.monotonic() - started:.0f} s; data in {home}")
    if not baselines or sync is None or not sync.fl_throughput_sps:
        print("vres_sync_vs_best_baseline=nan")
        return 1
    print(f"best_baseline_fl_sps={max(baselines):.2f}")
    print(f"vres_sync_fl_sps={sync.fl_throughput_sps:.2f}")
    print(f"vres_sync_vs_best_baseline={sync.fl_throughput_sps / max(baselines):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
