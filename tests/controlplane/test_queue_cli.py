"""The lab's commands (issue 24, item 3): ``mtfl queue`` (text and ``--json``), ``mtfl
device-pause`` / ``device-resume`` and ``mtfl pool``, with one-line errors."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from controlplane.fleet.models import Device, DevicePool
from tests.controlplane.queue_world import two_researchers
from tests.controlplane.test_cli import _mtfl

pytestmark = pytest.mark.django_db


def _call(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def lab(make_experiment, make_device, user):
    return two_researchers(make_experiment, make_device, user, now=timezone.now())


def test_queue_prints_each_devices_holder_and_the_waiting_rounds_in_order(lab):
    text = _call("queue")

    lines = text.splitlines()
    assert lines[0].startswith("Policy: ")
    assert "1 round(s) waiting · 2 of 2 device(s) held · 0 paused" in text
    dev_a = next(line for line in lines if line.strip().startswith("dev-a"))
    assert "held" in dev_a and f"run {lab.holder.id} sharing (researcher) round 0" in dev_a
    waiting = next(line for line in lines if line.startswith("  1 "))
    assert f"run {lab.waiter.id} sharing" in waiting and "colleague" in waiting
    assert f"dev-a (run {lab.holder.id}, researcher)" in waiting


def test_queue_names_a_profiling_sweep_that_holds_up_a_round(lab):
    from controlplane.experiments.models import Round
    from controlplane.lab.models import DeviceLease
    from controlplane.profiling.models import ProfileSweep

    DeviceLease.objects.update(released_at=timezone.now())
    Round.objects.filter(id=lab.holder_round.id).update(status=Round.Status.SUCCEEDED)
    sweep = ProfileSweep.objects.create(device=lab.devices[1], backend="cpu", budget_s=60, request={})

    lines = _call("queue").splitlines()

    dev_b = next(line for line in lines if line.strip().startswith("dev-b"))
    assert "profiling" in dev_b and f"profiling sweep {sweep.id}" in dev_b
    waiting = next(line for line in lines if line.startswith("  1 "))
    assert f"dev-b (profiling sweep {sweep.id})" in waiting


def test_queue_json_is_the_apis_body(lab, api):
    body = json.loads(_call("queue", "--json"))

    api_body = api.get("/api/queue/").json()
    assert body["waiting"][0]["run"] == lab.waiter.id
    for answer in (body, api_body):  # what moves with the clock
        answer.pop("now")
        for w in answer["waiting"]:
            w.pop("waited_s")
    assert body == api_body


def test_an_empty_queue_says_so(db):
    text = _call("queue")

    assert "none: every device is free" in text and "0 round(s) waiting" in text


def test_device_pause_and_resume_by_name(lab):
    paused = _call("device_pause", "dev-a", "--reason", "driver update")
    shown = _call("queue")
    resumed = _call("device_resume", "dev-a")

    assert paused.strip() == "paused dev-a (driver update): no new round gets it until `mtfl device-resume dev-a`"
    assert "paused (driver update)" in shown
    assert resumed.strip() == "resumed dev-a"
    assert not Device.objects.get(name="dev-a").paused


def test_pausing_twice_keeps_the_first_reason_and_time_and_resuming_a_running_device_says_so(lab):
    _call("device_pause", "dev-a", "--reason", "driver update")
    first = Device.objects.get(name="dev-a")
    _call("device_pause", "dev-a")
    again = Device.objects.get(name="dev-a")
    _call("device_resume", "dev-a")

    assert (again.paused_reason, again.paused_at) == ("driver update", first.paused_at)
    assert _call("device_resume", "dev-a").strip() == "dev-a was not paused: nothing to resume"


def test_an_unknown_device_is_one_line_naming_the_known_ones(lab):
    with pytest.raises(CommandError) as err:
        _call("device_pause", "dev-z")
    assert str(err.value) == "no device named 'dev-z'; devices: dev-a, dev-b"


def test_taking_a_device_from_a_pool_warns_of_the_running_runs_that_lose_it(lab):
    from controlplane.experiments.models import Run

    _call("pool", "create", "cpus", "--devices", "dev-a,dev-b")
    Run.objects.filter(id=lab.waiter.id).update(pool=DevicePool.objects.get(name="cpus"))

    changed = _call("pool", "set", "cpus", "--devices", "dev-b")
    moved = _call("pool", "create", "other", "--devices", "dev-b")

    assert f"warning: run {lab.waiter.id} (colleague) on pool cpus loses dev-a:" in changed
    assert f"warning: run {lab.waiter.id} (colleague) on pool cpus loses dev-b:" in moved
    assert "warning" not in _call("pool", "set", "other", "--devices", "dev-b")


def test_pool_delete_removes_a_pool_no_run_names(lab):
    _call("pool", "create", "spare", "--devices", "dev-a")

    assert _call("pool", "delete", "spare").strip() == "deleted pool spare"
    assert Device.objects.get(name="dev-a").pool is None
    with pytest.raises(CommandError) as err:
        _call("pool", "delete", "spare")
    assert "spare" in str(err.value)


def test_pool_create_list_and_set(lab):
    created = _call("pool", "create", "cpus", "--devices", "dev-a,dev-b", "--description", "the cpu hosts")
    changed = _call("pool", "set", "cpus", "--devices", "dev-b")
    listed = _call("pool", "list")

    assert created.strip() == "created pool cpus with 2 device(s)"
    assert changed.strip() == "pool cpus now has 1 device(s)"
    assert listed.strip() == "cpus — the cpu hosts: 1 device(s) dev-b; 0 run(s) name it"
    assert list(DevicePool.objects.get(name="cpus").devices.values_list("name", flat=True)) == ["dev-b"]


@pytest.mark.parametrize(
    "args,message",
    [
        (("pool", "drop", "x"), "action 'drop' is not allowed; allowed: list, create, set, delete"),
        (("pool", "create"), "mtfl pool create needs the pool's name"),
        (("pool", "create", "p"), "mtfl pool create needs --devices: comma-separated device names"),
        (("pool", "create", "p", "--devices", "dev-a,dev-a"), "--devices lists 'dev-a' more than once"),
        (("pool", "create", "p", "--devices", "dev-q"), "--devices: no device dev-q"),
        (("pool", "set", "nope", "--devices", "dev-a"), "no device pool 'nope'; pools: none"),
    ],
)
def test_pool_bad_input_is_one_line(lab, args, message):
    with pytest.raises(CommandError) as err:
        _call(*args)
    assert str(err.value) == message


def test_queue_on_a_new_home_is_one_line_without_traceback(tmp_path):
    out = _mtfl("queue", env_extra={"MTFL_HOME": str(tmp_path)})

    assert out.returncode != 0
    assert "cannot read the queue from the database" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
