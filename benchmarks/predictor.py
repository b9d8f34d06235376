"""Benchmark: profile co-located mixes on the cpu backend, fit the throughput predictor, and
print its held-out accuracy per model family and its speed.

    python benchmarks/predictor.py [--budget 480] [--cores 0,1] [--save sweep.json]
    python benchmarks/predictor.py --load sweep.json      # refit on a saved sweep

Eleven real 2-core sweeps are kept in ``benchmarks/sweeps/``, five of them profiled through the
profilers' fork server (``*-fork-*``) (``--load`` any of them to compare a change to the
predictor on the same measurements; tests/benchmarks/test_predictor_sweeps.py refits them and
holds the README's figures).

Steps: (1) a profiling sweep of ``--budget`` seconds on this machine's cores, exactly what a
device agent runs for ``POST /api/devices/{id}/profile/`` (workers.profiling.sweep.run_sweep with the
cpu backend); (2) workload features of the models (torch.utils.flop_counter); (3) the four
model families compared under grouped cross-validation with whole mixes held out (5 folds, the
error taken over 3 random partitions of the mixes into folds), the best
kept (controlplane.planning.predictor.fit_predictor); (4) speed: fitting the kept family on
5,000 samples (the sweep's configurations resampled with replacement, throughputs jittered by
2 % so no two rows are identical: a timing workload, not new measurements) and predicting
100,000 random configurations in one call.

On the ``cpu`` backend every measurement carries its cores' speed (``speed_index``,
workers.profiling.speed_probe). The benchmark prints the measurement noise of the sweep's repeated
configurations, raw and divided by the speed probe, then the families' held-out accuracy twice:
on raw throughputs (the host's speed changes left in: no predictor can do better than the raw
noise) and on throughputs at the reference speed (controlplane.planning.predictor.normalise_speed),
which is what the fitted predictor predicts and what ``heldout_rmsle`` reports. Every
measurement of a task on 2 or more cores also carries the round trip between its cores
(``cross_core_rtt_ns``, workers.profiling.core_link_probe): the benchmark prints their spread and the
kept predictor's link exponent (how much a task alone on several cores slows down when the host
moves them apart; the predictor predicts at the near placement) and its passive-wait ratio ``κ``
(what a multi-threaded task on shared cores pays per iteration, as a fraction of its per-iteration
overhead ``t_0``). Last, the kept family's held-out
error by the slice a task ran on (controlplane.planning.predictor.slice_labels: how many cores,
alone on them or not) beside the repeat noise of the same slices: on 2 cores a 1-thread task
alone on its core is predicted far better than a 2-thread one.

Targets (issue 3): held-out RMSLE ≤ 0.10, fit on 5,000 samples < 30 s, 100,000 predictions
< 1 s. The last line is ``heldout_rmsle=<value>`` for the kept family.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.planning.predictor import (  # noqa: E402
    MAX_MIX,
    MixTask,
    ModelWorkload,
    ProfiledTask,
    encode_mixes,
    fit_family,
    fit_predictor,
    slice_labels,
)

DEFAULT_ARCHITECTURES = "resnet18,mobilenet_v3_small,shufflenet_v2_x1_0,mobilenet_v3_large"


def profile(args) -> list[dict]:
    from workers.backends.base import AgentContext
    from workers.profiling.sweep import run_sweep
    from workers.protocol.messages import ProfileSweepRequest
    from workers.registry.backends import get_backend

    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    request = ProfileSweepRequest(
        sweep_id=1,
        device="bench",
        backend="cpu",
        budget_s=args.budget,
        architectures=args.architectures.split(","),
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        max_mix=args.max_mix,
        seed=args.seed,
        **({} if args.min_window_s is None else {"min_window_s": args.min_window_s}),
    )
    results: list[dict] = []
    started = time.monotonic()

    def emit(result) -> None:
        results.append(result.model_dump(mode="json"))
        mix = " + ".join(f"{t.architecture}/B{t.batch_size}/{t.active_thread_percentage}%" for t in result.tasks)
        rates = ", ".join(f"{m.throughput_sps:.0f}" if m.throughput_sps else "—" for m in result.measurements)
        print(
            f"[{time.monotonic() - started:6.0f} s] config {result.config_index:3d} {result.status:9s} {mix} → {rates} samples/s",
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="mtfl-bench-") as state:
        ctx = AgentContext(device="bench", cores=cores, state_dir=Path(state), artifact_root=Path(state))
        summary = run_sweep(request, ctx, get_backend("cpu"), emit, should_stop=lambda: False)
    spread = sorted(summary.repeat_spread)
    print(
        f"\nsweep: {summary.configs} configurations, {summary.samples} task samples in {summary.elapsed_s:.0f} s "
        f"on {len(cores)} cores ({summary.elapsed_s / max(1, summary.configs):.1f} s per configuration)"
    )
    if spread:
        print(
            f"repeat spread over {len(spread)} repeated configurations: median {100 * spread[len(spread) // 2]:.1f} %, "
            f"largest {100 * spread[-1]:.1f} %"
        )
    return results


def to_samples(results: list[dict]) -> list[ProfiledTask]:
    samples = []
    for r in results:
        if r["status"] != "succeeded":
            continue
        mix = tuple(MixTask(t["architecture"], t["batch_size"], t["active_thread_percentage"]) for t in r["tasks"])
        for m in r["measurements"]:
            if m["throughput_sps"]:
                samples.append(
                    ProfiledTask(
                        f"c{r['config_index']}",
                        mix,
                        m["task_index"],
                        m["throughput_sps"],
                        m["standalone_sps"],
                        m["peak_memory_bytes"],
                        m.get("speed_index"),
                        m.get("cross_core_rtt_ns"),
                    )
                )
    return samples


def repeat_pairs(results: list[dict]) -> list[tuple[tuple[MixTask, ...], int, float, float | None]]:
    """Every task of every (original, repeat) pair of the sweep: ``(configuration, task index,
    d_raw, d_speed)``, ``d`` the log ratio of the two throughputs, raw and divided by each one's
    speed index (``None`` without one)."""
    by_index = {r["config_index"]: r for r in results if r["status"] == "succeeded"}
    pairs = []
    for r in by_index.values():
        original = by_index.get(r["repeat_of"]) if r["repeat_of"] is not None else None
        if original is None:
            continue
        mix = tuple(MixTask(t["architecture"], t["batch_size"], t["active_thread_percentage"]) for t in r["tasks"])
        for a, b in zip(original["measurements"], r["measurements"], strict=True):
            if a["throughput_sps"] and b["throughput_sps"]:
                d = math.log(a["throughput_sps"] / b["throughput_sps"])
                speed = (
                    d - math.log(a["speed_index"] / b["speed_index"])
                    if a.get("speed_index") and b.get("speed_index")
                    else None
                )
                pairs.append((mix, b["task_index"], d, speed))
    return pairs


def sigma(d: list[float]) -> float | None:
    """One measurement's RMS log error from log ratios of pairs: ``sqrt(mean(d²) / 2)``; the
    floor of any predictor's held-out RMSLE on those measurements."""
    return math.sqrt(float(np.mean(np.square(d))) / 2) if d else None


def repeat_noise(results: list[dict]) -> tuple[int, float | None, float | None]:
    """Measurement noise from the sweep's repeated configurations: ``(pairs, σ_raw, σ_speed)``
    (:func:`sigma` over every task of every pair of :func:`repeat_pairs`)."""
    pairs = repeat_pairs(results)
    return len(pairs), sigma([p[2] for p in pairs]), sigma([p[3] for p in pairs if p[3] is not None])


def print_slices(report, predictor, results: list[dict]) -> None:
    """Held-out RMSLE of the kept family by the kind of slice a task ran on, beside the repeat
    noise of the same kind (speed-normalised when every repeated pair has the probe's reading,
    raw otherwise: one kind for every slice)."""
    kept = next(f for f in report.families if f.family == report.kept)
    pairs = repeat_pairs(results)
    noise: dict[str, list[float]] = {}
    if pairs:
        labels = slice_labels(predictor.space, encode_mixes([p[0] for p in pairs], predictor.space.architectures))
        probed = all(speed is not None for *_rest, speed in pairs)
        for (_mix, index, raw, speed), row in zip(pairs, labels, strict=True):
            noise.setdefault(str(row[index]), []).append(speed if probed else raw)
    print(f"\nby the slice a task ran on ({report.kept}; repeat noise from the sweep's repeated configurations):")
    print(f"{'slice':<20}{'tasks':>7}{'held-out RMSLE':>16}{'repeated tasks':>16}{'repeat noise':>14}")
    tasks = Counter(h["slice"] for h in report.heldout)
    for kind, value in kept.by_slice.items():
        n = noise.get(kind, [])
        print(f"{kind:<20}{tasks[kind]:>7d}{value:>16.3f}{len(n):>16d}{(f'{sigma(n):.3f}' if n else '—'):>14}")


def print_families(report) -> None:
    print(f"{'family':<20}{'RMSLE':>10}{'MAPE':>10}{'CV seconds':>12}   RMSLE by mix size")
    for f in sorted(report.families, key=lambda f: f.rmsle):
        sizes = "  ".join(f"{k}:{v:.3f}" for k, v in sorted(f.by_mix_size.items()))
        mark = "  ← kept" if f.family == report.kept else ""
        print(f"{f.family:<20}{f.rmsle:>10.4f}{100 * f.mape:>9.1f}%{f.fit_seconds:>12.1f}   {sizes}{mark}")


def workloads_of(architectures) -> dict[str, ModelWorkload]:
    from workers.training.features import workload_features

    out = {}
    for arch in sorted(set(architectures)):
        f = workload_features(arch, 10)
        out[arch] = ModelWorkload(
            f.train_flops_per_sample, f.activation_bytes_per_sample, f.params, f.param_bytes, f.ops_per_step
        )
    return out


def resampled(samples: list[ProfiledTask], n: int, seed: int) -> list[ProfiledTask]:
    """At least ``n`` samples: whole configurations drawn with replacement, throughputs
    jittered by 2 % (log-normal), under new configuration keys."""
    rng = np.random.default_rng(seed)
    by_config: dict[str, list[ProfiledTask]] = {}
    for s in samples:
        by_config.setdefault(s.config_key, []).append(s)
    keys = sorted(by_config)
    out: list[ProfiledTask] = []
    copy = 0
    while len(out) < n:
        key = keys[rng.integers(len(keys))]
        for s in by_config[key]:
            out.append(
                ProfiledTask(
                    f"r{copy}",
                    s.mix,
                    s.task_index,
                    s.throughput_sps * math.exp(rng.normal(0, 0.02)),
                    s.standalone_sps,
                    s.peak_memory_bytes,
                )
            )
        copy += 1
    return out


def random_configurations(
    n: int, architectures: list[str], batch_sizes: list[int], seed: int
) -> list[tuple[MixTask, ...]]:
    rng = np.random.default_rng(seed)
    shares = np.arange(10, 101, 5)
    sizes = rng.integers(1, MAX_MIX + 1, size=n)
    return [
        tuple(
            MixTask(
                architectures[rng.integers(len(architectures))], int(rng.choice(batch_sizes)), int(rng.choice(shares))
            )
            for _ in range(k)
        )
        for k in sizes
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=480.0, help="profiling seconds (default 480)")
    parser.add_argument("--architectures", default=DEFAULT_ARCHITECTURES)
    parser.add_argument("--batch-sizes", default="16,32,64,128,256")
    parser.add_argument("--max-mix", type=int, default=4)
    parser.add_argument(
        "--min-window-s",
        type=float,
        default=None,
        help="seconds every configuration is timed at least (default: the sweep's, 2)",
    )
    parser.add_argument("--cores", default=None, help="cores of the profiled device, e.g. 0,1 (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="write the sweep's results to this JSON file")
    parser.add_argument("--load", default=None, help="skip profiling: fit on a sweep saved with --save")
    args = parser.parse_args()

    if args.load:
        saved = json.loads(Path(args.load).read_text())
        results, cores = saved["results"], saved["cores"]
        print(f"loaded {len(results)} configurations measured on {cores} cores from {args.load}")
    else:
        results = profile(args)
        cores = len(args.cores.split(",")) if args.cores else len(os.sched_getaffinity(0))
        if args.save:
            Path(args.save).write_text(json.dumps({"cores": cores, "results": results}))
    samples = to_samples(results)
    architectures = sorted({t.architecture for s in samples for t in s.mix})
    workloads = workloads_of(architectures)

    pairs, sigma_raw, sigma_speed = repeat_noise(results)
    if pairs:
        print(
            f"\nmeasurement noise from {pairs} repeated task measurements (RMS log error of one measurement): "
            f"{sigma_raw:.3f} raw"
            + (f", {sigma_speed:.3f} divided by the speed probe" if sigma_speed is not None else "")
        )

    rtts = sorted(s.cross_core_rtt_ns for s in samples if s.cross_core_rtt_ns)
    if rtts:
        q = lambda f: rtts[min(len(rtts) - 1, int(f * len(rtts)))]  # noqa: E731 - local shorthand
        print(
            f"cross-core round trip of {len(rtts)} multi-core task measurements: min {rtts[0]:.0f} ns, "
            f"10 % {q(0.1):.0f}, median {q(0.5):.0f}, 90 % {q(0.9):.0f}, max {rtts[-1]:.0f} ns"
        )

    raw_samples = [replace(s, speed_index=None) for s in samples]
    with_probe = any(s.speed_index for s in samples)
    if with_probe:
        _p, raw_report = fit_predictor(raw_samples, workloads, cores=cores, placement="packed", seed=args.seed)
        print("\nheld-out accuracy on raw throughputs (the host's speed changes left in):")
        print_families(raw_report)

    predictor, report = fit_predictor(samples, workloads, cores=cores, placement="packed", seed=args.seed)
    print(
        f"\nheld-out accuracy{' at the reference speed (throughputs divided by the speed probe)' if with_probe else ''}: "
        f"{report.samples} task samples in {report.configurations} configurations, "
        f"{report.groups} distinct mixes, {report.folds}-fold grouped cross-validation on {report.partitions} "
        f"random partitions (whole mixes held out)"
    )
    print_families(report)
    print_slices(report, predictor, results)
    if predictor.space.reference_cross_core_rtt_ns:
        print(
            f"link exponent γ = {predictor.space.link_exponent:.3f}: a task alone on 2+ cores runs at "
            f"(rtt / {predictor.space.reference_cross_core_rtt_ns:.0f} ns)^-γ of its speed at the near placement"
        )
    print(
        f"passive-wait ratio κ = {predictor.space.passive_ratio:.3f}: a multi-threaded task on cores other tasks share "
        f"spends κ·t_0 more per iteration (its threads sleep at every barrier)"
    )

    big = resampled(samples, 5000, args.seed)
    t0 = time.perf_counter()
    fit_family(big, workloads, cores=cores, family=report.kept, placement="packed", seed=args.seed)
    fit_s = time.perf_counter() - t0
    configs = random_configurations(100_000, architectures, [int(b) for b in args.batch_sizes.split(",")], args.seed)
    enc = encode_mixes(configs, predictor.space.architectures)
    t0 = time.perf_counter()
    predicted = predictor.predict_arrays(enc)
    predict_s = time.perf_counter() - t0
    assert np.isfinite(predicted[enc.present]).all()
    kept = next(f for f in report.families if f.family == report.kept)
    print(f"\nfit of {report.kept} on {len(big)} samples: {fit_s:.2f} s (target < 30 s, ratio {fit_s / 30:.2f})")
    print(
        f"prediction of {len(configs)} configurations ({int(enc.present.sum())} tasks) in one call: {predict_s:.3f} s "
        f"(target < 1 s, ratio {predict_s:.2f})"
    )
    print(f"kept={report.kept}")
    print(f"heldout_mape={kept.mape:.4f}")
    print(f"fit_5000_samples_s={fit_s:.3f}")
    print(f"predict_100000_configs_s={predict_s:.3f}")
    if with_probe:
        raw_kept = min(raw_report.families, key=lambda f: f.rmsle)
        print(f"heldout_rmsle_raw={raw_kept.rmsle:.4f}")
    if sigma_raw is not None:
        print(f"repeat_noise_raw={sigma_raw:.4f}")
    if sigma_speed is not None:
        print(f"repeat_noise_speed={sigma_speed:.4f}")
    print(f"heldout_rmsle={kept.rmsle:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
