"""Profiling through warm processes (issue 31, item 2): a warm trainer's ``profile`` jobs, the
pool's keys for them, a sweep on a GPU backend taking its profilers from the pool, the GPU's
busy fraction and seconds per configuration.

No GPU here: the sweep runs on the real ``cuda-mps`` backend with NVML, the MPS control daemon
and the SM probe replaced at their boundaries (the stand-ins of tests/workers/test_cuda_backends.py),
and its trainers told to compute on the CPU (``MTFL_TRAINER_DEVICE=cpu``): a cpu stand-in for
the GPU that runs the real warm trainers, pool and sweep.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from tests.workers.test_cuda_backends import (  # noqa: F401 - fixtures: the GPU's stand-ins
    fake_mps,
    fake_nvml,
    fake_probe,
)
from workers import config, launch, warm
from workers.backends import CpuBackend, CudaMpsBackend
from workers.backends.base import TrainerResources
from workers.launch import DONE_LINE, GO_LINE, READY_LINE
from workers.profiling.sweep import BUSY_SAMPLE_INTERVAL_S, PROFILER_COMMAND, busy_fraction, run_sweep
from workers.protocol.messages import GpuSample, ProfileConfigResult, ProfileSweepRequest
from workers.training.profiler import ITER_PREFIX, STOP_LINE, ProfileChildResult, ProfileChildSpec, WarmModels
from workers.training.runtime import ENV_DEVICE
from workers.training.zoo import build_model

REPO = Path(__file__).resolve().parents[2]
NVML_UTIL_PERCENT = 37  # what the stand-in NVML reports (tests/workers/test_cuda_backends.py)


def _spec(path: Path, architecture: str = "mobilenet_v3_small", batch_size: int = 8, **fields) -> Path:
    spec = ProfileChildSpec(architecture=architecture, batch_size=batch_size, threads=1, warmup_iterations=1, **fields)
    path.write_text(spec.model_dump_json())
    return path


# ------------------------------------------------------------------------- the model cache


def test_warm_models_build_once_and_hand_each_job_the_freshly_built_state():
    models = WarmModels()
    spec = ProfileChildSpec(architecture="mobilenet_v3_small", batch_size=8, threads=1)
    fresh = build_model(spec.architecture, spec.num_classes, spec.seed, spec.input_shape).state_dict()

    first = models.model(spec, torch.device("cpu"))
    with torch.no_grad():  # what a job's training leaves behind: other weights and statistics
        for value in first.state_dict().values():
            value.add_(1)
    first.train()(torch.randn(4, 3, 32, 32)).sum().backward()
    second = models.model(spec.model_copy(update={"batch_size": 64, "threads": 2}), torch.device("cpu"))

    assert second is first and models.models_built == 1
    assert all(p.grad is None for p in second.parameters())
    state = second.state_dict()
    assert state.keys() == fresh.keys()
    assert all(torch.equal(state[name], fresh[name]) for name in fresh)

    other = models.model(spec.model_copy(update={"num_classes": 20}), torch.device("cpu"))

    assert other is not first and models.models_built == 2


# --------------------------------------------------------------------------- the pool's key


def test_profile_jobs_share_a_process_across_batch_sizes_not_across_models_or_shares(tmp_path):
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}

    def key(spec: Path, environment: dict[str, str] = env) -> tuple[object, ...]:
        return warm.process_key(warm.TRAINER_MODULE, ["profile", str(spec), str(tmp_path / "r.json")], environment)

    small = key(_spec(tmp_path / "a.json", batch_size=8))

    assert key(_spec(tmp_path / "b.json", batch_size=256)) == small
    assert key(_spec(tmp_path / "c.json", architecture="resnet18")) != small
    assert key(_spec(tmp_path / "d.json", num_classes=100)) != small
    assert key(tmp_path / "a.json", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}) != small
    with pytest.raises(ValueError, match="profile SPEC RESULT"):
        warm.process_key(warm.TRAINER_MODULE, ["tune", str(tmp_path / "a.json"), "r.json"], env)


# ---------------------------------------------------------------- a warm trainer's profile job


def _profile_job(job, timed: int) -> list[list[str]]:
    """Drive one profile job (a warm trainer's job or a profiler process) through the sweep's
    protocol: READY, GO, ``timed`` ITER lines, STOP, its end; return every ITER line's words."""
    lines = iter(job.stdout)
    assert next(lines).split() == [READY_LINE.encode()]
    job.stdin.write(f"{GO_LINE}\n".encode())
    job.stdin.flush()
    iterations = [next(lines).decode().split() for _ in range(timed)]
    job.stdin.write(f"{STOP_LINE}\n".encode())
    job.stdin.flush()
    iterations += [raw.decode().split() for raw in lines]  # those timed before STOP arrived
    assert job.wait(timeout=120) == 0
    return iterations


def _check_iterations(iterations: list[list[str]], batch_size: int) -> None:
    """``ITER <start> <end> <samples> [<steps>]``: chunks of whole batches, one after another."""
    assert len(iterations) >= 3 and {words[0] for words in iterations} == {ITER_PREFIX}
    assert all(int(words[3]) == batch_size * int(words[4] if len(words) > 4 else 1) for words in iterations)
    spans = [(float(words[1]), float(words[2])) for words in iterations]
    assert all(start <= end for start, end in spans)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # one after another


def test_a_warm_trainer_serves_profile_jobs_one_after_another_as_a_cold_profiler_would(tmp_path):
    pool = warm.TrainerPool(max_processes=2)
    env = CpuBackend().trainer_env(TrainerResources(threads=1, cores=None))
    try:
        jobs, results = [], []
        for k, batch_size in enumerate((8, 16)):
            spec = _spec(tmp_path / f"job-{k}.spec.json", batch_size=batch_size)
            result = tmp_path / f"job-{k}.result.json"
            job = pool.spawn(
                warm.TRAINER_MODULE, ["profile", str(spec), str(result)], env=env, stderr_path=tmp_path / f"{k}.log"
            )
            iterations = _profile_job(job, timed=3)
            job.release(keep=True)
            jobs.append(job)
            results.append(ProfileChildResult.model_validate_json(result.read_text()))
            _check_iterations(iterations, batch_size)

        assert jobs[0].pid == jobs[1].pid and pool.started == 1  # the second job reused the process
        assert pool.idle_pids() == [jobs[0].pid]
    finally:
        pool.close()

    # The second spec through a new profiler process, driven the same way: the same protocol
    # and the same kind of result.
    cold_result = tmp_path / "cold.result.json"
    cold = subprocess.Popen(
        [*PROFILER_COMMAND, str(tmp_path / "job-1.spec.json"), str(cold_result)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        _check_iterations(_profile_job(cold, timed=3), 16)
    finally:
        cold.kill()
        cold.wait()
    expected = ProfileChildResult.model_validate_json(cold_result.read_text())
    for warm_result in results:
        assert warm_result.status == expected.status == "succeeded" and warm_result.error == expected.error == ""
        assert warm_result.iterations >= 1 + 3 and expected.iterations >= 1 + 3  # warm-up, then the timed ones
        # Private resident memory on cpu: torch's alone is more than 50 MiB in either process.
        assert min(warm_result.peak_memory_bytes, expected.peak_memory_bytes) > 50 * 2**20


def test_a_job_line_and_the_go_behind_it_in_one_write_both_reach_the_trainer(tmp_path):
    """serve reads its job lines through the same unbuffered reader as the job's GO and STOP:
    a buffered reader would keep the GO that arrived with the job line where select cannot
    see it, and the job would wait for ever."""
    spec = _spec(tmp_path / "s.spec.json")
    job_line = {"mode": "profile", "spec": str(spec), "result": str(tmp_path / "r.json"), "stderr": str(tmp_path / "e")}
    env = CpuBackend().trainer_env(TrainerResources(threads=1, cores=None))
    process = subprocess.Popen(
        [*warm.SERVE_COMMAND, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO
    )
    # A trainer waiting for a GO it already swallowed would wait for ever: the watchdog kills
    # it, its stdout ends and the test fails instead of hanging.
    watchdog = threading.Timer(120, process.kill)
    watchdog.start()
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(f"JOB {json.dumps(job_line)}\n{GO_LINE}\n".encode())
        process.stdin.flush()
        assert process.stdout.readline().split() == [READY_LINE.encode()]
        assert process.stdout.readline().split()[0] == ITER_PREFIX.encode()
        process.stdin.write(f"{STOP_LINE}\n".encode())
        process.stdin.flush()
        while (line := process.stdout.readline().split()) and line[0] == ITER_PREFIX.encode():
            pass
        assert line == [DONE_LINE.encode(), b"0"]
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        process.kill()
        process.wait()


# ------------------------------------------------------------------- a sweep on a GPU backend


class CpuStandInMps(CudaMpsBackend):
    """``cuda-mps`` whose trainers compute on the CPU: everything the backend does (shares in
    the environment, the MPS daemon, NVML) is real code, only the arithmetic moves."""

    def trainer_env(self, resources: TrainerResources) -> dict[str, str]:
        env = super().trainer_env(resources)
        env[ENV_DEVICE] = "cpu"
        return env


@pytest.fixture
def stand_in_backend(request, monkeypatch):
    request.getfixturevalue("fake_nvml")
    request.getfixturevalue("fake_mps")
    monkeypatch.setenv(config.ENV_WARM_TRAINERS, "8")
    monkeypatch.delenv(config.ENV_WARM_TRAINERS_MEMORY_MB, raising=False)
    backend = CpuStandInMps()
    yield backend
    backend.stop()


def test_a_sweep_on_a_gpu_backend_reuses_warm_profilers_per_model_and_share(stand_in_backend, agent_context):
    stand_in_backend.start(agent_context)
    emitted: list[ProfileConfigResult] = []
    request = ProfileSweepRequest(
        sweep_id=9,
        device=agent_context.device,
        backend="cuda-mps",
        budget_s=3600,
        architectures=["mobilenet_v3_small"],
        batch_sizes=[8, 16],
        max_mix=1,
        share_min=50,
        share_step=50,
        warmup_iterations=1,
        min_timed_iterations=2,
        min_window_s=0.2,
        config_timeout_s=900,  # a bound on failure only: a process start takes minutes on a loaded machine
        repeat_every=0,
    )
    pool = stand_in_backend.warm_pool()
    assert pool is not None

    summary = run_sweep(request, agent_context, stand_in_backend, emitted.append, should_stop=lambda: len(emitted) >= 4)

    assert summary.configs == len(emitted) == 4
    assert all(r.status == "succeeded" for r in emitted), [r.error for r in emitted]
    shares = {r.tasks[0].active_thread_percentage for r in emitted}
    # One process per share (the model is the same): fewer processes than configurations.
    assert pool.started == len(shares) < len(emitted)
    assert summary.seconds_per_config == pytest.approx(summary.elapsed_s / summary.configs)
    for result in emitted:
        (measurement,) = result.measurements
        assert measurement.throughput_sps > 0 and measurement.timed_iterations >= 2
        assert measurement.gpu_busy_fraction == pytest.approx(NVML_UTIL_PERCENT / 100)
        assert measurement.peak_memory_bytes > 50 * 2**20
    assert pool.pids() == [] and launch.live_children() == []  # the profilers go with the sweep


# -------------------------------------------------------------------------- busy fraction


def _sample(t: float, util: int) -> GpuSample:
    return GpuSample(t=t, gpu_util_percent=util, memory_used_bytes=0, memory_total_bytes=1)


def test_busy_fraction_is_the_mean_utilisation_of_the_samples_in_the_window():
    samples = [_sample(t, u) for t, u in [(0.9, 100), (1.0, 20), (1.5, 40), (2.0, 60), (2.4, 0)]]

    assert busy_fraction(samples, 1.0, 2.0) == pytest.approx(0.4)
    # A window between two samples: the next one covers its end.
    assert busy_fraction(samples, 2.05, 2.2) == 0.0
    assert busy_fraction(samples, 2.5, 3.0) is None
    assert busy_fraction(samples, 2.0, 1.0) is None
    assert busy_fraction([], 0.0, 1.0) is None


def test_a_device_without_a_gpu_samples_no_busy_fraction():
    assert CpuBackend().gpu_telemetry(BUSY_SAMPLE_INTERVAL_S) is None
    assert not CpuBackend().profiles_warm and CudaMpsBackend.profiles_warm


def test_a_sweep_without_configurations_has_no_seconds_per_configuration(agent_context):
    request = ProfileSweepRequest(
        sweep_id=1, device="another", budget_s=5, architectures=["mobilenet_v3_small"], batch_sizes=[8]
    )

    refused = run_sweep(request, agent_context, CpuBackend(), lambda r: None)

    assert refused.status == "failed" and refused.configs == 0 and refused.seconds_per_config is None


def test_a_train_job_time_sliced_or_shared_on_the_same_cores_shares_a_process(tmp_path):
    # The lock is a job's, not the process's: a plan that moves a device between a time-sliced
    # and a shared configuration of the same cores must not start its trainers cold.
    task = {"architecture": "resnet18", "num_classes": 10, "input_shape": [3, 32, 32], "dataset": {"name": "digits"}}

    def key(name: str, **resources: object) -> tuple[object, ...]:
        spec = tmp_path / name
        spec.write_text(json.dumps({"task": task, "threads": 1, "cores": [0], **resources}))
        return warm.process_key(warm.TRAINER_MODULE, ["train", str(spec), str(tmp_path / "r.json")], {})

    shared = key("shared.json")

    assert key("sliced.json", lock_path=str(tmp_path / "device.lock")) == shared
    assert key("wider.json", threads=2, cores=[0, 1]) != shared
