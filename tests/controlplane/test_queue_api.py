"""The lab's API (issue 24, items 2 and 3): ``GET /api/queue/``, an admin's pause and resume of a
device, device pools, and a run's pool, priority and place in the queue."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.experiments.models import Run
from controlplane.fleet.models import Device, DevicePool
from tests.controlplane.queue_world import two_researchers

pytestmark = pytest.mark.django_db


def _api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


@pytest.fixture
def admin_api(db) -> APIClient:
    return _api_for(get_user_model().objects.create_user("lab-admin", password="x-pass-123", is_staff=True))


@pytest.fixture
def lab(make_experiment, make_device, user):
    return two_researchers(make_experiment, make_device, user, now=timezone.now())


def test_every_user_sees_the_whole_queue(lab):
    outsider = get_user_model().objects.create_user("outsider", password="x-pass-123")

    body = _api_for(outsider).get("/api/queue/").json()

    assert body["policy"] in ("fifo", "fair")
    [entry] = body["waiting"]
    assert (entry["run"], entry["owner"], entry["position"]) == (lab.waiter.id, "colleague", 1)
    assert [b["holder_run"] for b in entry["blockers"]] == [lab.holder.id, lab.holder.id]
    assert dt.datetime.fromisoformat(entry["estimated_start"]) > dt.datetime.fromisoformat(entry["queued_at"])
    rows = {d["name"]: d for d in body["devices"]}
    assert rows["dev-a"]["holder"]["owner"] == "researcher"
    assert rows["dev-a"]["holder"]["run"] == lab.holder.id
    assert rows["dev-a"]["waiting"] == [lab.waiter_round.id]


def test_the_queue_needs_credentials():
    response = APIClient().get("/api/queue/")
    assert response.status_code in (401, 403) and response.json()["message"]


def test_a_waiting_run_shows_its_place_in_the_queue_and_others_do_not(lab):
    colleague = _api_for(lab.colleague)

    waiting = colleague.get(f"/api/runs/{lab.waiter.id}/").json()
    holding = _api_for(lab.owner).get(f"/api/runs/{lab.holder.id}/").json()

    assert waiting["queue"]["position"] == 1
    assert waiting["queue"]["blockers"][0]["holder_owner"] == "researcher"
    assert waiting["priority"] == 0 and waiting["pool"] is None
    assert holding["queue"] is None


def test_a_list_of_runs_reads_the_queue_once(lab, django_assert_max_num_queries):
    from tests.controlplane.queue_world import queued_round, running_run

    for _ in range(5):
        queued_round(running_run(lab.waiter.experiment), queued_at=lab.now)
    colleague = _api_for(lab.colleague)
    with django_assert_max_num_queries(40) as few:
        colleague.get("/api/runs/?limit=1")
    with django_assert_max_num_queries(len(few.captured_queries) + 2):
        body = colleague.get("/api/runs/").json()
    assert sum(1 for r in body["results"] if r["queue"]) == 6


def test_pausing_a_device_is_for_lab_admins_only(lab):
    device = lab.devices[0]

    response = _api_for(lab.owner).post(f"/api/devices/{device.id}/pause/", {"reason": "mine"}, format="json")

    assert response.status_code == 403
    assert response.json() == {"message": "only a lab admin (a staff user) may do this", "errors": {}}
    assert _api_for(lab.owner).post(f"/api/devices/{device.id}/resume/", {}, format="json").status_code == 403
    assert not Device.objects.get(id=device.id).paused


def test_an_admin_pauses_and_resumes_a_device(lab, admin_api):
    device = lab.devices[1]

    paused = admin_api.post(f"/api/devices/{device.id}/pause/", {"reason": "new fan"}, format="json")
    queue = admin_api.get("/api/queue/").json()
    resumed = admin_api.post(f"/api/devices/{device.id}/resume/", {}, format="json")

    assert paused.status_code == 200, paused.json()
    assert (paused.json()["paused"], paused.json()["paused_reason"]) == (True, "new fan")
    row = next(d for d in queue["devices"] if d["name"] == "dev-b")
    assert (row["paused"], row["paused_reason"]) == (True, "new fan")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False


def test_pause_refuses_unknown_fields_and_a_long_reason_naming_them(lab, admin_api):
    device = lab.devices[0]
    unknown = admin_api.post(f"/api/devices/{device.id}/pause/", {"why": "x"}, format="json")
    long = admin_api.post(f"/api/devices/{device.id}/pause/", {"reason": "x" * 201}, format="json")
    missing = admin_api.post("/api/devices/999999/pause/", {}, format="json")

    assert unknown.status_code == 400 and "why" in unknown.json()["errors"]
    assert long.status_code == 400 and long.json()["message"].startswith("reason")
    assert missing.status_code == 404


def test_an_admin_creates_a_pool_by_device_names_and_ids_and_everyone_reads_it(lab, admin_api):
    a, b = lab.devices

    created = admin_api.post(
        "/api/pools/", {"name": "cpu-pool", "description": "the cpus", "devices": ["dev-a", b.id]}, format="json"
    )
    listed = _api_for(lab.colleague).get("/api/pools/").json()

    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["name"], body["description"], body["devices"], body["device_names"], body["runs"]) == (
        "cpu-pool",
        "the cpus",
        [a.id, b.id],
        ["dev-a", "dev-b"],
        0,
    )
    assert [p["name"] for p in listed["results"]] == ["cpu-pool"]
    assert set(Device.objects.filter(pool__name="cpu-pool").values_list("name", flat=True)) == {"dev-a", "dev-b"}


def test_only_admins_change_pools(lab):
    pool = DevicePool.objects.create(name="p")
    researcher = _api_for(lab.owner)

    created = researcher.post("/api/pools/", {"name": "q"}, format="json")
    changed = researcher.patch(f"/api/pools/{pool.id}/", {"devices": ["dev-a"]}, format="json")

    assert (created.status_code, changed.status_code) == (403, 403)
    assert researcher.get(f"/api/pools/{pool.id}/").status_code == 200


def test_a_pool_with_an_unknown_device_is_a_400_naming_devices(lab, admin_api):
    response = admin_api.post("/api/pools/", {"name": "p", "devices": ["dev-a", "dev-zz"]}, format="json")
    wrong_type = admin_api.post("/api/pools/", {"name": "p", "devices": [True]}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == {"devices": ["devices: no device dev-zz"]}
    assert wrong_type.status_code == 400 and "devices[0]" in wrong_type.json()["errors"]
    assert not DevicePool.objects.exists()


def test_an_admin_changes_a_pools_devices_but_not_its_name(lab, admin_api):
    pool = DevicePool.objects.create(name="p")

    changed = admin_api.patch(f"/api/pools/{pool.id}/", {"devices": ["dev-b"]}, format="json")
    renamed = admin_api.patch(f"/api/pools/{pool.id}/", {"name": "other"}, format="json")

    assert changed.status_code == 200, changed.json()
    assert changed.json()["device_names"] == ["dev-b"]
    assert renamed.status_code == 400
    assert renamed.json()["errors"] == {"name": ["a pool's name cannot change: runs name it"]}


def test_a_run_launched_on_a_pool_with_a_priority(lab, admin_api, django_capture_on_commit_callbacks):
    pool = DevicePool.objects.create(name="cpu-pool")
    Device.objects.filter(id__in=[d.id for d in lab.devices]).update(pool=pool)
    researcher = _api_for(lab.owner)

    with django_capture_on_commit_callbacks(execute=False):
        by_name = researcher.post(
            f"/api/experiments/{lab.holder.experiment_id}/runs/",
            {"strategy": "sharing", "pool": "cpu-pool", "priority": 3},
            format="json",
        )
        by_id = researcher.post(
            f"/api/experiments/{lab.holder.experiment_id}/runs/",
            {"strategy": "sharing", "pool": pool.id},
            format="json",
        )

    assert by_name.status_code == 201, by_name.json()
    assert (by_name.json()["pool"], by_name.json()["priority"]) == (pool.id, 3)
    assert Run.objects.get(id=by_id.json()["id"]).pool_id == pool.id


def test_a_run_with_a_bad_pool_or_priority_is_a_400_naming_it(lab):
    researcher = _api_for(lab.owner)
    url = f"/api/experiments/{lab.holder.experiment_id}/runs/"

    no_pool = researcher.post(url, {"strategy": "sharing", "pool": "nowhere"}, format="json")
    bad_type = researcher.post(url, {"strategy": "sharing", "pool": 1.5}, format="json")
    too_high = researcher.post(url, {"strategy": "sharing", "priority": 11}, format="json")

    assert no_pool.status_code == 400 and list(no_pool.json()["errors"]) == ["pool"]
    assert bad_type.status_code == 400 and list(bad_type.json()["errors"]) == ["pool"]
    assert too_high.status_code == 400
    assert too_high.json()["errors"] == {"priority": ["must be at most 10: allowed -10 to 10"]}


def test_a_comparison_places_every_run_in_its_pool_with_its_priority(
    lab, predictor, django_capture_on_commit_callbacks
):
    pool = DevicePool.objects.create(name="cpu-pool")
    Device.objects.filter(id__in=[d.id for d in lab.devices]).update(pool=pool)
    researcher = _api_for(lab.owner)
    url = f"/api/experiments/{lab.holder.experiment_id}/compare/"

    with django_capture_on_commit_callbacks(execute=False):
        made = researcher.post(
            url, {"strategies": ["temporal", "sharing"], "pool": "cpu-pool", "priority": -2}, format="json"
        )
    bad = researcher.post(url, {"strategies": ["temporal", "sharing"], "pool": "nowhere"}, format="json")

    assert made.status_code == 201, made.json()
    runs = Run.objects.filter(comparison_id=made.json()["id"])
    assert runs.count() == 2 and {(r.pool_id, r.priority) for r in runs} == {(pool.id, -2)}
    assert bad.status_code == 400 and list(bad.json()["errors"]) == ["pool"]


def test_a_comparison_of_baselines_needs_no_predictor_and_a_planned_one_names_strategies(
    lab, django_capture_on_commit_callbacks
):
    researcher = _api_for(lab.owner)
    url = f"/api/experiments/{lab.holder.experiment_id}/compare/"

    planned = researcher.post(url, {"strategies": ["temporal", "vres_sync"]}, format="json")
    with django_capture_on_commit_callbacks(execute=False):
        baselines = researcher.post(url, {"strategies": ["temporal", "sharing"]}, format="json")

    assert baselines.status_code == 201, baselines.json()
    assert planned.status_code == 400 and list(planned.json()["errors"]) == ["strategies"]
    assert "no fitted throughput predictor" in planned.json()["message"]


def test_changing_a_pool_answers_with_warnings_for_the_running_runs_that_lose_devices(lab, admin_api):
    pool = DevicePool.objects.create(name="cpu-pool")
    Device.objects.filter(id__in=[d.id for d in lab.devices]).update(pool=pool)
    Run.objects.filter(id=lab.waiter.id).update(pool=pool)

    changed = admin_api.patch(f"/api/pools/{pool.id}/", {"devices": [lab.devices[1].name]}, format="json")
    again = admin_api.patch(f"/api/pools/{pool.id}/", {"devices": [lab.devices[1].name]}, format="json")

    assert changed.status_code == 200, changed.json()
    [line] = changed.json()["warnings"]
    assert line.startswith(f"run {lab.waiter.id} (colleague) on pool cpu-pool loses {lab.devices[0].name}")
    assert again.json()["warnings"] == []


def test_an_admin_deletes_a_pool_no_run_names_and_only_an_admin(lab, admin_api):
    empty = DevicePool.objects.create(name="empty")
    named = DevicePool.objects.create(name="named")
    Run.objects.filter(id=lab.waiter.id).update(pool=named)

    refused = _api_for(lab.owner).delete(f"/api/pools/{empty.id}/")
    deleted = admin_api.delete(f"/api/pools/{empty.id}/")
    kept = admin_api.delete(f"/api/pools/{named.id}/")

    assert refused.status_code == 403 and deleted.status_code == 204
    assert not DevicePool.objects.filter(id=empty.id).exists()
    assert kept.status_code == 409 and list(kept.json()["errors"]) == ["pool"]
    assert f"named by runs {lab.waiter.id}" in kept.json()["message"]


def test_the_schema_documents_the_lab_operations(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    for path in ("/api/queue/", "/api/pools/", "/api/pools/{id}/", "/api/devices/{id}/pause/"):
        assert path in schema["paths"], path
    assert "403" in schema["paths"]["/api/devices/{id}/pause/"]["post"]["responses"]
