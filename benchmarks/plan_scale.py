"""Benchmark: plan one round for 1,000 devices × 3 tasks with ``vres_sync``.

    python benchmarks/plan_scale.py [--devices 1000] [--budget 3600] [--seed 0]

Steps: (1) a profiling sweep of the light mix's models (resnet18, mobilenet_v3_large,
shufflenet_v2_x1_0) on the ``simulated`` backend's Titan V, ``--budget`` simulated seconds
(workers.profiling.sweep.run_sweep, as an agent runs it); (2) a predictor fitted on it
(controlplane.planning.predictor.fit_predictor, shares pooled as under MPS, the device's SMs as
allocation units); (3) ``--devices`` devices, each holding a Dirichlet-skewed share of every
task's data (α = 0.5 over 50,000 samples per task per 10 devices, at least 16 per shard);
(4) the wall-clock time of ``vres_sync`` planning one round for all of them (the best of three
calls), and, for scale, ``vres_greedy`` on the first 50 devices. It also prints the predicted
round time of the plan against the ``sharing`` baseline's on the same predictor.

Target (issue 4): ≤ 2 s on 2 cores. Last line: ``plan_1000_devices_s=<seconds>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from predictor import to_samples, workloads_of  # noqa: E402 - benchmarks/predictor.py

from controlplane.planning.planner import DeviceCapacity, PlannerContext, plan_vres_greedy, plan_vres_sync  # noqa: E402
from controlplane.planning.predictor import MixTask, fit_predictor  # noqa: E402
from controlplane.planning.strategies import plan_sharing  # noqa: E402
from controlplane.planning.types import PlanningInput  # noqa: E402

LIGHT = ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"]


def simulated_sweep(budget_s: float, seed: int) -> tuple[list[dict], object]:
    from workers.backends.base import AgentContext
    from workers.profiling.sweep import run_sweep
    from workers.protocol.messages import ProfileSweepRequest
    from workers.registry.backends import get_backend

    backend = get_backend("simulated")
    request = ProfileSweepRequest(
        sweep_id=1,
        device="sim",
        backend="simulated",
        budget_s=budget_s,
        architectures=LIGHT,
        batch_sizes=[16, 32, 64, 128, 256, 512],
        max_mix=3,
        seed=seed,
    )
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mtfl-plan-") as state:
        ctx = AgentContext(device="sim", cores=[0], state_dir=Path(state), artifact_root=Path(state))
        summary = run_sweep(
            request, ctx, backend, lambda r: results.append(r.model_dump(mode="json")), should_stop=lambda: False
        )
    return results, summary, backend


def skewed_samples(devices: int, seed: int) -> dict[tuple[int, int], int]:
    rng = np.random.default_rng(seed)
    out = {}
    per_task_total = 5_000 * devices  # 50,000 samples per task per 10 devices
    for task in range(len(LIGHT)):
        p = rng.dirichlet(np.full(devices, 0.5))
        counts = np.maximum(16, np.floor(p * per_task_total)).astype(int)
        for d in range(devices):
            out[(d, task)] = int(counts[d])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--budget", type=float, default=3600.0, help="simulated profiling seconds (default 3600)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    results, summary, backend = simulated_sweep(args.budget, args.seed)
    samples = to_samples(results)
    workloads = workloads_of(LIGHT)
    device = backend.device
    print(
        f"simulated sweep on {device.name}: {summary.configs} configurations, {summary.samples} samples "
        f"({summary.elapsed_s:.0f} simulated s, {time.perf_counter() - t0:.1f} s wall)"
    )
    t0 = time.perf_counter()
    predictor, report = fit_predictor(samples, workloads, cores=int(device.sms), placement="pooled", seed=args.seed)
    kept = next(f for f in report.families if f.family == report.kept)
    print(f"predictor: kept {report.kept}, held-out RMSLE {kept.rmsle:.3f} ({time.perf_counter() - t0:.1f} s to fit)")

    samples_of = skewed_samples(args.devices, args.seed)
    spec = PlanningInput(
        device_ids=tuple(range(args.devices)), task_ids=tuple(range(len(LIGHT))), samples=samples_of, local_epochs=1
    )
    capacity = DeviceCapacity(predictor, memory_bytes=float(device.memory_bytes))
    ctx = PlannerContext(
        architectures=dict(enumerate(LIGHT)), devices=dict.fromkeys(spec.device_ids, capacity), seed=args.seed
    )
    shards = np.array(list(samples_of.values()))
    print(
        f"{args.devices} devices × {len(LIGHT)} tasks: shard sizes {shards.min()}–{shards.max()} "
        f"(median {int(np.median(shards))})"
    )
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        plan = plan_vres_sync(spec, ctx)
        times.append(time.perf_counter() - t0)
    best = min(times)
    sharing = plan_sharing(spec)
    mixes = [
        tuple(MixTask(LIGHT[a.task_id], a.batch_size, a.active_thread_percentage) for a in sharing.on_device(d))
        for d in spec.device_ids
    ]
    predicted = predictor.predict(mixes)
    sharing_round = max(
        a.samples / p
        for d, row in zip(spec.device_ids, predicted, strict=True)
        for a, p in zip(sharing.on_device(d), row, strict=True)
    )
    print(
        f"vres_sync: {best:.2f} s per plan (calls: {', '.join(f'{t:.2f}' for t in times)}); predicted round time "
        f"{plan.predicted_round_time_s:.1f} s against sharing's {sharing_round:.1f} s "
        f"({sharing_round / plan.predicted_round_time_s:.2f}× shorter)"
    )
    # What the slack buys: the same round time, more optimizer steps on the early devices.
    tight = plan_vres_sync(
        spec, PlannerContext(architectures=ctx.architectures, devices=ctx.devices, seed=args.seed, slack="none")
    )

    def steps_and_idle(p):
        steps = sum(-(-a.samples // a.batch_size) for a in p.assignments)
        busy = [max(a.samples / a.predicted_throughput_sps for a in p.on_device(d)) for d in spec.device_ids]
        idle = sum(p.predicted_round_time_s - b for b in busy) / (len(busy) * p.predicted_round_time_s)
        return steps, idle

    steps_tight, idle_tight = steps_and_idle(tight)
    steps_slack, idle_slack = steps_and_idle(plan)
    print(
        f"slack use: predicted round time {tight.predicted_round_time_s:.2f} s without, "
        f"{plan.predicted_round_time_s:.2f} s with; optimizer steps per round {steps_tight} → {steps_slack} "
        f"({steps_slack / steps_tight:.2f}×); devices idle {100 * idle_tight:.0f} % → {100 * idle_slack:.0f} % "
        "of the round (predicted)"
    )
    small = PlanningInput(device_ids=spec.device_ids[:50], task_ids=spec.task_ids, samples=samples_of, local_epochs=1)
    t0 = time.perf_counter()
    plan_vres_greedy(small, ctx)
    print(f"vres_greedy on 50 devices: {time.perf_counter() - t0:.2f} s")
    print(f"target ≤ 2 s: ratio {best / 2.0:.2f}")
    print(f"plan_1000_devices_s={best:.3f}" if args.devices == 1000 else f"plan_{args.devices}_devices_s={best:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
