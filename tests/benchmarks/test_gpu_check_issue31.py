"""benchmarks/gpu_check.py --issue31 end to end on the simulated backend: the same phases a GPU
host runs (profile, fit, plan, eager against graphs alone, the strategies in interleaved blocks,
2 FL rounds through the embedded control plane, the targets), so the check cannot rot before a
GPU is lent; and its pure parts (the paired ratio, the targets)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
LIGHT = ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"]
STRATEGIES = ["temporal", "isolation", "sharing", "vres_sync"]


@pytest.mark.integration
@pytest.mark.one_database
def test_the_issue31_check_runs_end_to_end_on_simulated(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OUT=str(tmp_path), PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--backend",
            "simulated",
            "--issue31",
            "--blocks",
            "2",
            "--budget",
            "120",
            "--min-configs",
            "10",
            "--e2e-time-limit",
            "300",
            "--time-limit",
            "600",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )  # 60-90 s on an idle 2-core machine; minutes on a loaded one

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert output.splitlines()[-1].startswith("gpu_check: OK in "), output[-3000:]
    assert "| target | value | 95 % interval | goal | met |" in output
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (report["schema"], report["status"], report["exit_code"]) == ("mtfl-gpu-check/2", "succeeded", 0)
    assert [p["name"] for p in report["phases"]] == [
        "preflight",
        "features",
        "profile",
        "fit",
        "plan",
        "alone",
        "compare",
        "e2e",
        "report",
    ]
    assert all(p["status"] == "succeeded" for p in report["phases"]), report["phases"]
    # The workers-only phases ran without Django: only the e2e child imports it.
    assert report["host"]["django_imported"] is False and report["host"]["celery_imported"] is False

    profile = report["profile"]
    assert profile["succeeded"] >= 10 and profile["execution"] == "graphs"
    assert profile["summary"]["configs"] > 0 and profile["sweep_seconds_per_config"] > 0
    assert all(m["execution_mode"] == "graphs" for c in profile["configs"] for m in c["measurements"])

    modes = report["alone_modes"]
    assert [row["architecture"] for row in modes] == LIGHT
    for row in modes:
        assert row["batch_size"] == 128 and row["eager_sps"] > 0 and row["graphs_sps"] > 0, row
        assert (row["eager_ran"], row["graphs_ran"]) == ("eager", "graphs")
        assert row["graphs_over_eager"] == pytest.approx(row["graphs_sps"] / row["eager_sps"])

    compared = report["compare"]
    assert compared["execution"] == "graphs" and len(compared["blocks"]) == 2
    # Interleaved: every block measures every strategy once, the second in a rotated order.
    assert [b["order"] for b in compared["blocks"]] == [STRATEGIES, STRATEGIES[1:] + STRATEGIES[:1]]
    assert [s["strategy"] for s in compared["strategies"]] == STRATEGIES
    for row in compared["strategies"]:
        raw = row["raw_sps"]
        assert row["blocks_succeeded"] == 2 and raw["n"] == 2
        assert raw["low"] <= raw["mean"] <= raw["high"] and raw["mean"] > 0, row
        values = [b["measurements"][row["strategy"]]["raw_sps"] for b in compared["blocks"]]
        assert raw["mean"] == pytest.approx(sum(values) / 2)
    assert compared["strategies"][0]["partitioning"] == "timeslice"
    assert compared["strategies"][0]["raw_over_temporal"] == 1.0
    paired = compared["vres_sync_over_best_baseline"]
    assert paired["baseline"] in STRATEGIES[:3] and paired["n"] == 2
    assert paired["low"] <= paired["ratio"] <= paired["high"]

    e2e = report["e2e"]
    assert e2e["schema"] == "mtfl-gpu-e2e/1" and e2e["status"] == "succeeded", e2e["error"]
    assert e2e["device"]["backend"] == "simulated"
    # The control plane's predictor was fitted on this check's own sweep, not a second one.
    assert e2e["profile"]["configs"] == profile["summary"]["configs"]
    assert e2e["predictor"]["status"] == "ready"
    assert [run["strategy"] for run in e2e["runs"]] == ["sharing", "vres_sync"]
    for run in e2e["runs"]:
        assert run["status"] == "succeeded" and run["simulated"], run["error"]
        assert [r["index"] for r in run["rounds"]] == [0, 1]
        for r in run["rounds"]:
            assert r["status"] == "succeeded" and r["fl_throughput_sps"] > 0
            assert sorted(a["architecture"] for a in r["assignments"]) == sorted(LIGHT)
            assert sorted(c["architecture"] for c in r["checkpoints"]) == sorted(LIGHT)
            for checkpoint in r["checkpoints"]:
                assert checkpoint["evaluation_status"] == "done"
                assert 0.0 <= checkpoint["test_accuracy"] <= 1.0

    rows = {t["name"]: t for t in report["targets"]}
    assert report["targets_simulated"] is True
    assert rows["FL rounds through the control plane (each run)"]["value"] == 2
    assert rows["FL rounds through the control plane (each run)"]["met"] is True
    assert all(f"graphs / eager alone, {arch} B128" in rows for arch in LIGHT)
    assert rows["profiled configurations"]["value"] == profile["succeeded"]


def _compare(blocks: list[dict[str, float]]) -> dict:
    """A compare report of ``blocks`` (strategy -> raw samples/s per block) as gpu_check makes it."""
    from controlplane.planning.metrics import estimate

    names = list(blocks[0])
    return {
        "blocks": [{"measurements": {n: {"raw_sps": b[n]} for n in names}} for b in blocks],
        "strategies": [{"strategy": n, "raw_sps": estimate(b[n] for b in blocks).as_dict()} for n in names],
    }


def test_the_paired_ratio_is_over_the_best_baseline_on_the_log_scale():
    gpu_check = load_benchmark("gpu_check")
    out = _compare(
        [
            {"temporal": 100.0, "sharing": 200.0, "vres_sync": 240.0},
            {"temporal": 110.0, "sharing": 180.0, "vres_sync": 234.0},
            {"temporal": 90.0, "sharing": 220.0, "vres_sync": 242.0},
        ]
    )

    paired = gpu_check.paired_ratio(out, "vres_sync", ("temporal", "isolation", "sharing"))

    logs = [math.log(1.2), math.log(1.3), math.log(1.1)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert paired["baseline"] == "sharing" and paired["n"] == 3
    assert paired["ratio"] == pytest.approx(math.exp(mean))
    assert (paired["low"], paired["high"]) == pytest.approx((math.exp(mean - half), math.exp(mean + half)))


def test_the_paired_ratio_leaves_out_a_block_missing_either_side():
    gpu_check = load_benchmark("gpu_check")
    out = _compare([{"sharing": 100.0, "vres_sync": 150.0}, {"sharing": 100.0, "vres_sync": 150.0}])
    out["blocks"][1]["measurements"]["vres_sync"]["raw_sps"] = None

    paired = gpu_check.paired_ratio(out, "vres_sync", ("sharing",))

    assert paired == {"baseline": "sharing", "ratio": pytest.approx(1.5), "low": None, "high": None, "n": 1}
    assert gpu_check.paired_ratio(out, "vres_greedy", ("sharing",)) is None


def test_e2e_rounds_counts_only_rounds_with_every_accuracy():
    gpu_check = load_benchmark("gpu_check")
    done = {"status": "succeeded", "checkpoints": [{"test_accuracy": 0.5}, {"test_accuracy": 0.7}]}
    pending = {"status": "succeeded", "checkpoints": [{"test_accuracy": 0.5}, {"test_accuracy": None}]}
    report = {
        "runs": [
            {"status": "succeeded", "rounds": [done, done]},
            {"status": "succeeded", "rounds": [done, pending]},
        ]
    }

    assert gpu_check.e2e_rounds_succeeded(report) == 1
    report["runs"][1]["status"] = "failed"
    assert gpu_check.e2e_rounds_succeeded(report) == 0
    assert gpu_check.e2e_rounds_succeeded(None) is None


def test_issue31_refuses_a_single_block_in_one_line(capsys):
    gpu_check = load_benchmark("gpu_check")

    code = gpu_check.main(["--backend", "simulated", "--issue31", "--blocks", "1"])

    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 2
    assert lines == ["gpu_check: FAILED: --blocks must be at least 2 (an interval needs two), got 1"]


def test_on_a_gpu_backend_alone_and_compare_measure_through_the_warm_pool_in_the_mode_asked(monkeypatch, tmp_path):
    """No GPU here: the cuda-mps backend object (built, never started) and a stand-in for
    measure_configuration show what the check asks of a GPU host."""
    gpu_check = load_benchmark("gpu_check")
    from workers.backends import AgentContext
    from workers.protocol.messages import ProfileConfigResult, ProfileMeasurement
    from workers.registry.backends import get_backend

    calls = []

    def measure_configuration(tasks, request, ctx, backend, *, config_index, partitioning, should_stop, launcher):
        calls.append((partitioning, request.execution.mode, launcher, [t.architecture for t in tasks]))
        mode = "eager" if request.execution.mode == "eager" else "graphs"
        speed = 1000.0 if mode == "eager" else 2500.0
        return ProfileConfigResult(
            sweep_id=request.sweep_id,
            device=ctx.device,
            backend=request.backend,
            config_index=config_index,
            tasks=list(tasks),
            measurements=[
                ProfileMeasurement(
                    task_index=k,
                    architecture=t.architecture,
                    batch_size=t.batch_size,
                    active_thread_percentage=t.active_thread_percentage,
                    throughput_sps=speed * (k + 1),
                    execution_mode=mode,
                )
                for k, t in enumerate(tasks)
            ],
            started_at=0.0,
            finished_at=1.0,
            status="succeeded",
        )

    monkeypatch.setattr("workers.profiling.sweep.measure_configuration", measure_configuration)
    args = gpu_check.parse_args(["--backend", "cuda-mps", "--issue31", "--blocks", "2"])
    check = gpu_check.Check(args)
    backend = get_backend("cuda-mps")
    ctx = AgentContext(device="gpu-check", cores=[0], state_dir=tmp_path, artifact_root=tmp_path / "a")
    measurer = gpu_check.Measurer(check, backend, ctx)

    rows = gpu_check.alone_modes(check, measurer, ["resnet18"])
    entry = {
        "name": "light",
        "strategies": [
            {
                "strategy": name,
                "partitioning": partitioning,
                "tasks": [{"architecture": "resnet18", "batch_size": 128, "share": share, "predicted_sps": None}],
            }
            for name, partitioning, share in (("temporal", "timeslice", 100), ("vres_sync", "mps", 60))
        ],
    }
    out = gpu_check.compare(check, measurer, entry, {("resnet18", 128): (2500.0, "measured")})

    pool = backend.profiler_pool()
    assert pool is not None and all(launcher is pool for _, _, launcher, _ in calls)
    assert [(p, m) for p, m, _, _ in calls] == [
        ("timeslice", "eager"),
        ("timeslice", "graphs"),
        ("timeslice", "graphs"),
        ("mps", "graphs"),
        ("mps", "graphs"),
        ("timeslice", "graphs"),
    ]
    assert rows == [
        {
            "architecture": "resnet18",
            "batch_size": 128,
            "graphs_over_eager": 2.5,
            "error": "",
            "eager_sps": 1000.0,
            "eager_ran": "eager",
            "eager_host_step_s": None,
            "graphs_sps": 2500.0,
            "graphs_ran": "graphs",
            "graphs_host_step_s": None,
        }
    ]
    assert [s["raw_sps"]["mean"] for s in out["strategies"]] == [2500.0, 2500.0]
    assert out["vres_sync_over_best_baseline"]["ratio"] == pytest.approx(1.0)
