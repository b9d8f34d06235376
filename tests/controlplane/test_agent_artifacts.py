"""Agent tokens and the agent artifact endpoints: a device's agent fetches the global models its
assignments need and sends back the weights it trained, and nothing else; researchers' tokens
do not work there and agent tokens work nowhere else."""

from __future__ import annotations

import hashlib
import io
import pickle
import struct

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from safetensors.numpy import save, save_file

from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from controlplane.fleet.models import DeviceToken
from controlplane.fleet.services import agent_token_hash, device_token_issue
from workers.fl.artifacts import device_weights_key, global_weights_key

pytestmark = pytest.mark.django_db


def _state(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "fc.weight": np.full((4, 3), scale, dtype=np.float32),
        "fc.bias": np.zeros(3, dtype=np.float32),
        "bn.num_batches_tracked": np.array(5, dtype=np.int64),
    }


def _weights(scale: float = 1.0) -> bytes:
    return save(_state(scale))


def _agent(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {key}")
    return client


def _researcher(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


def _put(client: APIClient, key: str, body: bytes, sha256: str | None = None):
    return client.put(
        f"/api/agent/artifacts/{key}",
        data=body,
        content_type="application/octet-stream",
        HTTP_X_CONTENT_SHA256=sha256 if sha256 is not None else hashlib.sha256(body).hexdigest(),
    )


@pytest.fixture
def world(tmp_path, monkeypatch, make_device, make_task, make_experiment):
    """A running round of a one-task experiment on dev-a and dev-b, the task's initial model in
    the store, and an agent token per device."""
    monkeypatch.setenv("ARTIFACT_ROOT", str(tmp_path / "store"))
    devices = [make_device("dev-a"), make_device("dev-b")]
    task = make_task("t-small", "mobilenet_v3_small")
    experiment = make_experiment(devices=devices, tasks=[task])
    run = Run.objects.create(experiment=experiment, strategy="isolation", status=Run.Status.RUNNING)
    initial = global_weights_key(run.id, task.id, None)
    (tmp_path / "store" / initial).parent.mkdir(parents=True)
    save_file(_state(0.0), str(tmp_path / "store" / initial))
    sha = hashlib.sha256((tmp_path / "store" / initial).read_bytes()).hexdigest()
    Checkpoint.objects.create(run=run, task=task, round=None, artifact_path=initial, sha256=sha)
    rnd = Round.objects.create(run=run, index=0, status=Round.Status.RUNNING)
    for device in devices:
        Assignment.objects.create(
            round=rnd, device=device, task=task, batch_size=8, active_thread_percentage=100, samples=40
        )
    keys = {d.name: device_token_issue(device=d)[1] for d in devices}
    return {
        "run": run,
        "round": rnd,
        "task": task,
        "devices": devices,
        "keys": keys,
        "initial": initial,
        "initial_sha": sha,
        "store": tmp_path / "store",
        "output": {d.name: device_weights_key(run.id, 0, d.name, task.id) for d in devices},
    }


# ----------------------------------------------------------------------------- round trip


def test_agent_downloads_a_global_model_it_needs_with_its_sha256(world):
    response = _agent(world["keys"]["dev-a"]).get(f"/api/agent/artifacts/{world['initial']}")

    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body == (world["store"] / world["initial"]).read_bytes()
    assert response["X-Content-SHA256"] == world["initial_sha"] == hashlib.sha256(body).hexdigest()


def test_agent_uploads_its_trained_weights_to_the_assignments_key(world):
    body = _weights(2.0)
    key = world["output"]["dev-a"]

    response = _put(_agent(world["keys"]["dev-a"]), key, body)

    assert response.status_code == 201, response.json()
    assert response.json() == {"key": key, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    assert (world["store"] / key).read_bytes() == body
    assert [p.name for p in (world["store"] / key).parent.iterdir()] == [f"task-{world['task'].id:d}.safetensors"]


def test_a_repeated_upload_replaces_the_first(world):
    agent, key = _agent(world["keys"]["dev-a"]), world["output"]["dev-a"]
    _put(agent, key, _weights(1.0))

    assert _put(agent, key, _weights(3.0)).status_code == 201
    assert (world["store"] / key).read_bytes() == _weights(3.0)


def test_post_works_like_put(world):
    body = _weights(2.0)
    response = _agent(world["keys"]["dev-b"]).post(
        f"/api/agent/artifacts/{world['output']['dev-b']}",
        data=body,
        content_type="application/octet-stream",
        HTTP_X_CONTENT_SHA256=hashlib.sha256(body).hexdigest(),
    )

    assert response.status_code == 201


def test_agent_learns_its_device_and_the_upload_limit(world, settings):
    settings.MTFL = {**settings.MTFL, "MAX_ARTIFACT_BYTES": 12345}

    response = _agent(world["keys"]["dev-b"]).get("/api/agent/device/")

    assert response.json() == {"id": world["devices"][1].id, "name": "dev-b", "max_artifact_bytes": 12345}


# --------------------------------------------------------------------------------- tokens


def test_a_wrong_or_missing_agent_token_is_401(world):
    assert _agent("not-a-token").get(f"/api/agent/artifacts/{world['initial']}").status_code == 401
    response = APIClient().get(f"/api/agent/artifacts/{world['initial']}")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Agent"
    assert _put(_agent("x y"), world["output"]["dev-a"], _weights()).status_code == 401


def test_an_agent_cannot_touch_another_devices_artifacts(world):
    agent = _agent(world["keys"]["dev-a"])

    response = _put(agent, world["output"]["dev-b"], _weights())

    assert response.status_code == 404
    assert not (world["store"] / world["output"]["dev-b"]).exists()


def test_an_agent_cannot_download_what_none_of_its_assignments_needs(world, make_device):
    other = make_device("dev-c")
    _, key = device_token_issue(device=other)

    assert _agent(key).get(f"/api/agent/artifacts/{world['initial']}").status_code == 404
    # Anything that is not a global model, even a device's trained weights, is never served.
    _put(_agent(world["keys"]["dev-b"]), world["output"]["dev-b"], _weights())
    assert _agent(world["keys"]["dev-a"]).get(f"/api/agent/artifacts/{world['output']['dev-b']}").status_code == 404
    assert _agent(world["keys"]["dev-a"]).get("/api/agent/artifacts/../secret_key").status_code == 404


def test_downloads_and_uploads_end_with_the_round(world):
    Round.objects.filter(id=world["round"].id).update(status=Round.Status.SUCCEEDED)
    agent = _agent(world["keys"]["dev-a"])

    assert agent.get(f"/api/agent/artifacts/{world['initial']}").status_code == 404
    response = _put(agent, world["output"]["dev-a"], _weights())
    assert response.status_code == 409 and "no longer takes weights" in response.json()["message"]


def test_a_researchers_token_or_session_is_refused_on_agent_endpoints(world, user, client):
    assert _researcher(user).get(f"/api/agent/artifacts/{world['initial']}").status_code == 401
    assert _put(_researcher(user), world["output"]["dev-a"], _weights()).status_code == 401
    client.force_login(user)
    assert client.get("/api/agent/device/").status_code == 401


@pytest.mark.parametrize("url", ["/api/devices/", "/api/experiments/", "/api/runs/", "/api/tasks/"])
def test_an_agent_token_is_refused_on_researcher_endpoints(world, url):
    assert _agent(world["keys"]["dev-a"]).get(url).status_code == 401


def test_an_agent_token_cannot_issue_tokens(world):
    device = world["devices"][0]
    assert _agent(world["keys"]["dev-a"]).post(f"/api/devices/{device.id}/token/").status_code == 401


def test_issuing_a_token_returns_the_key_once_and_stores_only_its_hash(world, user):
    user.is_superuser = True
    user.save()
    device = world["devices"][0]
    old = world["keys"]["dev-a"]

    response = _researcher(user).post(f"/api/devices/{device.id}/token/")

    assert response.status_code == 201
    key = response.json()["token"]
    assert response.json()["device_name"] == "dev-a" and len(key) >= 40
    stored = DeviceToken.objects.get(device=device)
    assert stored.key_hash == agent_token_hash(key) and key not in str(DeviceToken.objects.values().get(id=stored.id))
    assert stored.created_by == user
    assert _agent(key).get("/api/agent/device/").status_code == 200
    assert _agent(old).get("/api/agent/device/").status_code == 401  # rotated: the old key is dead
    assert _researcher(user).get(f"/api/devices/{device.id}/token/").status_code == 405


def test_only_permitted_researchers_issue_tokens(world, user):
    device = world["devices"][0]
    researcher = _researcher(user)

    assert researcher.post(f"/api/devices/{device.id}/token/").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="add_devicetoken"))
    user = get_user_model().objects.get(id=user.id)  # a fresh permission cache
    assert _researcher(user).post(f"/api/devices/{device.id}/token/").status_code == 201
    assert APIClient().post(f"/api/devices/{device.id}/token/").status_code == 401


def test_a_used_token_records_when(world):
    _agent(world["keys"]["dev-a"]).get("/api/agent/device/")

    assert DeviceToken.objects.get(device__name="dev-a").last_used_at is not None
    assert DeviceToken.objects.get(device__name="dev-b").last_used_at is None


def test_device_token_command_prints_a_working_key(world):
    out, err = io.StringIO(), io.StringIO()

    call_command("device_token", "dev-new", stdout=out, stderr=err)

    key = out.getvalue().strip()
    assert "registered device 'dev-new'" in err.getvalue()
    assert _agent(key).get("/api/agent/device/").json()["name"] == "dev-new"


# ------------------------------------------------------------------------ upload refusals


def test_an_upload_over_the_size_limit_is_413(world, settings):
    settings.MTFL = {**settings.MTFL, "MAX_ARTIFACT_BYTES": 100}

    response = _put(_agent(world["keys"]["dev-a"]), world["output"]["dev-a"], _weights())

    assert response.status_code == 413
    assert "at most 100 (MTFL_MAX_ARTIFACT_BYTES)" in response.json()["message"]
    assert not (world["store"] / world["output"]["dev-a"]).exists()


def test_a_body_longer_than_its_content_length_is_cut_off_at_the_limit(world, settings):
    from controlplane.common.errors import ApplicationError
    from controlplane.storage.services.agent_artifacts import agent_artifact_upload

    settings.MTFL = {**settings.MTFL, "MAX_ARTIFACT_BYTES": 100}
    body = _weights()
    assert len(body) > 100

    with pytest.raises(ApplicationError) as caught:
        agent_artifact_upload(
            device=world["devices"][0],
            key=world["output"]["dev-a"],
            body=io.BytesIO(body),
            content_length=50,
            sha256=hashlib.sha256(body).hexdigest(),
        )

    assert caught.value.status_code == 413
    assert list((world["store"] / world["output"]["dev-a"]).parent.iterdir()) == []  # no temporary file left


def test_a_sha256_mismatch_is_400(world):
    response = _put(_agent(world["keys"]["dev-a"]), world["output"]["dev-a"], _weights(), sha256="0" * 64)

    assert response.status_code == 400
    assert "sha256 mismatch" in response.json()["message"]
    assert not (world["store"] / world["output"]["dev-a"]).exists()


def test_a_missing_sha256_is_400(world):
    response = _put(_agent(world["keys"]["dev-a"]), world["output"]["dev-a"], _weights(), sha256="")

    assert response.status_code == 400 and "X-Content-SHA256" in response.json()["message"]


def _malformed() -> dict[str, bytes]:
    good = _weights()
    header_len = struct.unpack("<Q", good[:8])[0]
    return {
        "truncated": (good[: len(good) - 7], "truncated or trailing bytes"),
        "too short": (good[:5], "shorter than the 8-byte header length"),
        "bad header length": (struct.pack("<Q", len(good)) + good[8:], "runs past the end"),
        "header not JSON": (
            struct.pack("<Q", header_len) + b"{not json" + b" " * (header_len - 9) + good[8 + header_len :],
            "invalid JSON in header",
        ),
        "pickle renamed": (pickle.dumps(_state()), "not a safetensors file"),
        "wrong tensors": (save({"other": np.zeros(2, dtype=np.float32)}), "do not fit task"),
        "wrong shape": (
            save({**_state(), "fc.weight": np.zeros((3, 4), dtype=np.float32)}),
            "'fc.weight' is F32 [3, 4]",
        ),
    }


@pytest.mark.parametrize("case", list(_malformed()))
def test_a_malformed_weights_file_is_400_with_the_reason(world, case):
    body, reason = _malformed()[case]

    response = _put(_agent(world["keys"]["dev-a"]), world["output"]["dev-a"], body)

    assert response.status_code == 400, response.json()
    assert reason in response.json()["message"]
    assert not (world["store"] / world["output"]["dev-a"]).exists()


def test_nothing_from_an_upload_is_unpickled(world, monkeypatch):
    calls = []
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: calls.append(a))

    _put(_agent(world["keys"]["dev-a"]), world["output"]["dev-a"], pickle.dumps(_state()))

    assert calls == []


def test_mtfl_agent_passes_the_transfer_options_to_the_agent(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "MTFL_CONTROL_URL", "MTFL_AGENT_TOKEN"}}
    env.update(MTFL_HOME=str(tmp_path), CELERY_BROKER_URL="redis://127.0.0.1:1/0")

    out = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "agent", "--device", "dev-a", "--agent-token", "k"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )

    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("mtfl agent:") and "MTFL_CONTROL_URL is not" in out.stderr
