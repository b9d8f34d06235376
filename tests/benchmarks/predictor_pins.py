"""Write the predictor's held-out figures on the kept sweeps to ``predictor_pins.json``.

    python -m tests.benchmarks.predictor_pins          # from the repository root

For every kept 2-core sweep (``benchmarks/sweeps/cpu-2cores-*.json``) the predictor is fitted as
``python benchmarks/predictor.py --load <sweep>`` fits it (``placement="packed"``, every family,
5 folds, 3 partitions, seed 0; BLAS and OpenMP held to one thread by ``fit_predictor``), and the
held-out figures of every family (RMSLE, MAPE, RMSLE by mix size and by slice), the report's
counts and the kept predictor's fitted physical scalars are written out, with the workload
features the fit used (so :mod:`tests.benchmarks.test_predictor_pins` needs no torch).
``test_predictor_pins`` then holds any change of the predictor's code to these figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from controlplane.planning.predictor import ModelWorkload, fit_predictor
from tests.benchmarks import BENCHMARKS, load_benchmark

PINS = Path(__file__).with_name("predictor_pins.json")
COMMAND = "python -m tests.benchmarks.predictor_pins"
SWEEPS = sorted((BENCHMARKS / "sweeps").glob("cpu-2cores-*.json"))


def figures(path: Path, workloads: dict[str, ModelWorkload], bench: Any) -> dict[str, Any]:
    """The held-out figures of fitting every family on the sweep at ``path``."""
    saved = json.loads(path.read_text())
    samples = bench.to_samples(saved["results"])
    predictor, report = fit_predictor(samples, workloads, cores=saved["cores"], placement="packed")
    space = predictor.space
    return {
        "configurations": report.configurations,
        "groups": report.groups,
        "samples": report.samples,
        "folds": report.folds,
        "partitions": report.partitions,
        "kept": report.kept,
        "families": {
            f.family: {
                "rmsle": f.rmsle,
                "mape": f.mape,
                "by_mix_size": {str(k): v for k, v in f.by_mix_size.items()},
                "by_slice": f.by_slice,
            }
            for f in report.families
        },
        "physics": {
            "sharing_weight": space.sharing_weight,
            "escape_weight": space.escape_weight,
            "link_exponent": space.link_exponent,
            "passive_ratio": space.passive_ratio,
            "reference_speed_index": space.reference_speed_index,
            "reference_cross_core_rtt_ns": space.reference_cross_core_rtt_ns,
        },
    }


def main() -> int:
    bench = load_benchmark("predictor")
    architectures = sorted(
        {t["architecture"] for path in SWEEPS for r in json.loads(path.read_text())["results"] for t in r["tasks"]}
    )
    workloads = bench.workloads_of(architectures)
    pins = {
        "command": COMMAND,
        "workloads": {
            a: [w.train_flops_per_sample, w.activation_bytes_per_sample, w.params, w.param_bytes, w.ops_per_step]
            for a, w in workloads.items()
        },
        "sweeps": {},
    }
    for path in SWEEPS:
        pins["sweeps"][path.name] = figures(path, workloads, bench)
        print(
            path.name, {f: round(v["rmsle"], 4) for f, v in pins["sweeps"][path.name]["families"].items()}, flush=True
        )
    PINS.write_text(json.dumps(pins, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
