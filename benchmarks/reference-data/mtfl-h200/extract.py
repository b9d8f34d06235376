"""Extract the H200 measurements the simulator is scored on into ``measurements.csv``.

    python benchmarks/reference-data/mtfl-h200/extract.py [RESULTS_DIR]

Reads every ``*.json`` of ``benchmarks/results/gpu_check_h200/`` (default; schema
``mtfl-gpu-check/1``, written by ``benchmarks/gpu_check.py``) and writes one row per measured
task: each succeeded profiling configuration's tasks, and each measured strategy plan's tasks.
Skipped and failed plans, and tasks without a measured throughput, are left out. The README
beside this file describes the columns.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "results" / "gpu_check_h200"
COLUMNS = [
    "run",
    "kind",
    "group",
    "strategy",
    "partitioning",
    "task_index",
    "architecture",
    "batch_size",
    "share",
    "configuration",
    "samples_per_s",
    "timed_iterations",
    "peak_memory_bytes",
    "gpu_util_mean_percent",
]


def configuration(tasks: list[tuple[str, int, int]]) -> str:
    """The whole co-located configuration, in task order: ``arch@batch@share+...``."""
    return "+".join(f"{a}@{b}@{s}" for a, b, s in tasks)


def rows_of(run: str, check: dict[str, Any]) -> list[dict[str, object]]:
    """One row per measured task of one gpu_check JSON (see the module docstring)."""
    rows: list[dict[str, object]] = []
    for config in check["profile"]["configs"]:
        if config["status"] != "succeeded":
            continue
        tasks = [(t["architecture"], t["batch_size"], t["active_thread_percentage"]) for t in config["tasks"]]
        for m in config["measurements"]:
            if m.get("throughput_sps") is None:
                continue
            rows.append(
                {
                    "run": run,
                    "kind": "profile",
                    "group": f"config{config['config_index']:02d}",
                    "strategy": "",
                    "partitioning": "mps",
                    "task_index": m["task_index"],
                    "architecture": m["architecture"],
                    "batch_size": m["batch_size"],
                    "share": m["active_thread_percentage"],
                    "configuration": configuration(tasks),
                    "samples_per_s": round(m["throughput_sps"], 3),
                    "timed_iterations": m["timed_iterations"],
                    "peak_memory_bytes": m.get("peak_memory_bytes") or "",
                    "gpu_util_mean_percent": "",
                }
            )
    for mix in check["mixes"]:
        for plan in mix["strategies"]:
            if plan["status"] != "succeeded":
                continue
            tasks = [(t["architecture"], t["batch_size"], t["share"]) for t in plan["tasks"]]
            for k, t in enumerate(plan["tasks"]):
                if t.get("measured_sps") is None:
                    continue
                rows.append(
                    {
                        "run": run,
                        "kind": "plan",
                        "group": f"{mix['name']}/{plan['strategy']}",
                        "strategy": plan["strategy"],
                        "partitioning": plan["partitioning"],
                        "task_index": k,
                        "architecture": t["architecture"],
                        "batch_size": t["batch_size"],
                        "share": t["share"],
                        "configuration": configuration(tasks),
                        "samples_per_s": round(t["measured_sps"], 3),
                        "timed_iterations": t["timed_iterations"],
                        "peak_memory_bytes": t.get("peak_memory_bytes") or "",
                        "gpu_util_mean_percent": round(plan["gpu_util_mean_percent"], 1),
                    }
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results = Path(args[0]) if args else RESULTS
    files = sorted(results.glob("*.json"))
    if not files:
        print(f"no *.json in {results}", file=sys.stderr)
        return 2
    rows = [row for path in files for row in rows_of(path.stem, json.loads(path.read_text()))]
    with open(HERE / "measurements.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows from {len(files)} files -> {HERE / 'measurements.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
