"""Agents on other hosts, the agent's side: settings, the HTTP client against a scripted
control plane (retries, checks, one-line errors), a round with fetched and sent weights, the
safetensors header checks and the artifact key parsers."""

from __future__ import annotations

import hashlib
import http.server
import json
import pickle
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from workers.agent import app as agent
from workers.fl.artifacts import (
    InvalidSafetensorsError,
    TensorInfo,
    device_weights_key,
    global_weights_key,
    parse_device_weights_key,
    parse_global_weights_key,
    read_safetensors_header,
    tensors_mismatch,
)
from workers.fl.transfer import (
    ArtifactClient,
    TransferError,
    TransferSettings,
    run_round_remote,
    transfer_settings,
)
from workers.protocol.messages import AssignmentResult, DeviceRoundResult

WEIGHTS = save({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(1, dtype=np.int64)})
SHA = hashlib.sha256(WEIGHTS).hexdigest()


# ------------------------------------------------------------------ a scripted control plane


class ControlPlane:
    """An HTTP server answering ``/api/agent/...`` from a script: each request pops the next
    ``(status, body, headers)``; uploads are recorded."""

    def __init__(self) -> None:
        self.script: list[tuple[int, bytes, dict]] = []
        self.requests: list[dict] = []
        plane = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                plane.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                status, payload, headers = plane.script.pop(0) if plane.script else (500, b"{}", {})
                self.send_response(status)
                for name, value in {"Content-Length": str(len(payload)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def json(self, status: int, body: dict) -> None:
        self.script.append((status, json.dumps(body).encode(), {"Content-Type": "application/json"}))

    def file(self, data: bytes, sha256: str) -> None:
        self.script.append((200, data, {"X-Content-SHA256": sha256}))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def plane():
    server = ControlPlane()
    yield server
    server.close()


def _client(url: str, sleeps: list[float] | None = None, attempts: int = 3) -> ArtifactClient:
    record = sleeps if sleeps is not None else []
    return ArtifactClient(TransferSettings(url, "k3y"), attempts=attempts, backoff_s=0.5, sleep=record.append)


def _unused_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -------------------------------------------------------------------------------- settings


def test_without_a_control_url_the_agent_shares_artifact_root(monkeypatch):
    monkeypatch.delenv("MTFL_CONTROL_URL", raising=False)
    monkeypatch.delenv("MTFL_AGENT_TOKEN", raising=False)
    monkeypatch.delenv("MTFL_AGENT_TOKEN_FILE", raising=False)

    assert transfer_settings() is None


@pytest.mark.parametrize(
    "env,message",
    [
        ({"MTFL_AGENT_TOKEN": "k"}, "MTFL_CONTROL_URL is not"),
        ({"MTFL_CONTROL_URL": "http://cp:8000"}, "set MTFL_AGENT_TOKEN"),
        ({"MTFL_CONTROL_URL": "cp:8000", "MTFL_AGENT_TOKEN": "k"}, "is not an http(s) URL"),
        ({"MTFL_CONTROL_URL": "http://cp", "MTFL_AGENT_TOKEN_FILE": "/nonexistent/token"}, "cannot be read"),
    ],
)
def test_half_or_bad_transfer_settings_are_refused_in_one_line(monkeypatch, env, message):
    for name in ("MTFL_CONTROL_URL", "MTFL_AGENT_TOKEN", "MTFL_AGENT_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(RuntimeError) as caught:
        transfer_settings()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_token_can_come_from_a_file_and_is_never_in_the_repr(monkeypatch, tmp_path):
    (tmp_path / "token").write_text("s3cret-key\n")
    monkeypatch.delenv("MTFL_AGENT_TOKEN", raising=False)
    monkeypatch.setenv("MTFL_AGENT_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("MTFL_CONTROL_URL", "https://mtfl.lab.example/")

    settings = transfer_settings()

    assert settings == TransferSettings("https://mtfl.lab.example", "s3cret-key")
    assert "s3cret" not in repr(settings) and "s3cret" not in repr(ArtifactClient(settings))


# ---------------------------------------------------------------------------------- client


def test_download_streams_checks_and_stores_atomically(plane, tmp_path):
    plane.file(WEIGHTS, SHA)
    key = global_weights_key(1, 2, None)

    digest = _client(plane.url).download(key, tmp_path / "g.safetensors")

    assert digest == SHA and (tmp_path / "g.safetensors").read_bytes() == WEIGHTS
    request = plane.requests[0]
    assert request["path"] == f"/api/agent/artifacts/{key}"
    assert request["headers"]["authorization"] == "Agent k3y"


def test_a_download_with_the_wrong_sha256_is_refused_and_not_kept(plane, tmp_path):
    plane.file(WEIGHTS, "0" * 64)

    with pytest.raises(TransferError, match="sha256 mismatch"):
        _client(plane.url).download(global_weights_key(1, 2, None), tmp_path / "g.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_a_download_that_is_not_safetensors_is_refused(plane, tmp_path):
    junk = b"\x80\x04junk-junk-junk"
    plane.file(junk, hashlib.sha256(junk).hexdigest())

    with pytest.raises(TransferError, match="not a valid safetensors file"):
        _client(plane.url).download(global_weights_key(1, 2, None), tmp_path / "g.safetensors")


def test_upload_sends_the_file_with_its_length_and_sha256(plane, tmp_path):
    (tmp_path / "w.safetensors").write_bytes(WEIGHTS)
    plane.json(201, {"key": "k", "sha256": SHA, "size": len(WEIGHTS)})
    key = device_weights_key(1, 0, "dev-a", 2)

    assert _client(plane.url).upload(key, tmp_path / "w.safetensors", SHA) == SHA

    request = plane.requests[0]
    assert request["method"] == "PUT" and request["path"] == f"/api/agent/artifacts/{key}"
    assert request["body"] == WEIGHTS
    assert request["headers"]["x-content-sha256"] == SHA
    assert request["headers"]["content-length"] == str(len(WEIGHTS))


def test_an_upload_whose_file_changed_since_training_is_refused(plane, tmp_path):
    (tmp_path / "w.safetensors").write_bytes(WEIGHTS)

    with pytest.raises(TransferError, match="trainer reported"):
        _client(plane.url).upload(device_weights_key(1, 0, "dev-a", 2), tmp_path / "w.safetensors", "1" * 64)
    assert plane.requests == []


def test_an_upload_over_the_announced_limit_is_refused_before_sending(plane, tmp_path):
    (tmp_path / "w.safetensors").write_bytes(WEIGHTS)
    plane.json(200, {"id": 1, "name": "dev-a", "max_artifact_bytes": 10})
    client = _client(plane.url)
    client.whoami()

    with pytest.raises(TransferError, match="at most 10") as caught:
        client.upload(device_weights_key(1, 0, "dev-a", 2), tmp_path / "w.safetensors")
    assert caught.value.status == 413 and len(plane.requests) == 1


def test_transient_failures_are_retried_with_growing_backoff(plane, tmp_path):
    plane.json(503, {"message": "busy"})
    plane.json(502, {"message": "bad gateway"})
    plane.json(200, {"id": 1, "name": "dev-a"})
    sleeps: list[float] = []

    assert _client(plane.url, sleeps).whoami() == "dev-a"

    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 0.75 and 1.0 <= sleeps[1] <= 1.5


def test_a_download_cut_after_its_headers_is_tried_again(plane, tmp_path):
    # the server announces the whole file, sends 10 bytes and closes the connection
    plane.script.append((200, WEIGHTS[:10], {"Content-Length": str(len(WEIGHTS)), "X-Content-SHA256": SHA}))
    plane.file(WEIGHTS, SHA)
    sleeps: list[float] = []
    dest = tmp_path / "agent" / "w.safetensors"

    assert _client(plane.url, sleeps).download(global_weights_key(1, 2, None), dest) == SHA

    assert dest.read_bytes() == WEIGHTS and len(plane.requests) == 2 and len(sleeps) == 1
    assert [p.name for p in dest.parent.iterdir()] == ["w.safetensors"]  # no partial file left


def test_a_refusal_is_final_and_quotes_the_control_planes_reason(plane, tmp_path):
    (tmp_path / "w.safetensors").write_bytes(WEIGHTS)
    plane.json(400, {"message": "not a valid safetensors file: header is not JSON", "errors": {}})
    sleeps: list[float] = []

    with pytest.raises(TransferError) as caught:
        _client(plane.url, sleeps).upload(device_weights_key(1, 0, "dev-a", 2), tmp_path / "w.safetensors")

    assert caught.value.status == 400 and sleeps == []
    assert "HTTP 400: not a valid safetensors file: header is not JSON" in str(caught.value)


def test_an_unreachable_control_plane_fails_after_the_retries_in_one_line():
    sleeps: list[float] = []

    with pytest.raises(TransferError) as caught:
        _client(_unused_url(), sleeps, attempts=3).whoami()

    assert caught.value.status is None and len(sleeps) == 2
    message = str(caught.value)
    assert "unreachable after 3 tries" in message and "Connection" in message and "\n" not in message


# ------------------------------------------------------------------------------- a round


class FakeClient:
    def __init__(self, fail_download: bool = False, fail_upload: bool = False) -> None:
        self.fail_download, self.fail_upload = fail_download, fail_upload
        self.downloaded: list[str] = []
        self.uploaded: dict[str, bytes] = {}

    def download(self, key: str, dest: Path) -> str:
        if self.fail_download:
            raise TransferError(f"download {key}: control plane at http://cp unreachable after 5 tries: refused")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(WEIGHTS)
        self.downloaded.append(key)
        return SHA

    def upload(self, key: str, source: Path, sha256: str | None = None) -> str:
        if self.fail_upload:
            raise TransferError(f"upload {key}: http://cp answered HTTP 409: round 0 of run 1 is failed")
        self.uploaded[key] = source.read_bytes()
        return SHA


@pytest.fixture
def remote_round(make_task_ref, make_assignment, make_round, tmp_path):
    task = make_task_ref(7, "mobilenet_v3_small")
    global_key = global_weights_key(1, 7, None)
    request = make_round([make_assignment(task, global_key, assignment_id=3, offset=0)], "mps")
    root = tmp_path / "agent-artifacts"
    seen: dict[str, bool] = {}

    def run_round(req):
        spec = req.assignments[0]
        seen["global there"] = (root / spec.global_weights).read_bytes() == WEIGHTS
        (root / spec.output_weights).parent.mkdir(parents=True, exist_ok=True)
        (root / spec.output_weights).write_bytes(WEIGHTS + b"")
        return DeviceRoundResult(
            run_id=req.run_id,
            round_id=req.round_id,
            device=req.device,
            status="succeeded",
            assignments=[
                AssignmentResult(
                    assignment_id=3,
                    task_id=7,
                    status="succeeded",
                    samples_trained=64,
                    weights=spec.output_weights,
                    weights_sha256=SHA,
                )
            ],
        )

    return request, root, run_round, seen


def test_a_remote_round_fetches_trains_sends_and_cleans_up(remote_round):
    request, root, run_round, seen = remote_round
    client = FakeClient()

    result = run_round_remote(run_round, request, root, client)

    assert result.status == "succeeded" and seen["global there"]
    output = request.assignments[0].output_weights
    assert client.downloaded == [request.assignments[0].global_weights]
    assert client.uploaded == {output: WEIGHTS}
    assert result.assignments[0].weights == output  # the control plane's key, read by FedAvg
    assert not any(p.is_file() for p in root.rglob("*"))


def test_a_failed_download_fails_the_round_before_training(remote_round):
    request, root, run_round, seen = remote_round

    result = run_round_remote(run_round, request, root, FakeClient(fail_download=True))

    assert result.status == "failed" and "cannot fetch the global weights" in result.error
    assert seen == {}


def test_a_failed_upload_fails_the_assignment_and_the_device(remote_round):
    request, root, run_round, _ = remote_round

    result = run_round_remote(run_round, request, root, FakeClient(fail_upload=True))

    assert result.status == "failed" and "HTTP 409" in result.error
    assert result.assignments[0].status == "failed" and "cannot send the trained weights" in result.assignments[0].error
    assert not any(p.is_file() for p in root.rglob("*"))


# ------------------------------------------------------------------------------ agent main


@pytest.fixture
def agent_main_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MTFL_HOME", str(tmp_path / "home"))
    for name in ("MTFL_CONTROL_URL", "MTFL_AGENT_TOKEN", "MTFL_AGENT_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("time.sleep", lambda s: None)


def test_agent_refuses_a_token_without_a_control_url(agent_main_env, capsys):
    assert agent.main(["--device", "dev-a", "--agent-token", "k"]) == agent.EXIT_CONFIG
    assert "MTFL_CONTROL_URL is not" in capsys.readouterr().err


def test_agent_refuses_an_unreachable_control_plane_with_exit_code_5(agent_main_env, capsys):
    code = agent.main(["--device", "dev-a", "--control-url", _unused_url(), "--agent-token", "k"])

    assert code == agent.EXIT_CONTROL_PLANE
    err = capsys.readouterr().err.strip()
    assert "unreachable after 3 tries" in err and len(err.splitlines()) == 1


def test_agent_refuses_a_token_the_control_plane_rejects(agent_main_env, plane, capsys):
    plane.json(401, {"message": "invalid agent token"})

    assert agent.main(["--device", "dev-a", "--control-url", plane.url, "--agent-token", "k"]) == agent.EXIT_CONFIG
    assert "refused the agent token: issue one with `mtfl device-token dev-a`" in capsys.readouterr().err


def test_agent_refuses_another_devices_token(agent_main_env, plane, capsys):
    plane.json(200, {"id": 2, "name": "dev-b", "max_artifact_bytes": 1 << 30})

    assert agent.main(["--device", "dev-a", "--control-url", plane.url, "--agent-token", "k"]) == agent.EXIT_CONFIG
    assert "belongs to device 'dev-b', not 'dev-a'" in capsys.readouterr().err


def test_in_transfer_mode_trainers_use_the_agents_own_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(agent.ENV_DEVICE, "dev-a")
    monkeypatch.setenv(agent.ENV_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.setenv("ARTIFACT_ROOT", str(tmp_path / "shared"))
    monkeypatch.setenv("MTFL_CONTROL_URL", "http://cp:8000")
    monkeypatch.setenv("MTFL_AGENT_TOKEN", "k")

    ctx = agent._context(agent.agent_settings())

    assert ctx.artifact_root == tmp_path / "state" / "artifacts"
    assert not (tmp_path / "shared").exists()


# ----------------------------------------------------------------- header checks and keys


def _header_file(tmp_path: Path, header: dict | bytes, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "f.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_a_well_formed_file_lists_its_tensors(tmp_path):
    path = tmp_path / "ok.safetensors"
    path.write_bytes(WEIGHTS)

    assert read_safetensors_header(path) == {"w": TensorInfo("F32", (2, 3)), "n": TensorInfo("I64", ())}


# The reasons are the safetensors library's own words (the tensor or the value at fault).
@pytest.mark.parametrize(
    "header,data,reason",
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "(?i)offset"),
        (
            {
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]},
            },
            b"\0" * 8,
            "(?i)offset.*b",
        ),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "(?i)offset.*a"),
        ({"a": {"dtype": "OBJ", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "OBJ"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "-1"),
        ({"__metadata__": {"k": 1}}, b"", "(?i)string"),
        ([1, 2], b"", "(?i)sequence"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 6, "trailing"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 2, "truncated"),
        (b"{not json}", b"", "(?i)json"),
        # offsets that add up past 2**64 (the library's sums are 64-bit)
        ({"a": {"dtype": "U8", "shape": [2**64 - 1], "data_offsets": [0, 2**64 - 1]}}, b"", "(?i)overflow|covered"),
        (
            {
                f"t{i}": {"dtype": "U8", "shape": [2**61 - 1], "data_offsets": [i * (2**61 - 1), (i + 1) * (2**61 - 1)]}
                for i in range(8)
            }
            | {"t8": {"dtype": "U8", "shape": [7], "data_offsets": [2**64 - 8, 2**64 - 1]}},
            b"",
            "(?i)covered",
        ),
    ],
)
def test_inconsistent_headers_are_refused_with_the_reason(tmp_path, header, data, reason):
    with pytest.raises(InvalidSafetensorsError, match=reason) as caught:
        read_safetensors_header(_header_file(tmp_path, header, data))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "shorter than the 8-byte header length"),
        (WEIGHTS[:5], "shorter than the 8-byte header length"),
        (WEIGHTS[:20], "runs past the end"),
        (b"<!doctype html><html><body>502 Bad Gateway</body></html>", "not a safetensors file"),
        (pickle.dumps({"w": [1.0, 2.0, 3.0]}), "not a safetensors file"),
        (struct.pack("<Q", 2**40) + b"{}", "out of range"),  # a header bomb: never read, never allocated
    ],
)
def test_files_of_another_kind_are_named_before_the_library_reads_them(tmp_path, content, reason):
    path = tmp_path / "f.safetensors"
    path.write_bytes(content)

    with pytest.raises(InvalidSafetensorsError, match=reason):
        read_safetensors_header(path)


def test_entry_fields_beyond_the_format_are_ignored_as_by_every_reader(tmp_path):
    header = {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4], "note": "x"}, "__metadata__": {"k": "v"}}

    assert read_safetensors_header(_header_file(tmp_path, header, b"\0" * 4)) == {"a": TensorInfo("BF16", (2,))}


def test_tensor_mismatches_are_named():
    model = {"w": TensorInfo("F32", (2, 3)), "n": TensorInfo("I64", ())}

    assert tensors_mismatch(model, dict(model)) is None
    assert "'n' is missing" in tensors_mismatch(model, {"w": model["w"]})
    assert "'x' is not in the model" in tensors_mismatch(model, {**model, "x": model["n"]})
    assert "'w' is F16 [2, 3]" in tensors_mismatch(model, {**model, "w": TensorInfo("F16", (2, 3))})


def test_artifact_keys_parse_back_only_in_their_own_spelling():
    assert parse_global_weights_key(global_weights_key(3, 4, None)) == (3, 4, None)
    assert parse_global_weights_key(global_weights_key(3, 4, 12)) == (3, 4, 12)
    assert parse_device_weights_key(device_weights_key(3, 12, "dev-a", 7)) == (3, 12, "dev-a", 7)
    for bad in (
        "runs/03/tasks/4/global/initial.safetensors",
        "runs/3/tasks/4/global/round-1.safetensors",
        "runs/3/rounds/00012/dev-a/task-07.safetensors",
        "runs/3/rounds/00012/Dev A/task-7.safetensors",
        "../runs/3/tasks/4/global/initial.safetensors",
        "secret_key",
    ):
        assert parse_global_weights_key(bad) is None and parse_device_weights_key(bad) is None
