"""Diagnostic: how repeatable is one profiled configuration on this host, back to back and
right after a large configuration?

    python benchmarks/profile_repeatability.py [--config mobilenet_v3_small/32/95]
        [--after mobilenet_v3_large/256/40+mobilenet_v3_large/256/15+resnet18/16/20+mobilenet_v3_small/128/55]
        [--repeats 4] [--cores 0,1]

A configuration is ``model/batch_size/share`` joined by ``+``. The script measures ``--config``
``--repeats`` times in a row, then ``--repeats`` times each directly after ``--after``, with
``workers.profiling.sweep.measure_configuration`` on the cpu backend: exactly what a profiling sweep
does for one configuration (profiler processes forked from the sweep's fork servers, warm-up,
common window, speed probe; ``MTFL_PROFILER_FORK_SERVER=0``: new interpreters instead). It prints
every measurement with its speed index, then per condition the median throughput and the RMS
log spread of one measurement, and the ratio of the two medians, raw and divided by the speed
probe.

Why: on the 2-core Firecracker VM of issue 3's closing note, ``mobilenet_v3_small`` at batch
32 on both cores measured 817–880 samples/s back to back, but 470–660 in processes started
right after a 4-task configuration of large batches had exited (five times out of five, every
timed iteration 63 ms instead of 37 ms), while the speed probe read the same host speed. Later
runs showed the cause is not the preceding configuration: the host has slow periods of tens of
seconds in which a 2-thread trainer runs about 40 % slower (also alone, also plain torch
outside the profiler, with either OpenMP wait policy) while a 1-thread trainer and the probe
change by a few percent. This script printed ``after_ratio=0.974`` in a calm period. Such a
host adds that spread to profile samples; the sweep's ``repeat_noise``
(benchmarks/predictor.py) is its average over one sweep. The slow periods turned out to be the
host placing the VM's two cores far apart (workers.profiling.core_link_probe: a cache line's round trip
between them 230–250 ns in calm periods, 580–630 ns in slow ones); a multi-core
measurement prints the round trip its link probe read.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_AFTER = "mobilenet_v3_large/256/40+mobilenet_v3_large/256/15+resnet18/16/20+mobilenet_v3_small/128/55"


def parse_configuration(text: str):
    """``model/batch_size/share[+…]`` → ProfileTaskSpec list.

    Raises:
        SystemExit: a part is not ``model/batch_size/share`` or a value is out of range (one
            line naming the field and ProfileTaskSpec's rule).
    """
    from pydantic import ValidationError

    from workers.protocol.messages import ProfileTaskSpec
    from workers.registry.names import check_names

    tasks = []
    for part in text.split("+"):
        fields = part.split("/")
        if len(fields) != 3:
            raise SystemExit(f"error: {part!r} is not model/batch_size/share, e.g. resnet18/32/50")
        if not (fields[1].isdigit() and fields[2].isdigit()):
            raise SystemExit(f"error: {part!r}: batch_size and share must be whole numbers, e.g. resnet18/32/50")
        try:
            spec = ProfileTaskSpec(
                architecture=fields[0], batch_size=int(fields[1]), active_thread_percentage=int(fields[2])
            )
            tasks.append(check_names(spec))
        except ValidationError as exc:
            error = exc.errors()[0]
            raise SystemExit(f"error: {part!r}: {'.'.join(map(str, error['loc']))}: {error['msg']}") from None
    return tasks


def spread(logs: list[float]) -> float | None:
    """RMS deviation of one log-throughput from the condition's mean (sample standard deviation)."""
    return statistics.stdev(logs) if len(logs) > 1 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="mobilenet_v3_small/32/95", help="the configuration measured")
    parser.add_argument(
        "--after", default=DEFAULT_AFTER, help="the configuration run before each measurement of the second condition"
    )
    parser.add_argument("--repeats", type=int, default=4, help="measurements per condition (default 4, at least 2)")
    parser.add_argument("--cores", default=None, help="cores of the device, e.g. 0,1 (default: all)")
    args = parser.parse_args()
    if args.repeats < 2:
        raise SystemExit(f"error: --repeats must be at least 2, got {args.repeats}")

    from workers.backends.base import AgentContext
    from workers.forkserver import ForkServerPool
    from workers.profiling.sweep import fork_server_wanted, measure_configuration
    from workers.protocol.messages import ProfileSweepRequest
    from workers.registry.backends import get_backend

    config, after = parse_configuration(args.config), parse_configuration(args.after)
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    request = ProfileSweepRequest(
        sweep_id=1,
        device="bench",
        backend="cpu",
        budget_s=60,
        architectures=sorted({t.architecture for t in config + after}),
    )
    backend = get_backend("cpu")
    results: dict[str, list[tuple[float, float]]] = {"back to back": [], "after --after": []}
    with tempfile.TemporaryDirectory(prefix="mtfl-repeat-") as state, ForkServerPool(Path(state)) as pool:
        ctx = AgentContext(device="bench", cores=cores, state_dir=Path(state), artifact_root=Path(state))
        launcher = pool if fork_server_wanted(backend) else None
        index = 0

        def measure(tasks, label: str | None):
            nonlocal index
            result = measure_configuration(tasks, request, ctx, backend, config_index=index, launcher=launcher)
            index += 1
            if result.status != "succeeded":
                raise SystemExit(f"error: configuration {index - 1} failed: {result.error}")
            m = result.measurements[0]
            if label is not None:
                results[label].append((m.throughput_sps, m.speed_index or float("nan")))
                link = f", cores' round trip {m.cross_core_rtt_ns:.0f} ns" if m.cross_core_rtt_ns else ""
                print(
                    f"{label:<14} {args.config}: {m.throughput_sps:7.1f} samples/s (task 0), "
                    f"speed index {m.speed_index or float('nan'):.1f}{link}",
                    flush=True,
                )

        for _ in range(args.repeats):
            measure(config, "back to back")
        for _ in range(args.repeats):
            measure(after, None)
            measure(config, "after --after")

    print()
    medians = {}
    for label, values in results.items():
        logs = [math.log(p) for p, _ in values]
        speed_logs = [math.log(p / s) for p, s in values]
        medians[label] = (statistics.median(p for p, _ in values), statistics.median(p / s for p, s in values))
        print(
            f"{label:<14} median {medians[label][0]:7.1f} samples/s; spread of one measurement "
            f"{spread(logs):.3f} raw, {spread(speed_logs):.3f} divided by the speed probe"
        )
    ratio = medians["after --after"][0] / medians["back to back"][0]
    ratio_speed = medians["after --after"][1] / medians["back to back"][1]
    print(f"after_ratio={ratio:.3f}")
    print(f"after_ratio_speed={ratio_speed:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
