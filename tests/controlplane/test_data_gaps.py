"""Devices without data (issue 33, item 5): a partition leaving a device 0 samples of a task, or
of every task, is accepted with warnings — in the API's experiment, after the dashboard's form,
on the experiment page and on each run — and the rounds train each device's tasks with data
only, leaving a device with none out of training (not dispatched)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Round, Run
from controlplane.experiments.selectors import experiment_data_warnings
from controlplane.planning.data_gaps import data_gap_warnings, data_gaps
from tests.controlplane.test_aggregation_resume import (
    begin,
    capture_dispatch,
    device_results,
    global_state,
    trained,
)

pytestmark = pytest.mark.django_db

IDLE = "dev-c holds no data of any task: it is left out of training in every round"
PARTIAL = "dev-b holds 0 samples of t-shufflenet: it trains t-mobilenet only"


def _created_message(n: int) -> str:
    return (
        f"Created, with {n} warning{'s' if n != 1 else ''}: the partition leaves devices without data "
        "(listed below; every run of this experiment carries them)."
    )


@pytest.fixture
def gapped(make_device, make_task):
    """dev-a holds both tasks, dev-b only t-mobilenet, dev-c nothing (explicit counts)."""
    devices = [make_device("dev-a"), make_device("dev-b"), make_device("dev-c")]
    tasks = [make_task("t-mobilenet", "mobilenet_v3_small"), make_task("t-shufflenet", "shufflenet_v2_x1_0")]
    counts = [
        {"device": devices[0].id, "task": tasks[0].id, "num_samples": 30},
        {"device": devices[0].id, "task": tasks[1].id, "num_samples": 20},
        {"device": devices[1].id, "task": tasks[0].id, "num_samples": 10},
    ]
    return devices, tasks, counts


def test_the_warnings_name_each_gap_and_count_past_the_limit():
    shards = [(f"d{k:02d}", t, 0 if (k < 5 and t == "y") or k >= 7 else 5) for k in range(10) for t in ("x", "y")]

    gaps = data_gaps(shards)
    lines = data_gap_warnings(gaps, limit=3)

    assert gaps.idle == ("d07", "d08", "d09") and list(gaps.partial) == ["d00", "d01", "d02", "d03", "d04"]
    assert lines == [
        "d00 holds 0 samples of y: it trains x only",
        "d01 holds 0 samples of y: it trains x only",
        "d02 holds 0 samples of y: it trains x only",
        "2 more devices hold 0 samples of some task: each trains only the tasks it holds",
        "d07, d08, d09 hold no data of any task: they are left out of training in every round",
    ]
    assert data_gap_warnings(data_gaps([("a", "x", 3), ("a", "y", 1)])) == []


def test_the_api_creates_the_experiment_with_its_warnings(api, gapped):
    devices, tasks, counts = gapped
    body = {
        "name": "gaps",
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": 1,
        "partition_rule": "explicit",
        "sample_counts": counts,
    }

    created = api.post("/api/experiments/", body, format="json")

    assert created.status_code == 201, created.content
    assert created.json()["warnings"] == [PARTIAL, IDLE]
    assert api.get(f"/api/experiments/{created.json()['id']}/").json()["warnings"] == [PARTIAL, IDLE]
    listed = api.get("/api/experiments/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert next(r for r in rows if r["name"] == "gaps")["warnings"] == [PARTIAL, IDLE]


def test_an_experiment_whose_devices_all_hold_data_has_no_warnings(api, make_experiment):
    experiment = make_experiment(name="full")
    assert api.get(f"/api/experiments/{experiment.id}/").json()["warnings"] == []


def test_the_experiment_page_shows_the_warnings_near_the_top(browser_client, make_experiment, gapped):
    devices, tasks, counts = gapped
    experiment = make_experiment(devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", name="gaps")

    html = browser_client.get(f"/experiments/{experiment.id}/").content.decode()

    box = html[html.index('id="data-warnings"') : html.index("</section>", html.index('id="data-warnings"'))]
    assert PARTIAL in box and IDLE in box
    assert html.index('id="data-warnings"') < html.index('id="launch-run"')


def test_the_form_says_after_creating_which_devices_lack_data(browser_client, make_device, make_task):
    devices = [make_device(f"dev-{k}") for k in range(4)]
    tasks = [make_task("t-mobilenet", "mobilenet_v3_small")]
    form = {
        "name": "skewed",
        "description": "",
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": "1",
        "local_epochs": "1",
        "partition_rule": "quantity",
        "partition-quantity-alpha": "0.05",  # a Dirichlet this peaked leaves some of 4 devices nothing
        "seed": "1",
    }

    response = browser_client.post("/experiments/new/", form)

    assert response.status_code == 302, response.content.decode()[:3000]
    from controlplane.experiments.models import Experiment

    expected = experiment_data_warnings(Experiment.objects.get(name="skewed"))
    assert expected and any("no data of any task" in w for w in expected)
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert shown == [_created_message(len(expected))]


def test_a_device_without_data_is_left_out_with_the_reason_and_the_rest_train(
    browser_client, make_experiment, gapped, monkeypatch, django_capture_on_commit_callbacks
):
    sent = capture_dispatch(monkeypatch)
    devices, tasks, counts = gapped
    experiment = make_experiment(devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", rounds=1)

    with django_capture_on_commit_callbacks(execute=True):
        run = begin(experiment)
    rnd = Round.objects.get(run=run, index=0)
    updates = {
        (device, task): trained(global_state(run, task, None), seed=k)
        for k, (device, task) in enumerate(
            [("dev-a", "t-mobilenet"), ("dev-a", "t-shufflenet"), ("dev-b", "t-mobilenet")]
        )
    }
    services.round_record(round_id=rnd.id, results=device_results(rnd, updates))

    run.refresh_from_db()
    assert run.warnings[:2] == [PARTIAL, IDLE]
    # dev-c was dispatched nothing; dev-b trained its one task; every device with data trained
    dispatched = {r.device: [a.task.name for a in r.assignments] for _, requests in sent["round"] for r in requests}
    assert dispatched == {"dev-a": ["t-mobilenet", "t-shufflenet"], "dev-b": ["t-mobilenet"]}
    trained_rows = set(Assignment.objects.filter(round=rnd).values_list("device__name", "task__name", "status"))
    assert trained_rows == {
        ("dev-a", "t-mobilenet", "succeeded"),
        ("dev-a", "t-shufflenet", "succeeded"),
        ("dev-b", "t-mobilenet", "succeeded"),
    }
    assert run.status == Run.Status.SUCCEEDED
    # the round's participants are the devices holding data: the lab leases (and waits for) those only
    assert rnd.participants == sorted(d.id for d in devices[:2])
    html = browser_client.get(f"/runs/{run.id}/").content.decode()
    box = html[html.index('id="run-warnings"') : html.index("</section>", html.index('id="run-warnings"'))]
    assert IDLE in box and PARTIAL in box
    live = browser_client.get(f"/runs/{run.id}/live/").json()
    assert live["rounds"][0]["participants"]["count"] == 2 and live["rounds"][0]["participants"]["of"] == 3


def test_mtfl_create_experiment_prints_the_warnings_under_its_data_table(make_device, capsys):
    from django.core.management import call_command

    from controlplane.experiments.models import Experiment

    for name in ("dev-a", "dev-b", "dev-c"):
        make_device(name)

    # Dirichlet volumes this peaked leave some device nothing of some task (seed 0)
    call_command("create_experiment", template="light", devices="dev-a,dev-b,dev-c", alpha="0.01")

    expected = experiment_data_warnings(Experiment.objects.get())
    out = capsys.readouterr().out
    assert expected
    for warning in expected:
        assert f"warning: {warning}" in " ".join(out.split())


def test_the_template_form_says_after_creating_which_devices_lack_data(browser_client, make_device):
    from controlplane.experiments.models import Experiment

    devices = [make_device(f"dev-{k:02d}") for k in range(12)]

    # the template's Dirichlet volumes over 12 devices leave some device nothing of some task (seed 0)
    response = browser_client.post(
        "/experiments/from-template/", {"template": "light", "devices": [d.id for d in devices], "name": ""}
    )

    assert response.status_code == 302, response.content.decode()[:3000]
    expected = experiment_data_warnings(Experiment.objects.get())
    assert expected
    assert [str(m) for m in get_messages(response.wsgi_request)] == [_created_message(len(expected))]
