"""An experiment's FL algorithm settings (issue 23): the aggregator with its parameters, per-task
overrides and partial participation, through every surface that sets them — the API (create,
update, from a template, GET), ``mtfl create-experiment``, the dashboard's experiment form and
page — and the exports. Every refusal is a 400 (a one-line usage error on the command line)
naming the field and what is allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils.html import escape

from controlplane.experiments.models import Experiment, Run
from tests.controlplane.test_aggregation_resume import MOMENTUM, MOMENTUM_DEFAULTS
from workers.registry.aggregators import AGGREGATOR_REGISTRY

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalogue(make_device, make_task):
    return (
        [make_device("dev-a"), make_device("dev-b")],
        [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")],
    )


def _body(catalogue, **change) -> dict:
    devices, tasks = catalogue
    body = {
        "name": "fl",
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": 2,
        "partition_rule": "iid",
        **change,
    }
    return {k: v for k, v in body.items() if v is not None}


def _refused(response, field: str, *texts: str) -> str:
    """Assert a 400 naming ``field`` first, its message holding ``texts``; return the message."""
    assert response.status_code == 400, response.content
    payload = response.json()
    assert next(iter(payload["errors"])) == field, payload
    message = payload["errors"][field][0]
    assert payload["message"].startswith(field), payload
    for text in texts:
        assert text in message, message
    return message


# --- the API -----------------------------------------------------------------------------------


def test_an_experiment_without_fl_settings_uses_fedavg_on_every_device(api, catalogue):
    response = api.post("/api/experiments/", _body(catalogue), format="json")

    assert response.status_code == 201, response.content
    got = api.get(f"/api/experiments/{response.json()['id']}/").json()
    assert {k: got[k] for k in ("aggregation", "aggregation_params", "task_aggregation")} == {
        "aggregation": "fedavg",
        "aggregation_params": {},
        "task_aggregation": {},
    }
    assert (got["clients_per_round"], got["client_fraction"], got["client_sampling"]) == (None, None, "uniform")


def test_aggregation_params_are_stored_checked_with_defaults_filled(api, catalogue, momentum):
    response = api.post(
        "/api/experiments/",
        _body(catalogue, aggregation=MOMENTUM, aggregation_params={"server_learning_rate": 0.5}),
        format="json",
    )

    assert response.status_code == 201, response.content
    assert response.json()["aggregation"] == MOMENTUM
    assert response.json()["aggregation_params"] == {**MOMENTUM_DEFAULTS, "server_learning_rate": 0.5}
    assert Experiment.objects.get().aggregation_params == {**MOMENTUM_DEFAULTS, "server_learning_rate": 0.5}


def test_task_overrides_by_name_or_id_are_stored_by_task_id_and_checked(api, catalogue, momentum):
    _, tasks = catalogue
    overrides = {
        "t-mobilenet": {"aggregation": MOMENTUM, "aggregation_params": {"mu": 0.1}},
        str(tasks[1].id): {"aggregation": "fedavg"},
    }

    response = api.post("/api/experiments/", _body(catalogue, task_aggregation=overrides), format="json")

    assert response.status_code == 201, response.content
    assert response.json()["task_aggregation"] == {
        str(tasks[0].id): {"aggregation": MOMENTUM, "aggregation_params": {**MOMENTUM_DEFAULTS, "mu": 0.1}},
        str(tasks[1].id): {"aggregation": "fedavg", "aggregation_params": {}},
    }


def test_an_override_without_an_aggregator_takes_the_experiments(api, catalogue, momentum):
    _, tasks = catalogue
    body = _body(
        catalogue,
        aggregation=MOMENTUM,
        task_aggregation={"t-shufflenet": {"aggregation_params": {"server_momentum": 0.5}}},
    )

    response = api.post("/api/experiments/", body, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["task_aggregation"] == {
        str(tasks[1].id): {"aggregation": MOMENTUM, "aggregation_params": {**MOMENTUM_DEFAULTS, "server_momentum": 0.5}}
    }


def test_partial_participation_is_stored(api, catalogue):
    response = api.post(
        "/api/experiments/", _body(catalogue, clients_per_round=1, client_sampling="weighted"), format="json"
    )

    assert response.status_code == 201, response.content
    assert (response.json()["clients_per_round"], response.json()["client_sampling"]) == (1, "weighted")
    fraction = api.post("/api/experiments/", _body(catalogue, name="half", client_fraction=0.5), format="json")
    assert fraction.status_code == 201 and fraction.json()["client_fraction"] == 0.5


@pytest.mark.parametrize(
    "change,field,texts",
    [
        ({"aggregation": "fedsgd"}, "aggregation", ["'fedsgd' is not allowed; allowed: ", "fedavg", MOMENTUM]),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"server_momentum": 1.5}},
            "aggregation_params.server_momentum",
            ["a number in [0, 0.999]", "1.5"],
        ),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"server_learning_rate": 0}},
            "aggregation_params.server_learning_rate",
            ["a number in (0, 10]"],
        ),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"beta9": 1}},
            "aggregation_params.beta9",
            ["takes no parameter of that name; allowed: server_learning_rate, server_momentum, mu"],
        ),
        ({"aggregation_params": {"mu": 0.1}}, "aggregation_params.mu", ["fedavg takes no parameter", "allowed: none"]),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"mu": "high"}},
            "aggregation_params.mu",
            ["must be a number in [0, 1000]", "'high'"],
        ),
        ({"aggregation_params": {"mu": [1]}}, "aggregation_params.mu", ["must be a finite number, true or false"]),
        (
            {"task_aggregation": {"t-resnet": {"aggregation": "fedavg"}}},
            "task_aggregation",
            ["'t-resnet' is not a task of this experiment; its tasks: t-mobilenet (id "],
        ),
        (
            {"task_aggregation": {"t-mobilenet": {"aggregation": "fedsgd"}}},
            "task_aggregation.t-mobilenet.aggregation",
            ["'fedsgd' is not allowed; allowed: "],
        ),
        (
            {"task_aggregation": {"t-mobilenet": {"aggregation": MOMENTUM, "aggregation_params": {"mu": -1}}}},
            "task_aggregation.t-mobilenet.aggregation_params.mu",
            ["must be a number in [0, 1000]"],
        ),
        (
            {"task_aggregation": {"t-mobilenet": {"aggregation": "fedavg", "mu": 1}}},
            "task_aggregation.t-mobilenet.mu",
            ["unknown field"],
        ),
        ({"clients_per_round": 0}, "clients_per_round", ["allowed 1 to"]),
        ({"clients_per_round": 3}, "clients_per_round", ["clients_per_round=3 is out of range: allowed 1 to 2"]),
        ({"client_fraction": 0}, "client_fraction", ["allowed (0, 1]"]),
        ({"client_fraction": 1.5}, "client_fraction", ["allowed (0, 1]"]),
        (
            {"clients_per_round": 1, "client_fraction": 0.5},
            "clients_per_round",
            ["clients_per_round and client_fraction are exclusive"],
        ),
        ({"client_sampling": "random"}, "client_sampling", ["'random' is not allowed; allowed: uniform, weighted"]),
    ],
)
def test_bad_fl_settings_are_400_naming_the_field(api, catalogue, momentum, change, field, texts):
    response = api.post("/api/experiments/", _body(catalogue, **change), format="json")

    _refused(response, field, *texts)
    assert not Experiment.objects.exists()


def test_an_override_naming_a_task_twice_is_refused(api, catalogue):
    _, tasks = catalogue
    overrides = {"t-mobilenet": {"aggregation": "fedavg"}, str(tasks[0].id): {"aggregation": "fedavg"}}

    response = api.post("/api/experiments/", _body(catalogue, task_aggregation=overrides), format="json")

    _refused(response, "task_aggregation", "'t-mobilenet'", "given twice")


def test_fl_settings_change_until_the_experiment_has_runs(api, catalogue, momentum):
    experiment_id = api.post("/api/experiments/", _body(catalogue, client_fraction=0.5), format="json").json()["id"]
    url = f"/api/experiments/{experiment_id}/"

    # a new aggregator without parameters takes its defaults
    changed = api.patch(url, {"aggregation": MOMENTUM}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["aggregation_params"] == MOMENTUM_DEFAULTS
    # the other count while one is set: refused naming both, accepted when the other is cleared
    _refused(api.patch(url, {"clients_per_round": 2}, format="json"), "clients_per_round", "client_fraction")
    swapped = api.patch(url, {"clients_per_round": 2, "client_fraction": None}, format="json")
    assert (swapped.json()["clients_per_round"], swapped.json()["client_fraction"]) == (2, None)
    _refused(
        api.patch(url, {"aggregation_params": {"server_momentum": 2}}, format="json"),
        "aggregation_params.server_momentum",
        "[0, 0.999]",
    )

    Run.objects.create(experiment_id=experiment_id, strategy="sharing")
    frozen = api.patch(url, {"aggregation": "fedavg"}, format="json")
    assert frozen.status_code == 409 and "aggregation cannot change" in frozen.json()["message"]
    unchanged = api.patch(url, {"aggregation": MOMENTUM, "client_sampling": "uniform"}, format="json")
    assert unchanged.status_code == 200, unchanged.content  # the same values are not a change
    assert Experiment.objects.get(id=experiment_id).aggregation == MOMENTUM


def test_the_openapi_schema_documents_the_fl_settings(api):
    schemas = api.get("/api/schema/?format=json").json()["components"]["schemas"]
    create = schemas["ExperimentCreateRequest"]["properties"]

    def enum(field: str) -> list[str]:
        return schemas[create[field]["allOf"][0]["$ref"].rsplit("/", 1)[1]]["enum"]

    assert set(AGGREGATOR_REGISTRY.names()) <= set(enum("aggregation"))
    assert enum("client_sampling") == ["uniform", "weighted"]
    for field in ("aggregation", "aggregation_params", "task_aggregation", "clients_per_round", "client_fraction"):
        assert create[field]["description"], field
    assert create["task_aggregation"]["additionalProperties"]["$ref"].endswith("/TaskAggregationRequest")
    assert "aggregation" in schemas["ExperimentUpdateRequest"]["properties"]
    assert "aggregation" in schemas["ExperimentFromTemplateRequest"]["properties"]
    assert {"aggregation", "task_aggregation", "client_fraction"} <= set(schemas["Experiment"]["properties"])


# --- templates and the CLI -----------------------------------------------------------------------


def test_a_template_takes_overrides_by_architecture(api, make_device, momentum):
    device = make_device("dev-a")

    response = api.post(
        "/api/experiments/from-template/",
        {
            "template": "light",
            "devices": [device.id],
            "aggregation": MOMENTUM,
            "task_aggregation": {"resnet18": {"aggregation": "fedavg"}},
            "clients_per_round": 1,
        },
        format="json",
    )

    assert response.status_code == 201, response.content
    experiment = Experiment.objects.get()
    resnet = experiment.tasks.get(architecture="resnet18")
    assert experiment.aggregation == MOMENTUM and experiment.aggregation_params == MOMENTUM_DEFAULTS
    assert experiment.task_aggregation == {str(resnet.id): {"aggregation": "fedavg", "aggregation_params": {}}}
    assert experiment.clients_per_round == 1


def test_the_cli_sets_every_fl_setting(make_device, momentum, capsys):
    make_device("dev-a")
    make_device("dev-b")

    call_command(
        "create_experiment",
        "--template",
        "light",
        "--devices",
        "dev-a,dev-b",
        "--aggregation",
        MOMENTUM,
        "--aggregation-param",
        "server_learning_rate=0.5",
        "--aggregation-param",
        "server_momentum=0",
        "--task-aggregation",
        "resnet18=fedavg",
        "--task-aggregation",
        f"shufflenet_v2_x1_0={MOMENTUM}:mu=0.01,server_momentum=0.5",
        "--client-fraction",
        "0.5",
        "--client-sampling",
        "weighted",
    )

    experiment = Experiment.objects.get()
    resnet = experiment.tasks.get(architecture="resnet18")
    shufflenet = experiment.tasks.get(architecture="shufflenet_v2_x1_0")
    assert experiment.aggregation_params == {**MOMENTUM_DEFAULTS, "server_learning_rate": 0.5, "server_momentum": 0}
    assert experiment.task_aggregation == {
        str(resnet.id): {"aggregation": "fedavg", "aggregation_params": {}},
        str(shufflenet.id): {
            "aggregation": MOMENTUM,
            "aggregation_params": {**MOMENTUM_DEFAULTS, "mu": 0.01, "server_momentum": 0.5},
        },
    }
    assert (experiment.clients_per_round, experiment.client_fraction, experiment.client_sampling) == (
        None,
        0.5,
        "weighted",
    )
    out = capsys.readouterr().out
    assert f"aggregation: {MOMENTUM} (mu=0, server_learning_rate=0.5, server_momentum=0)" in out
    assert "0.5 of the devices per round, drawn weighted" in out


@pytest.mark.parametrize(
    "options,message",
    [
        (["--aggregation", "fedsgd"], "aggregation: 'fedsgd' is not allowed; allowed: fedavg"),
        (["--aggregation-param", "mu"], "--aggregation-param must be NAME=VALUE (e.g. server_learning_rate=0.01)"),
        (["--aggregation-param", "mu=1"], "aggregation_params.mu: fedavg takes no parameter of that name"),
        (
            ["--aggregation", MOMENTUM, "--aggregation-param", "server_momentum=high"],
            "aggregation_params.server_momentum must be a number in [0, 0.999], got 'high'",
        ),
        (["--task-aggregation", "resnet18"], "--task-aggregation must be TASK=AGGREGATOR[:NAME=VALUE,...]"),
        (
            ["--task-aggregation", "resnet18=fedavg", "--task-aggregation", "resnet18=fedavg"],
            "--task-aggregation gives task 'resnet18' more than once",
        ),
        (["--task-aggregation", "vgg16=fedavg"], "task_aggregation: 'vgg16' is not a task of this experiment"),
        (
            ["--clients-per-round", "1", "--client-fraction", "0.5"],
            "--clients-per-round and --client-fraction are exclusive",
        ),
        (["--clients-per-round", "3"], "clients_per_round=3 is out of range: allowed 1 to 1"),
        (["--clients-per-round", "some"], "--clients-per-round must be an integer, got 'some'"),
        (["--client-fraction", "2"], "client_fraction=2.0 is out of range: allowed (0, 1]"),
        (["--client-sampling", "random"], "--client-sampling: 'random' is not allowed; allowed: uniform, weighted"),
    ],
)
def test_cli_bad_fl_settings_are_usage_errors(options, message, make_device, momentum):
    make_device("dev-a")

    with pytest.raises(CommandError) as error:
        call_command("create_experiment", "--template", "light", "--devices", "dev-a", *options)

    assert message in str(error.value) and error.value.returncode == 2, str(error.value)
    assert "\n" not in str(error.value)
    assert not Experiment.objects.exists()


def test_cli_bad_fl_setting_is_one_line_with_exit_status_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"}}
    env["MTFL_HOME"] = str(tmp_path)
    args = ["--template", "light", "--devices", "a", "--aggregation-param", "eta"]

    out = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "create-experiment", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )

    assert out.returncode == 2, out.stderr
    assert "--aggregation-param must be NAME=VALUE" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# --- the dashboard -------------------------------------------------------------------------------


def _form(catalogue, **change) -> dict:
    devices, tasks = catalogue
    return {
        "name": "mine",
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": "2",
        "partition_rule": "iid",
        **change,
    }


def test_the_experiment_form_has_the_aggregators_and_their_parameters(browser_client, catalogue, momentum):
    html = browser_client.get("/experiments/new/").content.decode()

    for aggregator in AGGREGATOR_REGISTRY.records():
        assert f'<option value="{aggregator.name}"' in html
        for parameter in aggregator.parameters:
            start = html.index(f'name="aggregation-{aggregator.name}-{parameter.name}"')
            opened = max(html.rindex("<input", 0, start), html.rindex("<select", 0, start))  # a switch: a select
            tag = html[opened : html.index(">", start)]
            assert f'data-aggregation="{aggregator.name}"' in tag
            assert f"{aggregator.name} only: " in html[start:]
    for field in ("clients_per_round", "client_fraction", "client_sampling"):
        assert f'name="{field}"' in html


def test_the_experiment_form_sends_the_chosen_aggregators_parameters_only(browser_client, catalogue, momentum):
    form = _form(
        catalogue,
        aggregation=MOMENTUM,
        **{f"aggregation-{MOMENTUM}-server_momentum": "0.5", f"aggregation-{MOMENTUM}-mu": ""},
        clients_per_round="1",
        client_sampling="weighted",
    )

    response = browser_client.post("/experiments/new/", form)

    assert response.status_code == 302, response.content.decode()[:3000]
    experiment = Experiment.objects.get()
    assert experiment.aggregation == MOMENTUM
    assert experiment.aggregation_params == {**MOMENTUM_DEFAULTS, "server_momentum": 0.5}
    assert (experiment.clients_per_round, experiment.client_sampling) == (1, "weighted")


def test_the_experiment_form_shows_a_parameters_error_at_its_input(browser_client, catalogue, momentum):
    field = f"aggregation-{MOMENTUM}-server_momentum"

    response = browser_client.post("/experiments/new/", _form(catalogue, aggregation=MOMENTUM, **{field: "3"}))

    assert response.status_code == 400
    html = response.content.decode()
    start = html.index(f'id="field-{field}"')
    label = html[start : html.index("</label>", start)]
    assert escape("must be a number in [0, 0.999], got 3") in label
    assert not Experiment.objects.exists()


def test_the_experiment_form_shows_a_participation_error_at_its_input(browser_client, catalogue):
    response = browser_client.post("/experiments/new/", _form(catalogue, client_fraction="1.5"))

    assert response.status_code == 400
    html = response.content.decode()
    start = html.index('id="field-client_fraction"')
    assert "allowed (0, 1]" in html[start : html.index("</label>", start)]


def test_the_experiment_page_shows_the_aggregator_overrides_and_participation(
    browser_client, make_experiment, momentum
):
    experiment = make_experiment(
        aggregation=MOMENTUM,
        aggregation_params={"server_momentum": 0.5},
        task_aggregation={"t-shufflenet": {"aggregation": "fedavg"}},
        clients_per_round=1,
    )

    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    assert f'<strong id="aggregation">{MOMENTUM}</strong>' in html
    assert '<span class="aggregation-param">server_momentum = 0.5</span>' in html
    assert '<span class="task-aggregation">t-shufflenet: <strong>fedavg</strong></span>' in html
    assert '<span id="participation">1 device per round, drawn uniform</span>' in html


def test_the_experiment_page_says_every_device_trains_by_default(browser_client, make_experiment):
    experiment = make_experiment()

    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    assert '<strong id="aggregation">fedavg</strong>' in html
    assert '<span id="participation">every device, every round</span>' in html


# --- exports -------------------------------------------------------------------------------------


def test_the_json_export_holds_the_fl_settings_with_task_names(browser_client, make_experiment, momentum):
    experiment = make_experiment(
        aggregation=MOMENTUM,
        task_aggregation={"t-mobilenet": {"aggregation": "fedavg"}},
        client_fraction=0.5,
        client_sampling="weighted",
    )

    body = b"".join(browser_client.get(f"/experiments/{experiment.id}/results.json").streaming_content)
    summary = json.loads(body)["experiment"]

    assert summary["aggregation"] == MOMENTUM and summary["aggregation_params"] == MOMENTUM_DEFAULTS
    assert summary["task_aggregation"] == {"t-mobilenet": {"aggregation": "fedavg", "aggregation_params": {}}}
    assert (summary["clients_per_round"], summary["client_fraction"], summary["client_sampling"]) == (
        None,
        0.5,
        "weighted",
    )
