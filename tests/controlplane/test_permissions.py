"""Accounts and permissions: an experiment and everything below it is seen and changed only by
its owner and collaborators (others get 404, not 403); tasks and devices are the lab's shared
catalogue, changed only by whoever defined them. Three users: owner, collaborator, outsider."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.experiments.models import Assignment, Checkpoint, Comparison, Round, Run

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


@pytest.fixture
def world(user, make_experiment, client):
    """The ``user`` fixture owns an experiment with a run, a round, assignments, checkpoints and
    a comparison; ``carol`` collaborates on it; ``oscar`` is an outsider."""
    User = get_user_model()
    carol = User.objects.create_user("carol", password="carol-pass-1")
    oscar = User.objects.create_user("oscar", password="oscar-pass-1")
    experiment = make_experiment(name="private-exp")
    experiment.collaborators.add(carol)
    comparison = Comparison.objects.create(experiment=experiment, strategies=["temporal"])
    run = Run.objects.create(
        experiment=experiment, strategy="temporal", status=Run.Status.RUNNING, started_at=T0, comparison=comparison
    )
    rnd = Round.objects.create(
        run=run,
        index=0,
        status=Round.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=20),
        round_time_s=12.5,
    )
    shard = experiment.shards.select_related("device", "task").first()
    assignment = Assignment.objects.create(
        round=rnd,
        device=shard.device,
        task=shard.task,
        batch_size=8,
        active_thread_percentage=100,
        samples=shard.num_samples,
        status=Assignment.Status.SUCCEEDED,
    )
    checkpoint = Checkpoint.objects.create(run=run, task=shard.task, round=rnd, artifact_path="x", sha256="0" * 64)
    return {
        "users": {"owner": user, "collaborator": carol, "outsider": oscar},
        "experiment": experiment,
        "comparison": comparison,
        "run": run,
        "round": rnd,
        "assignment": assignment,
        "checkpoint": checkpoint,
        "task": shard.task,
        "device": shard.device,
    }


def _detail_urls(w) -> dict[str, str]:
    return {
        "experiment": f"/api/experiments/{w['experiment'].id}/",
        "run": f"/api/runs/{w['run'].id}/",
        "run progress": f"/api/runs/{w['run'].id}/progress/",
        "round": f"/api/rounds/{w['round'].id}/",
        "assignment": f"/api/assignments/{w['assignment'].id}/",
        "checkpoint": f"/api/checkpoints/{w['checkpoint'].id}/",
        "comparison": f"/api/comparisons/{w['comparison'].id}/",
    }


LISTS = {
    "/api/experiments/": "experiment",
    "/api/runs/": "run",
    "/api/rounds/": "round",
    "/api/assignments/": "assignment",
    "/api/checkpoints/": "checkpoint",
    "/api/comparisons/": "comparison",
}


def _ids(response) -> set[int]:
    body = response.json()
    rows = body["results"] if isinstance(body, dict) and "results" in body else body
    return {row["id"] for row in rows}


@pytest.mark.parametrize("who", ["owner", "collaborator"])
def test_members_see_every_resource_of_the_experiment(world, who):
    api = _api_for(world["users"][who])
    for url, key in LISTS.items():
        response = api.get(url)
        assert response.status_code == 200, url
        assert world[key].id in _ids(response), f"{who} misses the {key} in {url}"
    for name, url in _detail_urls(world).items():
        assert api.get(url).status_code == 200, f"{who} cannot read the {name}"


def test_an_outsider_sees_nothing_and_others_objects_are_404_not_403(world):
    api = _api_for(world["users"]["outsider"])
    for url, key in LISTS.items():
        response = api.get(url)
        assert response.status_code == 200 and world[key].id not in _ids(response), url
    for name, url in _detail_urls(world).items():
        assert api.get(url).status_code == 404, name
    experiment, run, comparison = world["experiment"], world["run"], world["comparison"]
    for method, url, body in [
        ("patch", f"/api/experiments/{experiment.id}/", {"description": "mine now"}),
        ("post", f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing"}),
        ("post", f"/api/experiments/{experiment.id}/compare/", {}),
        ("post", f"/api/runs/{run.id}/cancel/", {}),
        ("post", f"/api/comparisons/{comparison.id}/cancel/", {}),
    ]:
        assert getattr(api, method)(url, body, format="json").status_code == 404, url
    run.refresh_from_db()
    experiment.refresh_from_db()
    assert run.status == Run.Status.RUNNING and experiment.description != "mine now"


def test_an_outsider_cannot_filter_by_others_experiments_or_runs(world):
    api = _api_for(world["users"]["outsider"])
    for url in [
        f"/api/runs/?experiment={world['experiment'].id}",
        f"/api/rounds/?run={world['run'].id}",
        f"/api/assignments/?experiment={world['experiment'].id}",
        f"/api/checkpoints/?run={world['run'].id}",
    ]:
        response = api.get(url)
        # the filter refuses an id it does not offer this user; either way no row leaks
        assert response.status_code in (200, 400), url
        if response.status_code == 200:
            assert _ids(response) == set(), url
        else:
            assert "Select a valid choice" in response.content.decode()


def test_a_collaborator_launches_and_cancels_but_only_the_owner_shares(world):
    owner, carol = _api_for(world["users"]["owner"]), _api_for(world["users"]["collaborator"])
    experiment, run = world["experiment"], world["run"]
    assert carol.patch(f"/api/experiments/{experiment.id}/", {"description": "notes"}, format="json").status_code == 200
    assert carol.post(f"/api/runs/{run.id}/cancel/").status_code == 200
    refused = carol.patch(f"/api/experiments/{experiment.id}/", {"collaborators": ["carol", "oscar"]}, format="json")
    assert refused.status_code == 403
    assert "owner" in refused.json()["errors"]["collaborators"][0]

    unknown = owner.patch(f"/api/experiments/{experiment.id}/", {"collaborators": ["nobody"]}, format="json")
    assert unknown.status_code == 400 and "'nobody'" in unknown.json()["errors"]["collaborators"][0]
    shared = owner.patch(f"/api/experiments/{experiment.id}/", {"collaborators": ["oscar"]}, format="json")
    assert shared.status_code == 200 and shared.json()["collaborators"] == ["oscar"]
    assert shared.json()["owner"] == "researcher"
    # carol is out, oscar is in
    assert carol.get(f"/api/experiments/{experiment.id}/").status_code == 404
    assert _api_for(world["users"]["outsider"]).get(f"/api/runs/{run.id}/").status_code == 200


def test_an_experiment_created_through_the_api_belongs_to_its_creator(world, make_task):
    oscar = _api_for(world["users"]["outsider"])
    device = world["device"]
    response = oscar.post(
        "/api/experiments/",
        {
            "name": "oscar-exp",
            "tasks": [world["task"].id],
            "devices": [device.id],
            "rounds": 1,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["owner"] == "oscar" and response.json()["collaborators"] == []
    assert _api_for(world["users"]["owner"]).get(f"/api/experiments/{response.json()['id']}/").status_code == 404


def test_tasks_and_devices_are_shared_but_only_their_owner_changes_a_task(world):
    oscar, owner = _api_for(world["users"]["outsider"]), _api_for(world["users"]["owner"])
    task = world["task"]
    assert task.id in _ids(oscar.get("/api/tasks/")) and world["device"].id in _ids(oscar.get("/api/devices/"))
    refused = oscar.patch(f"/api/tasks/{task.id}/", {"name": "hijacked"}, format="json")
    assert refused.status_code == 403 and "owner" in str(refused.json())
    assert owner.patch(f"/api/tasks/{task.id}/", {"name": "renamed"}, format="json").status_code == 200
    created = oscar.post("/api/tasks/", {"name": "oscar-task", "architecture": "resnet18"}, format="json")
    assert created.status_code == 201 and created.json()["owner"] == "oscar"


def test_a_superuser_sees_every_experiment(world):
    admin = get_user_model().objects.create_superuser("admin", password="admin-pass-1")
    api = _api_for(admin)
    for url, key in LISTS.items():
        assert world[key].id in _ids(api.get(url)), url


# ------------------------------------------------------------------------------- dashboard


def _browser(client, user):
    client.force_login(user)
    return client


@pytest.mark.parametrize("who", ["owner", "collaborator"])
def test_members_open_every_dashboard_page_of_the_experiment(world, client, who):
    browser = _browser(client, world["users"][who])
    experiment, run, task = world["experiment"], world["run"], world["task"]
    assert "private-exp" in browser.get("/").content.decode()
    for url in [f"/experiments/{experiment.id}/", f"/runs/{run.id}/", f"/runs/{run.id}/live/"]:
        assert browser.get(url).status_code == 200, url
    assert "private-exp" in browser.get(f"/tasks/{task.id}/").content.decode()


def test_an_outsider_gets_404_on_every_dashboard_page_of_the_experiment(world, client):
    browser = _browser(client, world["users"]["outsider"])
    experiment, run, task = world["experiment"], world["run"], world["task"]
    index = browser.get("/").content.decode()
    assert "private-exp" not in index
    for url in [f"/experiments/{experiment.id}/", f"/runs/{run.id}/", f"/runs/{run.id}/live/"]:
        assert browser.get(url).status_code == 404, url
    assert browser.post(f"/experiments/{experiment.id}/compare/").status_code == 404
    # the shared task page opens, without naming an experiment the outsider cannot see
    page = browser.get(f"/tasks/{task.id}/")
    assert page.status_code == 200 and "private-exp" not in page.content.decode()
    assert not Comparison.objects.exclude(pk=world["comparison"].pk).exists()


def test_an_experiment_created_from_the_dashboard_template_form_belongs_to_its_creator(world, client):
    browser = _browser(client, world["users"]["outsider"])
    response = browser.post(
        "/experiments/from-template/",
        {
            "template": "light",
            "devices": [world["device"].id],
            "rounds": 1,
            "local_epochs": 1,
            "dirichlet_alpha": 0.5,
            "seed": 0,
            "dataset": "digits",
            "name": "oscar-light",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    from controlplane.experiments.models import Experiment

    experiment = Experiment.objects.get(name="oscar-light")
    assert experiment.owner == world["users"]["outsider"]
    assert _browser(client, world["users"]["owner"]).get(f"/experiments/{experiment.id}/").status_code == 404
