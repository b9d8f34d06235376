"""A run's own aggregator (issue 23, item 4): ``Run.options["aggregation"]`` and
``["aggregation_params"]`` let runs of several FL algorithms share one experiment's devices,
data, partition and seed. Checked at run creation exactly as the experiment's (400 naming
``options.aggregation`` / ``options.aggregation_params.<name>``), through the API, comparisons
and the run form; resolved for each task in one place (the experiment's override for the task,
else the run's, else the experiment's) that both the aggregation and the round requests use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from controlplane.experiments import services
from controlplane.experiments.models import Checkpoint, Experiment, Round, Run
from controlplane.experiments.services.planning import DEFAULT_OPTIONS, planner_options
from controlplane.experiments.services.rounds.aggregate import (
    task_aggregation_choice,
    task_aggregator,
    task_trainer_options,
)
from controlplane.experiments.services.rounds.requests import round_device_request_load
from tests.controlplane.test_aggregation_resume import (
    MOMENTUM,
    MOMENTUM_DEFAULTS,
    capture_dispatch,
    device_results,
    global_state,
    standalone_at_100_sps,
    trained,
)


@pytest.fixture
def experiment(make_experiment, two_tasks) -> Experiment:
    devices, tasks, counts = two_tasks
    return make_experiment(devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", rounds=2)


def _refused(response, field: str, *texts: str) -> str:
    """Assert a 400 naming ``field`` first, its message holding ``texts``; return the message."""
    assert response.status_code == 400, response.content
    payload = response.json()
    assert next(iter(payload["errors"])) == field, payload
    message = payload["errors"][field][0]
    for text in texts:
        assert text in message, message
    return message


# --- checked at run creation ---------------------------------------------------------------------


def test_a_run_stores_its_own_aggregator_checked_with_defaults_filled(api, experiment, momentum):
    response = api.post(
        f"/api/experiments/{experiment.id}/runs/",
        {"strategy": "sharing", "options": {"aggregation": MOMENTUM, "aggregation_params": {"mu": 0.1}}},
        format="json",
    )

    assert response.status_code == 201, response.content
    run = Run.objects.get(id=response.json()["id"])
    assert run.options == {"aggregation": MOMENTUM, "aggregation_params": {**MOMENTUM_DEFAULTS, "mu": 0.1}}
    assert response.json()["options"] == run.options


def test_a_run_without_an_aggregator_keeps_empty_options(api, experiment):
    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing"}, format="json")

    assert response.status_code == 201, response.content
    assert Run.objects.get(id=response.json()["id"]).options == {}


def test_aggregation_params_alone_are_the_experiments_aggregators(api, make_experiment, two_tasks, momentum):
    devices, tasks, counts = two_tasks
    experiment = make_experiment(
        devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", aggregation=MOMENTUM
    )

    response = api.post(
        f"/api/experiments/{experiment.id}/runs/",
        {"strategy": "sharing", "options": {"aggregation_params": {"server_momentum": 0.5}}},
        format="json",
    )

    assert response.status_code == 201, response.content
    assert Run.objects.get(id=response.json()["id"]).options == {
        "aggregation": MOMENTUM,
        "aggregation_params": {**MOMENTUM_DEFAULTS, "server_momentum": 0.5},
    }


@pytest.mark.parametrize(
    ("options", "field", "texts"),
    [
        ({"aggregation": "fedsgd"}, "options.aggregation", ["'fedsgd' is not allowed; allowed: ", "fedavg", MOMENTUM]),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"server_momentum": 1.5}},
            "options.aggregation_params.server_momentum",
            ["[0, 0.999]"],
        ),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"server_learning_rate": 0}},
            "options.aggregation_params.server_learning_rate",
            ["(0, 10]"],
        ),
        (
            {"aggregation": MOMENTUM, "aggregation_params": {"beta9": 1}},
            "options.aggregation_params.beta9",
            ["allowed: server_learning_rate, server_momentum, mu"],
        ),
        ({"aggregation_params": {"mu": 0.1}}, "options.aggregation_params.mu", ["fedavg takes no parameter"]),
        ({"aggregation": MOMENTUM, "aggregation_params": {"mu": "high"}}, "options.aggregation_params.mu", []),
        ({"aggregation": MOMENTUM, "aggregation_params": [1]}, "options.aggregation_params", []),
    ],
)
def test_a_bad_run_aggregator_is_refused_naming_the_field(api, experiment, momentum, options, field, texts):
    response = api.post(
        f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing", "options": options}, format="json"
    )

    _refused(response, field, *texts)
    assert not Run.objects.exists()


def test_planner_options_still_apply_to_the_planners_only(api, experiment):
    response = api.post(
        f"/api/experiments/{experiment.id}/runs/",
        {"strategy": "sharing", "options": {"aggregation": "fedavg", "objective": "fair"}},
        format="json",
    )

    message = _refused(response, "options", "options.objective", "apply to every strategy")
    assert "vres_greedy" in message


def test_a_planners_options_pass_over_the_runs_aggregator():
    stored = {"objective": "fair", "aggregation": "fedavg", "aggregation_params": {}}

    assert planner_options(stored) == {**DEFAULT_OPTIONS, "objective": "fair"}


def test_a_comparison_gives_every_run_its_aggregator(api, experiment, momentum, predictor):
    response = api.post(
        f"/api/experiments/{experiment.id}/compare/",
        {
            "strategies": ["temporal", "sharing", "vres_greedy"],
            "options": {"aggregation": MOMENTUM, "objective": "fair"},
        },
        format="json",
    )

    assert response.status_code == 201, response.content
    runs = {r.strategy: r for r in Run.objects.filter(comparison_id=response.json()["id"])}
    aggregation = {"aggregation": MOMENTUM, "aggregation_params": MOMENTUM_DEFAULTS}
    assert runs["temporal"].options == runs["sharing"].options == aggregation
    # a planner's run keeps its planner options beside the aggregator, and still plans from them
    assert runs["vres_greedy"].options == {**DEFAULT_OPTIONS, "objective": "fair", **aggregation}
    assert planner_options(runs["vres_greedy"].options)["objective"] == "fair"


def test_a_comparison_refuses_a_bad_aggregator_before_any_run(api, experiment, predictor):
    response = api.post(
        f"/api/experiments/{experiment.id}/compare/",
        {"strategies": ["temporal", "sharing"], "options": {"aggregation": "fedsgd"}},
        format="json",
    )

    _refused(response, "options.aggregation", "'fedsgd' is not allowed")
    assert not Run.objects.exists()


def test_the_run_form_launches_a_run_with_its_aggregator(browser_client, experiment, momentum):
    response = browser_client.post(
        f"/experiments/{experiment.id}/runs/",
        {"strategy": "sharing", "aggregation": MOMENTUM, "aggregation_params": "server_momentum=0.5"},
    )

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Run.objects.get().options == {
        "aggregation": MOMENTUM,
        "aggregation_params": {**MOMENTUM_DEFAULTS, "server_momentum": 0.5},
    }


def test_the_run_form_shows_a_bad_parameter_at_its_input(browser_client, experiment, momentum):
    response = browser_client.post(
        f"/experiments/{experiment.id}/runs/",
        {"strategy": "sharing", "aggregation": MOMENTUM, "aggregation_params": "server_momentum=2"},
    )

    html = response.content.decode()
    assert response.status_code == 400
    assert "options.aggregation_params.server_momentum" in html and "[0, 0.999]" in html
    assert not Run.objects.exists()


# --- one resolution for aggregation and requests --------------------------------------------------


def test_the_experiments_task_override_wins_then_the_run_then_the_experiment(make_experiment, two_tasks, momentum):
    devices, tasks, counts = two_tasks
    experiment = make_experiment(
        devices=devices,
        tasks=tasks,
        counts=counts,
        partition_rule="explicit",
        task_aggregation={"t-shufflenet": {"aggregation": "fedavg"}},
    )
    mobilenet, shufflenet = tasks
    overridden = {"aggregation": MOMENTUM, "aggregation_params": {**MOMENTUM_DEFAULTS, "mu": 0.1}}

    assert task_aggregation_choice(experiment, overridden, shufflenet.id) == ("fedavg", {})
    assert task_aggregation_choice(experiment, overridden, mobilenet.id) == (MOMENTUM, overridden["aggregation_params"])
    assert task_aggregation_choice(experiment, {"objective": "raw"}, mobilenet.id) == ("fedavg", {})
    assert task_aggregation_choice(experiment, None, mobilenet.id) == ("fedavg", {})

    run = Run(experiment=experiment, strategy="sharing", options=overridden)
    record, options = task_aggregator(run, mobilenet.id)
    assert (record.name, options) == (MOMENTUM, overridden["aggregation_params"])
    assert task_trainer_options(run, mobilenet.id) == {"aggregator": MOMENTUM, "client_options": {"mu": 0.1}}
    assert task_trainer_options(run, shufflenet.id) == {}


@pytest.mark.django_db
def test_a_runs_aggregator_reaches_its_trainers_and_its_checkpoints(make_experiment, two_tasks, momentum, monkeypatch):
    capture_dispatch(monkeypatch)
    devices, tasks, counts = two_tasks
    experiment = make_experiment(
        devices=devices,
        tasks=tasks,
        counts=counts,
        partition_rule="explicit",
        rounds=1,
        task_aggregation={"t-shufflenet": {"aggregation": "fedavg"}},
    )
    runs = {
        "fedavg": services.run_create(experiment=experiment, strategy="sharing"),
        MOMENTUM: services.run_create(
            experiment=experiment,
            strategy="sharing",
            options={"aggregation": MOMENTUM, "aggregation_params": {"mu": 0.1}},
        ),
    }

    for run in runs.values():
        services.run_begin(run_id=run.id)
        services.standalone_record(run_id=run.id, results=standalone_at_100_sps(run, devices))
        rnd = Round.objects.get(run=run, index=0)
        updates = {
            (device, task): trained(global_state(run, task, None), seed=k)
            for k, (device, task) in enumerate(
                [("dev-a", "t-mobilenet"), ("dev-b", "t-mobilenet"), ("dev-b", "t-shufflenet")]
            )
        }
        services.round_record(round_id=rnd.id, results=device_results(rnd, updates))

    # each device's part of round 0, as the round sent it (rebuilt from the database as a retry is)
    mu = {
        (name, spec.task.name): (spec.aggregator, spec.client_options)
        for name, run in runs.items()
        for d in devices
        for spec in round_device_request_load(
            rnd=Round.objects.get(run=run, index=0), device_id=d.id, attempt=0
        ).assignments
    }
    # the run's aggregator asks its trainers for mu; the task the experiment overrides does not
    assert mu == {
        ("fedavg", "t-mobilenet"): (None, {}),
        ("fedavg", "t-shufflenet"): (None, {}),
        (MOMENTUM, "t-mobilenet"): (MOMENTUM, {"mu": 0.1}),
        (MOMENTUM, "t-shufflenet"): (None, {}),
    }
    made = {
        (name, c.task.name): (c.aggregation, bool(c.server_state_path))
        for name, run in runs.items()
        for c in Checkpoint.objects.filter(run=run, round__isnull=False).select_related("task")
    }
    assert made == {
        ("fedavg", "t-mobilenet"): ("fedavg", False),
        ("fedavg", "t-shufflenet"): ("fedavg", False),
        (MOMENTUM, "t-mobilenet"): (MOMENTUM, True),
        (MOMENTUM, "t-shufflenet"): ("fedavg", False),
    }
    assert {Run.objects.get(id=r.id).status for r in runs.values()} == {Run.Status.SUCCEEDED}


def test_mtfl_compare_refuses_a_malformed_aggregation_param_in_one_line(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL"}
    }
    out = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "compare", "light mix", "--aggregation-param", "mu"],
        capture_output=True,
        text=True,
        env={**env, "MTFL_HOME": str(tmp_path)},
        timeout=120,
    )

    assert out.returncode == 2
    assert "--aggregation-param must be NAME=VALUE (e.g. server_learning_rate=0.01), got 'mu'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
