"""Benchmark: the five strategies side by side on the paper's mixes, measured on local agents.

    python benchmarks/compare.py --backend simulated [--mix light|mixed|heavy|all] [--rounds 3]
    python benchmarks/compare.py --backend cpu [--repeats 3] [--budget 240] [--rounds 2]

Steps, all in one process tree on the embedded stack (an embedded Redis, a control worker and
``--devices`` local device agents as child processes, a fresh database in a temporary
``MTFL_HOME``): (1) a profiling sweep on the first device over every model of the chosen mixes
(``POST /api/devices/{id}/profile/``'s service); (2) a predictor fitted on it (``mtfl
fit-predictor``'s service); (3) per mix, an experiment of its three tasks with Dirichlet-skewed
data volumes (``quantity``, ``--alpha``); (4) per mix, a comparison (``mtfl compare``'s
service): ``temporal``, ``isolation``, ``sharing``, ``vres_greedy``, ``vres_sync`` on the same
devices, data and seeds, ``--repeats`` times in interleaved orders.

Data: on ``simulated`` a data set of CIFAR-10's size and shape (50,000 training images of
3×32×32; the paper's setting; the simulated backend trains nothing, so the images are zeros and
every accuracy stays the initial model's), default mixes ``all``; on ``cpu`` scikit-learn's
digits, trained for real, default mix ``light``.

Printed per mix: the comparison report's tables (``mtfl compare``'s: raw, fair and FL throughput
with speedups over ``temporal``, time and rounds to each task's target accuracy, the planners'
verdicts against the best baseline, each a mean ± half its 95 % interval over repeats), then
``name=value`` lines: per mix ``vres_sync_raw_vs_temporal_<mix>`` and
``vres_sync_vs_best_baseline_<mix>`` (FL throughput over the best baseline's, means over
repeats), its two components ``vres_sync_never_worse_fl_<mix>`` (FL throughput not ``worse``
than the best baseline's at 95 %) and ``vres_sync_never_worse_tta_<mix>`` (no task's time to
accuracy ``worse`` at 95 %), ``vres_sync_never_worse_<mix>`` (both: the clock FL waits on and
what it buys; raw and fair throughput, which ``vres_sync`` does not optimise, are listed when
worse but not counted), and last ``vres_sync_vs_best_baseline=<mean over the mixes>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fl_bench import PAPER_MIXES, follow, mix_experiment, profile_and_fit, setup_django, sized_dataset  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        default="cpu",
        choices=["cpu", "simulated"],
        help="execution backend of the local agents (simulated: the Titan V model, labelled so)",
    )
    parser.add_argument(
        "--mix", default=None, choices=[*sorted(PAPER_MIXES), "all"], help="default: all on simulated, light on cpu"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="profiling seconds (default 240 on cpu, 3600 simulated seconds on simulated)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="FL rounds per run (default 2 on cpu, 3 simulated)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every strategy, interleaved (default 1)")
    parser.add_argument("--devices", type=int, default=2, help="local devices (default 2)")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha of the data volumes (default 0.5)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per comparison (default 3600)")
    parser.add_argument("--home", default=None, help="MTFL_HOME to use (default: a new temporary folder)")
    args = parser.parse_args()
    simulated = args.backend == "simulated"
    mixes = sorted(PAPER_MIXES) if (args.mix or ("all" if simulated else "light")) == "all" else [args.mix or "light"]
    budget = args.budget if args.budget is not None else (3600.0 if simulated else 240.0)
    rounds = args.rounds if args.rounds is not None else (3 if simulated else 2)
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats must be 1 to 10")

    started = time.monotonic()
    home = setup_django(args.home)
    print(f"MTFL_HOME={home}")
    from rich.console import Console

    from controlplane.core.cli_support import comparison_report_tables
    from controlplane.core.stack import LocalStack
    from controlplane.experiments.selectors import comparison_report
    from controlplane.experiments.services import comparison_create
    from controlplane.fleet.models import Device

    data = sized_dataset(home / "data" / "cifar10-sized") if simulated else None
    archs = sorted({a for mix in mixes for a in PAPER_MIXES[mix]})
    names = [f"bench-{chr(ord('a') + i)}" for i in range(args.devices)]
    reports = {}
    with LocalStack(agents=names, backend=args.backend, log=lambda line: print(f"  {line}", flush=True)) as stack:
        stack.wait_ready()
        devices = list(Device.objects.filter(name__in=names).order_by("name"))
        profile_and_fit(stack, devices[0], budget=budget, architectures=archs, backend=args.backend)
        for mix in mixes:
            experiment = mix_experiment(
                mix=mix, device_ids=[d.id for d in devices], rounds=rounds, dataset_root=data, alpha=args.alpha
            )
            print(
                f"\n{mix} mix, experiment {experiment.name}: shards "
                + ", ".join(
                    f"{s.device.name}/{s.task.architecture}={s.num_samples}"
                    for s in experiment.shards.select_related("device", "task").order_by("device__name", "task_id")
                ),
                flush=True,
            )
            comparison = comparison_create(experiment=experiment, repeats=args.repeats)
            runs = follow(stack, list(comparison.runs.order_by("id")), timeout_s=args.timeout)
            for run in runs:
                if run.error:
                    print(f"  run {run.id} ({run.strategy}, repeat {run.repeat}): {run.status}: {run.error}")
            comparison.refresh_from_db()
            reports[mix] = comparison_report(comparison)
            wide = Console(width=200, highlight=False)  # a log file is not a terminal: no truncated tables
            for table in comparison_report_tables(reports[mix]):
                wide.print(table)

    print(f"\nbenchmark took {time.monotonic() - started:.0f} s; data in {home}")
    ratios = []
    ok = True
    for mix, report in reports.items():
        by_strategy = {row["strategy"]: row for row in report["strategies"]}
        sync = by_strategy.get("vres_sync")
        baselines = [row for name, row in by_strategy.items() if name in ("temporal", "isolation", "sharing")]
        best_fl = max((row["fl_throughput_sps"]["mean"] or 0.0 for row in baselines), default=0.0)
        if sync is None or not sync["fl_throughput_sps"]["mean"] or not best_fl:
            print(f"vres_sync_vs_best_baseline_{mix}=nan")
            ok = False
            continue
        ratio = sync["fl_throughput_sps"]["mean"] / best_fl
        ratios.append(ratio)
        worse = [v for v in report["verdicts"] if v["strategy"] == "vres_sync" and v["verdict"] == "worse"]
        judged = {v["figure"] for v in report["verdicts"] if v["strategy"] == "vres_sync"}
        worse_fl = [v for v in worse if v["figure"] == "fl_throughput_sps"]
        worse_tta = [v for v in worse if v["figure"] == "time_to_accuracy_s"]
        raw = sync["raw_speedup"]["mean"]
        print(f"vres_sync_raw_vs_temporal_{mix}={raw:.3f}" if raw else f"vres_sync_raw_vs_temporal_{mix}=nan")
        print(f"vres_sync_vs_best_baseline_{mix}={ratio:.3f}")
        # A component with no verdict at all (one repeat, or no task reached its target) is not
        # shown to be never worse.
        fl_ok = "fl_throughput_sps" in judged and not worse_fl
        tta_ok = "time_to_accuracy_s" in judged and not worse_tta
        print(f"vres_sync_never_worse_fl_{mix}={fl_ok}")
        print(f"vres_sync_never_worse_tta_{mix}={tta_ok}")
        print(f"vres_sync_never_worse_{mix}={fl_ok and tta_ok}")
        for v in worse:
            print(
                f"  worse: {v['figure']}{' of ' + v['task_name'] if v.get('task_name') else ''} against {v['against']}"
            )
    if not ratios:
        print("vres_sync_vs_best_baseline=nan")
        return 1
    print(f"vres_sync_vs_best_baseline={sum(ratios) / len(ratios):.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
