"""The GPU backends (``cuda-mps``, ``cuda-timeslice``) without a GPU.

The NVIDIA pieces are replaced at their boundaries only: ``nvidia-cuda-mps-control`` by an
executable stand-in first on ``PATH`` (tests/workers/fakes/nvidia-cuda-mps-control.py), NVML by
a stand-in ``pynvml`` module (tests/workers/fakes/nvml/pynvml.py), the SM probe subprocess by a
stand-in reporting the SM count MPS would leave it (tests/workers/fakes/fake_sm_probe.py), and,
for rounds, the trainer command by a stand-in that speaks the trainer's protocol, writes what the
MPS server would log and reports the SM count it would see (tests/workers/fakes/fake_trainer.py).
Everything else is the real code a GPU host runs.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers import launch, warm
from workers.agent import app as agent
from workers.backends import (
    BackendUnavailableError,
    CudaMpsBackend,
    CudaTimesliceBackend,
    base,
    gpu,
    gpu_mps,
)
from workers.protocol.messages import DeviceInventory, ShardRef, StandaloneItem, StandaloneRequest
from workers.protocol.queues import CONTROL_QUEUE, TaskName
from workers.registry.backends import get_backend

FAKES = Path(__file__).parent / "fakes"
REPO = Path(__file__).resolve().parents[2]
GPU_UUID = "GPU-5f2c0a1e-7b3d-4c2a-9e61-0123456789ab"
H200_BYTES = 150_000_000_000
NVML_CONFIG = {
    "driver": True,
    "driver_version": "550.54.15",
    "cuda_version": 12040,
    "gpus": [
        {
            "uuid": GPU_UUID,
            "name": "NVIDIA H200",
            "memory_total": H200_BYTES,
            "memory_used": 600_000_000,
            "util": 37,
            "sm_count": 132,
            "capability": [9, 0],
            "compute_mode": 0,
            "attributes": True,
        }
    ],
}


# ------------------------------------------------------------------------------ fixtures


class FakeNvml:
    """The stand-in ``pynvml`` loaded in this process; ``config`` is its live configuration."""

    def __init__(self, module, path: Path) -> None:
        self.module = module
        self.path = path

    @property
    def config(self) -> dict:
        return self.module.CONFIG

    def set_gpu(self, **values) -> None:
        data = json.loads(self.path.read_text())
        data["gpus"][0].update(values)
        self.path.write_text(json.dumps(data))
        self.module.CONFIG = data
        gpu.reset_nvml()


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch) -> FakeNvml:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(NVML_CONFIG))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "nvml" / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv(gpu.ENV_GPU, raising=False)
    gpu.reset_nvml()
    yield FakeNvml(module, path)
    gpu.reset_nvml()


class FakeMps:
    """The stand-in control binary on PATH and what it (and the fake trainers) recorded."""

    def __init__(self, record: Path, monkeypatch) -> None:
        self.record = record
        self._monkeypatch = monkeypatch

    def entries(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def calls(self) -> list[str]:
        """Daemon invocations in order: ``-d`` or the command sent on stdin."""
        return [" ".join(e["argv"]) or e["command"] for e in self.entries() if "argv" in e]

    def timeline(self) -> list[str]:
        """Daemon calls and trainer launches (``trainer:<assignment>``) in order."""
        return [
            (" ".join(e["argv"]) or e["command"]) if "argv" in e else f"trainer:{e['assignment']}"
            for e in self.entries()
        ]

    def trainers(self) -> dict[int, dict]:
        """Each launched trainer's recorded environment, by assignment id (last launch)."""
        return {e["assignment"]: e["env"] for e in self.entries() if "trainer" in e}

    def mode(self, mode: str) -> None:
        self._monkeypatch.setenv("FAKE_MPS_MODE", mode)


@pytest.fixture
def fake_mps(tmp_path, monkeypatch) -> FakeMps:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    binary = bin_dir / gpu_mps.CONTROL_BINARY
    binary.write_text(f"#!{sys.executable}\n" + (FAKES / "nvidia-cuda-mps-control.py").read_text())
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(tmp_path / "mps-record.jsonl"))
    monkeypatch.setenv(gpu_mps.ENV_MPS_TIMEOUT_S, "5")
    for name in (
        gpu_mps.ENV_MPS_CONTROL,
        "FAKE_MPS_MODE",
        "FAKE_MPS_SERVER_SHARE",
        "FAKE_MPS_IGNORED",
        "FAKE_PROBE_MODE",
        "FAKE_GPU_SMS",
        *[k for k in os.environ if k.startswith("CUDA_")],
    ):
        monkeypatch.delenv(name, raising=False)
    return FakeMps(tmp_path / "mps-record.jsonl", monkeypatch)


@pytest.fixture
def fake_trainer(monkeypatch):
    monkeypatch.setattr(base, "TRAINER_COMMAND", [sys.executable, str(FAKES / "fake_trainer.py")])


@pytest.fixture(autouse=True)
def fake_probe(monkeypatch):
    """Every SM probe in these tests is the stand-in (the real one imports torch, which sees no GPU here)."""
    monkeypatch.setattr(gpu, "PROBE_COMMAND", [sys.executable, str(FAKES / "fake_sm_probe.py")])


@pytest.fixture
def mps_backend(fake_nvml, fake_mps):
    backend = CudaMpsBackend()
    yield backend
    backend.stop()


@pytest.fixture
def gpu_round(make_task_ref, make_assignment, make_round):
    """A round request for the GPU device: tasks named by the fake trainer's behaviour."""

    def build(names: list[str], shares: list[int], partitioning: str = "mps", updates: dict[int, dict] | None = None):
        updates = updates or {}
        assignments = [
            make_assignment(
                make_task_ref(k + 1, "resnet18").model_copy(update={"name": name}),
                "runs/1/tasks/global.safetensors",
                assignment_id=11 + k,
                offset=64 * k,
                share=share,
            ).model_copy(update=updates.get(k, {}))
            for k, (name, share) in enumerate(zip(names, shares, strict=True))
        ]
        return make_round(assignments, partitioning)

    return build


# ----------------------------------------------------------------- trainer environments


def test_mps_trainers_get_their_own_share_gpu_uuid_and_pinned_limit(mps_backend, gpu_round, agent_context, monkeypatch):
    request = gpu_round(["a", "b"], [30, 70], updates={0: {"memory_limit_bytes": 2 * 2**30}})
    # What an agent may inherit must not leak into a trainer behind the plan's back.
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")

    resources = mps_backend.trainer_resources(request, agent_context)
    envs = [mps_backend.trainer_env(r) for r in resources]

    pipe = agent_context.state_dir / "mps" / "pipe"
    assert [e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs] == ["30", "70"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {GPU_UUID}
    assert {e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs} == {str(pipe)}
    assert {e["MTFL_TRAINER_DEVICE"] for e in envs} == {"cuda"}
    assert envs[0]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048MB"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs[1]


@pytest.mark.parametrize("backend_class", [CudaMpsBackend, CudaTimesliceBackend])
def test_timeslice_trainers_never_reach_an_mps_daemon(
    backend_class, fake_nvml, fake_mps, gpu_round, agent_context, monkeypatch
):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")  # a system daemon's
    backend = backend_class()
    request = gpu_round(["a", "b"], [30, 70], "timeslice", {0: {"memory_limit_bytes": 2**30}})

    envs = [backend.trainer_env(r) for r in backend.trainer_resources(request, agent_context)]

    for env in envs:
        assert env["CUDA_VISIBLE_DEVICES"] == GPU_UUID and env["MTFL_TRAINER_DEVICE"] == "cuda"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
        empty = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
        assert empty.is_dir() and not any(empty.iterdir())  # no daemon to connect to
    assert fake_mps.calls() == []  # no daemon started for time slicing


def test_cuda_timeslice_refuses_mps_partitioning(fake_nvml, agent_context):
    with pytest.raises(ValueError, match="temporal"):
        CudaTimesliceBackend().resources_for_shares([50, 50], "mps", agent_context)


@pytest.mark.parametrize("shares,message", [([50, 0], r"shares\[1\]"), ([101], r"shares\[0\]")])
def test_bad_share_is_refused_naming_it(mps_backend, agent_context, shares, message):
    with pytest.raises(ValueError, match=message):
        mps_backend.resources_for_shares(shares, "mps", agent_context)


# ------------------------------------------------------------------------ daemon lifecycle


def test_start_runs_a_private_daemon_without_a_daemon_wide_share(mps_backend, fake_mps, agent_context, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40")

    mps_backend.start(agent_context)

    assert fake_mps.calls() == ["-d", "get_server_list"]
    start = fake_mps.entries()[0]["env"]
    assert start["CUDA_MPS_PIPE_DIRECTORY"] == str(agent_context.state_dir / "mps" / "pipe")
    assert start["CUDA_MPS_LOG_DIRECTORY"] == str(agent_context.state_dir / "mps" / "log")
    assert start["CUDA_VISIBLE_DEVICES"] == GPU_UUID
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in start


def test_agent_stops_the_daemon_on_exit(mps_backend, fake_mps, agent_context, monkeypatch):
    monkeypatch.setitem(agent._BACKEND_CACHE, "cuda-mps", mps_backend)
    mps_backend.start(agent_context)

    agent.stop_backends()
    agent.stop_backends()  # idempotent: main and atexit both call it

    assert fake_mps.calls() == ["-d", "get_server_list", "quit"]
    assert not (agent_context.state_dir / "mps" / "pipe" / "control").exists()


def test_sigterm_hook_terminates_trainers_then_quits_the_daemon(mps_backend, fake_mps, agent_context, monkeypatch):
    monkeypatch.setitem(agent._BACKEND_CACHE, "cuda-mps", mps_backend)
    mps_backend.start(agent_context)
    try:
        agent._on_worker_shutting_down(sig="SIGTERM", how="Warm", exitcode=0)

        assert launch.shutdown_requested()
        assert fake_mps.calls()[-1] == "quit"
    finally:
        launch.clear_shutdown()


def test_daemon_not_answering_is_a_clear_error_within_the_timeout(fake_nvml, fake_mps, agent_context, monkeypatch):
    monkeypatch.setenv(gpu_mps.ENV_MPS_TIMEOUT_S, "1")
    fake_mps.mode("hang")
    backend = CudaMpsBackend()
    started = time.monotonic()

    with pytest.raises(BackendUnavailableError, match="did not answer") as caught:
        backend.start(agent_context)

    assert time.monotonic() - started < 5
    assert "\n" not in str(caught.value)


def test_daemon_start_failure_quotes_the_daemon(mps_backend, fake_mps, agent_context):
    fake_mps.mode("fail_start")

    with pytest.raises(BackendUnavailableError, match="already running"):
        mps_backend.start(agent_context)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_daemon_of_another_user_is_a_clear_error(mps_backend, fake_mps, agent_context):
    pipe = agent_context.state_dir / "mps" / "pipe"
    pipe.mkdir(parents=True)
    (pipe / "control").write_text("")
    os.chown(pipe / "control", 54321, 54321)

    with pytest.raises(BackendUnavailableError, match="uid 54321.*another user"):
        mps_backend.start(agent_context)
    assert fake_mps.calls() == []


def test_stale_daemon_of_this_user_is_replaced(mps_backend, fake_mps, agent_context):
    mps_backend.start(agent_context)
    fresh = CudaMpsBackend()  # an agent restarted after a crash finds the old daemon

    fresh.start(agent_context)

    assert fake_mps.calls() == ["-d", "get_server_list", "get_server_list", "quit", "-d", "get_server_list"]
    fresh.stop()


def test_a_daemon_stuck_after_quit_is_killed_with_its_server(fake_nvml, fake_mps, agent_context, monkeypatch):
    monkeypatch.setenv(gpu_mps.ENV_MPS_TIMEOUT_S, "1")
    fake_mps.mode("stuck")
    backend = CudaMpsBackend()
    backend.start(agent_context)
    pipe = agent_context.state_dir / "mps" / "pipe"
    daemon = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    deadline = time.monotonic() + 10
    while not gpu_mps.child_pids(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    (server,) = gpu_mps.child_pids(daemon)

    backend.stop()  # quit is answered but nothing exits: escalated to SIGKILL, no error

    assert fake_mps.calls()[-1] == "quit"
    assert not gpu_mps.pid_alive(daemon) and not gpu_mps.pid_alive(server)
    assert not (pipe / "control").exists()  # the killed daemon's socket is not left behind


def test_a_zombie_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while gpu_mps.pid_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child.pid, 0)  # still in the process table: exited, not reaped

        assert not gpu_mps.pid_alive(child.pid)
        assert gpu_mps.pid_alive(os.getpid())
    finally:
        child.wait()


def test_too_long_pipe_directory_is_refused(fake_nvml, fake_mps, tmp_path):
    daemon = gpu_mps.MpsDaemon(
        binary="unused", pipe_dir=tmp_path / ("x" * 100), log_dir=tmp_path / "log", gpu_uuid=GPU_UUID
    )

    with pytest.raises(gpu_mps.MpsError, match="too long for unix sockets"):
        daemon.start()


def test_bad_mps_timeout_names_the_variable(fake_nvml, monkeypatch):
    monkeypatch.setenv(gpu_mps.ENV_MPS_TIMEOUT_S, "0")

    with pytest.raises(ValueError, match=r"MTFL_MPS_TIMEOUT_S='0'.*\(0, 600\]"):
        CudaMpsBackend()


# ------------------------------------------------------------------- refusal before launch


def test_more_trainers_than_mps_clients_are_refused_before_launch(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context
):
    count = gpu_mps.MPS_MAX_CLIENTS + 1
    request = gpu_round([f"t{k}" for k in range(count)], [2] * count)

    result = mps_backend.run_round(request, agent_context)

    assert result.status == "failed" and result.assignments == []
    assert f"{count} co-located trainers" in result.error and "at most 48" in result.error
    assert fake_mps.entries() == []  # nothing started, not even the daemon


def test_trainers_that_cannot_fit_in_memory_are_refused_before_launch(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context
):
    request = gpu_round(
        ["a", "b"],
        [50, 50],
        updates={0: {"predicted_memory_bytes": 100 * 2**30}, 1: {"memory_limit_bytes": 60 * 2**30}},
    )

    result = mps_backend.run_round(request, agent_context)

    assert result.status == "failed" and "refused before launch" in result.error
    assert "160.00 GiB" in result.error and "139.70 GiB" in result.error
    assert fake_mps.entries() == []


def test_time_slicing_on_an_exclusive_process_gpu_is_refused(
    fake_nvml, fake_mps, fake_trainer, gpu_round, agent_context
):
    fake_nvml.set_gpu(compute_mode=3)

    result = CudaTimesliceBackend().run_round(gpu_round(["a", "b"], [50, 50], "timeslice"), agent_context)

    assert result.status == "failed" and "Exclusive_Process" in result.error
    assert fake_mps.entries() == []


# ----------------------------------------------------------------------------------- rounds


def test_mps_round_verifies_each_share_from_the_sm_count_the_trainer_saw(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context
):
    mps_backend.start(agent_context)

    result = mps_backend.run_round(gpu_round(["a", "b"], [30, 70]), agent_context)

    assert result.status == "succeeded", result.error
    # 30 % and 70 % of 132 SMs, in whole TPCs: 38 and 92.
    assert [a.visible_sm_count for a in result.assignments] == [38, 92]
    assert [a.mps_verified for a in result.assignments] == [True, True]
    assert [a.mps_active_thread_percentage for a in result.assignments] == [28.79, 69.7]
    assert "saw 38 of 132 SMs" in result.assignments[0].mps_detail
    assert all("client of MPS server" in a.mps_detail for a in result.assignments)
    assert [fake_mps.trainers()[k]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for k in (11, 12)] == ["30", "70"]
    assert not result.mps_restarted
    assert result.telemetry and result.telemetry[0].gpu_util_percent == 37
    assert result.telemetry[0].memory_used_bytes == 600_000_000
    assert result.telemetry[0].memory_total_bytes == H200_BYTES


def test_a_server_capped_below_the_share_is_reported_unverified(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context, monkeypatch
):
    monkeypatch.setenv("FAKE_MPS_SERVER_SHARE", "50.0")

    result = mps_backend.run_round(gpu_round(["a", "b"], [30, 70]), agent_context)

    assert result.status == "succeeded", result.error
    low, high = result.assignments
    assert (low.mps_verified, low.visible_sm_count) == (True, 38)
    assert (high.mps_verified, high.visible_sm_count, high.mps_active_thread_percentage) == (False, 66, 50.0)
    assert "outside the 90-95 SMs that share allows" in high.mps_detail


def test_trainers_that_silently_ran_without_mps_are_reported_unverified(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context, monkeypatch
):
    # What the server-log check could not see: clients that never reached the daemon run as
    # plain CUDA contexts ("continues to run as it normally would without MPS").
    mps_backend.start(agent_context)
    monkeypatch.setenv("FAKE_MPS_IGNORED", "1")

    result = mps_backend.run_round(gpu_round(["a", "b"], [30, 100]), agent_context)

    assert result.status == "succeeded", result.error
    partial, whole = result.assignments
    assert (partial.mps_verified, partial.mps_active_thread_percentage) == (False, 100.0)
    assert "MPS did not limit it" in partial.mps_detail
    assert whole.mps_verified is False and "does not show it as a client" in whole.mps_detail


def test_a_full_share_is_verified_by_the_server_logs_connection(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context
):
    result = mps_backend.run_round(gpu_round(["a"], [100]), agent_context)

    assert result.status == "succeeded", result.error
    (only,) = result.assignments
    assert (only.mps_verified, only.visible_sm_count, only.mps_active_thread_percentage) == (True, 132, 100.0)
    assert "client of MPS server" in only.mps_detail


# ------------------------------------------------------------------ the start-up MPS probe


def test_start_probes_a_half_share_client_and_allows_mps_rounds_when_its_sms_drop(
    mps_backend, fake_mps, agent_context, caplog
):
    caplog.set_level("INFO", logger="workers.backends.cuda")

    mps_backend.start(agent_context)

    assert "an MPS probe client at 50 % saw 66 of 132 SMs" in caplog.text
    assert mps_backend.probe_mps(agent_context) is None


@pytest.mark.parametrize(
    "mode,reason",
    [
        ("no_mps", "saw all 132 SMs (132): MPS does not limit clients here"),
        ("no_gpu", "could not read its SM count: torch sees no GPU"),
        ("crash", "could not read its SM count: Traceback (most recent call last): RuntimeError: CUDA driver"),
    ],
)
def test_a_probe_that_shows_no_share_refuses_mps_rounds_saying_why(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context, monkeypatch, mode, reason
):
    monkeypatch.setenv("FAKE_PROBE_MODE", mode)
    mps_backend.start(agent_context)  # the agent still starts: time-sliced rounds can run

    refused = mps_backend.run_round(gpu_round(["a", "b"], [50, 50]), agent_context)
    sliced = mps_backend.run_round(gpu_round(["a", "b"], [50, 50], "timeslice"), agent_context)

    assert refused.status == "failed" and refused.assignments == []
    assert refused.error.startswith("mps rounds refused on this device: ") and reason in refused.error
    assert "\n" not in refused.error
    assert sliced.status == "succeeded", sliced.error
    started = [e["env"] for e in fake_mps.entries() if "trainer" in e]
    assert len(started) == 2 and not any("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env for env in started)


def test_an_mps_dispatch_probes_first_when_the_agent_did_not_start_the_backend(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context, monkeypatch
):
    monkeypatch.setenv("FAKE_PROBE_MODE", "no_mps")

    result = mps_backend.run_round(gpu_round(["a"], [40]), agent_context)

    assert result.status == "failed" and "device not ready: cuda-mps: mps rounds refused" in result.error
    assert fake_mps.trainers() == {}  # refused before any trainer started


def test_probe_verdict_judges_the_sm_count():
    assert gpu_mps.probe_verdict(66, 132) is None
    assert "saw all 132 SMs" in gpu_mps.probe_verdict(132, 132)
    assert "SM count is unknown" in gpu_mps.probe_verdict(66, None)
    assert gpu_mps.probe_verdict(None, 132, "no answer within 120 s").endswith("no answer within 120 s")


def test_mps_round_starts_the_daemon_when_the_agent_did_not(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context
):
    result = mps_backend.run_round(gpu_round(["a"], [40]), agent_context)

    assert result.status == "succeeded", result.error
    assert fake_mps.timeline() == ["-d", "get_server_list", "trainer:11"]


def test_timeslice_round_on_cuda_mps_has_no_mps_clients(mps_backend, fake_mps, fake_trainer, gpu_round, agent_context):
    result = mps_backend.run_round(gpu_round(["a", "b"], [30, 70], "timeslice"), agent_context)

    assert result.status == "succeeded", result.error
    assert [a.mps_verified for a in result.assignments] == [None, None]
    assert fake_mps.calls() == []
    assert not list((agent_context.state_dir / "mps").rglob("server.log"))


@pytest.mark.parametrize(
    "crash,reason",
    [
        ("crash-cuda", "CUDA error: an illegal memory access"),
        ("crash-oom", "CUDA out of memory"),
        ("crash-killed", "exited with code -9"),
    ],
)
def test_a_crashing_trainer_stops_the_round_names_it_and_mps_restarts_before_the_next(
    mps_backend, fake_mps, fake_trainer, gpu_round, agent_context, crash, reason
):
    mps_backend.start(agent_context)

    failed = mps_backend.run_round(gpu_round(["slow", crash], [50, 50]), agent_context)

    assert failed.status == "failed"
    assert f"task 2 ({crash})" in failed.error and reason in failed.error
    survivor, culprit = failed.assignments
    assert culprit.status == "failed" and reason in culprit.error
    assert survivor.status == "failed" and f"killed because task 2 ({crash})" in survivor.error
    assert launch.live_children() == []
    # The survivor was ended as an MPS client (terminate_client) before it was killed.
    server = (agent_context.state_dir / "mps" / "pipe" / "fake-server-pid").read_text().strip()
    slow_pid = next(e["trainer"] for e in fake_mps.entries() if e.get("assignment") == 11)
    assert fake_mps.calls()[-2:] == ["get_server_list", f"terminate_client {server} {slow_pid}"]

    again = mps_backend.run_round(gpu_round(["a", "b"], [50, 50]), agent_context)

    assert again.status == "succeeded", again.error
    assert again.mps_restarted
    timeline = fake_mps.timeline()
    # Trainers of one round start together, in any order; the daemon restarts between rounds.
    assert timeline[:2] == ["-d", "get_server_list"] and timeline[6:9] == ["quit", "-d", "get_server_list"]
    assert set(timeline[2:4]) == set(timeline[9:]) == {"trainer:11", "trainer:12"}
    assert all(a.mps_verified for a in again.assignments)


def test_standalone_runs_outside_mps_on_the_whole_gpu(
    mps_backend, fake_mps, fake_trainer, make_task_ref, agent_context
):
    request = StandaloneRequest(
        run_id=1,
        device=agent_context.device,
        items=[
            StandaloneItem(
                task=make_task_ref(1, "resnet18"), batch_size=16, shard=ShardRef(permutation_seed=0, offset=0, count=32)
            )
        ],
    )

    result = mps_backend.measure_standalone(request, agent_context)

    assert result.status == "succeeded", result.error
    env = fake_mps.trainers()[None]
    assert env["CUDA_VISIBLE_DEVICES"] == GPU_UUID and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


# ------------------------------------------------------------------------------ MPS logs


REAL_FORMAT_LOG = """\
[2026-04-28 18:20:41.704 Other 4428] Startup
[2026-04-28 18:20:41.855 Server 4428] Creating server context on device 0 (Tesla T4)
[2026-04-28 18:20:41.986 Server 4428] Active Threads Percentage set to 100.0
[2026-04-28 18:20:41.986 Server 4428] Device pinned memory limit for device 0 set to 0x140000000 bytes
[2026-04-28 18:20:41.986 Server 4428] Server has started
[2026-04-28 18:20:41.986 Server 4428] Received new client request for {PID: 1073741824, Context ID: 1}
[2026-04-28 18:20:41.986 Server 4428] Client {PID: 4267, Context ID: 0} connected
[2026-04-28 18:20:41.990 Server 4428] Client {PID: 4281, Context ID: 0} connected
[2013-08-05 13:00:09.269 Server 13929] New client 14781 connected
[2013-08-05 13:00:09.270 Server 13929] Client 14777 disconnected
"""


def test_server_log_parser_reads_the_documented_lines():
    log = gpu_mps.parse_server_log(REAL_FORMAT_LOG)

    assert log.server_share == {4428: 100.0}
    assert log.client_server == {4267: 4428, 4281: 4428, 14781: 13929}
    assert gpu_mps.client_server(log, 4267) == 4428
    assert gpu_mps.client_server(log, 999) is None and gpu_mps.client_server(log, None) is None


def test_a_client_share_line_is_recorded_when_a_driver_writes_one():
    log = gpu_mps.parse_server_log(
        REAL_FORMAT_LOG + "[2026-04-28 18:20:42.000 Server 4428] Client {PID: 4267, Context ID: 0} "
        "active thread percentage 20.0\n"
    )

    assert log.client_share == {4267: 20.0}


@pytest.mark.parametrize(
    "total,share,bounds",
    [(132, 50, (64, 68)), (132, 1, (1, 4)), (132, 100, (130, 132)), (80, 30, (22, 26)), (1, 50, (1, 1))],
)
def test_share_sm_bounds_allow_one_tpc_either_way(total, share, bounds):
    assert gpu_mps.share_sm_bounds(total, share) == bounds


@pytest.mark.parametrize("total,share", [(0, 50), (132, 0), (132, 101)])
def test_share_sm_bounds_refuse_bad_input_naming_it(total, share):
    with pytest.raises(ValueError, match="total_sms|share"):
        gpu_mps.share_sm_bounds(total, share)


@pytest.mark.parametrize(
    "seen,total,share,connected,verified,said",
    [
        (66, 132, 50, 7, True, "saw 66 of 132 SMs (50 %) at a 50 % share; client of MPS server 7"),
        (66, 132, 50, None, True, "saw 66 of 132 SMs (50 %) at a 50 % share"),
        (132, 132, 50, 7, False, "MPS did not limit it"),
        (40, 132, 50, 7, False, "outside the 64-68 SMs"),
        (132, 132, 100, 7, True, "client of MPS server 7"),
        (132, 132, 100, None, False, "cannot tell an MPS client from a plain CUDA context"),
        (130, 132, 100, 7, False, "fewer than the whole GPU"),
        (None, 132, 50, 7, False, "reported no SM count"),
        (66, None, 50, 7, False, "SM count is unknown"),
    ],
)
def test_verify_client_sms(seen, total, share, connected, verified, said):
    applied, ok, detail = gpu_mps.verify_client_sms(seen, total, share, connected_to=connected)

    assert ok is verified and said in detail
    assert applied == (None if seen is None or total is None else round(100 * seen / total, 2))


def test_read_server_log_counts_only_clients_after_the_mark(tmp_path):
    path = tmp_path / "server.log"
    path.write_text(REAL_FORMAT_LOG)
    mark = {path: path.stat().st_size}
    with open(path, "a") as handle:
        handle.write("[2026-04-28 18:30:00.000 Server 4428] Client {PID: 5000, Context ID: 0} connected\n")

    log = gpu_mps.read_server_log([path], mark)

    assert log.client_server == {5000: 4428} and log.server_share == {4428: 100.0}


# ------------------------------------------------------------------ inventory and telemetry


def test_inventory_reports_the_gpu_through_nvml(mps_backend, fake_mps, agent_env_cuda):
    inventory = agent.build_inventory(agent.agent_settings())

    assert isinstance(inventory, DeviceInventory) and inventory.backend == "cuda-mps"
    assert (inventory.accelerator, inventory.gpu_uuid, inventory.gpu_index) == ("NVIDIA H200", GPU_UUID, 0)
    assert inventory.memory_bytes == H200_BYTES
    assert (inventory.driver_version, inventory.cuda_version) == ("550.54.15", "12.4")
    assert inventory.sm_count == inventory.allocation_units == 132
    assert (inventory.compute_capability, inventory.compute_mode) == ("9.0", "Default")
    assert inventory.mps_available is True


@pytest.fixture
def agent_env_cuda(monkeypatch, tmp_path):
    monkeypatch.setenv(agent.ENV_DEVICE, "gpu-a")
    monkeypatch.setenv(agent.ENV_BACKEND, "cuda-mps")
    monkeypatch.setenv(agent.ENV_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.delenv(agent.ENV_CORES, raising=False)
    monkeypatch.setattr(agent, "_BACKEND_CACHE", {})


def test_telemetry_samples_the_whole_gpu_until_stopped(fake_nvml):
    telemetry = gpu.GpuTelemetry(GPU_UUID, interval_s=0.05)

    telemetry.start()
    time.sleep(0.3)
    fake_nvml.config["gpus"][0]["util"] = 88
    time.sleep(0.2)
    samples = telemetry.stop()

    assert len(samples) >= 4
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert samples[0].gpu_util_percent == 37 and samples[-1].gpu_util_percent == 88


def test_no_driver_makes_the_backend_unavailable_in_one_line(fake_nvml):
    fake_nvml.config["driver"] = False
    fake_nvml.path.write_text(json.dumps({**NVML_CONFIG, "driver": False}))
    gpu.reset_nvml()

    with pytest.raises(BackendUnavailableError) as caught:
        CudaTimesliceBackend().check_available()

    assert "NVIDIA driver" in str(caught.value) and "\n" not in str(caught.value)


def test_a_gpu_index_the_host_lacks_is_named(fake_nvml, monkeypatch):
    monkeypatch.setenv(gpu.ENV_GPU, "3")

    with pytest.raises(BackendUnavailableError, match="MTFL_AGENT_GPU=3 but this host has 1 GPU"):
        get_backend("cuda-mps").check_available()


def test_a_malformed_gpu_selector_is_refused(monkeypatch):
    monkeypatch.setenv(gpu.ENV_GPU, "first")

    with pytest.raises(ValueError, match="MTFL_AGENT_GPU='first'"):
        get_backend("cuda-timeslice")


# --------------------------------------------------------------------------- no GPU here


def _nvidia_driver_present() -> bool:
    code = "import pynvml; pynvml.nvmlInit()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


no_gpu = pytest.mark.skipif(_nvidia_driver_present(), reason="this host has an NVIDIA driver")


def _run_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MTFL_"))}
    env.update(CELERY_BROKER_URL="redis://127.0.0.1:1/0", MTFL_HOME=str(tmp_path / "home"))
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@no_gpu
@pytest.mark.parametrize("backend", ["cuda-mps", "cuda-timeslice"])
def test_agent_without_a_gpu_exits_at_once_with_one_line(backend, tmp_path):
    started = time.monotonic()
    done = _run_cli([sys.executable, "-m", "workers.agent", "--device", "gpu-a", "--backend", backend], tmp_path)

    assert done.returncode == agent.EXIT_CONFIG
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"backend {backend!r} unavailable" in lines[0] and "NVML" in lines[0]
    assert time.monotonic() - started < 30


@no_gpu
def test_mtfl_agent_without_a_gpu_exits_with_one_line(tmp_path):
    done = _run_cli(
        [sys.executable, "-m", "controlplane.cli", "agent", "--device", "gpu-a", "--backend", "cuda-mps"], tmp_path
    )

    assert done.returncode == agent.EXIT_CONFIG
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtfl agent: backend 'cuda-mps' unavailable"), done.stderr


@no_gpu
def test_the_real_mps_probe_fails_cleanly_without_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu, "PROBE_COMMAND", [sys.executable, "-c", gpu._PROBE_CODE])

    seen, error = gpu.probe_mps_client(GPU_UUID, {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}, timeout_s=120)

    assert seen is None and error.startswith("torch sees no GPU") and "\n" not in error
    assert "torch sees no GPU" in gpu_mps.probe_verdict(seen, 132, error)


def test_agent_and_backends_never_initialise_cuda():
    code = (
        "import sys\n"
        "import workers.agent.app, workers.backends, workers.backends.cuda, workers.backends.gpu, workers.backends.gpu_mps\n"
        "from workers.backends import BackendUnavailableError\n"
        "from workers.registry.backends import get_backend\n"
        "assert 'torch' not in sys.modules and 'pynvml' not in sys.modules\n"
        "for name in ('cuda-mps', 'cuda-timeslice'):\n"
        "    try:\n"
        "        get_backend(name).check_available()\n"
        "    except BackendUnavailableError:\n"
        "        pass\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr


# -------------------------------------------------------------------- a real agent process


@pytest.mark.integration
def test_agent_process_starts_mps_registers_the_gpu_and_quits_mps_on_sigterm(start_agent, fake_mps, tmp_path):
    nvml_config = tmp_path / "nvml-agent.json"
    nvml_config.write_text(json.dumps(NVML_CONFIG))
    agent_process = start_agent(
        "--device",
        "gpu-a",
        "--backend",
        "cuda-mps",
        "--heartbeat-s",
        "600",
        "--state-dir",
        str(tmp_path / "st"),  # its MPS sockets' paths must stay short
        PYTHONPATH=os.pathsep.join([str(FAKES / "nvml"), str(REPO)]),
        FAKE_NVML_CONFIG=str(nvml_config),
    )
    deadline = time.monotonic() + 60
    while "get_server_list" not in fake_mps.calls() and time.monotonic() < deadline:
        assert agent_process.proc.poll() is None, agent_process.proc.communicate()[0]
        time.sleep(0.1)
    registered = []
    while not registered and time.monotonic() < deadline:
        registered = [
            args for name, args in _control_messages(agent_process.server) if name == TaskName.DEVICE_REGISTER
        ]
        time.sleep(0.1)
    # SIGTERM once the worker serves, so it goes through Celery's shutdown hook.
    while not agent_process.client.control.ping(timeout=0.5) and time.monotonic() < deadline:
        pass

    agent_process.stop()

    assert agent_process.proc.returncode == 0, agent_process.output
    assert fake_mps.calls() == ["-d", "get_server_list", "quit"]
    inventory = DeviceInventory.model_validate(registered[0])
    assert (inventory.backend, inventory.gpu_uuid, inventory.sm_count) == ("cuda-mps", GPU_UUID, 132)


def _control_messages(server) -> list[tuple[str, dict]]:
    """The control queue's messages, oldest first: (task name, first positional argument)."""
    bodies = [json.loads(m) for m in reversed(server.lrange(CONTROL_QUEUE, 0, -1))]
    return [(b["headers"]["task"], json.loads(base64.b64decode(b["body"]))[0][0]) for b in bodies]


@pytest.mark.integration
def test_agent_stopped_while_starting_still_quits_mps(start_agent, fake_mps, tmp_path):
    nvml_config = tmp_path / "nvml-agent.json"
    nvml_config.write_text(json.dumps(NVML_CONFIG))
    agent_process = start_agent(
        "--device",
        "gpu-b",
        "--backend",
        "cuda-mps",
        "--state-dir",
        str(tmp_path / "st"),
        PYTHONPATH=os.pathsep.join([str(FAKES / "nvml"), str(REPO)]),
        FAKE_NVML_CONFIG=str(nvml_config),
    )
    deadline = time.monotonic() + 60
    while "get_server_list" not in fake_mps.calls() and time.monotonic() < deadline:
        time.sleep(0.02)

    agent_process.stop()  # SIGTERM at once: before or while Celery sets up

    assert fake_mps.calls() == ["-d", "get_server_list", "quit"], agent_process.output


# ------------------------------------------------------------------ warm trainers (workers/warm.py)


@pytest.fixture
def warm_fake_trainer(monkeypatch):
    """Warm trainers on: the stand-in's ``serve`` mode plays the warm trainer."""
    monkeypatch.setattr(warm, "SERVE_COMMAND", [sys.executable, str(FAKES / "fake_trainer.py")])
    monkeypatch.setenv("MTFL_WARM_TRAINERS", "100")


def test_warm_mps_trainers_keep_their_share_across_rounds_and_go_before_the_daemon_restarts(
    mps_backend, fake_mps, warm_fake_trainer, gpu_round, agent_context
):
    mps_backend.start(agent_context)

    first = mps_backend.run_round(gpu_round(["a", "b"], [30, 70]), agent_context)

    assert first.status == "succeeded", first.error
    pool = mps_backend.warm_pool()
    assert pool is not None and pool.max_processes == 48  # the MPS client limit bounds the setting
    warm_pids = set(pool.idle_pids())
    assert len(warm_pids) == 2

    second = mps_backend.run_round(gpu_round(["a", "b"], [30, 70]), agent_context)

    assert second.status == "succeeded", second.error
    assert set(pool.idle_pids()) == warm_pids and pool.started == 2
    launches = [e for e in fake_mps.entries() if "trainer" in e]
    # The two trainers log concurrently, so each round's pair may come in either order: the same
    # warm trainers keep the same shares.
    shares = [
        {e["trainer"]: e["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in pair}
        for pair in (launches[:2], launches[2:4])
    ]
    assert shares[1] == shares[0] and sorted(shares[1].values()) == ["30", "70"]
    # Their connection lines are from round 1; the shares are still verified in round 2.
    assert [a.mps_verified for a in second.assignments] == [True, True]
    assert [a.visible_sm_count for a in second.assignments] == [38, 92]

    failed = mps_backend.run_round(gpu_round(["slow", "crash-cuda"], [30, 70]), agent_context)

    assert failed.status == "failed" and "task 2 (crash-cuda)" in failed.error
    assert "killed because task 2 (crash-cuda)" in failed.assignments[0].error
    assert pool.idle_pids() == [] and launch.live_children() == []

    again = mps_backend.run_round(gpu_round(["a", "b"], [30, 70]), agent_context)

    assert again.status == "succeeded", again.error
    assert again.mps_restarted and all(a.mps_verified for a in again.assignments)
    fresh = set(pool.idle_pids())
    assert len(fresh) == 2 and not fresh & warm_pids and pool.started == 4
    mps_backend.stop()
    assert pool.pids() == []
