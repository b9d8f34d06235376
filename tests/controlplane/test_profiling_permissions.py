"""Who may hold a shared device with a profiling sweep, and for how long; who may end one; and
who may fit a predictor.

A device being profiled gets no round (the lab scheduler), as a paused one; pausing is a lab
admin's. So a researcher without staff rights may give a sweep at most
:data:`~controlplane.common.limits.SWEEP_BUDGET_SELF_SERVE` (dashboard and API alike), lab staff
and the operator's CLI the whole :data:`~controlplane.common.limits.SWEEP_BUDGET`; whoever
started a sweep, or lab staff, may cancel it, which frees the device at once, tells the agent, and
drops what the agent reports afterwards. Any researcher may fit a predictor: a fit is what the
shared samples give, whoever asks.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.celery import app as celery_app
from controlplane.common.errors import ApplicationError
from controlplane.common.limits import SWEEP_BUDGET, SWEEP_BUDGET_SELF_SERVE, bound_text
from controlplane.core.management.commands import profile as profile_command
from controlplane.lab.services import scheduler
from controlplane.profiling.models import ProfileSample, ProfileSweep
from controlplane.profiling.services import (
    predictor_current,
    predictor_fit,
    profile_done,
    profile_record,
    sweep_cancel,
    sweep_start,
)
from tests.controlplane.contention_law import store_synthetic_samples
from tests.controlplane.queue_world import queued_round, running_run
from tests.controlplane.test_api import _queued_control_messages
from workers.protocol.queues import CANCELLED_STATE, TaskName, cancel_marker_id

pytestmark = pytest.mark.django_db

ABOVE_CAP = SWEEP_BUDGET_SELF_SERVE.high + 1
WITHIN_CAP = SWEEP_BUDGET_SELF_SERVE.high
CAP_TEXT = f"allowed {SWEEP_BUDGET_SELF_SERVE.span} seconds"


def _person(name: str, *, staff: bool = False):
    return get_user_model().objects.create_user(name, password="s3cret-pass", is_staff=staff)


def _api_as(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def _browser_as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _budget_error(response) -> str:
    html = response.content.decode()
    match = re.search(r'id="field-budget_s">(.*?)</label>', html, re.S)
    assert match, html[:2000]
    return unescape(" ".join(re.findall(r'<span class="error">(.*?)</span>', match.group(1), re.S)))


def _measured(sweep: ProfileSweep, config_index: int) -> dict:
    """One configuration of two tasks as the agent reports it."""
    task = {"architecture": "mobilenet_v3_small", "batch_size": 32, "active_thread_percentage": 50}
    return {
        "sweep_id": sweep.id,
        "device": sweep.device.name,
        "config_index": config_index,
        "tasks": [task, task],
        "measurements": [{**task, "task_index": i, "throughput_sps": 100.0 + i} for i in range(2)],
        "status": "succeeded",
    }


# ------------------------------------------------------------------------------- the budget cap


def test_a_researcher_above_the_cap_is_refused_on_the_api_naming_the_field_and_range(make_device, user):
    device = make_device("dev-a")

    response = _api_as(user).post(f"/api/devices/{device.id}/profile/", {"budget_s": ABOVE_CAP}, format="json")

    assert response.status_code == 403, response.json()
    body = response.json()
    assert "budget_s" in body["errors"] and CAP_TEXT in body["errors"]["budget_s"][0]
    assert f"up to {bound_text(SWEEP_BUDGET.high)}" in body["errors"]["budget_s"][0]
    assert not ProfileSweep.objects.exists()


def test_a_researcher_above_the_cap_is_refused_on_the_dashboard_at_the_budget(make_device, user):
    device = make_device("dev-a")
    client = _browser_as(user)
    page = client.get("/profiling/new/").content.decode()
    assert f'max="{bound_text(SWEEP_BUDGET_SELF_SERVE.high)}"' in page  # the input offers what they may give

    response = client.post("/profiling/new/", {"device": str(device.id), "budget_s": str(ABOVE_CAP)})

    assert response.status_code == 403
    assert f"budget_s={ABOVE_CAP:g}" in _budget_error(response) and CAP_TEXT in _budget_error(response)
    assert not ProfileSweep.objects.exists()


def test_a_researcher_within_the_cap_starts_a_sweep_recorded_as_theirs(
    make_device, user, django_capture_on_commit_callbacks
):
    device = make_device("dev-a")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        api_response = _api_as(user).post(f"/api/devices/{device.id}/profile/", {"budget_s": WITHIN_CAP}, format="json")
    assert api_response.status_code == 202, api_response.json()
    assert api_response.json()["started_by"] == user.username and len(callbacks) == 1
    sweep = ProfileSweep.objects.get()
    assert sweep.started_by == user and sweep.budget_s == WITHIN_CAP and sweep.task_id

    other = make_device("dev-b")
    response = _browser_as(user).post("/profiling/new/", {"device": str(other.id), "budget_s": "300"})
    assert response.status_code == 302
    assert ProfileSweep.objects.get(device=other).started_by == user


def test_staff_may_give_the_whole_range_and_no_more(make_device):
    device = make_device("dev-a")
    admin = _api_as(_person("admin", staff=True))

    beyond = admin.post(f"/api/devices/{device.id}/profile/", {"budget_s": SWEEP_BUDGET.high + 1}, format="json")
    assert beyond.status_code == 400
    assert f"allowed {SWEEP_BUDGET.span} seconds" in beyond.json()["errors"]["budget_s"][0]

    response = admin.post(f"/api/devices/{device.id}/profile/", {"budget_s": SWEEP_BUDGET.high}, format="json")
    assert response.status_code == 202, response.json()
    assert ProfileSweep.objects.get().budget_s == SWEEP_BUDGET.high


def test_the_operators_cli_gives_the_whole_range_and_its_help_says_so(make_device):
    """``mtfl profile`` calls the service with no actor: the operator, as lab staff."""
    sweep = sweep_start(device=make_device("dev-a"), budget_s=ABOVE_CAP, architectures=["mobilenet_v3_small"])
    assert sweep.budget_s == ABOVE_CAP and sweep.started_by is None

    parser = profile_command.Command().create_parser("manage.py", "profile")
    budget_help = next(a.help for a in parser._actions if a.dest == "budget")
    assert SWEEP_BUDGET.span in budget_help and "operator" in budget_help
    assert SWEEP_BUDGET_SELF_SERVE.span in budget_help


# ---------------------------------------------------------------------------------------- cancel


def _running_sweep(device, starter) -> ProfileSweep:
    sweep = sweep_start(device=device, budget_s=WITHIN_CAP, architectures=["mobilenet_v3_small"], actor=starter)
    assert profile_record(result={**_measured(sweep, 0), "started_at": 1.0e9, "finished_at": 1.0e9 + 3}) == 2
    sweep.refresh_from_db()
    assert sweep.status == ProfileSweep.Status.RUNNING
    return sweep


def test_the_starter_cancels_on_the_api_and_the_scheduler_gets_the_device_at_once(
    make_experiment, make_device, user, monkeypatch, django_capture_on_commit_callbacks
):
    dispatched: list[int] = []
    monkeypatch.setattr(scheduler, "round_dispatch", lambda *, round_id: dispatched.append(round_id))
    device = make_device("dev-a")
    experiment = make_experiment(devices=[device])
    sweep = _running_sweep(device, user)
    waiting = queued_round(running_run(experiment), queued_at=timezone.now())
    assert scheduler.lab_schedule() == []  # the sweep holds dev-a
    _queued_control_messages()

    with django_capture_on_commit_callbacks(execute=True):
        response = _api_as(user).post(f"/api/profile-sweeps/{sweep.id}/cancel/")

    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "cancelled" and response.json()["progress"] == 1.0
    assert TaskName.LAB_SCHEDULE in [name for name, _ in _queued_control_messages()]
    assert scheduler.lab_schedule() == [waiting.id] and dispatched == [waiting.id]
    # The agent is told: its sweep's device task is marked cancelled, with who did it.
    marker = celery_app.backend.get_task_meta(cancel_marker_id(sweep.task_id))
    assert marker["status"] == CANCELLED_STATE and user.username in marker["result"]["reason"]


def test_what_the_agent_reports_after_a_cancel_is_dropped(make_device, user):
    sweep = _running_sweep(make_device("dev-a"), user)
    sweep_cancel(sweep=sweep, actor=user)

    assert profile_record(result=_measured(sweep, 1)) == 0
    assert profile_done(summary={"sweep_id": sweep.id, "device": "dev-a", "status": "succeeded"}) is None
    sweep.refresh_from_db()
    assert sweep.status == ProfileSweep.Status.CANCELLED and (sweep.configs, sweep.samples) == (1, 2)
    assert ProfileSample.objects.filter(sweep=sweep).count() == 2  # measured before the cancel: kept


def test_staff_cancel_anyones_sweep_with_the_dashboard_button(make_device, user):
    sweep = _running_sweep(make_device("dev-a"), user)
    admin = _browser_as(_person("admin", staff=True))
    assert 'id="cancel-sweep"' in admin.get(f"/profiling/sweeps/{sweep.id}/").content.decode()

    response = admin.post(f"/profiling/sweeps/{sweep.id}/cancel/", follow=True)

    assert response.redirect_chain == [(f"/profiling/sweeps/{sweep.id}/", 302)]
    html = response.content.decode()
    assert "dev-a is free for rounds again" in html and 'id="cancel-sweep"' not in html
    assert "Cancelled" in html and "cancelled by admin" in html
    assert ProfileSweep.objects.get(id=sweep.id).status == ProfileSweep.Status.CANCELLED


def test_another_researcher_may_not_cancel_a_sweep(make_device, user):
    sweep = _running_sweep(make_device("dev-a"), user)
    colleague = _person("colleague")
    assert 'id="cancel-sweep"' not in _browser_as(colleague).get(f"/profiling/sweeps/{sweep.id}/").content.decode()

    api_response = _api_as(colleague).post(f"/api/profile-sweeps/{sweep.id}/cancel/")
    page = _browser_as(colleague).post(f"/profiling/sweeps/{sweep.id}/cancel/")

    assert api_response.status_code == 403
    assert "started by researcher" in api_response.json()["message"]
    assert page.status_code == 403 and 'id="cancel-error"' in page.content.decode()
    assert ProfileSweep.objects.get(id=sweep.id).status == ProfileSweep.Status.RUNNING


def test_a_sweep_that_ended_cannot_be_cancelled(make_device, user):
    sweep = _running_sweep(make_device("dev-a"), user)
    profile_done(summary={"sweep_id": sweep.id, "device": "dev-a", "status": "succeeded"})

    with pytest.raises(ApplicationError) as refused:
        sweep_cancel(sweep=sweep, actor=user)

    assert refused.value.status_code == 409 and "already ended (succeeded)" in refused.value.message
    assert ProfileSweep.objects.get(id=sweep.id).status == ProfileSweep.Status.SUCCEEDED


# ------------------------------------------------------------------------------------ predictors

FAST_FAMILIES = ("baseline", "extra_trees")
"""Two of the families (as the ``predictor`` fixture fits): enough to show a fit is repeatable."""


def test_a_researchers_refit_gives_the_model_the_samples_give_so_fitting_is_open(
    make_device, user, django_capture_on_commit_callbacks
):
    """Planners take the newest ready predictor; a researcher without staff rights may still fit
    one, because the new version is the model that the shared samples give anyway."""
    store_synthetic_samples(make_device("profiled"), n=60)
    earlier = predictor_fit(backend="cpu", families=FAST_FAMILIES)

    with django_capture_on_commit_callbacks(execute=False):
        response = _api_as(user).post("/api/predictors/", {"backend": "cpu", "device_class": "cpu-2cores"})
    assert response.status_code == 202, response.json()
    # What the control worker then runs for the queued fit.
    refit = predictor_fit(predictor_id=response.json()["id"], families=FAST_FAMILIES)

    assert refit.status == "ready" and refit.version == earlier.version + 1
    assert predictor_current(backend="cpu", device_class="cpu-2cores") == refit
    assert refit.sha256 == earlier.sha256 and refit.kept_family == earlier.kept_family
    assert refit.heldout_rmsle == pytest.approx(earlier.heldout_rmsle, rel=1e-9)
