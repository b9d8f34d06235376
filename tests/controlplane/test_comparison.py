"""Planned runs and comparisons through the services and the API (the Celery messages are read
off the in-memory broker, not executed)."""

from __future__ import annotations

import re
import shlex

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.core.management.commands import profile
from controlplane.experiments import services
from controlplane.experiments.models import Checkpoint, Comparison, Round, Run
from tests.controlplane.test_api import _queued_control_messages
from tests.controlplane.test_replan_services import _start
from workers.protocol.queues import TaskName


def test_a_planned_run_without_a_predictor_is_refused_with_the_way_out(api, make_experiment):
    experiment = make_experiment()
    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "vres_sync"}, format="json")
    assert response.status_code == 400
    message = response.json()["errors"]["strategy"][0]
    assert "no fitted throughput predictor for device dev-a" in message and "mtfl profile" in message
    assert not Run.objects.exists()


def test_the_way_out_names_commands_that_run(api, make_experiment, monkeypatch):
    """Each command the hint quotes is accepted: ``mtfl profile`` gets through its argument
    checks and the device look-up to where it needs the running stack; ``mtfl fit-predictor``
    to where it finds no samples yet."""
    experiment = make_experiment()
    message = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "vres_sync"}, format="json").json()[
        "errors"
    ]["strategy"][0]
    commands = [shlex.split(c) for c in re.findall(r"`(mtfl [^`]+)`", message)]
    assert [c[1] for c in commands] == ["profile", "fit-predictor"]

    def stop_before_the_broker() -> str:
        raise RuntimeError("reached the broker")

    monkeypatch.setattr(profile, "use_running_broker", stop_before_the_broker)
    with pytest.raises(CommandError, match="reached the broker"):
        call_command(commands[0][1], *commands[0][2:])
    with pytest.raises(CommandError, match="no profile samples for backend 'cpu'"):
        call_command(commands[1][1].replace("-", "_"), *commands[1][2:])


def test_a_planned_run_stores_its_plan_and_rounds_carry_the_predictions(
    api, make_experiment, predictor, django_capture_on_commit_callbacks
):
    experiment = make_experiment()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            f"/api/experiments/{experiment.id}/runs/",
            {"strategy": "vres_greedy", "options": {"objective": "fair"}},
            format="json",
        )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["options"] == {"objective": "fair", "slack": "smaller_batches", "replan": "every_round"}
    planned = body["planned"]
    assert planned["strategy"] == "vres_greedy" and len(planned["assignments"]) == 4
    assert planned["predicted_round_time_s"] > 0
    assert all(a["batch_size"] <= a["samples"] and a["predicted_throughput_sps"] > 0 for a in planned["assignments"])
    run = Run.objects.get(id=body["id"])
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
    for task in experiment.tasks.all():  # what run_begin writes: the initial global models
        Checkpoint.objects.create(run=run, task=task, round=None, artifact_path=f"init-{task.id}", sha256="0" * 64)
    with django_capture_on_commit_callbacks(execute=True):
        rnd = _start(run, 0)  # leased, P_alone recorded, dispatched
    assert rnd.predicted_round_time_s == pytest.approx(planned["predicted_round_time_s"])
    by_pair = {(a["device_id"], a["task_id"]): a for a in planned["assignments"]}
    for a in rnd.assignments.all():
        expected = by_pair[(a.device_id, a.task_id)]
        assert (a.batch_size, a.active_thread_percentage) == (
            expected["batch_size"],
            expected["active_thread_percentage"],
        )
        assert a.predicted_throughput_sps == pytest.approx(expected["predicted_throughput_sps"])
    listed = api.get(f"/api/assignments/?run={run.id}").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert all(row["predicted_throughput_sps"] > 0 for row in rows)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"strategy": "vres_sync", "options": {"objective": "fastest"}}, "options.objective"),
        ({"strategy": "vres_sync", "options": {"slack": "more"}}, "options.slack"),
        ({"strategy": "vres_sync", "options": {"speed": "max"}}, "options.speed"),
        ({"strategy": "isolation", "options": {"objective": "raw"}}, "options"),
    ],
)
def test_planner_options_are_checked(api, make_experiment, predictor, body, field):
    experiment = make_experiment()
    response = api.post(f"/api/experiments/{experiment.id}/runs/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"]


def test_compare_runs_the_five_strategies_one_after_another(
    api, make_experiment, predictor, django_capture_on_commit_callbacks
):
    experiment = make_experiment()
    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/experiments/{experiment.id}/compare/", {}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["strategies"] == ["temporal", "isolation", "sharing", "vres_greedy", "vres_sync"]
    assert [r["strategy"] for r in body["runs"]] == body["strategies"]
    runs = list(Run.objects.filter(comparison_id=body["id"]).order_by("id"))
    assert _queued_control_messages() == [(TaskName.RUN_BEGIN, [runs[0].id])]
    assert all(r.planned for r in runs[3:]) and not any(r.planned for r in runs[:3])

    # The first run ends: the second starts; a failed run does not stop the comparison.
    Run.objects.filter(id=runs[0].id).update(status=Run.Status.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_finish(run_id=runs[0].id)
    assert _queued_control_messages() == [(TaskName.RUN_BEGIN, [runs[1].id])]
    Run.objects.filter(id=runs[1].id).update(status=Run.Status.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_fail(run_id=runs[1].id, error="device lost")
    assert _queued_control_messages() == [(TaskName.RUN_BEGIN, [runs[2].id])]

    # Cancelling the comparison cancels the run in flight and the ones not started.
    Run.objects.filter(id=runs[2].id).update(status=Run.Status.RUNNING)
    cancelled = api.post(f"/api/comparisons/{body['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert [r.status for r in Run.objects.filter(comparison_id=body["id"]).order_by("id")] == [
        "succeeded",
        "failed",
        "cancelled",
        "cancelled",
        "cancelled",
    ]
    assert _queued_control_messages() == []
    again = api.post(f"/api/comparisons/{body['id']}/cancel/")
    assert again.status_code == 409


@pytest.mark.parametrize(
    "strategies, reason",
    [
        ([], "non-empty list"),
        ("temporal", "list"),
        (["temporal", "bogus"], "'bogus' is not allowed"),
        (["temporal", "sharing", "sharing"], "repeat"),
        (["sharing", "vres_sync"], "baseline 'temporal'"),
    ],
)
def test_a_comparison_of_chosen_strategies_is_checked(api, make_experiment, strategies, reason):
    experiment = make_experiment()
    response = api.post(f"/api/experiments/{experiment.id}/compare/", {"strategies": strategies}, format="json")
    assert response.status_code == 400, response.json()
    assert reason in " ".join(response.json()["errors"]["strategies"])
    assert not Comparison.objects.exists() and not Run.objects.exists()


def test_a_comparison_runs_the_chosen_strategies_in_their_order(
    api, make_experiment, predictor, django_capture_on_commit_callbacks
):
    experiment = make_experiment()
    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            f"/api/experiments/{experiment.id}/compare/", {"strategies": ["temporal", "vres_sync"]}, format="json"
        )
    assert response.status_code == 201, response.json()
    assert response.json()["strategies"] == ["temporal", "vres_sync"]
    runs = list(Run.objects.filter(comparison_id=response.json()["id"]).order_by("id"))
    assert [r.strategy for r in runs] == ["temporal", "vres_sync"] and runs[1].planned and not runs[0].planned
    assert _queued_control_messages() == [(TaskName.RUN_BEGIN, [runs[0].id])]


def test_a_second_comparison_waits_for_the_first_and_each_keeps_its_own_baseline(
    api, make_experiment, predictor, django_capture_on_commit_callbacks
):
    from controlplane.experiments.selectors import run_baselines

    experiment = make_experiment()
    with django_capture_on_commit_callbacks(execute=True):
        first = services.comparison_create(experiment=experiment, strategies=["temporal", "sharing"])
    again = api.post(f"/api/experiments/{experiment.id}/compare/", {"strategies": ["temporal"]}, format="json")
    assert again.status_code == 409, again.json()
    assert f"comparison {first.id} is still running" in again.json()["errors"]["experiment"][0]
    for run, sps in zip(first.runs.order_by("id"), (100.0, 250.0), strict=True):
        Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
        with django_capture_on_commit_callbacks(execute=True):
            services.run_finish(run_id=run.id)
        # run_finish measures the rounds (none here); the figures a finished run would carry:
        Run.objects.filter(id=run.id).update(raw_throughput_sps=sps, fair_throughput=sps / 100)
    first.refresh_from_db()
    assert first.status == Comparison.Status.SUCCEEDED
    # A later comparison's faster baseline does not rebase the first comparison's speedups.
    with django_capture_on_commit_callbacks(execute=True):
        second = services.comparison_create(experiment=experiment, strategies=["temporal"])
    (late,) = second.runs.all()
    Run.objects.filter(id=late.id).update(status=Run.Status.SUCCEEDED, raw_throughput_sps=400.0, fair_throughput=4.0)
    sharing = first.runs.get(strategy="sharing")
    baselines = run_baselines(experiment, experiment.runs.all())
    assert baselines[sharing.id].comparison_id == first.id and baselines[late.id].id == late.id
    listed = {r["id"]: r for r in api.get("/api/runs/", {"experiment": experiment.id}).json()["results"]}
    assert listed[sharing.id]["raw_speedup"] == pytest.approx(2.5) and listed[late.id]["raw_speedup"] == 1.0


def test_a_comparison_closes_after_its_last_run(make_experiment, predictor, django_capture_on_commit_callbacks):
    experiment = make_experiment()
    with django_capture_on_commit_callbacks(execute=True):
        comparison = services.comparison_create(experiment=experiment)
    for run in Run.objects.filter(comparison=comparison).order_by("id"):
        Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
        with django_capture_on_commit_callbacks(execute=True):
            services.run_finish(run_id=run.id)
    comparison.refresh_from_db()
    assert comparison.status == Comparison.Status.SUCCEEDED and comparison.finished_at is not None


def test_compare_without_a_predictor_creates_nothing(api, make_experiment):
    experiment = make_experiment()
    response = api.post(f"/api/experiments/{experiment.id}/compare/", {}, format="json")
    assert response.status_code == 400 and "strategies" in response.json()["errors"]
    assert not Comparison.objects.exists() and not Run.objects.exists()
    assert not Round.objects.exists()


def test_the_experiment_page_button_launches_a_comparison(
    browser_client, make_experiment, predictor, django_capture_on_commit_callbacks
):
    experiment = make_experiment()
    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        response = browser_client.post(f"/experiments/{experiment.id}/compare/")
    assert response.status_code == 302 and response["Location"] == f"/experiments/{experiment.id}/"
    comparison = Comparison.objects.get(experiment=experiment)
    first = comparison.runs.order_by("id").first()
    assert first.strategy == "temporal"
    assert _queued_control_messages() == [(TaskName.RUN_BEGIN, [first.id])]
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert f"Comparison {comparison.id}" in page and "vres_sync" in page
