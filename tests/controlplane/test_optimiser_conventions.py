"""The adaptive server optimisers' conventions (issue 33 item 6: ``bias_correction`` and
``initial_v``, workers/fl/server_opt.py) through every surface that sets an aggregator's
parameters: the API (an experiment's and a run's), ``mtfl create-experiment`` and the dashboard's
experiment form. A bad value is a 400 naming the field and the allowed values; the defaults are
Reddi et al. 2021's, so an experiment that names neither stores what it stored before."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils.html import escape

from controlplane.experiments.models import Experiment, Run
from tests.controlplane.test_fl_settings import _body, _form, _refused

pytestmark = pytest.mark.django_db

REDDI = {"server_learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 0.001}
"""FedAdam's numeric defaults (workers/registry/aggregators.py)."""


@pytest.fixture
def catalogue(make_device, make_task):
    return (
        [make_device("dev-a"), make_device("dev-b")],
        [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")],
    )


def test_the_api_stores_flowers_conventions(api, catalogue):
    params = {"bias_correction": True, "initial_v": "zero"}

    response = api.post(
        "/api/experiments/", _body(catalogue, aggregation="fedadam", aggregation_params=params), format="json"
    )

    assert response.status_code == 201, response.content
    assert Experiment.objects.get().aggregation_params == {**REDDI, **params}


def test_an_experiment_that_names_no_convention_stores_reddi_et_al(api, catalogue):
    response = api.post("/api/experiments/", _body(catalogue, aggregation="fedyogi"), format="json")

    assert response.status_code == 201, response.content
    assert response.json()["aggregation_params"] == {**REDDI, "bias_correction": False, "initial_v": "tau_squared"}


@pytest.mark.parametrize(
    "aggregation,params,field,texts",
    [
        (
            "fedadam",
            {"bias_correction": "perhaps"},
            "aggregation_params.bias_correction",
            ["true or false", "'perhaps'"],
        ),
        ("fedyogi", {"bias_correction": 1}, "aggregation_params.bias_correction", ["true or false"]),
        ("fedadam", {"initial_v": "one"}, "aggregation_params.initial_v", ["one of tau_squared, zero", "'one'"]),
        (
            "fedadagrad",
            {"bias_correction": True},
            "aggregation_params.bias_correction",
            ["fedadagrad takes no parameter of that name; allowed: server_learning_rate, beta1, tau, initial_v"],
        ),
        ("fedadam", {"initial_v": "z" * 65}, "aggregation_params.initial_v", ["a name of at most 64 characters"]),
    ],
)
def test_a_bad_convention_is_400_naming_the_field(api, catalogue, aggregation, params, field, texts):
    body = _body(catalogue, aggregation=aggregation, aggregation_params=params)

    _refused(api.post("/api/experiments/", body, format="json"), field, *texts)
    assert not Experiment.objects.exists()


def test_a_run_may_take_flowers_conventions(api, catalogue):
    experiment_id = api.post("/api/experiments/", _body(catalogue), format="json").json()["id"]
    options = {"aggregation": "fedadam", "aggregation_params": {"bias_correction": True, "initial_v": "zero"}}

    response = api.post(
        f"/api/experiments/{experiment_id}/runs/", {"strategy": "sharing", "options": options}, format="json"
    )

    assert response.status_code == 201, response.content
    assert Run.objects.get().options["aggregation_params"] == {**REDDI, "bias_correction": True, "initial_v": "zero"}
    bad = {"aggregation": "fedadam", "aggregation_params": {"initial_v": "ones"}}
    refused = api.post(
        f"/api/experiments/{experiment_id}/runs/", {"strategy": "sharing", "options": bad}, format="json"
    )
    assert refused.status_code == 400 and "options.aggregation_params.initial_v" in refused.json()["message"]


def test_the_cli_takes_the_conventions_as_words(make_device, capsys):
    make_device("dev-a")
    words = ["--aggregation-param", "bias_correction=true", "--aggregation-param", "initial_v=zero"]

    call_command("create_experiment", "--template", "light", "--devices", "dev-a", "--aggregation", "fedadam", *words)

    assert Experiment.objects.get().aggregation_params == {**REDDI, "bias_correction": True, "initial_v": "zero"}
    assert (
        "aggregation: fedadam (beta1=0.9, beta2=0.99, bias_correction=true, initial_v=zero," in capsys.readouterr().out
    )
    with pytest.raises(
        CommandError, match=r"aggregation_params\.initial_v must be one of tau_squared, zero, got 'ones'"
    ):
        call_command(
            "create_experiment", "--template", "light", "--devices", "dev-a", "--name", "other",
            "--aggregation", "fedadam", "--aggregation-param", "initial_v=ones",
        )  # fmt: skip


def test_the_experiment_form_offers_the_conventions_as_selects(browser_client, catalogue):
    html = browser_client.get("/experiments/new/").content.decode()

    for field, options in (("bias_correction", ("true", "false")), ("initial_v", ("tau_squared", "zero"))):
        start = html.index(f'name="aggregation-fedadam-{field}"')
        select = html[html.rindex("<select", 0, start) : html.index("</select>", start)]
        assert 'data-aggregation="fedadam"' in select
        assert all(f'<option value="{option}"' in select for option in options)
    assert 'name="aggregation-fedadagrad-bias_correction"' not in html


def test_the_experiment_form_sends_the_conventions(browser_client, catalogue):
    chosen = {"aggregation-fedadam-bias_correction": "true", "aggregation-fedadam-initial_v": "zero"}

    response = browser_client.post("/experiments/new/", _form(catalogue, aggregation="fedadam", **chosen))

    assert response.status_code == 302, response.content.decode()[:3000]
    assert Experiment.objects.get().aggregation_params == {**REDDI, "bias_correction": True, "initial_v": "zero"}


def test_the_experiment_form_shows_a_bad_convention_at_its_input(browser_client, catalogue):
    field = "aggregation-fedyogi-initial_v"

    response = browser_client.post("/experiments/new/", _form(catalogue, aggregation="fedyogi", **{field: "ones"}))

    assert response.status_code == 400
    html = response.content.decode()
    start = html.index(f'id="field-{field}"')
    assert escape("must be one of tau_squared, zero, got 'ones'") in html[start : html.index("</label>", start)]
