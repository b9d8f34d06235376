"""REST API: authentication, validation messages naming the field, CRUD, filters, run launch."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.celery import app as celery_app
from controlplane.experiments.models import Assignment, Round, Run
from workers.protocol.queues import CONTROL_QUEUE, TaskName

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path",
    [
        "/api/devices/",
        "/api/tasks/",
        "/api/experiments/",
        "/api/runs/",
        "/api/rounds/",
        "/api/assignments/",
        "/api/checkpoints/",
    ],
)
def test_anonymous_requests_are_refused(path):
    response = APIClient().get(path)
    assert response.status_code in (401, 403)
    assert response.json()["message"]


def test_token_authentication_lists_devices(api, make_device):
    make_device("dev-a")
    response = api.get("/api/devices/")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    assert body["results"][0]["queue"] == "device.dev-a"
    assert body["results"][0]["status"] == "online"  # the fixture's agent reported just now


def test_device_create_validates_name_and_backend(api):
    ok = api.post("/api/devices/", {"name": "gpu-1", "backend": "cpu"}, format="json")
    assert ok.status_code == 201 and ok.json()["queue"] == "device.gpu-1"
    bad_name = api.post("/api/devices/", {"name": "GPU 1"}, format="json")
    assert bad_name.status_code == 400 and "name" in bad_name.json()["errors"]
    dup = api.post("/api/devices/", {"name": "gpu-1"}, format="json")
    assert dup.status_code == 400 and "already exists" in dup.json()["message"]
    bad_backend = api.post("/api/devices/", {"name": "gpu-2", "backend": "tpu"}, format="json")
    assert bad_backend.status_code == 400
    assert "allowed: cpu" in bad_backend.json()["errors"]["backend"][0]


def test_device_update_changes_backend_only(api, make_device):
    device = make_device("dev-a")
    response = api.patch(f"/api/devices/{device.id}/", {"backend": "cpu"}, format="json")
    assert response.status_code == 200


def test_unknown_architecture_names_the_field_and_allowed_values(api):
    response = api.post("/api/tasks/", {"name": "t", "architecture": "alexnet"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert "architecture" in body["errors"]
    assert "resnet18" in body["errors"]["architecture"][0] and "densenet121" in body["errors"]["architecture"][0]
    assert body["message"].startswith("architecture")


def test_task_numbers_out_of_range_are_refused(api):
    lr = api.post("/api/tasks/", {"name": "t", "architecture": "resnet18", "learning_rate": -1}, format="json")
    assert lr.status_code == 400 and lr.json()["errors"]["learning_rate"][0].endswith("allowed (0, 10]")
    classes = api.post("/api/tasks/", {"name": "t", "architecture": "resnet18", "num_classes": 3}, format="json")
    assert classes.status_code == 400 and "num_classes" in classes.json()["errors"]
    cifar = api.post("/api/tasks/", {"name": "t", "architecture": "resnet18", "dataset": "cifar10"}, format="json")
    assert cifar.status_code == 400 and "dataset_root" in cifar.json()["errors"]


def test_task_create_and_update(api):
    created = api.post("/api/tasks/", {"name": "r18", "architecture": "resnet18", "learning_rate": 0.1}, format="json")
    assert created.status_code == 201, created.json()
    task_id = created.json()["id"]
    updated = api.patch(f"/api/tasks/{task_id}/", {"learning_rate": 0.01}, format="json")
    assert updated.status_code == 200 and updated.json()["learning_rate"] == 0.01
    assert updated.json()["architecture"] == "resnet18"


def test_experiment_with_missing_device_is_refused(api, make_task):
    task = make_task()
    response = api.post(
        "/api/experiments/", {"name": "e", "tasks": [task.id], "devices": [999], "rounds": 1}, format="json"
    )
    assert response.status_code == 400
    assert "999" in response.json()["errors"]["devices"][0]


def test_experiment_negative_sample_count_is_refused(api, make_task, make_device):
    task, device = make_task(), make_device()
    response = api.post(
        "/api/experiments/",
        {
            "name": "e",
            "tasks": [task.id],
            "devices": [device.id],
            "rounds": 1,
            "partition_rule": "explicit",
            "sample_counts": [{"device": device.id, "task": task.id, "num_samples": -5}],
        },
        format="json",
    )
    assert response.status_code == 400
    assert "num_samples" in response.json()["errors"]
    assert "allowed 0 or 2 and more" in response.json()["message"]


def test_experiment_rounds_and_alpha_ranges(api, make_task, make_device):
    task, device = make_task(), make_device()
    base = {"name": "e", "tasks": [task.id], "devices": [device.id]}
    rounds = api.post("/api/experiments/", {**base, "rounds": 0}, format="json")
    assert rounds.status_code == 400 and "rounds" in rounds.json()["errors"]
    alpha = api.post(
        "/api/experiments/", {**base, "rounds": 1, "partition_rule": "quantity", "dirichlet_alpha": 0}, format="json"
    )
    assert alpha.status_code == 400 and "(0, 1000]" in alpha.json()["errors"]["dirichlet_alpha"][0]


def test_quantity_experiment_derives_skewed_shards_covering_the_split(api, make_task, make_device):
    tasks = [make_task("a", "resnet18"), make_task("b", "shufflenet_v2_x1_0")]
    devices = [make_device("d1"), make_device("d2"), make_device("d3")]
    response = api.post(
        "/api/experiments/",
        {
            "name": "e",
            "tasks": [t.id for t in tasks],
            "devices": [d.id for d in devices],
            "rounds": 2,
            "partition_rule": "quantity",
            "dirichlet_alpha": 0.5,
            "seed": 3,
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    shards = response.json()["shards"]
    assert len(shards) == 6
    for task in tasks:
        counts = [s["num_samples"] for s in shards if s["task"] == task.id]
        assert sum(counts) == 1437  # the digits training split
        assert len(set(counts)) > 1  # skewed, not even
    first = {(s["device"], s["task"]): s["num_samples"] for s in shards}
    again = api.post(
        "/api/experiments/",
        {
            "name": "e2",
            "tasks": [t.id for t in tasks],
            "devices": [d.id for d in devices],
            "rounds": 2,
            "partition_rule": "quantity",
            "dirichlet_alpha": 0.5,
            "seed": 3,
        },
        format="json",
    ).json()["shards"]
    assert {(s["device"], s["task"]): s["num_samples"] for s in again} == first


def test_experiment_update_refuses_fixed_fields(api, make_experiment):
    experiment = make_experiment()
    ok = api.patch(f"/api/experiments/{experiment.id}/", {"rounds": 5}, format="json")
    assert ok.status_code == 200 and ok.json()["rounds"] == 5
    fixed = api.patch(f"/api/experiments/{experiment.id}/", {"partition_rule": "iid"}, format="json")
    assert fixed.status_code == 400 and "partition_rule" in fixed.json()["errors"]


def _queued_control_messages() -> list[tuple[str, list]]:
    """Drain the control queue of the in-memory broker: ``[(task name, args)]``."""
    out = []
    with celery_app.connection_for_write() as conn:
        queue = conn.SimpleQueue(CONTROL_QUEUE)
        while True:
            try:
                message = queue.get(block=True, timeout=0.2)
            except queue.Empty:
                break
            out.append((message.headers["task"], message.payload[0]))
            message.ack()
        queue.close()
    return out


def test_launching_a_run_queues_run_begin_after_commit(api, make_experiment, django_capture_on_commit_callbacks):
    experiment = make_experiment()
    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "isolation"}, format="json")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(id=response.json()["id"])
    assert run.status == Run.Status.PENDING and run.strategy == "isolation"
    assert _queued_control_messages() == [(TaskName.RUN_BEGIN, [run.id])]


def test_run_launch_validates_strategy_and_manual_plan(api, make_experiment):
    experiment = make_experiment()
    bad = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "fastest"}, format="json")
    assert bad.status_code == 400 and "temporal" in bad.json()["errors"]["strategy"][0]
    shards = list(experiment.shards.all())
    plan = [{"device": s.device_id, "task": s.task_id, "batch_size": 8, "active_thread_percentage": 50} for s in shards]
    plan[0]["batch_size"] = 100000
    too_big = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "manual", "plan": plan}, format="json")
    assert too_big.status_code == 400
    assert too_big.json()["errors"] == {"plan[0].batch_size": ["must be at most 4096: allowed 2 to 4096"]}
    plan[0]["batch_size"] = 8
    plan[1]["active_thread_percentage"] = 0
    share = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "manual", "plan": plan}, format="json")
    assert share.status_code == 400 and "plan[1].active_thread_percentage" in share.json()["errors"]
    plan[1]["active_thread_percentage"] = 70
    plan[0]["batch_size"] = 1000  # within the API's range, beyond the shard: the planner says so
    shard = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "manual", "plan": plan}, format="json")
    assert shard.status_code == 400 and "the shard holds" in shard.json()["message"]
    plan[0]["batch_size"] = 8
    plan[1]["active_thread_percentage"] = 70
    ok = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "manual", "plan": plan}, format="json")
    assert ok.status_code == 201, ok.json()


def test_lists_filter_by_experiment_run_and_round(api, make_experiment):
    e1 = make_experiment(name="e1")
    e2 = make_experiment(name="e2", devices=list(e1.devices.all()), tasks=list(e1.tasks.all()))
    runs = [Run.objects.create(experiment=e, strategy="sharing") for e in (e1, e1, e2)]
    rounds = [Round.objects.create(run=r, index=0) for r in runs]
    for rnd in rounds:
        for shard in rnd.run.experiment.shards.all():
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=8,
                active_thread_percentage=100,
                samples=shard.num_samples,
            )
    assert api.get(f"/api/runs/?experiment={e1.id}").json()["count"] == 2
    assert api.get(f"/api/rounds/?run={runs[2].id}").json()["count"] == 1
    assert api.get(f"/api/rounds/?experiment={e1.id}").json()["count"] == 2
    assert api.get(f"/api/assignments/?round={rounds[0].id}").json()["count"] == 4
    assert api.get(f"/api/assignments/?run={runs[1].id}").json()["count"] == 4
    assert api.get(f"/api/assignments/?experiment={e2.id}").json()["count"] == 4
    assert api.get(f"/api/checkpoints/?run={runs[0].id}").json()["count"] == 0
    progress = api.get(f"/api/runs/{runs[0].id}/progress/").json()
    assert progress["rounds_total"] == 1 and progress["current_round"]["assignments_total"] == 4


def test_a_filter_given_twice_is_a_400_naming_it(api, make_experiment):
    experiment = make_experiment()

    twice = api.get(f"/api/runs/?experiment={experiment.id}&experiment={experiment.id + 1}")
    once = api.get(f"/api/runs/?experiment={experiment.id}")

    assert twice.status_code == 400
    assert "experiment" in twice.json()["errors"] and twice.json()["message"].startswith("experiment")
    assert once.status_code == 200


def test_cancel_a_run_then_cancel_again_conflicts(api, make_experiment):
    run = Run.objects.create(experiment=make_experiment(), strategy="sharing", status=Run.Status.RUNNING)
    first = api.post(f"/api/runs/{run.id}/cancel/")
    assert first.status_code == 200 and first.json()["status"] == "cancelled"
    second = api.post(f"/api/runs/{run.id}/cancel/")
    assert second.status_code == 409


def test_openapi_schema_and_docs_are_served(api):
    schema = api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/experiments/{id}/runs/" in schema.content
    docs = api.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_huge_ids_and_deep_json_are_400_not_500(api, make_device, make_task):
    device, task = make_device(), make_task()
    huge = 99999999999999999999999
    for body in (
        {"name": "e", "tasks": [huge], "devices": [device.id], "rounds": 1},
        {"name": "e", "tasks": [task.id], "devices": [huge], "rounds": 1},
    ):
        response = api.post("/api/experiments/", body, format="json")
        assert response.status_code == 400 and "allowed 1 to" in response.json()["message"]
    for url in (
        f"/api/rounds/?experiment={huge}",
        f"/api/assignments/?run={huge}",
        f"/api/assignments/?experiment={huge}",
        f"/api/runs/?experiment={huge}",
    ):
        assert api.get(url).status_code == 400, url
    deep = "[" * 5000 + "]" * 5000
    response = api.post("/api/devices/", deep, content_type="application/json")
    assert response.status_code == 400 and "JSON" in response.json()["message"]


def test_unknown_and_fixed_fields_are_refused(api, make_device, make_task, make_experiment):
    device = make_device("dev-z")
    unknown = api.post("/api/devices/", {"name": "dev-x", "extra": 1}, format="json")
    assert (
        unknown.status_code == 400 and "unknown field; allowed: name, backend" in unknown.json()["errors"]["extra"][0]
    )
    rename = api.patch(f"/api/devices/{device.id}/", {"name": "renamed"}, format="json")
    assert rename.status_code == 400 and "Celery queue" in rename.json()["errors"]["name"][0]
    number_name = api.post("/api/devices/", {"name": 123}, format="json")
    assert number_name.status_code == 400 and "must be a string" in number_name.json()["errors"]["name"][0]
    task = api.post("/api/tasks/", {"name": "t", "architecture": "resnet18", "id": 999}, format="json")
    assert task.status_code == 400 and "id" in task.json()["errors"]
    experiment = make_experiment()
    bogus = api.patch(f"/api/experiments/{experiment.id}/", {"bogus": 1}, format="json")
    assert bogus.status_code == 400 and "unknown field" in bogus.json()["errors"]["bogus"][0]


def test_ranges_are_named_for_bad_types(api, make_task, make_device):
    task, device = make_task(), make_device()
    response = api.post(
        "/api/experiments/", {"name": "e", "tasks": [task.id], "devices": [device.id], "rounds": "many"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["errors"]["rounds"] == ["must be an integer: allowed 1 to 10000"]
    seed = api.post(
        "/api/experiments/",
        {"name": "e", "tasks": [task.id], "devices": [device.id], "rounds": 1, "seed": -1},
        format="json",
    )
    assert "allowed 0 to 2147483647" in seed.json()["errors"]["seed"][0]
    nan = api.post("/api/tasks/", {"name": "t", "architecture": "resnet18", "learning_rate": "NaN"}, format="json")
    assert nan.status_code == 400 and "learning_rate" in nan.json()["errors"]


def test_runs_freeze_the_experiment_and_its_tasks(api, make_experiment):
    experiment = make_experiment()
    Run.objects.create(experiment=experiment, strategy="sharing")
    rounds = api.patch(f"/api/experiments/{experiment.id}/", {"rounds": 3}, format="json")
    assert rounds.status_code == 409 and "rounds cannot change" in rounds.json()["message"]
    renamed = api.patch(f"/api/experiments/{experiment.id}/", {"name": "renamed"}, format="json")
    assert renamed.status_code == 200
    task = experiment.tasks.first()
    type(task).objects.filter(id=task.id).update(learning_rate=0.1)
    lr = api.patch(f"/api/tasks/{task.id}/", {"learning_rate": 0.5}, format="json")
    assert lr.status_code == 409 and "learning_rate cannot change" in lr.json()["message"]
    put = api.put(f"/api/tasks/{task.id}/", {"name": task.name, "architecture": task.architecture}, format="json")
    assert put.status_code == 409  # would reset the optimizer to its defaults
    assert api.patch(f"/api/tasks/{task.id}/", {"name": "new-name"}, format="json").status_code == 200


def test_a_run_needs_every_device_to_have_connected(api, user, make_device, make_task):
    from controlplane.experiments.services import experiment_create

    ghost, real = make_device("ghost", connected=False), make_device("real")
    task = make_task()
    experiment = experiment_create(name="g", task_ids=[task.id], device_ids=[ghost.id, real.id], rounds=1, owner=user)
    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing"}, format="json")
    assert response.status_code == 409
    assert "ghost has never connected" in response.json()["message"]


def test_a_baseline_takes_no_plan_even_an_empty_one(api, make_experiment):
    experiment = make_experiment()
    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "temporal", "plan": []}, format="json")
    assert response.status_code == 400 and "takes no plan" in response.json()["message"]


def test_device_status_filter_uses_the_heartbeat(api, make_device):
    import datetime as dt

    from controlplane.fleet.models import Device

    make_device("fresh")
    make_device("never", connected=False)
    stale = make_device("stale")
    Device.objects.filter(id=stale.id).update(last_heartbeat_at=stale.last_heartbeat_at - dt.timedelta(hours=1))
    names = {
        s: {d["name"] for d in api.get(f"/api/devices/?status={s}").json()["results"]}
        for s in ("online", "offline", "unknown")
    }
    assert names == {"online": {"fresh"}, "offline": {"stale"}, "unknown": {"never"}}
    listed = {d["name"]: d["status"] for d in api.get("/api/devices/").json()["results"]}
    assert listed == {"fresh": "online", "stale": "offline", "never": "unknown"}
