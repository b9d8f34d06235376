"""The lab on the dashboard (issue 24, item 3): the queue page (who holds each device, who waits,
estimated starts, the policy; pause and resume for admins) and the run page of a run whose
round waits (its banner, each round's queued time)."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from controlplane.dashboard.data import queue_banner
from controlplane.experiments.models import Round
from controlplane.fleet.models import Device
from tests.controlplane.queue_world import two_researchers

pytestmark = pytest.mark.django_db


@pytest.fixture
def lab(make_experiment, make_device, user):
    return two_researchers(make_experiment, make_device, user, now=timezone.now())


@pytest.fixture
def colleague_client(client, lab):
    client.force_login(lab.colleague)
    return client


@pytest.fixture
def admin_client(client, lab):
    client.force_login(get_user_model().objects.create_user("lab-admin", password="x-pass-123", is_staff=True))
    return client


def _live(html: str) -> dict:
    match = re.search(r'<script id="run-live" type="application/json">(.*?)</script>', html, re.S)
    assert match
    return json.loads(match.group(1))


def test_the_nav_links_the_queue_page(browser_client, lab):
    html = browser_client.get("/").content.decode()
    assert 'href="/queue/"' in html


def test_the_queue_page_shows_each_devices_holder_and_the_waiting_round(colleague_client, lab):
    response = colleague_client.get("/queue/")

    assert response.status_code == 200
    html = response.content.decode()
    row = re.search(r'<tr id="queue-device-dev-a">(.*?)</tr>', html, re.S).group(1)
    assert f"run {lab.holder.id}</a>" not in row  # not the colleague's run: no link to a page they cannot see
    assert f"run {lab.holder.id} · sharing on mine · round 0 · <strong>researcher</strong>" in row
    assert '<span class="badge running">held</span>' in row
    waiting = re.search(rf'<tr id="queue-round-{lab.waiter_round.id}">(.*?)</tr>', html, re.S).group(1)
    assert f'<a href="/runs/{lab.waiter.id}/">run {lab.waiter.id}</a>' in waiting  # their own run
    assert "<strong>colleague</strong>" in waiting
    assert f'dev-a <span class="muted">held by run {lab.holder.id} (researcher)' in waiting
    assert 'id="queue-policy"' in html and "MTFL_SCHEDULER_POLICY" in html
    assert "js/queue_live.js" in html and 'data-url="/queue/tables/"' in html


def test_the_queue_tables_refresh_alone_and_researchers_get_no_admin_buttons(colleague_client, lab):
    response = colleague_client.get("/queue/tables/")

    html = response.content.decode()
    assert response.status_code == 200
    assert 'id="queue-devices"' in html and "<html" not in html
    assert "Pause" not in html and "/pause/" not in html


def test_an_admin_pauses_a_device_from_the_queue_page_and_resumes_it(admin_client, lab):
    page = admin_client.get("/queue/").content.decode()
    assert f'action="/devices/{lab.devices[0].id}/pause/"' in page

    paused = admin_client.post(f"/devices/{lab.devices[0].id}/pause/", {"reason": "memory test"}, follow=True)
    html = paused.content.decode()
    row = re.search(r'<tr id="queue-device-dev-a">(.*?)</tr>', html, re.S).group(1)
    assert '<span class="badge paused">paused</span>' in row and "memory test" in row
    assert "dev-a is paused" in html
    assert Device.objects.get(id=lab.devices[0].id).paused_reason == "memory test"

    admin_client.post(f"/devices/{lab.devices[0].id}/resume/")
    assert not Device.objects.get(id=lab.devices[0].id).paused


def test_a_researcher_cannot_pause_a_device(colleague_client, lab):
    response = colleague_client.post(f"/devices/{lab.devices[0].id}/pause/", {"reason": "mine now"})

    assert response.status_code == 403
    assert not Device.objects.get(id=lab.devices[0].id).paused


def test_the_waiting_runs_page_says_what_it_waits_for_and_when_it_should_start(colleague_client, lab):
    html = colleague_client.get(f"/runs/{lab.waiter.id}/").content.decode()

    banner = re.search(r'<p class="queue-banner" id="queue-banner" role="status">(.*?)</p>', html, re.S).group(1)
    assert banner.startswith(f"queued: waiting for dev-a and dev-b held by run {lab.holder.id} (researcher) since ")
    text = banner.split(" <a href")[0]
    assert re.search(r"since \d\d:\d\d:\d\d \(\d+ s ago\), estimated start \d\d:\d\d:\d\d \(in \d+ s\)$", text), text
    live = _live(html)
    assert live["queue_banner"] == text.strip()
    assert live["rounds"][0]["status"] == "queued"


def test_a_running_runs_page_has_no_banner_and_each_round_its_queued_time(browser_client, lab):
    Round.objects.filter(id=lab.holder_round.id).update(queue_s=12.5)

    html = browser_client.get(f"/runs/{lab.holder.id}/").content.decode()

    assert '<p class="queue-banner" id="queue-banner" role="status" hidden>' in html
    live = _live(html)
    assert live["queue_banner"] is None
    assert live["rounds"][0]["queue_s"] == 12.5
    assert "<th title=\"seconds the round waited in the lab's queue" in html


def test_the_run_live_json_carries_the_banner_while_the_round_waits(colleague_client, lab):
    body = colleague_client.get(f"/runs/{lab.waiter.id}/live/").json()

    assert body["queue_banner"].startswith("queued: waiting for dev-a")


def test_the_banner_names_the_blockers_of_other_holders_by_count():
    now = dt.datetime(2026, 12, 4, 13, 0, tzinfo=dt.UTC)
    since = now - dt.timedelta(minutes=3)
    held = {"paused": False, "holder_owner": "alice", "since": since}
    entry = {
        "position": 1,
        "blockers": [
            {"device": "gpu-b", "holder_run": 7, **held},
            {"device": "gpu-a", "holder_run": 7, **held},
            {"device": "gpu-c", "holder_run": 9, **held},
        ],
        "blockers_count": 4,
        "estimated_start": now + dt.timedelta(minutes=5),
    }

    assert queue_banner(entry, now=now) == (
        "queued: waiting for gpu-a and gpu-b held by run 7 (alice) since 12:57:00 (3 min ago) (and 2 more devices), "
        "estimated start 13:05:00 (in 5 min)"
    )


def test_the_banner_names_a_paused_device_and_says_there_is_no_estimate():
    now = dt.datetime(2026, 12, 4, 13, 0, tzinfo=dt.UTC)
    entry = {
        "position": 2,
        "blockers": [{"device": "gpu-1", "paused": True, "holder_run": None, "holder_owner": None, "since": None}],
        "blockers_count": 1,
        "estimated_start": None,
    }

    assert queue_banner(entry, now=now) == (
        "queued: waiting for gpu-1, paused by a lab admin, no estimated start while a device it needs is paused"
    )
    entry["blockers"], entry["blockers_count"] = [], 0
    entry["estimated_start"] = now + dt.timedelta(seconds=1)
    assert queue_banner(entry, now=now) == (
        "queued: position 2 in the queue, its devices free at the next scheduling pass, "
        "estimated start 13:00:01 (in 1 s)"
    )


def test_the_banner_gives_a_pause_its_reason_and_names_a_profiling_sweep():
    now = dt.datetime(2026, 12, 4, 13, 0, tzinfo=dt.UTC)
    paused = {"device": "gpu-1", "paused": True, "paused_reason": "driver update", "holder_run": None}
    profiling = {
        "device": "gpu-2",
        "paused": False,
        "holder_run": None,
        "profiling_sweep": 9,
        "since": now - dt.timedelta(seconds=30),
    }
    entry = {"position": 1, "blockers": [paused], "blockers_count": 1, "estimated_start": None}

    assert queue_banner(entry, now=now).startswith("queued: waiting for gpu-1, paused by a lab admin (driver update),")
    entry.update(blockers=[profiling], estimated_start=now + dt.timedelta(seconds=90))
    assert queue_banner(entry, now=now) == (
        "queued: waiting for gpu-2, being profiled (sweep 9) since 12:59:30 (30 s ago), "
        "estimated start 13:01:30 (in 90 s)"
    )


def test_a_queued_round_has_its_own_badge_colour():
    from pathlib import Path

    css = Path(__file__).resolve().parents[2].joinpath("frontend/css/app.css").read_text()
    assert ".badge.queued {" in css
