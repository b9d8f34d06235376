"""A whole comparison through real processes on simulated devices: a profile sweep on the
simulated backend (``mtfl profile``), a predictor fitted on it (``mtfl fit-predictor``), the light template, then all five strategies one
after another over the embedded Redis, every number labelled simulated."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Comparison, Run
from controlplane.experiments.selectors import comparison_report
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class
from controlplane.profiling.models import Predictor, ProfileSample, ProfileSweep

pytestmark = [pytest.mark.integration, pytest.mark.one_database]


def test_a_comparison_on_simulated_devices(child_env, monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    names = ["sim-a", "sim-b"]
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=120)
        devices = list(Device.objects.filter(name__in=names).order_by("name"))
        assert {device_class(d) for d in devices} == {"simulated-titan-v"}

        # What a researcher types, each in its own process against the running stack:
        # `mtfl profile` (a progress bar until the agent's sweep ends), then `mtfl fit-predictor`.
        env = {**os.environ, **stack._child_env()}
        profiled = subprocess.run(
            [
                sys.executable,
                "-m",
                "controlplane.cli",
                "profile",
                "--device",
                "sim-a",
                "--budget",
                "1800",
                "--architectures",
                "resnet18,mobilenet_v3_large,shufflenet_v2_x1_0",
                "--batch-sizes",
                "16,32,64,128,256",
                "--max-mix",
                "3",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )  # 14-19 s idle; minutes on a loaded 2-core machine
        assert profiled.returncode == 0, profiled.stdout[-3000:] + profiled.stderr[-3000:]
        sweep = ProfileSweep.objects.get(device=devices[0])
        assert f"sweep {sweep.id} succeeded: {sweep.configs} configurations, {sweep.samples} samples" in profiled.stdout
        assert sweep.samples > 100 and ProfileSample.objects.filter(sweep=sweep, simulated=False).count() == 0
        stack.children.check_alive()
        fitted = subprocess.run(
            [sys.executable, "-m", "controlplane.cli", "fit-predictor", "--backend", "simulated"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert fitted.returncode == 0, fitted.stdout[-3000:] + fitted.stderr[-3000:]
        predictor = Predictor.objects.get(backend="simulated")
        assert predictor.status == "ready" and predictor.device_class == "simulated-titan-v"
        assert f"/predictors/{predictor.id}/" in fitted.stdout and predictor.kept_family in fitted.stdout
        assert "median speed" not in fitted.stdout  # the simulated backend has no speed probe

        experiment = services.experiment_create_from_template(
            template="light", device_ids=[d.id for d in devices], rounds=1, dataset="digits"
        )
        # What a researcher types: `mtfl compare EXPERIMENT`, in its own process against the
        # running stack, follows every run to its end and prints the tables.
        done = subprocess.run(
            [sys.executable, "-m", "controlplane.cli", "compare", experiment.name, "--timeout", "600"],
            env={**os.environ, **stack._child_env()},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "vres_sync" in done.stdout and "Final test accuracy" in done.stdout
        assert "Time to accuracy" in done.stdout and "Planners against the best baseline" in done.stdout
        comparison = Comparison.objects.get(experiment=experiment)
        runs = [run_wait(run, timeout_s=10) for run in comparison.runs.order_by("id")]
        stack.children.check_alive()

    comparison.refresh_from_db()
    assert comparison.status == Comparison.Status.SUCCEEDED
    by_strategy = {r.strategy: r for r in runs}
    assert list(by_strategy) == ["temporal", "isolation", "sharing", "vres_greedy", "vres_sync"]
    for run in runs:
        assert run.status == Run.Status.SUCCEEDED, (run.strategy, run.error)
        assert run.simulated and run.fl_throughput_sps > 0
    assert not Assignment.objects.filter(round__run__in=runs, simulated=False).exists()
    planned = Assignment.objects.filter(round__run=by_strategy["vres_sync"])
    assert all(a.predicted_throughput_sps > 0 and a.throughput_sps > 0 for a in planned)
    # The simulated Titan V shares well: every MPS strategy beats time slicing, and planning
    # for the round time beats the best baseline on the round time itself.
    for strategy in ("isolation", "sharing", "vres_greedy", "vres_sync"):
        assert by_strategy[strategy].raw_throughput_sps > by_strategy["temporal"].raw_throughput_sps, strategy
    best_baseline = max(by_strategy[s].fl_throughput_sps for s in ("temporal", "isolation", "sharing"))
    assert by_strategy["vres_sync"].fl_throughput_sps > best_baseline
    # Time to accuracy: each task's default target is the lowest final accuracy of the runs, so
    # every run reaches it, here in its one round, after that round's FL round time.
    report = comparison_report(comparison)
    assert [t["source"] for t in report["targets"]] == ["lowest final accuracy"] * 3
    for row in report["runs"]:
        for task, target in zip(row["tasks"], report["targets"], strict=True):
            assert set(task) >= {"time_to_accuracy_s", "rounds_to_accuracy", "samples_to_accuracy"}
            if target["target"] is not None:
                assert task["rounds_to_accuracy"] == 1 and task["time_to_accuracy_s"] > 0, (row["strategy"], task)
    assert {v["strategy"] for v in report["verdicts"]} == {"vres_greedy", "vres_sync"}
