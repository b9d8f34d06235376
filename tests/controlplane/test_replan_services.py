"""Closed-loop replanning and the planner's guard through the services, the API, the CLI and
the dashboard (the pure parts are tests/controlplane/test_closed_loop.py's): a vres_sync run
replans round 1 from what round 0 measured and stores one decision per device; ``replan:
never`` trains the first plan again; an experiment's ``untrusted_predictor`` decides what a run
with an untrusted predictor trains; the run page shows the warnings and the plan per round.

Rounds are started with :func:`services.round_enqueue` and their results fabricated on the rows
(no agent runs); the Celery messages the services queue are never executed.
"""

from __future__ import annotations

import math
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from controlplane.experiments import services
from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Experiment,
    Round,
    Run,
    StandaloneThroughput,
)
from controlplane.experiments.services.planning import predictor_guard, round_timesliced_devices
from controlplane.experiments.services.samples import samples_from_round
from controlplane.profiling.models import ProfileSample

UNTRUSTED = 1e-6
"""A held-out RMSLE threshold no fitted predictor meets: every device's predictor is untrusted."""


@pytest.fixture
def untrusted(settings):
    settings.MTFL = {**settings.MTFL, "PREDICTOR_MAX_RMSLE": UNTRUSTED}


def _launch(api, experiment: Experiment, strategy: str = "vres_sync", **options) -> Run:
    """POST a run (201), mark it running with its initial models, as ``run_begin`` would."""
    body = {"strategy": strategy, **({"options": options} if options else {})}
    response = api.post(f"/api/experiments/{experiment.id}/runs/", body, format="json")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(id=response.json()["id"])
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
    for task in experiment.tasks.all():
        Checkpoint.objects.create(run=run, task=task, round=None, artifact_path=f"init-{task.id}", sha256="0" * 64)
    run.refresh_from_db()
    return run


def _start(run: Run, index: int) -> Round:
    """Start round ``index``; a batch size never measured alone (round 0's, or a replanned one)
    is measured first on the leased devices (``Run.planned["pending_round"]``): record them as
    the devices would, and dispatch the round."""
    rnd = services.round_enqueue(run_id=run.id, index=index)
    assert rnd is not None
    if not rnd.assignments.exists():
        run.refresh_from_db()
        pending = run.planned["pending_round"]
        assert pending["index"] == index
        for a in pending["plan"]["assignments"]:
            StandaloneThroughput.objects.get_or_create(
                run=run,
                device_id=a["device_id"],
                task_id=a["task_id"],
                batch_size=a["batch_size"],
                defaults={"throughput_sps": 100.0},
            )
        rnd = services.round_dispatch(round_id=rnd.id)
    assert rnd is not None
    return rnd


def _measured(rnd: Round, factor: float = 0.6) -> None:
    """Round ``rnd`` succeeded: every assignment trained its samples at ``factor`` times its
    predicted throughput (the predictor was optimistic), or 50 samples/s without a prediction."""
    now = timezone.now()
    for a in rnd.assignments.all():
        a.status = Assignment.Status.SUCCEEDED
        a.throughput_sps = (a.predicted_throughput_sps or 50.0 / factor) * factor
        a.samples_trained = a.samples
        a.seconds = a.samples / a.throughput_sps
        a.started_at, a.finished_at = now, now
        a.save()
    Round.objects.filter(id=rnd.id).update(status=Round.Status.SUCCEEDED, round_time_s=1.0)


def _configuration(rnd: Round) -> list[tuple[int, int, int, int]]:
    return sorted(rnd.assignments.values_list("device_id", "task_id", "batch_size", "active_thread_percentage"))


def _is_sharing(rnd: Round) -> bool:
    """Sharing's plan: every task the whole device (100 %), at batch 128 clipped to its shard."""
    return all(a.active_thread_percentage == 100 and a.batch_size == min(128, a.samples) for a in rnd.assignments.all())


# --- closed-loop replanning ----------------------------------------------------------------------


def test_round_1_of_a_vres_sync_run_is_replanned_from_round_0_with_a_decision_per_device(
    api,
    make_experiment,
    predictor,
):
    experiment = make_experiment(rounds=3)
    run = _launch(api, experiment)
    first = _start(run, 0)
    assert first.replan is None  # round 0 trains the run's first plan
    _measured(first)
    second = _start(run, 1)
    replan = second.replan
    assert replan["measured_rounds"] == [0]
    devices = dict(experiment.devices.values_list("id", "name"))
    assert sorted(d["device_id"] for d in replan["decisions"]) == sorted(devices)
    for d in replan["decisions"]:
        assert d["device"] == devices[d["device_id"]]
        assert d["action"] in {"moved", "kept", "new", "slack"} and d["reason"].strip()
        assert d["residual_rms"] is not None and d["residual_rms"] > 0  # measured 0.6 × predicted
    # the API answers the decisions as stored
    rows = api.get(f"/api/rounds/?run={run.id}").json()
    rows = rows["results"] if isinstance(rows, dict) else rows
    by_index = {r["index"]: r for r in rows}
    assert by_index[0]["replan"] is None and by_index[1]["replan"] == replan


def test_replan_never_trains_the_first_plan_again(api, make_experiment, predictor):
    experiment = make_experiment(rounds=3)
    run = _launch(api, experiment, replan="never")
    first = _start(run, 0)
    _measured(first)
    second = _start(run, 1)
    assert second.replan is None
    assert _configuration(second) == _configuration(first)


# --- the guard: untrusted_predictor ---------------------------------------------------------------


def test_an_untrusted_predictor_planned_anyway_says_so_on_the_run(
    api,
    make_experiment,
    predictor,
    untrusted,
):
    experiment = make_experiment(rounds=3)
    warnings = predictor_guard(experiment)
    assert warnings and all("above the threshold 1e-06" in w for w in warnings)
    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "vres_sync"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["warnings"] == [*warnings, "planned anyway (the experiment's untrusted_predictor is plan)"]
    assert "fallback" not in body["planned"] and body["planned"]["strategy"] == "vres_sync"
    assert api.get(f"/api/runs/{body['id']}/").json()["warnings"] == body["warnings"]


def test_an_untrusted_predictor_with_baseline_trains_sharing_in_every_round(
    api,
    make_experiment,
    predictor,
    untrusted,
):
    experiment = make_experiment(rounds=3, untrusted_predictor="baseline")
    run = _launch(api, experiment)
    assert run.planned["fallback"] == "baseline" and run.planned["baseline"] == "sharing"
    assert run.warnings[-1].startswith("the run trains sharing's plan in every round")
    first = _start(run, 0)
    assert _is_sharing(first)
    _measured(first)
    second = _start(run, 1)
    assert second.replan is None and _configuration(second) == _configuration(first)


def test_an_untrusted_predictor_with_measure_trains_sharing_then_replans(
    api,
    make_experiment,
    predictor,
    untrusted,
):
    experiment = make_experiment(rounds=3, untrusted_predictor="measure")
    run = _launch(api, experiment)
    assert run.planned["fallback"] == "measure"
    assert "in round 0, then replans" in run.warnings[-1]
    first = _start(run, 0)
    assert _is_sharing(first) and first.replan is None
    _measured(first)
    second = _start(run, 1)
    assert second.replan is not None and len(second.replan["decisions"]) == experiment.devices.count()
    assert all(d["reason"] for d in second.replan["decisions"])


def test_the_planner_check_answers_the_guards_warnings(api, make_experiment, predictor, untrusted):
    experiment = make_experiment(untrusted_predictor="measure")
    body = api.get(f"/api/experiments/{experiment.id}/planner-check/").json()
    assert body == {
        "untrusted_predictor": "measure",
        "warnings": predictor_guard(experiment),
        "max_rmsle": UNTRUSTED,
        "predictors_ready": True,
    }
    assert body["warnings"]


def test_the_planner_check_of_a_device_without_a_predictor_is_a_warning_not_an_error(api, make_experiment):
    experiment = make_experiment()
    response = api.get(f"/api/experiments/{experiment.id}/planner-check/")
    assert response.status_code == 200
    body = response.json()
    assert body["predictors_ready"] is False and body["untrusted_predictor"] == "plan"
    [message] = body["warnings"]
    assert "no fitted throughput predictor for device dev-a" in message and "mtfl profile" in message


def test_untrusted_predictor_is_checked_everywhere_it_is_set(api, make_device, make_task):
    devices, task = [make_device("dev-a")], make_task()
    body = {"name": "e", "tasks": [task.id], "devices": [d.id for d in devices], "rounds": 1}
    bad = api.post("/api/experiments/", {**body, "untrusted_predictor": "maybe"}, format="json")
    assert bad.status_code == 400
    assert "allowed: plan, baseline, measure" in bad.json()["errors"]["untrusted_predictor"][0]
    template = api.post(
        "/api/experiments/from-template/",
        {"template": "light", "devices": [devices[0].id], "untrusted_predictor": "maybe"},
        format="json",
    )
    assert template.status_code == 400 and "untrusted_predictor" in template.json()["errors"]
    good = api.post("/api/experiments/", {**body, "untrusted_predictor": "measure"}, format="json")
    assert good.status_code == 201, good.json()
    assert good.json()["untrusted_predictor"] == "measure"
    # it may change later: each run applies it when planned and records what it did
    changed = api.patch(f"/api/experiments/{good.json()['id']}/", {"untrusted_predictor": "baseline"}, format="json")
    assert changed.status_code == 200 and changed.json()["untrusted_predictor"] == "baseline"
    refused = api.patch(f"/api/experiments/{good.json()['id']}/", {"untrusted_predictor": "x"}, format="json")
    assert refused.status_code == 400 and "untrusted_predictor" in refused.json()["errors"]
    default = api.post("/api/experiments/", {**body, "name": "e2"}, format="json")
    assert default.json()["untrusted_predictor"] == "plan"
    with pytest.raises(CommandError, match=r"--untrusted-predictor: 'maybe' is not allowed; allowed: plan, baseline"):
        call_command("create_experiment", "--template", "light", "--devices", "dev-a", "--untrusted-predictor", "maybe")
    with pytest.raises(Exception, match="untrusted_predictor='maybe' is not allowed"):
        services.experiment_create(
            name="e3", task_ids=[task.id], device_ids=[devices[0].id], rounds=1, untrusted_predictor="maybe"
        )


def test_the_experiment_form_chooses_untrusted_predictor(browser_client, make_device, make_task):
    devices, tasks = [make_device("dev-a")], [make_task()]
    form = {
        "name": "mine",
        "description": "",
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": "1",
        "local_epochs": "1",
        "partition_rule": "iid",
        "seed": "0",
        "lr_scaling": "none",
        "untrusted_predictor": "measure",
    }
    response = browser_client.post("/experiments/new/", form)
    assert response.status_code == 302
    experiment = Experiment.objects.get(name="mine")
    assert experiment.untrusted_predictor == "measure"
    page = browser_client.get(response["Location"]).content.decode()
    assert re.search(r'id="untrusted-predictor">measure<', page)
    # no predictor yet: the planner check says so on the page, which still renders
    assert 'id="planner-check"' in page and "no fitted throughput predictor for device dev-a" in page


# --- profile samples from FL rounds --------------------------------------------------------------


@pytest.mark.parametrize(("iterations", "kept"), [(4, False), (5, True)])
def test_an_assignment_becomes_a_sample_only_with_enough_timed_iterations(make_experiment, iterations, kept):
    """WARMUP_ITERATIONS 2 and MIN_TIMED_ITERATIONS 3: ``E·ceil(|D_ij| / B)`` iterations of
    which 5 or more time 3 or more; 4 time too few. A long task beside it is kept either way."""
    experiment = make_experiment(local_epochs=1)
    run = Run.objects.create(experiment=experiment, strategy="sharing", status="running")
    rnd = Round.objects.create(run=run, index=0, status="succeeded")
    device = experiment.devices.order_by("name").first()
    short, long = experiment.shards.filter(device=device).order_by("task_id")
    for shard, (samples, batch) in ((short, (iterations * 8 - 3, 8)), (long, (long.num_samples, 4))):
        Assignment.objects.create(
            round=rnd,
            device=device,
            task=shard.task,
            batch_size=batch,
            active_thread_percentage=100,
            samples=samples,
            throughput_sps=55.0,
            status="succeeded",
        )
    assert samples_from_round(round_id=rnd.id) == (2 if kept else 1)
    batches = sorted(ProfileSample.objects.filter(source="run").values_list("batch_size", flat=True))
    assert batches == ([4, 8] if kept else [4])


# --- the run page ---------------------------------------------------------------------------------


def test_the_run_page_shows_the_warnings_and_the_plan_per_round(browser_client, make_experiment):
    experiment = make_experiment(rounds=3)
    dev_a, dev_b = experiment.devices.order_by("name")
    task = experiment.tasks.order_by("id").first()
    warning = "predictor v1 (cpu, cpu-2cores) of device dev-a has a held-out RMSLE of 0.412, above the threshold 0.2"
    run = Run.objects.create(
        experiment=experiment, strategy="vres_sync", status="running", warnings=[warning, "planned anyway"]
    )
    first = Round.objects.create(run=run, index=0, status="succeeded")
    second = Round.objects.create(
        run=run,
        index=1,
        status="running",
        predicted_round_time_s=2.5,
        replan={
            "measured_rounds": [0],
            "predicted_round_time_s": 2.5,
            "decisions": [
                {
                    "device_id": dev_a.id,
                    "device": "dev-a",
                    "action": "moved",
                    "reason": "the new plan beats the best measured one by more than its uncertainty",
                    "predicted_gain": math.log(1.25),
                    "uncertainty": math.log(1.05),
                    "offset_scale": 0.3,
                    "shape_scale": 0.1,
                    "residual_rms": 0.2,
                },
                {
                    "device_id": dev_b.id,
                    "device": "dev-b",
                    "action": "kept",
                    "reason": "its best measured configuration is as good within the uncertainty",
                    "predicted_gain": None,
                    "uncertainty": None,
                    "offset_scale": 0.3,
                    "shape_scale": 0.1,
                    "residual_rms": 0.01,
                },
            ],
        },
    )
    for rnd, batch, measured in ((first, 16, 41.5), (second, 32, None)):
        for device in (dev_a, dev_b):
            Assignment.objects.create(
                round=rnd,
                device=device,
                task=task,
                batch_size=batch,
                active_thread_percentage=60,
                samples=40,
                predicted_throughput_sps=77.5,
                throughput_sps=measured,
                status="succeeded" if measured else "running",
            )

    page = browser_client.get(f"/runs/{run.id}/").content.decode()

    box = page[page.index('id="run-warnings"') : page.index("</section>", page.index('id="run-warnings"'))]
    assert warning in box and "planned anyway" in box
    assert page.index('id="run-warnings"') < page.index('id="progress-card"')  # at the top
    plans = page[page.index('id="round-plans"') :]
    assert plans.index('id="round-plan-1"') < plans.index('id="round-plan-0"')  # newest first
    newest = plans[plans.index('id="round-plan-1"') : plans.index('id="round-plan-0"')]
    assert "replanned from round 0" in newest and "2.50 s" in newest
    assert '<span class="badge moved">moved</span>' in newest and "+25.0 % ± 5.0 %" in newest
    assert "beats the best measured one" in newest
    assert '<span class="badge kept">kept</span>' in newest and "as good within the uncertainty" in newest
    assert newest.count("<td>t-mobilenet</td>") == 2 and ">32<" in newest and "77.5" in newest
    oldest = plans[plans.index('id="round-plan-0"') :]
    assert "the run's plan" in oldest and "41.5" in oldest and "badge moved" not in oldest


def test_the_experiment_page_counts_each_runs_warnings(browser_client, make_experiment):
    experiment = make_experiment()
    run = Run.objects.create(experiment=experiment, strategy="vres_sync", status="failed", warnings=["a", "b"])
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert f'href="/runs/{run.id}/#run-warnings"' in page and "2 warnings" in page


# --- what a GPU trainer reports ---------------------------------------------------------------------


def test_the_sm_count_a_trainer_saw_is_recorded_and_listed(started_round, api):
    from tests.controlplane.test_round_protocol import _device_results

    run, rnd = started_round()
    results = _device_results(rnd)
    for device in results:
        for a in device["assignments"]:
            # dev-a's trainer saw 40 of an 80-SM GPU's SMs; dev-b (a cpu trainer) reports none
            if device["device"] == "dev-a":
                a.update(visible_sm_count=40, mps_active_thread_percentage=50.0, mps_verified=True)
    services.round_record(round_id=rnd.id, results=results)
    recorded = dict(rnd.assignments.values_list("device__name", "visible_sm_count"))
    assert recorded == {"dev-a": 40, "dev-b": None}
    rows = api.get(f"/api/assignments/?run={run.id}").json()
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert sorted((r["device_name"], r["visible_sm_count"], r["mps_verified"]) for r in rows) == [
        ("dev-a", 40, True),
        ("dev-b", None, None),
    ]


def test_a_device_whose_plan_measured_slower_than_a_finished_baseline_run_goes_back_to_its_plan(
    api, make_experiment, predictor
):
    """The experiment's finished temporal run measured every device faster than the vres_sync
    run's round 0: round 1 trains temporal's configuration on every device, time-sliced, and a
    retry of a device's part would send that partitioning again (issue 31)."""
    from controlplane.experiments.services.planning import round_partitioning

    experiment = make_experiment(rounds=3)
    temporal = _launch(api, experiment, "temporal")
    baseline_round = _start(temporal, 0)
    _measured(baseline_round)  # 50 samples/s: seconds = samples / 50
    Run.objects.filter(id=temporal.id).update(status=Run.Status.SUCCEEDED)
    run = _launch(api, experiment)
    first = _start(run, 0)
    _measured(first)
    first.assignments.update(seconds=10_000.0)  # far slower than temporal's round on every device
    second = _start(run, 1)

    devices = sorted(experiment.devices.values_list("id", flat=True))
    assert second.replan["measured_rounds"] == [0]
    for d in second.replan["decisions"]:
        assert d["action"] == "kept"
        assert "temporal's plan (round 0)" in d["reason"] and "back to that plan" in d["reason"], d["reason"]
    assert _configuration(second) == _configuration(baseline_round)
    assert second.replan["partitionings"] == {str(d): "timeslice" for d in devices}
    assert [round_partitioning(second, d) for d in devices] == ["timeslice"] * len(devices)
    assert round_partitioning(first, devices[0]) == "mps"
    # Time-sliced devices ran at no share: their round teaches the throughput predictor nothing
    # (batch 2: enough timed iterations that only the partitioning can leave them out).
    _measured(second)
    second.assignments.update(batch_size=2)
    sliced = round_timesliced_devices(second)
    assert sliced == set(devices)
    assert samples_from_round(round_id=second.id, timesliced_devices=sliced) == 0
    Round.objects.filter(id=second.id).update(replan={**second.replan, "partitionings": {}})
    second.refresh_from_db()
    assert round_timesliced_devices(second) == set()
    assert samples_from_round(round_id=second.id) == second.assignments.count()
