"""The dashboard's workflows: a researcher registers a device, defines a task, creates an
experiment, launches and cancels runs and comparisons, chooses collaborators and downloads
results, all without the API. Every form answers with the API's own message for the same input;
an experiment's pages and downloads are its members' only (others get 404)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from html import escape

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.experiments.models import Assignment, Comparison, Experiment, Round, Run, Task
from controlplane.fleet.models import Device
from controlplane.storage import exports

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


def _api_message(response, field: str) -> str:
    body = response.json()
    assert response.status_code >= 400, body
    return body["errors"][field][0]


def _shows_at_field(response, message: str) -> bool:
    return f'<span class="error">{escape(message)}</span>' in response.content.decode()


def _shows_above_form(response, message: str) -> bool:
    return f'<p class="error wide form-error">{escape(message)}</p>' in response.content.decode()


@pytest.fixture
def people(user):
    """The ``user`` fixture (an experiment's owner), ``carol`` (its collaborator), ``oscar`` (an outsider)."""
    User = get_user_model()
    return {
        "owner": user,
        "collaborator": User.objects.create_user("carol", password="carol-pass-1"),
        "outsider": User.objects.create_user("oscar", password="oscar-pass-1"),
    }


def _browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def experiment(people, make_experiment):
    experiment = make_experiment(name="shared-exp", rounds=2)
    experiment.collaborators.add(people["collaborator"])
    return experiment


def _finished_run(experiment, strategy: str, *, rounds: int = 2, throughput: float = 40.0) -> Run:
    """A succeeded run with measured rounds and one assignment per shard in each."""
    run = Run.objects.create(
        experiment=experiment,
        strategy=strategy,
        status=Run.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(minutes=1),
        raw_throughput_sps=2 * throughput,
        fair_throughput=0.75,
        fl_throughput_sps=throughput / 2,
    )
    shards = list(experiment.shards.select_related("device", "task").order_by("device__name", "task__name"))
    for index in range(rounds):
        start = T0 + dt.timedelta(seconds=20 * index)
        rnd = Round.objects.create(
            run=run,
            index=index,
            status=Round.Status.SUCCEEDED,
            started_at=start,
            finished_at=start + dt.timedelta(seconds=15),
            round_time_s=12.5 + index,
            wall_time_s=14.0 + index,
            samples_trained=100 * (index + 1),
            fl_throughput_sps=8.0 + index,
            raw_throughput_sps=2 * throughput + index,
            fair_throughput=0.75,
            flags=["slow device"] if index else [],
        )
        for k, shard in enumerate(shards):
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=16 + k,
                active_thread_percentage=50,
                samples=shard.num_samples,
                samples_trained=shard.num_samples,
                throughput_sps=throughput + k + index / 4,
                seconds=1.5 + k,
                train_loss=0.5 - index / 10,
                status=Assignment.Status.SUCCEEDED,
                started_at=start + dt.timedelta(seconds=1),
                finished_at=start + dt.timedelta(seconds=5 + k),
            )
    return run


# ------------------------------------------------------------------------------- pages and CSRF


@pytest.mark.parametrize("url", ["/devices/new/", "/tasks/new/", "/experiments/new/", "/tasks/"])
def test_new_pages_need_login(client, url):
    response = client.get(url)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize(
    "url,button",
    [
        ("/devices/new/", "Register the device"),
        ("/tasks/new/", "Define the task"),
        ("/experiments/new/", "Create the experiment"),
    ],
)
def test_form_pages_render_a_post_form_with_a_csrf_token(browser_client, url, button):
    html = browser_client.get(url).content.decode()
    assert f'method="post" action="{url}"' in html and "csrfmiddlewaretoken" in html and button in html


def test_every_new_form_refuses_a_post_without_a_csrf_token(user, experiment):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    run = _finished_run(experiment, "temporal")
    for url in [
        "/devices/new/",
        "/tasks/new/",
        "/experiments/new/",
        f"/experiments/{experiment.id}/runs/",
        f"/experiments/{experiment.id}/collaborators/",
        f"/runs/{run.id}/cancel/",
    ]:
        assert strict.post(url, {"name": "x"}).status_code == 403, url


# ------------------------------------------------------------------------------- devices


def test_registering_a_device_lists_it_and_says_how_to_start_its_agent(browser_client):
    response = browser_client.post("/devices/new/", {"name": "gpu-a", "backend": "cuda-mps"}, follow=True)

    device = Device.objects.get(name="gpu-a")
    assert device.backend == "cuda-mps"
    assert response.redirect_chain == [("/#devices", 302)]
    html = response.content.decode()
    assert "device.gpu-a" in html and "mtfl agent --device gpu-a --backend cuda-mps" in html


@pytest.mark.parametrize(
    "form,field",
    [
        ({"name": "GPU A", "backend": "cpu"}, "name"),  # the service's rule
        ({"name": "gpu-a", "backend": "tpu"}, "backend"),  # the serializer's choice
        ({"name": "", "backend": "cpu"}, "name"),  # left empty: required
    ],
)
def test_device_form_shows_the_apis_message(browser_client, api, form, field):
    api_body = {k: v for k, v in form.items() if v != ""}
    message = _api_message(api.post("/api/devices/", api_body, format="json"), field)

    response = browser_client.post("/devices/new/", form)

    assert response.status_code == 400 and _shows_at_field(response, message), message
    assert not Device.objects.exists()


def test_device_form_refuses_a_taken_name_with_the_services_message(browser_client, api, make_device):
    make_device("gpu-a")
    message = _api_message(api.post("/api/devices/", {"name": "gpu-a"}, format="json"), "name")

    response = browser_client.post("/devices/new/", {"name": "gpu-a", "backend": "cpu"})

    assert response.status_code == 400 and _shows_at_field(response, message)
    assert message == "a device named 'gpu-a' already exists"


# ------------------------------------------------------------------------------- tasks


TASK = {
    "name": "digits-r18",
    "architecture": "resnet18",
    "dataset": "digits",
    "dataset_root": "",
    "num_classes": "10",
    "optimizer": "sgd",
    "learning_rate": "0.1",
    "momentum": "0.9",
    "weight_decay": "0.0005",
}


def test_defining_a_task_makes_it_the_researchers_and_opens_its_page(browser_client, user):
    response = browser_client.post("/tasks/new/", TASK)

    task = Task.objects.get(name="digits-r18")
    assert response.status_code == 302 and response["Location"] == f"/tasks/{task.id}/"
    assert task.owner == user and task.architecture == "resnet18" and task.learning_rate == 0.1
    assert "digits-r18" in browser_client.get("/tasks/").content.decode()


def test_a_task_without_classes_takes_them_from_its_data(browser_client):
    response = browser_client.post("/tasks/new/", {**TASK, "num_classes": ""})

    task = Task.objects.get(name="digits-r18")
    assert response.status_code == 302 and task.num_classes == 10 and task.input_shape == [3, 32, 32]
    page = browser_client.get(f"/tasks/{task.id}/").content.decode()
    assert '<td id="task-input-shape">3×32×32</td>' in page and f"{task.train_size} training" in page


def test_the_task_form_lists_models_and_data_sets_with_their_shapes(browser_client):
    from workers.registry.datasets import DATASET_REGISTRY
    from workers.registry.models import MODEL_REGISTRY

    html = browser_client.get("/tasks/new/").content.decode()
    resnet = MODEL_REGISTRY.get("resnet18")
    assert escape(f"{resnet.label} · {MODEL_REGISTRY.source('resnet18')}") in html
    digits = DATASET_REGISTRY.get("digits")
    assert escape(f"{digits.label} (3×32×32, 10 classes)") in html
    assert escape(f"{DATASET_REGISTRY.get('npz').label} (shape from the files)") in html
    # the data folder is asked for the data sets that read files only
    assert re.search(r'<option value="npz"[^>]* data-needs-root="true"', html)
    assert re.search(r'<option value="digits"[^>]* data-needs-root="false"', html)
    assert 'id="task-form"' in html


@pytest.mark.parametrize(
    "change,api_change,field",
    [
        ({"learning_rate": "fast"}, {"learning_rate": "fast"}, "learning_rate"),  # serializer: a number
        ({"learning_rate": "0"}, {"learning_rate": 0}, "learning_rate"),  # service: out of range
        ({"num_classes": "1"}, {"num_classes": 1}, "num_classes"),  # serializer: range
        ({"architecture": "alexnet"}, {"architecture": "alexnet"}, "architecture"),
        ({"dataset": "cifar10"}, {"dataset": "cifar10"}, "dataset_root"),  # service: needs its folder
        # the plug-in check (a child process) refuses a file that is not there
        (
            {"dataset": "npz", "dataset_root": "/nonexistent/rows.npz"},
            {"dataset": "npz", "dataset_root": "/nonexistent/rows.npz"},
            "dataset_root",
        ),
    ],
)
def test_task_form_shows_the_apis_message(browser_client, api, change, api_change, field):
    body = {"name": "t", "architecture": "resnet18", **api_change}
    message = _api_message(api.post("/api/tasks/", body, format="json"), field)

    response = browser_client.post("/tasks/new/", {**TASK, "name": "t", **change})

    assert response.status_code == 400 and _shows_at_field(response, message), message
    assert not Task.objects.exists()


# ------------------------------------------------------------------------------- experiments


@pytest.fixture
def catalogue(make_device, make_task):
    return (
        [make_device("dev-a"), make_device("dev-b")],
        [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")],
    )


ALPHA = "partition-dirichlet_labels-alpha"
"""The experiment form's input of dirichlet_labels' alpha (each rule's parameters have their own)."""


def _experiment_form(devices, tasks_, **change) -> dict:
    return {
        "name": "mine",
        "description": "",
        "tasks": [t.id for t in tasks_],
        "devices": [d.id for d in devices],
        "rounds": "2",
        "local_epochs": "1",
        "partition_rule": "dirichlet_labels",
        ALPHA: "0.5",
        "partition-quantity-alpha": "7",  # another rule's input: not sent
        "seed": "3",
        **change,
    }


def _field_html(response, field: str) -> str:
    """The form's ``<label>`` of ``field`` (its input, help and errors)."""
    html = response.content.decode()
    start = html.index(f'id="field-{field}"')
    return html[start : html.index("</label>", start)]


def test_creating_an_experiment_from_tasks_and_devices(browser_client, user, catalogue):
    devices, tasks = catalogue

    response = browser_client.post("/experiments/new/", _experiment_form(devices, tasks))

    experiment = Experiment.objects.get(name="mine")
    assert response.status_code == 302 and response["Location"] == f"/experiments/{experiment.id}/"
    assert experiment.owner == user and experiment.rounds == 2 and experiment.seed == 3
    assert experiment.partition_rule == "dirichlet_labels" and experiment.partition_params == {"alpha": 0.5}
    assert experiment.shards.count() == 4
    page = browser_client.get(response["Location"]).content.decode()
    assert 'id="launch-run"' in page and 'id="save-collaborators"' in page


def test_an_integer_parameter_is_sent_as_an_integer(browser_client, catalogue):
    devices, tasks = catalogue
    form = _experiment_form(devices, tasks, partition_rule="shards", **{"partition-shards-shards_per_device": "2"})

    response = browser_client.post("/experiments/new/", form)

    assert response.status_code == 302, response.content.decode()[:2000]
    experiment = Experiment.objects.get(name="mine")
    assert experiment.partition_rule == "shards" and experiment.partition_params == {"shards_per_device": 2}
    assert isinstance(experiment.partition_params["shards_per_device"], int)


def test_the_experiment_form_has_one_input_per_declared_parameter(browser_client, catalogue):
    from workers.registry.partitioners import PARTITIONER_REGISTRY

    html = browser_client.get("/experiments/new/").content.decode()
    for rule in PARTITIONER_REGISTRY.records():
        assert f'<option value="{rule.name}"' in html
        for parameter in rule.parameters:
            name = f"partition-{rule.name}-{parameter.name}"
            start = html.index(f'name="{name}"')
            tag = html[html.rindex("<input", 0, start) : html.index(">", start)]
            assert f'data-partition-rule="{rule.name}"' in tag
            if parameter.kind == "int":
                assert 'step="1"' in tag
            if parameter.default is not None:
                assert f'value="{parameter.default}"' in tag
            label = html[html.rindex("<label", 0, start) : start]
            assert escape(parameter.label) in label and f"{rule.name} only: " in html[start:]


@pytest.mark.parametrize(
    "change,api_change,field",
    [
        ({"rounds": "0"}, {"rounds": 0}, "rounds"),
        ({"rounds": "many"}, {"rounds": "many"}, "rounds"),
        ({"tasks": []}, {"tasks": []}, "tasks"),
        ({ALPHA: "-1"}, {"partition_params": {"alpha": -1}}, ALPHA),
        ({ALPHA: "abc"}, {"partition_params": {"alpha": "abc"}}, ALPHA),
        (
            {"partition_rule": "shards", "partition-shards-shards_per_device": "0"},
            {"partition_rule": "shards", "partition_params": {"shards_per_device": 0}},
            "partition-shards-shards_per_device",
        ),
        (
            {"partition_rule": "shards", "partition-shards-shards_per_device": "1.5"},
            {"partition_rule": "shards", "partition_params": {"shards_per_device": 1.5}},
            "partition-shards-shards_per_device",
        ),
        ({"name": ""}, {"name": None}, "name"),  # a blank input is a field left out: required
    ],
)
def test_experiment_form_shows_the_apis_message(browser_client, api, catalogue, change, api_change, field):
    devices, tasks = catalogue
    body = {
        "name": "mine",
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": 2,
        "partition_rule": "dirichlet_labels",
        "partition_params": {"alpha": 0.5},
        **api_change,
    }
    body = {k: v for k, v in body.items() if v is not None}
    refused = api.post("/api/experiments/", body, format="json")
    assert refused.status_code == 400, refused.json()
    # the API names the field (a parameter's: partition_params.<name>), the form shows it there
    key = next(iter(refused.json()["errors"]))
    message = refused.json()["errors"][key][0]

    response = browser_client.post("/experiments/new/", _experiment_form(devices, tasks, **change))

    assert response.status_code == 400 and _shows_at_field(response, message), (key, message)
    assert escape(message) in _field_html(response, field)
    assert not Experiment.objects.exists()


def test_experiment_form_keeps_what_was_typed_after_an_error(browser_client, catalogue):
    devices, tasks = catalogue
    html = browser_client.post("/experiments/new/", _experiment_form(devices, tasks, rounds="0")).content.decode()
    assert 'value="mine"' in html and f'<option value="{tasks[0].id}" selected>' in html


# ------------------------------------------------------------------------------- runs


def test_launching_a_run_goes_to_its_page(browser_client, experiment):
    response = browser_client.post(
        f"/experiments/{experiment.id}/runs/", {"strategy": "sharing", "objective": "", "slack": ""}
    )

    run = Run.objects.get(experiment=experiment)
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    assert run.strategy == "sharing" and run.status == Run.Status.PENDING
    assert 'id="cancel-run"' in browser_client.get(response["Location"]).content.decode()


def test_a_collaborator_launches_runs_too(people, experiment):
    response = _browser(people["collaborator"]).post(f"/experiments/{experiment.id}/runs/", {"strategy": "temporal"})
    assert response.status_code == 302 and Run.objects.filter(experiment=experiment).count() == 1


@pytest.mark.parametrize(
    "form,api_body,field,where",
    [
        ({"strategy": "fastest"}, {"strategy": "fastest"}, "strategy", "field"),  # serializer
        (
            {"strategy": "vres_greedy", "objective": "speed"},
            {"strategy": "vres_greedy", "options": {"objective": "speed"}},
            "options.objective",
            "objective",
        ),
        (
            {"strategy": "vres_greedy"},
            {"strategy": "vres_greedy"},
            "non_field_errors",
            "field",
        ),  # no predictor: service
        (
            {"strategy": "sharing", "slack": "none"},
            {"strategy": "sharing", "options": {"slack": "none"}},
            "options",
            "field",
        ),
    ],
)
def test_run_form_shows_the_apis_message(browser_client, api, experiment, form, api_body, field, where):
    api_response = api.post(f"/api/experiments/{experiment.id}/runs/", api_body, format="json")
    errors = api_response.json()["errors"]
    message = (errors.get(field) or next(iter(errors.values())))[0]

    response = browser_client.post(f"/experiments/{experiment.id}/runs/", form)

    assert response.status_code == api_response.status_code
    assert _shows_at_field(response, message) or _shows_above_form(response, message), message
    assert not Run.objects.exists()


def test_an_outsider_cannot_launch_a_run(people, experiment):
    response = _browser(people["outsider"]).post(f"/experiments/{experiment.id}/runs/", {"strategy": "temporal"})
    assert response.status_code == 404 and not Run.objects.exists()


def test_cancelling_a_running_run(browser_client, experiment):
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.RUNNING, started_at=T0)

    response = browser_client.post(f"/runs/{run.id}/cancel/")

    run.refresh_from_db()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    assert run.status == Run.Status.CANCELLED and run.error == "cancelled by a user"
    assert 'id="cancel-run"' not in browser_client.get(f"/runs/{run.id}/").content.decode()


def test_cancelling_a_finished_run_shows_the_apis_message(browser_client, api, experiment):
    run = _finished_run(experiment, "temporal")
    message = api.post(f"/api/runs/{run.id}/cancel/").json()["errors"]["status"][0]

    response = browser_client.post(f"/runs/{run.id}/cancel/")

    assert response.status_code == 409
    assert f'<p class="error" id="cancel-error">{escape(message)}</p>' in response.content.decode()


def test_an_outsider_cannot_cancel_a_run(people, experiment):
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.RUNNING, started_at=T0)
    assert _browser(people["outsider"]).post(f"/runs/{run.id}/cancel/").status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def _running_comparison(experiment) -> Comparison:
    comparison = Comparison.objects.create(experiment=experiment, strategies=["temporal", "isolation"])
    Run.objects.create(
        experiment=experiment, strategy="temporal", status=Run.Status.RUNNING, started_at=T0, comparison=comparison
    )
    Run.objects.create(experiment=experiment, strategy="isolation", comparison=comparison)
    return comparison


def test_cancelling_a_running_comparison_from_the_experiment_page(browser_client, experiment):
    comparison = _running_comparison(experiment)
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert f'action="/comparisons/{comparison.id}/cancel/"' in page

    response = browser_client.post(f"/comparisons/{comparison.id}/cancel/")

    comparison.refresh_from_db()
    assert response.status_code == 302 and comparison.status == Comparison.Status.CANCELLED
    assert set(comparison.runs.values_list("status", flat=True)) == {Run.Status.CANCELLED}


def test_cancelling_an_ended_comparison_shows_the_apis_message(browser_client, api, experiment):
    comparison = _running_comparison(experiment)
    browser_client.post(f"/comparisons/{comparison.id}/cancel/")
    message = api.post(f"/api/comparisons/{comparison.id}/cancel/").json()["errors"]["status"][0]

    response = browser_client.post(f"/comparisons/{comparison.id}/cancel/")

    assert (
        response.status_code == 409
        and f'<p class="error" id="compare-error">{escape(message)}</p>' in response.content.decode()
    )


def test_an_outsider_cannot_cancel_a_comparison(people, experiment):
    comparison = _running_comparison(experiment)
    assert _browser(people["outsider"]).post(f"/comparisons/{comparison.id}/cancel/").status_code == 404
    comparison.refresh_from_db()
    assert comparison.status == Comparison.Status.RUNNING


# ------------------------------------------------------------------------------- collaborators


def test_the_owner_chooses_the_collaborators(browser_client, people, experiment):
    get_user_model().objects.create_user("dave", password="dave-pass-1")

    response = browser_client.post(f"/experiments/{experiment.id}/collaborators/", {"collaborators": "carol, dave"})

    assert response.status_code == 302 and response["Location"] == f"/experiments/{experiment.id}/#members"
    assert sorted(u.username for u in experiment.collaborators.all()) == ["carol", "dave"]
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert 'value="carol, dave"' in page


def test_the_owner_can_share_with_no_one(browser_client, experiment):
    assert browser_client.post(f"/experiments/{experiment.id}/collaborators/", {"collaborators": ""}).status_code == 302
    assert not experiment.collaborators.exists()


@pytest.mark.parametrize("names,api_names", [("carol zed", ["carol", "zed"]), ("researcher", ["researcher"])])
def test_collaborators_form_shows_the_apis_message(browser_client, api, experiment, names, api_names):
    message = _api_message(
        api.patch(f"/api/experiments/{experiment.id}/", {"collaborators": api_names}, format="json"), "collaborators"
    )

    response = browser_client.post(f"/experiments/{experiment.id}/collaborators/", {"collaborators": names})

    assert response.status_code == 400 and _shows_at_field(response, message), message
    assert [u.username for u in experiment.collaborators.all()] == ["carol"]


def test_a_collaborator_sees_the_members_but_no_form_and_is_refused_with_the_apis_message(people, experiment):
    carol = _browser(people["collaborator"])
    page = carol.get(f"/experiments/{experiment.id}/").content.decode()
    assert 'id="members"' in page and 'id="save-collaborators"' not in page and "Only the owner" in page
    message = _api_message(
        _api_for(people["collaborator"]).patch(
            f"/api/experiments/{experiment.id}/", {"collaborators": []}, format="json"
        ),
        "collaborators",
    )

    response = carol.post(f"/experiments/{experiment.id}/collaborators/", {"collaborators": ""})

    assert response.status_code == 403
    assert f'<p class="error" id="collaborators-error">{escape(message)}</p>' in response.content.decode()
    assert [u.username for u in experiment.collaborators.all()] == ["carol"]


def test_an_outsider_cannot_change_the_collaborators(people, experiment):
    response = _browser(people["outsider"]).post(
        f"/experiments/{experiment.id}/collaborators/", {"collaborators": "oscar"}
    )
    assert response.status_code == 404
    assert [u.username for u in experiment.collaborators.all()] == ["carol"]


# ------------------------------------------------------------------------------- downloads


def _body(response) -> str:
    assert response.status_code == 200, response.status_code
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def _csv(response) -> tuple[list[str], list[dict]]:
    reader = csv.DictReader(io.StringIO(_body(response)))
    return reader.fieldnames, list(reader)


def _num(text: str) -> float | None:
    return float(text) if text != "" else None


def test_run_rounds_csv_has_the_rounds_of_the_database(browser_client, experiment):
    run = _finished_run(experiment, "sharing")
    _finished_run(experiment, "temporal")  # not in this run's download

    response = browser_client.get(f"/runs/{run.id}/rounds.csv")

    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.id}-sharing-rounds.csv"'
    header, rows = _csv(response)
    assert header[:4] == ["run", "strategy", "round_index", "status"]
    assert {"round_time_s", "raw_throughput_sps", "fair_throughput", "fl_throughput_sps"} <= set(header)
    expected = list(Round.objects.filter(run=run).order_by("index"))
    assert len(rows) == len(expected) == 2
    for row, rnd in zip(rows, expected, strict=True):
        assert (int(row["run"]), row["strategy"], int(row["round_index"]), row["status"]) == (
            run.id,
            "sharing",
            rnd.index,
            rnd.status,
        )
        assert (
            _num(row["round_time_s"]) == rnd.round_time_s and _num(row["raw_throughput_sps"]) == rnd.raw_throughput_sps
        )
        assert (
            _num(row["fair_throughput"]) == rnd.fair_throughput and int(row["samples_trained"]) == rnd.samples_trained
        )
        assert row["started_at"] == rnd.started_at.isoformat() and row["predicted_round_time_s"] == ""
        assert row["flags"] == ";".join(rnd.flags)


def test_run_assignments_csv_has_one_row_per_assignment_of_the_database(browser_client, experiment):
    run = _finished_run(experiment, "sharing")
    Assignment.objects.filter(round__run=run, round__index=1).update(  # as a GPU agent under MPS reports
        torch_device="cuda", peak_memory_bytes=123_456_789, mps_active_thread_percentage=50.0, mps_verified=True
    )

    header, rows = _csv(browser_client.get(f"/runs/{run.id}/assignments.csv"))

    assert header == list(exports.ASSIGNMENT_COLUMNS)
    assert {"device", "task", "batch_size", "active_thread_percentage", "throughput_sps", "status"} <= set(header)
    expected = Assignment.objects.filter(round__run=run).select_related("round", "device", "task")
    by_key = {(a.round.index, a.device.name, a.task.name): a for a in expected}
    assert len(rows) == len(by_key) == 8
    for row in rows:
        a = by_key[(int(row["round_index"]), row["device"], row["task"])]
        assert (
            int(row["batch_size"]) == a.batch_size
            and int(row["active_thread_percentage"]) == a.active_thread_percentage
        )
        assert _num(row["throughput_sps"]) == a.throughput_sps and _num(row["train_loss"]) == a.train_loss
        assert row["status"] == a.status and row["simulated"] == "false" and row["predicted_throughput_sps"] == ""
        gpu = a.round.index == 1
        assert row["torch_device"] == a.torch_device and row["mps_verified"] == ("true" if gpu else "")
        assert row["peak_memory_bytes"] == ("123456789" if gpu else "")
    assert [(r["round_index"], r["device"], r["task"]) for r in rows] == sorted(
        (r["round_index"], r["device"], r["task"]) for r in rows
    )


def test_run_json_parses_and_carries_the_same_rows(browser_client, experiment):
    run = _finished_run(experiment, "sharing")

    response = browser_client.get(f"/runs/{run.id}/results.json")

    assert response["Content-Type"] == "application/json"
    body = json.loads(_body(response))
    assert body["experiment"]["name"] == "shared-exp" and body["experiment"]["collaborators"] == ["carol"]
    assert len(body["experiment"]["shards"]) == 4
    assert [r["run"] for r in body["runs"]] == [run.id] and body["runs"][0]["raw_throughput_sps"] == 80.0
    assert [r["round_index"] for r in body["rounds"]] == [0, 1] and body["rounds"][1]["flags"] == ["slow device"]
    assert len(body["assignments"]) == 8
    first = Assignment.objects.filter(round__run=run).order_by("round__index", "device__name", "task__name").first()
    assert body["assignments"][0] == {
        "run": run.id,
        "strategy": "sharing",
        "round_index": 0,
        "device": first.device.name,
        "task": first.task.name,
        "status": "succeeded",
        "batch_size": first.batch_size,
        "active_thread_percentage": 50,
        "samples": first.samples,
        "samples_trained": first.samples_trained,
        "throughput_sps": first.throughput_sps,
        "predicted_throughput_sps": None,
        "standalone_throughput_sps": None,
        "seconds": first.seconds,
        "train_loss": first.train_loss,
        "started_at": first.started_at.isoformat(),
        "finished_at": first.finished_at.isoformat(),
        "simulated": False,
        "torch_device": "",
        "peak_memory_bytes": None,
        "mps_active_thread_percentage": None,
        "mps_verified": None,
        "execution_mode": "",
        "execution_fallback": "",
        "error": "",
    }


def test_experiment_downloads_hold_every_run(browser_client, experiment):
    runs = [_finished_run(experiment, "temporal", throughput=20.0), _finished_run(experiment, "sharing")]

    _, rounds = _csv(browser_client.get(f"/experiments/{experiment.id}/rounds.csv"))
    _, assignments = _csv(browser_client.get(f"/experiments/{experiment.id}/assignments.csv"))
    body = json.loads(_body(browser_client.get(f"/experiments/{experiment.id}/results.json")))

    assert [(int(r["run"]), r["strategy"]) for r in rounds] == [(runs[0].id, "temporal")] * 2 + [
        (runs[1].id, "sharing")
    ] * 2
    assert len(assignments) == Assignment.objects.filter(round__run__experiment=experiment).count() == 16
    assert [r["strategy"] for r in body["runs"]] == ["temporal", "sharing"]
    assert body["runs"][1]["raw_speedup"] == pytest.approx(2.0)  # over the temporal run
    assert len(body["rounds"]) == 4 and len(body["assignments"]) == 16


def test_a_long_run_streams_in_chunks(browser_client, experiment, monkeypatch):
    run = _finished_run(experiment, "sharing", rounds=5)
    monkeypatch.setattr(exports, "CHUNK_ROWS", 3)

    response = browser_client.get(f"/runs/{run.id}/assignments.csv")
    chunks = list(response.streaming_content)

    assert len(chunks) >= 20 // 3
    assert b"".join(chunks).decode().count("\n") == 1 + 20
    body = json.loads(_body(browser_client.get(f"/runs/{run.id}/results.json")))
    assert len(body["assignments"]) == 20 and len(body["rounds"]) == 5


def test_the_pages_link_the_downloads(browser_client, experiment):
    run = _finished_run(experiment, "sharing")
    experiment_page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    run_page = browser_client.get(f"/runs/{run.id}/").content.decode()
    for table in ("rounds", "assignments"):
        assert f'href="/experiments/{experiment.id}/{table}.csv"' in experiment_page
        assert f'href="/runs/{run.id}/{table}.csv"' in run_page
    assert f'href="/experiments/{experiment.id}/results.json"' in experiment_page
    assert f'href="/runs/{run.id}/results.json"' in run_page


def _download_urls(experiment, run) -> list[str]:
    return [
        f"/runs/{run.id}/rounds.csv",
        f"/runs/{run.id}/assignments.csv",
        f"/runs/{run.id}/results.json",
        f"/experiments/{experiment.id}/rounds.csv",
        f"/experiments/{experiment.id}/assignments.csv",
        f"/experiments/{experiment.id}/results.json",
    ]


def test_members_download_and_an_outsider_gets_404(people, experiment):
    run = _finished_run(experiment, "sharing")
    for who, status in (("owner", 200), ("collaborator", 200), ("outsider", 404)):
        browser = _browser(people[who])
        for url in _download_urls(experiment, run):
            assert browser.get(url).status_code == status, (who, url)


def test_downloads_need_login_and_a_known_table(browser_client, experiment):
    run = _finished_run(experiment, "sharing")
    for url in _download_urls(experiment, run):
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
    assert browser_client.get(f"/runs/{run.id}/checkpoints.csv").status_code == 404
    assert browser_client.get(f"/experiments/{experiment.id}/secrets.csv").status_code == 404
