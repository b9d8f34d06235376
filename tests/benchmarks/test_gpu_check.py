"""benchmarks/gpu_check.py: the GPU check's whole pipeline run on the cpu backend (profile, fit,
plan, measure the five strategies, table and JSON), and its one-line failures."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
STRATEGIES = ["temporal", "isolation", "sharing", "vres_greedy", "vres_sync"]


def _run(args: list[str], out: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}}
    env.update(OUT=str(out), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _load_script():
    return load_benchmark("gpu_check")


def _nvidia_driver_present() -> bool:
    from workers.backends import gpu

    try:
        gpu.nvml()
    except gpu.GpuUnavailableError:
        return False
    return True


def test_gpu_check_on_cpu_prints_the_speedup_table_and_writes_the_json(tmp_path):
    # One core: the check's processes then never spin on a core another process holds, so
    # the run takes about as long on a loaded machine as its configurations need.
    core = str(min(os.sched_getaffinity(0)))
    done = _run(
        ["--backend", "cpu", "--quick", "--budget", "20", "--cores", core, "--time-limit", "1500"],
        tmp_path,
        timeout=1700,
    )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    lines = output.splitlines()
    assert lines[-1].startswith("gpu_check: OK in "), lines[-1]
    rows = {}
    for line in lines:
        match = re.match(r"^tiny\s+(\w+)\s+(timeslice|mps)\s+([\d.]+)\s+([\d.]+~?)\s+([\d.]+)×\s+([\d.]+)×~?\s+", line)
        if match:
            rows[match.group(1)] = match.groups()[1:]
    assert list(rows) == STRATEGIES, output[-4000:]
    assert rows["temporal"][0] == "timeslice" and rows["temporal"][3:5] == ("1.00", "1.00")
    assert rows["isolation"][0] == rows["sharing"][0] == "mps"
    # A planner runs MPS shares, or the time slices of temporal's configuration where it predicts
    # that baseline faster (never worse than a baseline: issue 31).
    assert all(rows[s][0] in ("mps", "timeslice") for s in STRATEGIES[3:])

    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (report["schema"], report["status"], report["exit_code"]) == ("mtfl-gpu-check/2", "succeeded", 0)
    assert report["compare"] is report["e2e"] is report["targets"] is None
    assert report["host"]["django_imported"] is False
    assert report["profile"]["succeeded"] >= 10 and report["predictor"]["configurations"] >= 10
    assert [p["name"] for p in report["phases"]] == [
        "preflight",
        "features",
        "profile",
        "fit",
        "plan",
        "measure",
        "alone",
        "report",
    ]
    assert all(p["status"] == "succeeded" for p in report["phases"])
    (mix,) = report["mixes"]
    assert mix["name"] == "tiny" and mix["architectures"] == ["mobilenet_v3_small", "shufflenet_v2_x1_0"]
    assert mix["data"] == {"policy": "equal", "samples": [512, 512], "alpha": None}
    assert [s["strategy"] for s in mix["strategies"]] == STRATEGIES
    for row in mix["strategies"]:
        assert row["status"] == "succeeded", row["error"]
        for key in ("raw_sps", "fair", "raw_speedup", "fair_speedup"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["strategy"], key, row[key])
        assert row["raw_sps"] == pytest.approx(sum(t["measured_sps"] for t in row["tasks"]))
        assert row["fair"] == pytest.approx(sum(t["measured_sps"] / t["alone_sps"] for t in row["tasks"]))
        for task in row["tasks"]:
            assert task["measured_sps"] > 0 and task["timed_iterations"] >= 3
            assert task["alone_source"] in ("profiled", "measured", "interpolated")
        assert row["measurement"]["status"] == "succeeded"
    temporal = mix["strategies"][0]
    assert temporal["partitioning"] == "timeslice"
    assert temporal["raw_speedup"] == temporal["fair_speedup"] == 1.0
    assert [t["batch_size"] for t in temporal["tasks"]] == [16, 16]
    isolation, sharing = mix["strategies"][1:3]
    assert [t["share"] for t in isolation["tasks"]] == [50, 50]
    assert [t["share"] for t in sharing["tasks"]] == [100, 100]
    for planned in mix["strategies"][3:]:
        if planned["notes"]:  # kept on a baseline's configuration, never predicted worse than it
            assert all(t["batch_size"] == 16 for t in planned["tasks"]), planned["notes"]
        else:
            assert planned["partitioning"] == "mps"
            assert all(8 <= t["batch_size"] <= 16 and t["predicted_sps"] > 0 for t in planned["tasks"])


@pytest.mark.skipif(_nvidia_driver_present(), reason="an NVIDIA driver is present: the check would run")
def test_gpu_check_without_a_gpu_fails_at_once_with_one_line(tmp_path):
    done = _run(["--backend", "cuda-mps"], tmp_path, timeout=120)

    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert "Traceback" not in output
    failures = [line for line in output.splitlines() if line.startswith("gpu_check: FAILED")]
    assert failures == [output.splitlines()[-1]]
    assert failures[0].startswith("gpu_check: FAILED: cuda-mps: ")
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "failed" and report["exit_code"] == 2
    assert report["error"] == failures[0].removeprefix("gpu_check: FAILED: ")
    assert report["phases"] == [
        {
            "name": "preflight",
            "started_s": report["phases"][0]["started_s"],
            "elapsed_s": report["phases"][0]["elapsed_s"],
            "status": "failed",
        }
    ]


def test_gpu_check_stops_on_sigterm_with_one_line_and_the_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OUT=str(tmp_path), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--backend", "cpu", "--quick"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # printed once the signal handlers are installed
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()

    lines = (first + rest).strip().splitlines()
    assert " start: backend cpu" in first
    assert proc.returncode == 3, lines
    assert re.fullmatch(r"gpu_check: FAILED: stopped by SIGTERM during phase \w+", lines[-1])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (report["status"], report["exit_code"]) == ("failed", 3)


def test_gpu_check_names_a_missing_package_in_one_line(monkeypatch, capsys, tmp_path):
    gpu_check = _load_script()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        gpu_check.importlib.util, "find_spec", lambda name, *a: None if name == "pydantic" else real_find_spec(name, *a)
    )
    monkeypatch.setenv("OUT", str(tmp_path))

    code = gpu_check.main(["--backend", "cpu"])

    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 2
    assert lines[-1].startswith("gpu_check: FAILED: missing Python package: pydantic (")
    assert sum(line.startswith("gpu_check: FAILED") for line in lines) == 1


def test_gpu_check_refuses_an_unknown_mix_in_one_line(capsys):
    gpu_check = _load_script()

    code = gpu_check.main(["--backend", "cpu", "--mixes", "light,huge"])

    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 2
    assert lines[-1] == "gpu_check: FAILED: --mixes: unknown mix huge; allowed: light, mixed, heavy, tiny"
