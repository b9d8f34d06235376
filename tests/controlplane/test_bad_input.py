"""Bad input at the API's edge: non-finite numbers are refused naming the field and never
rendered, bodies that do not parse name ``body``, oversized bodies get 413, unknown URLs and
bad pagination answer in the API's error format."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import save, save_file

from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from workers.fl.artifacts import device_weights_key, global_weights_key

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]


def _post_raw(api, url: str, body: str, method: str = "POST"):
    return api.generic(method, url, body, content_type="application/json")


def _strict_json(raw: bytes):
    """Parse as a strict client would: NaN and Infinity are not JSON."""

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(raw, parse_constant=refuse)


# ------------------------------------------------------------------- non-finite numbers in


@pytest.fixture
def targets(make_experiment, make_device):
    """Every float an API client sends, as ``(method, url, JSON body with a @ placeholder, field)``."""
    experiment = make_experiment()
    device, task = experiment.devices.order_by("id")[0], experiment.tasks.order_by("id")[0]
    return [
        ("POST", "/api/tasks/", '{"name": "t", "architecture": "resnet18", "learning_rate": @}', "learning_rate"),
        ("POST", "/api/tasks/", '{"name": "t", "architecture": "resnet18", "momentum": @}', "momentum"),
        ("POST", "/api/tasks/", '{"name": "t", "architecture": "resnet18", "weight_decay": @}', "weight_decay"),
        ("PATCH", f"/api/tasks/{task.id}/", '{"learning_rate": @}', "learning_rate"),
        (
            "POST",
            "/api/experiments/",
            f'{{"name": "e", "tasks": [{task.id}], "devices": [{device.id}], "rounds": 1, '
            f'"partition_rule": "quantity", "dirichlet_alpha": @}}',
            "dirichlet_alpha",
        ),
        (
            "POST",
            "/api/experiments/",
            f'{{"name": "e", "tasks": [{task.id}], "devices": [{device.id}], "rounds": 1, "partition_rule": "explicit", '
            f'"sample_counts": [{{"device": {device.id}, "task": {task.id}, "num_samples": @}}]}}',
            "sample_counts[0].num_samples",
        ),
        (
            "POST",
            "/api/experiments/from-template/",
            f'{{"template": "light", "devices": [{device.id}], "dirichlet_alpha": @}}',
            "dirichlet_alpha",
        ),
        (
            "POST",
            f"/api/experiments/{experiment.id}/runs/",
            '{"strategy": "vres_sync", "options": {"slack": @}}',
            "options.slack",
        ),
        (
            "POST",
            f"/api/experiments/{experiment.id}/runs/",
            f'{{"strategy": "manual", "plan": [{{"device": {device.id}, "task": {task.id}, "batch_size": 8, '
            '"active_thread_percentage": 50}, '
            f'{{"device": {device.id}, "task": {task.id}, "batch_size": @, "active_thread_percentage": 50}}]}}',
            "plan[1].batch_size",
        ),
        ("POST", f"/api/experiments/{experiment.id}/compare/", '{"options": {"objective": @}}', "options.objective"),
        ("POST", f"/api/devices/{device.id}/profile/", '{"budget_s": @}', "budget_s"),
        ("PATCH", f"/api/experiments/{experiment.id}/", '{"deadline_factor": @}', "deadline_factor"),
    ]


@pytest.mark.parametrize("token", NON_FINITE)
def test_non_finite_numbers_are_refused_naming_the_field(api, targets, token):
    for method, url, template, field in targets:
        response = _post_raw(api, url, template.replace("@", token), method)

        assert response.status_code == 400, (url, field, response.content)
        body = response.json()
        assert list(body["errors"]) == [field], (url, body)
        assert body["message"].startswith(f"{field}: must be a finite number"), body
        assert token in body["message"]


def test_every_non_finite_number_of_a_body_is_named(api):
    response = _post_raw(
        api, "/api/tasks/", '{"name": "t", "architecture": "resnet18", "learning_rate": NaN, "momentum": Infinity}'
    )

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"learning_rate", "momentum"}


def test_a_body_that_is_only_a_non_finite_number_names_body(api):
    response = _post_raw(api, "/api/tasks/", "NaN")

    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["body"]


def test_finite_numbers_still_parse(api):
    response = _post_raw(
        api,
        "/api/tasks/",
        '{"name": "t", "architecture": "resnet18", "learning_rate": 1e-2, "momentum": 0.5, "weight_decay": 0}',
    )

    assert response.status_code == 201, response.json()
    assert response.json()["learning_rate"] == 0.01


# ------------------------------------------------------------------ non-finite numbers out


def _stored_non_finite_run(experiment) -> Run:
    """A run whose stored floats are NaN and ±inf (an agent reported them)."""
    nan, inf = float("nan"), float("inf")
    run = Run.objects.create(
        experiment=experiment,
        strategy="sharing",
        status=Run.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=9),
        raw_throughput_sps=nan,
        fair_throughput=inf,
        fl_throughput_sps=-inf,
    )
    rnd = Round.objects.create(
        run=run,
        index=0,
        status=Round.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=9),
        round_time_s=inf,
        wall_time_s=nan,
        fl_throughput_sps=nan,
        raw_throughput_sps=inf,
        fair_throughput=nan,
    )
    for shard in experiment.shards.select_related("device", "task"):
        Assignment.objects.create(
            round=rnd,
            device=shard.device,
            task=shard.task,
            batch_size=8,
            active_thread_percentage=100,
            samples=shard.num_samples,
            samples_trained=shard.num_samples,
            throughput_sps=nan,
            seconds=inf,
            predicted_throughput_sps=inf,
            standalone_throughput_sps=nan,
            train_loss=nan,
            started_at=T0,
            finished_at=T0 + dt.timedelta(seconds=3),
            status=Assignment.Status.SUCCEEDED,
        )
        Checkpoint.objects.get_or_create(
            run=run, task=shard.task, round=None, defaults={"artifact_path": "x", "sha256": "0" * 64}
        )
    Checkpoint.objects.create(
        run=run,
        task=experiment.tasks.first(),
        round=rnd,
        artifact_path="y",
        sha256="1" * 64,
        test_accuracy=nan,
        test_loss=inf,
    )
    return run


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/{run}/",
        "/api/runs/",
        "/api/rounds/",
        "/api/assignments/",
        "/api/checkpoints/",
        "/api/runs/{run}/progress/",
    ],
)
def test_stored_non_finite_floats_are_rendered_as_null(api, make_experiment, path):
    run = _stored_non_finite_run(make_experiment())

    response = api.get(path.format(run=run.id))

    assert response.status_code == 200
    body = _strict_json(response.content)
    assert "NaN" not in response.content.decode() and "Infinity" not in response.content.decode()
    if path == "/api/assignments/":
        row = body["results"][0]
        assert row["throughput_sps"] is None and row["seconds"] is None and row["predicted_throughput_sps"] is None
    if path == "/api/runs/{run}/":
        assert body["raw_throughput_sps"] is None and body["fair_throughput"] is None


def test_the_browsable_api_renders_stored_non_finite_floats(api, make_experiment):
    run = _stored_non_finite_run(make_experiment())

    response = api.get(f"/api/runs/{run.id}/", HTTP_ACCEPT="text/html")

    assert response.status_code == 200


def test_run_page_and_live_json_carry_no_nan(browser_client, make_experiment):
    run = _stored_non_finite_run(make_experiment())

    live = browser_client.get(f"/runs/{run.id}/live/")
    page = browser_client.get(f"/runs/{run.id}/")

    assert live.status_code == 200
    data = _strict_json(live.content)
    assert data["rounds"][0]["raw_throughput_sps"] is None and data["rounds"][0]["round_time_s"] is None
    assert page.status_code == 200
    html = page.content.decode()
    embedded = html.split('<script id="run-live" type="application/json">', 1)[1].split("</script>", 1)[0]
    _strict_json(embedded.encode())


def test_experiment_page_figures_carry_no_nan(browser_client, make_experiment):
    experiment = make_experiment()
    _stored_non_finite_run(experiment)

    page = browser_client.get(f"/experiments/{experiment.id}/")

    assert page.status_code == 200
    html = page.content.decode()
    embedded = html.split('<script id="experiment-figures" type="application/json">', 1)[1].split("</script>", 1)[0]
    _strict_json(embedded.encode())


# ------------------------------------------------------------------------- malformed bodies


@pytest.mark.parametrize("raw", ['{"name": ', "[1, 2", "{bad}", "\x00", "[" * 100_000])
def test_a_body_that_is_not_json_is_400_naming_body(api, raw):
    response = _post_raw(api, "/api/tasks/", raw)

    assert response.status_code == 400
    body = response.json()
    assert list(body["errors"]) == ["body"]
    assert body["message"].startswith("body: JSON parse error")


def test_a_body_in_a_non_text_charset_is_refused(api):
    response = api.generic("POST", "/api/tasks/", b"{}", content_type="application/json; charset=bz2_codec")

    assert response.status_code == 400
    assert "charset" in response.json()["message"]


# ------------------------------------------------------------------------ oversized bodies


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_an_oversized_body_is_413_with_a_message(api, settings, content_type):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"name": "x" * 2000, "architecture": "resnet18"})
    if content_type != "application/json":
        body = "name=" + "x" * 2000

    response = api.generic("POST", "/api/tasks/", body, content_type=content_type)

    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert "at most 1000 bytes" in response.json()["message"]


def test_an_oversized_multipart_body_is_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000

    response = api.post(
        "/api/tasks/", {"name": "t", "architecture": "resnet18", "dataset_root": "x" * 5000}, format="multipart"
    )

    assert response.status_code == 413
    assert "at most 1000 bytes" in response.json()["message"]


def test_the_default_limit_takes_the_largest_real_bodies(api, make_experiment):
    """1,000 plan entries (the serializer's maximum) fit well under the default limit."""
    experiment = make_experiment()
    device, task = experiment.devices.first(), experiment.tasks.first()
    plan = [{"device": device.id, "task": task.id, "batch_size": 8, "active_thread_percentage": 50}] * 1000

    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "manual", "plan": plan}, format="json")

    assert response.status_code != 413


def test_agent_uploads_are_not_held_to_the_request_body_limit(settings, tmp_path, monkeypatch, make_experiment):
    """The agent artifact endpoints stream their body under MTFL_MAX_ARTIFACT_BYTES: the
    general limit (DATA_UPLOAD_MAX_MEMORY_SIZE) must not refuse a model bigger than it."""
    from rest_framework.test import APIClient

    from controlplane.fleet.services import device_token_issue

    monkeypatch.setenv("ARTIFACT_ROOT", str(tmp_path / "store"))
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    state = {"fc.weight": np.ones((16, 16), dtype=np.float32)}
    experiment = make_experiment()
    device, task = experiment.devices.order_by("id")[0], experiment.tasks.order_by("id")[0]
    run = Run.objects.create(experiment=experiment, strategy="isolation", status=Run.Status.RUNNING)
    initial = tmp_path / "store" / global_weights_key(run.id, task.id, None)
    initial.parent.mkdir(parents=True)
    save_file(state, str(initial))
    Checkpoint.objects.create(
        run=run,
        task=task,
        round=None,
        artifact_path=global_weights_key(run.id, task.id, None),
        sha256=hashlib.sha256(initial.read_bytes()).hexdigest(),
    )
    rnd = Round.objects.create(run=run, index=0, status=Round.Status.RUNNING)
    Assignment.objects.create(
        round=rnd, device=device, task=task, batch_size=8, active_thread_percentage=100, samples=40
    )
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Agent {device_token_issue(device=device)[1]}")
    body = save(state)
    assert len(body) > 1000

    response = agent.put(
        f"/api/agent/artifacts/{device_weights_key(run.id, 0, device.name, task.id)}",
        data=body,
        content_type="application/octet-stream",
        HTTP_X_CONTENT_SHA256=hashlib.sha256(body).hexdigest(),
    )

    assert response.status_code == 201, response.content


# -------------------------------------------------------------------- URLs and pagination


@pytest.mark.parametrize("path", ["/api/devices/1/2/3/", "/api/nothing-here/", "/api/tasks/not-a-number/x/"])
def test_an_unknown_api_url_is_a_json_404(api, path):
    response = api.get(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["message"].startswith("no API endpoint at")


def test_an_unknown_dashboard_url_is_still_a_page(browser_client):
    response = browser_client.get("/no-such-page/")

    assert response.status_code == 404
    assert "text/html" in response["Content-Type"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=abc", "limit"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("offset=-1", "offset"),
        ("offset=x", "offset"),
    ],
)
def test_bad_pagination_is_400_naming_the_parameter(api, query, field):
    response = api.get(f"/api/tasks/?{query}")

    assert response.status_code == 400
    assert list(response.json()["errors"]) == [field]
    assert response.json()["message"].startswith(f"{field}: must be an integer from")


def test_good_pagination_pages(api, make_task):
    for i in range(3):
        make_task(f"t{i}", "resnet18")

    response = api.get("/api/tasks/?limit=2&offset=1")

    assert response.status_code == 200
    assert response.json()["count"] == 3 and len(response.json()["results"]) == 2
