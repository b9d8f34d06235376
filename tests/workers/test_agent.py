"""The device agent: configuration, refusal as data, and a real worker on an embedded Redis."""

from __future__ import annotations

import base64
import json
import os
import threading
import time

import pytest

from workers.agent import app as agent
from workers.protocol.queues import CANCELLED_STATE, CONTROL_QUEUE, TaskName, cancel_marker_id


def test_parse_and_format_cores_round_trip():
    assert agent.parse_cores("0-3, 6") == [0, 1, 2, 3, 6]
    assert agent.format_cores([6, 0, 1, 2, 3]) == "0-3,6"


@pytest.mark.parametrize("text", ["", "a", "3-1", "-2", "1,,2"])
def test_parse_cores_rejects_bad_lists(text):
    with pytest.raises(ValueError, match="cores"):
        agent.parse_cores(text)


@pytest.fixture
def agent_env(monkeypatch, tmp_path):
    monkeypatch.setenv(agent.ENV_DEVICE, "dev-a")
    monkeypatch.setenv(agent.ENV_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.setenv("ARTIFACT_ROOT", str(tmp_path / "artifacts"))
    monkeypatch.delenv(agent.ENV_CORES, raising=False)


def _round_request(device: str) -> dict:
    return {"run_id": 4, "round_id": 9, "round_index": 0, "device": device, "partitioning": "mps", "assignments": []}


def test_train_round_refuses_another_device_as_data(agent_env):
    result = agent.train_round(_round_request("dev-b"))

    assert result["status"] == "failed"
    assert (result["run_id"], result["round_id"], result["device"]) == (4, 9, "dev-a")
    assert "dev-b" in result["error"]


def test_train_round_reports_invalid_request_as_data(agent_env):
    result = agent.train_round({"run_id": 4, "device": "dev-a"})

    assert result["status"] == "failed" and "invalid TrainRoundRequest" in result["error"]
    assert result["run_id"] == 4 and result["round_id"] == -1


def test_train_round_with_no_assignments_succeeds(agent_env):
    result = agent.train_round(_round_request("dev-a"))

    assert result["status"] == "succeeded" and result["assignments"] == []


def test_a_round_cancelled_before_it_starts_is_not_run(agent_env):
    agent.app.backend.store_result(
        cancel_marker_id("t-cancelled"), {"reason": "cancelled: run 4 was cancelled"}, CANCELLED_STATE
    )
    request = {**_round_request("dev-a"), "attempt": 1, "idempotency_key": "round-9/dev-a/attempt-1"}

    result = agent.train_round.apply(args=[request], task_id="t-cancelled").get()

    assert result["status"] == "failed"
    assert result["error"] == "cancelled: run 4 was cancelled (before it started)"
    assert (result["attempt"], result["idempotency_key"]) == (1, "round-9/dev-a/attempt-1")


def test_a_redelivered_round_that_already_finished_returns_its_stored_result(agent_env):
    stored = {"run_id": 4, "round_id": 9, "device": "dev-a", "status": "succeeded", "assignments": []}
    agent.app.backend.store_result("t-done", stored, "SUCCESS")

    assert agent.train_round.apply(args=[_round_request("dev-a")], task_id="t-done").get() == stored


def test_a_round_cancelled_while_it_runs_stops_and_says_why(agent_env, monkeypatch, tmp_path, make_task_ref):
    monkeypatch.setenv(agent.ENV_BACKEND, "simulated")
    monkeypatch.setenv("MTFL_SIM_TIME_SCALE", "2000")  # about two minutes of simulated training
    monkeypatch.setenv(agent.ENV_CANCEL_POLL_S, "0.2")
    monkeypatch.setattr(agent, "_BACKEND_CACHE", {})
    monkeypatch.setattr(agent.app, "send_task", lambda *args, **kwargs: None)  # progress reports
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "global.safetensors").write_bytes(b"weights")
    task = make_task_ref(1, "mobilenet_v3_small").model_dump(mode="json")
    request = {
        **_round_request("dev-a"),
        "backend": "simulated",
        "idempotency_key": "round-9/dev-a/attempt-0",
        "assignments": [
            {
                "assignment_id": 5,
                "task": task,
                "batch_size": 32,
                "active_thread_percentage": 100,
                "shard": {"permutation_seed": 0, "offset": 0, "count": 200},
                "local_epochs": 1,
                "global_weights": "global.safetensors",
                "output_weights": "out.safetensors",
            }
        ],
    }
    reason = "cancelled: the run was cancelled by a user"
    timer = threading.Timer(
        1.0, lambda: agent.app.backend.store_result(cancel_marker_id("t-running"), {"reason": reason}, CANCELLED_STATE)
    )
    timer.start()
    started = time.monotonic()

    result = agent.train_round.apply(args=[request], task_id="t-running").get()

    assert time.monotonic() - started < 30
    assert result["status"] == "failed" and result["error"] == reason
    assert [a["error"] for a in result["assignments"]] == [reason]
    assert result["idempotency_key"] == "round-9/dev-a/attempt-0"
    assert not (tmp_path / "artifacts" / "out.safetensors").exists()


def test_unconfigured_agent_fails_as_data(monkeypatch):
    monkeypatch.delenv(agent.ENV_DEVICE, raising=False)

    result = agent.measure_standalone({"run_id": 1, "device": "dev-a", "items": []})

    assert result["status"] == "failed" and agent.ENV_DEVICE in result["error"]


def _sweep_request(device: str, **overrides) -> dict:
    request = {
        "sweep_id": 7,
        "device": device,
        "budget_s": 5,
        "architectures": ["mobilenet_v3_small"],
        "batch_sizes": [8],
        "max_mix": 2,
        "warmup_iterations": 1,
        "min_timed_iterations": 2,
        "min_window_s": 0.3,
        "config_timeout_s": 60,
        "repeat_every": 0,
    }
    request.update(overrides)
    return request


def test_profile_sweep_refused_as_data_still_reports_done(agent_env, monkeypatch):
    sent = []
    monkeypatch.setattr(agent.app, "send_task", lambda name, args, **kwargs: sent.append((name, args, kwargs)))

    result = agent.profile_sweep(_sweep_request("dev-b"))

    assert result["status"] == "failed" and "dev-b" in result["error"]
    assert (result["sweep_id"], result["device"], result["configs"]) == (7, "dev-a", 0)
    assert sent == [(TaskName.PROFILE_DONE, [result], {"queue": CONTROL_QUEUE, "ignore_result": True})]


def test_profile_sweep_reports_an_invalid_request_as_data(agent_env, monkeypatch):
    monkeypatch.setattr(agent.app, "send_task", lambda *args, **kwargs: None)

    result = agent.profile_sweep(_sweep_request("dev-a", batch_sizes=[1]))

    assert result["status"] == "failed" and "invalid ProfileSweepRequest" in result["error"]
    assert result["sweep_id"] == 7


def test_a_sweep_cancelled_before_it_starts_is_not_run_and_still_reports_done(agent_env, monkeypatch):
    sent = []
    monkeypatch.setattr(agent.app, "send_task", lambda name, args, **kwargs: sent.append((name, args)))
    monkeypatch.setattr(agent, "run_sweep", lambda *args, **kwargs: pytest.fail("a cancelled sweep ran"))
    reason = "sweep 7 cancelled by researcher"
    agent.app.backend.store_result(cancel_marker_id("s-cancelled"), {"reason": reason}, CANCELLED_STATE)

    result = agent.profile_sweep.apply(args=[_sweep_request("dev-a")], task_id="s-cancelled").get()

    assert result["status"] == "failed" and result["error"] == f"{reason} (before it started)"
    assert sent == [(TaskName.PROFILE_DONE, [result])]


def test_a_sweep_cancelled_while_it_runs_is_told_to_stop(agent_env, monkeypatch):
    """The control plane's cancel marker reaches the running sweep as its ``should_stop`` (which
    :func:`workers.profiling.sweep.run_sweep` obeys between and during configurations, tested
    with it); the trainers in flight are killed by the same watch as a round's."""
    monkeypatch.setenv(agent.ENV_CANCEL_POLL_S, "0.1")
    monkeypatch.setattr(agent.app, "send_task", lambda *args, **kwargs: None)
    reason = "sweep 7 cancelled by researcher"
    seen = {}

    def sweep_until_stopped(request, ctx, backend, emit, should_stop):
        seen["before"] = should_stop()
        agent.app.backend.store_result(cancel_marker_id("s-running"), {"reason": reason}, CANCELLED_STATE)
        deadline = time.monotonic() + 10
        while not should_stop() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["stopped"], seen["reason"] = should_stop(), agent.cancel_requested()
        return agent.ProfileSweepSummary(sweep_id=request.sweep_id, device=request.device, status="failed", error="x")

    monkeypatch.setattr(agent, "run_sweep", sweep_until_stopped)

    agent.profile_sweep.apply(args=[_sweep_request("dev-a")], task_id="s-running").get()

    assert seen == {"before": False, "stopped": True, "reason": reason}
    assert agent.cancel_requested() is None  # cleared for the agent's next task


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--device", "Bad Name"], "invalid"),
        (["--device", "a", "--cores", "100000"], "100000"),
        (["--device", "a", "--cores", "x"], "--cores"),
        (["--device", "a", "--heartbeat-s", "0"], "heartbeat"),
    ],
)
def test_main_refuses_bad_arguments_with_exit_code_2(argv, message, capsys):
    code = agent.main(argv)

    assert code == agent.EXIT_CONFIG
    assert message in capsys.readouterr().err


def test_main_refuses_unset_broker(monkeypatch, capsys):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)

    assert agent.main(["--device", "a"]) == agent.EXIT_CONFIG
    assert "CELERY_BROKER_URL" in capsys.readouterr().err


def test_inventory_reports_torch_version_without_importing_torch(agent_env):
    inventory = agent.build_inventory(agent.agent_settings())

    assert inventory.name == "dev-a" and inventory.torch_version
    assert inventory.cores == sorted(os.sched_getaffinity(0))


@pytest.mark.integration
def test_agent_process_registers_and_serves_its_queue(start_agent, make_task_ref):
    agent_process = start_agent("--device", "e2e", "--heartbeat-s", "1")
    server = agent_process.server
    try:
        request = {
            "run_id": 2,
            "device": "e2e",
            "warmup_iterations": 1,
            "timed_iterations": 1,
            "items": [
                {
                    "task": make_task_ref(1, "shufflenet_v2_x1_0").model_dump(mode="json"),
                    "batch_size": 8,
                    "shard": {"permutation_seed": 0, "offset": 0, "count": 16},
                }
            ],
        }
        result = agent_process.client.send_task(TaskName.MEASURE_STANDALONE, args=[request], queue="device.e2e").get(
            timeout=90
        )

        assert result["status"] == "succeeded", result
        assert result["measurements"][0]["throughput_sps"] > 0
        time.sleep(1.5)  # at least one heartbeat after registration
        bodies = [json.loads(m) for m in server.lrange(CONTROL_QUEUE, 0, -1)]
        names = [m["headers"]["task"] for m in bodies]
        assert names[-1] == TaskName.DEVICE_REGISTER  # LPUSH: oldest last
        assert TaskName.DEVICE_HEARTBEAT in names
        args = json.loads(base64.b64decode(bodies[-1]["body"]))[0]
        assert args[0]["name"] == "e2e" and args[0]["backend"] == "cpu"
    finally:
        agent_process.stop()
    assert agent_process.proc.returncode == 0, agent_process.output


def _control_messages(server) -> list[tuple[str, dict]]:
    """The control queue's messages, oldest first: (task name, first positional argument)."""
    bodies = [json.loads(m) for m in reversed(server.lrange(CONTROL_QUEUE, 0, -1))]
    return [(b["headers"]["task"], json.loads(base64.b64decode(b["body"]))[0][0]) for b in bodies]


@pytest.mark.integration
def test_agent_process_runs_a_profile_sweep_and_streams_records(start_agent):
    agent_process = start_agent("--device", "prof", "--heartbeat-s", "600")
    server, client = agent_process.server, agent_process.client
    try:
        summary = client.send_task(TaskName.PROFILE_SWEEP, args=[_sweep_request("prof")], queue="device.prof").get(
            timeout=120
        )

        assert summary["status"] == "succeeded", summary
        assert summary["configs"] >= 1 and summary["samples"] >= 1
        messages = [
            (name, args)
            for name, args in _control_messages(server)
            if name in (TaskName.PROFILE_RECORD, TaskName.PROFILE_DONE)
        ]
        records = [args for name, args in messages if name == TaskName.PROFILE_RECORD]
        assert len(records) == summary["configs"]
        assert messages[-1] == (TaskName.PROFILE_DONE, summary)
        first = records[0]
        assert (first["sweep_id"], first["device"], first["config_index"]) == (7, "prof", 0)
        assert first["status"] == "succeeded"
        assert first["measurements"][0]["throughput_sps"] > 0
        assert first["measurements"][0]["standalone_sps"] > 0
        if len(os.sched_getaffinity(0)) > 1:  # alone on every core of the agent: its link was probed
            assert first["measurements"][0]["cross_core_rtt_ns"] > 0
    finally:
        agent_process.stop()
    assert agent_process.proc.returncode == 0, agent_process.output
