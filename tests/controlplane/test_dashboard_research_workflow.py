"""The whole research workflow in the dashboard (issue 33, item 4): profile a device and follow the
sweep, fit a predictor and follow the fit, compare chosen strategies with repeats, targets,
objective and aggregator, and launch a ``manual`` plan typed into a table. Each form starts the
same service as the API and the CLI, and answers bad input with 400 and every field named at
once (item 5): the serializer's refusals and then the service's, asked again past each one."""

from __future__ import annotations

import re
from html import escape, unescape

import pytest

from controlplane.celery import app as celery_app
from controlplane.experiments.models import Comparison, Experiment, Run
from controlplane.profiling.models import Predictor, ProfileSweep
from controlplane.profiling.services import profile_done, profile_record
from tests.controlplane.contention_law import store_synthetic_samples
from workers.protocol.queues import CONTROL_QUEUE, TaskName, device_queue

pytestmark = pytest.mark.django_db


def _queued(queue_name: str) -> list[tuple[str, list]]:
    """Drain a queue of the in-memory broker: ``[(task name, args)]``."""
    out = []
    with celery_app.connection_for_write() as conn:
        queue = conn.SimpleQueue(queue_name)
        while True:
            try:
                message = queue.get(block=True, timeout=0.2)
            except queue.Empty:
                break
            out.append((message.headers["task"], message.payload[0]))
            message.ack()
        queue.close()
    return out


def _field_errors(response) -> dict[str, list[str]]:
    """The messages under each field of the page's forms: ``{field id: [message]}``."""
    html = response.content.decode()
    out: dict[str, list[str]] = {}
    for match in re.finditer(r'<(label|fieldset) class="[^"]*" id="field-([\w-]+)">(.*?)</\1>', html, re.S):
        messages = [unescape(m) for m in re.findall(r'<span class="error">(.*?)</span>', match.group(3), re.S)]
        if messages:
            out[match.group(2)] = messages
    return out


# ---------------------------------------------------------------------------- every error at once


def test_the_experiment_form_shows_three_bad_fields_at_once(browser_client, make_device, make_task):
    device, task = make_device("dev-a"), make_task("t1")
    response = browser_client.post(
        "/experiments/new/",
        {
            "name": "three-bad",
            "tasks": [task.id],
            "devices": [device.id],
            "rounds": "0",  # the serializer's refusal
            "partition_rule": "iid",
            "aggregation": "fedprox",
            "aggregation-fedprox-mu": "-1",  # the service's first refusal
            "client_fraction": "5",  # the service's next one, past the first
        },
    )
    assert response.status_code == 400
    errors = _field_errors(response)
    assert set(errors) == {"rounds", "aggregation-fedprox-mu", "client_fraction"}, errors
    assert "allowed 1 to 10000" in errors["rounds"][0]
    assert "mu" in errors["aggregation-fedprox-mu"][0]
    assert "client_fraction" in errors["client_fraction"][0] and "(0, 1]" in errors["client_fraction"][0]
    assert not Experiment.objects.exists()


def test_the_run_form_checks_the_rest_when_the_aggregator_parameters_are_malformed(browser_client, make_experiment):
    experiment = make_experiment()
    response = browser_client.post(
        f"/experiments/{experiment.id}/runs/",
        {"strategy": "sharing", "objective": "best", "aggregation": "nope", "aggregation_params": "oops"},
    )
    assert response.status_code == 400
    errors = _field_errors(response)
    assert set(errors) == {"objective", "aggregation", "aggregation_params"}, errors
    assert "NAME=VALUE" in errors["aggregation_params"][0]
    assert not Run.objects.exists()


# ------------------------------------------------------------------------------------ profiling


def test_profiling_a_device_starts_the_sweep_and_follows_it(
    browser_client, make_device, make_task, django_capture_on_commit_callbacks
):
    device = make_device("dev-a")
    task = make_task("t1", "mobilenet_v3_small")
    page = browser_client.get(f"/profiling/new/?device={device.id}").content.decode()
    assert f'<option value="{device.id}" selected>' in page and 'id="profile-button"' in page
    _queued(device_queue("dev-a"))
    with django_capture_on_commit_callbacks(execute=True):
        response = browser_client.post(
            "/profiling/new/", {"device": str(device.id), "budget_s": "30", "tasks": [task.id]}
        )
    sweep = ProfileSweep.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/profiling/sweeps/{sweep.id}/"
    assert sweep.budget_s == 30 and sweep.request["architectures"] == ["mobilenet_v3_small"]
    assert [name for name, _ in _queued(device_queue("dev-a"))] == [TaskName.PROFILE_SWEEP]
    assert TaskName.PROFILE_SWEEP_WATCHDOG in [name for name, _ in _queued(CONTROL_QUEUE)]

    # While it runs, the page shows its progress and fetches its status part again.
    html = browser_client.get(f"/profiling/sweeps/{sweep.id}/").content.decode()
    assert 'data-finished="false"' in html and "waiting for the agent" in html
    assert f'data-url="/profiling/sweeps/{sweep.id}/status/"' in html
    assert browser_client.get(f"/profiling/sweeps/{sweep.id}/status/").status_code == 200

    # The agent reports a configuration and the end: the page shows what was measured.
    measured = [
        {
            "task_index": i,
            "architecture": "mobilenet_v3_small",
            "batch_size": 32,
            "active_thread_percentage": 50,
            "throughput_sps": 120.0 + i,
            "standalone_sps": 200.0,
        }
        for i in range(2)
    ]
    config = [{"architecture": "mobilenet_v3_small", "batch_size": 32, "active_thread_percentage": 50}] * 2
    result = {"sweep_id": sweep.id, "device": "dev-a", "config_index": 0, "tasks": config, "measurements": measured}
    assert profile_record(result={**result, "started_at": 1.0e9, "finished_at": 1.0e9 + 3, "status": "succeeded"}) == 2
    profile_done(summary={"sweep_id": sweep.id, "device": "dev-a", "status": "succeeded"})
    html = browser_client.get(f"/profiling/sweeps/{sweep.id}/").content.decode()
    assert 'data-finished="true"' in html and 'id="sweep-configurations"' in html
    assert "mobilenet_v3_small + mobilenet_v3_small" in html and "120.0, 121.0" in html
    assert escape("/predictors/new/?backend=cpu&device_class=cpu-2cores") in html


def test_the_profile_form_names_the_budget_the_tasks_and_the_device_at_once(browser_client, make_device):
    never = make_device("dev-never", connected=False)
    response = browser_client.post("/profiling/new/", {"device": str(never.id), "budget_s": "soon", "tasks": ["999"]})
    assert response.status_code == 400
    errors = _field_errors(response)
    assert set(errors) == {"budget_s", "tasks", "device"}, errors
    assert "number" in errors["budget_s"][0]
    assert "no task with id 999" in errors["tasks"][0]
    assert "never connected an agent" in errors["device"][0]
    assert not ProfileSweep.objects.exists()


def test_the_profile_form_refuses_a_budget_out_of_range_and_no_device(browser_client, make_device):
    device = make_device("dev-a")
    response = browser_client.post("/profiling/new/", {"device": str(device.id), "budget_s": "1"})
    assert response.status_code == 400
    assert "budget_s=1 is out of range: allowed 5 to 604800 seconds" in _field_errors(response)["budget_s"][0]
    response = browser_client.post("/profiling/new/", {"device": "", "budget_s": "60"})
    assert response.status_code == 400 and "choose a registered device" in _field_errors(response)["device"][0]
    assert not ProfileSweep.objects.exists()


# ----------------------------------------------------------------------------------- predictors


def test_fitting_a_predictor_from_the_dashboard_queues_the_fit_and_follows_it(
    browser_client, make_device, django_capture_on_commit_callbacks
):
    store_synthetic_samples(make_device("profiled"), n=30)
    page = browser_client.get("/predictors/new/").content.decode()
    # The class profiled last is the default, listed with its sample count.
    assert re.search(r'<option value="cpu-2cores" selected>cpu-2cores \(cpu, \d+ samples\)</option>', page)
    _queued(CONTROL_QUEUE)
    with django_capture_on_commit_callbacks(execute=True):
        response = browser_client.post("/predictors/new/", {"backend": "cpu", "device_class": "cpu-2cores"})
    predictor = Predictor.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/predictors/{predictor.id}/"
    assert _queued(CONTROL_QUEUE) == [(TaskName.PREDICTOR_FIT, [predictor.id])]
    html = browser_client.get(f"/predictors/{predictor.id}/").content.decode()
    assert 'id="predictor-fitting"' in html and "fitting" in html


def test_the_predictor_form_names_the_backend_and_the_device_class(browser_client, make_device):
    store_synthetic_samples(make_device("profiled"), n=10)
    response = browser_client.post("/predictors/new/", {"backend": "warp-drive", "device_class": "cpu-64cores"})
    assert response.status_code == 400
    errors = _field_errors(response)
    assert set(errors) == {"backend", "device_class"}, errors
    assert "allowed: " in errors["backend"][0] and "cpu" in errors["backend"][0]
    assert "device_class 'cpu-64cores' has no samples; allowed: cpu-2cores" in errors["device_class"][0]
    assert not Predictor.objects.exists()


def test_the_predictor_form_without_samples_says_to_profile_first(browser_client):
    assert 'id="no-samples"' in browser_client.get("/predictors/new/").content.decode()
    response = browser_client.post("/predictors/new/", {"backend": "cpu"})
    assert response.status_code == 409
    assert "no profile samples for backend 'cpu' yet" in _field_errors(response)["backend"][0]


# ----------------------------------------------------------------------------------- comparisons


def test_comparing_chosen_strategies_with_repeats_targets_and_objective(
    browser_client, make_experiment, predictor, django_capture_on_commit_callbacks
):
    experiment = make_experiment()
    task = experiment.tasks.order_by("id").first()
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert 'id="compare-form"' in page and f'name="target-{task.id}"' in page
    assert "temporal (the baseline: required)" in page
    _queued(CONTROL_QUEUE)
    with django_capture_on_commit_callbacks(execute=True):
        response = browser_client.post(
            f"/experiments/{experiment.id}/compare/",
            {
                "chosen": "1",
                "strategies": ["temporal", "vres_greedy"],
                "repeats": "2",
                f"target-{task.id}": "0.5",
                "objective": "fair",
                "aggregation": "fedavgm",
            },
        )
    assert response.status_code == 302, _field_errors(response)
    comparison = Comparison.objects.get()
    assert comparison.strategies == ["temporal", "vres_greedy"] and comparison.repeats == 2
    assert comparison.targets == {str(task.id): 0.5}
    runs = list(comparison.runs.order_by("id"))
    # Interleaved: as given, then reversed.
    assert [r.strategy for r in runs] == ["temporal", "vres_greedy", "vres_greedy", "temporal"]
    assert all(r.options["aggregation"] == "fedavgm" for r in runs)
    assert all(r.options["objective"] == "fair" for r in runs if r.strategy == "vres_greedy")
    assert _queued(CONTROL_QUEUE) == [(TaskName.RUN_BEGIN, [runs[0].id])]


def test_the_comparison_form_names_the_baseline_repeats_and_target_at_once(browser_client, make_experiment):
    experiment = make_experiment()
    task = experiment.tasks.order_by("id").first()
    response = browser_client.post(
        f"/experiments/{experiment.id}/compare/",
        {"chosen": "1", "strategies": ["sharing"], "repeats": "11", f"target-{task.id}": "1.5"},
    )
    assert response.status_code == 400
    errors = _field_errors(response)
    assert set(errors) == {"strategies", "repeats", f"target-{task.id}"}, errors
    assert "must include the baseline 'temporal'" in errors["strategies"][0]
    assert "allowed 1 to 10" in errors["repeats"][0]
    assert "at most 1" in errors[f"target-{task.id}"][0]
    assert 'id="compare-error"' in response.content.decode()
    assert not Comparison.objects.exists() and not Run.objects.exists()


def test_the_comparison_form_with_no_strategy_ticked_says_so(browser_client, make_experiment):
    experiment = make_experiment()
    response = browser_client.post(f"/experiments/{experiment.id}/compare/", {"chosen": "1", "repeats": "1"})
    assert response.status_code == 400
    assert "non-empty list" in _field_errors(response)["strategies"][0]


# ----------------------------------------------------------------------------------- manual plans


def _plan_fields(experiment, values: dict[tuple[str, str], tuple[str, str]]) -> dict[str, str]:
    """The run form's plan inputs for ``{(device name, task name): (batch size, share)}``."""
    out = {}
    for shard in experiment.shards.select_related("device", "task"):
        batch, share = values[(shard.device.name, shard.task.name)]
        out[f"plan-{shard.device_id}-{shard.task_id}-batch_size"] = batch
        out[f"plan-{shard.device_id}-{shard.task_id}-active_thread_percentage"] = share
    return out


def _pairs(experiment) -> list[tuple[str, str]]:
    return [(s.device.name, s.task.name) for s in experiment.shards.select_related("device", "task")]


def test_a_manual_plan_typed_into_the_run_form_launches_that_plan(
    browser_client, make_device, make_experiment, django_capture_on_commit_callbacks
):
    experiment = make_experiment(devices=[make_device("gpu-a", "simulated"), make_device("gpu-b", "simulated")])
    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert 'id="manual-plan-table"' in page and '<option value="manual">' in page
    plan = {pair: (str(16 + 2 * k), str(40 + k)) for k, pair in enumerate(_pairs(experiment))}
    with django_capture_on_commit_callbacks(execute=True):
        response = browser_client.post(
            f"/experiments/{experiment.id}/runs/", {"strategy": "manual", **_plan_fields(experiment, plan)}
        )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    assert run.strategy == "manual"
    stored = {(e["device_id"], e["task_id"]): (e["batch_size"], e["active_thread_percentage"]) for e in run.manual_plan}
    shards = {
        (s.device.name, s.task.name): (s.device_id, s.task_id)
        for s in experiment.shards.select_related("device", "task")
    }
    assert stored == {shards[pair]: (int(b), int(r)) for pair, (b, r) in plan.items()}


def test_every_bad_cell_of_a_manual_plan_is_named(browser_client, make_device, make_experiment):
    experiment = make_experiment(devices=[make_device("gpu-a", "simulated"), make_device("gpu-b", "simulated")])
    pairs = _pairs(experiment)
    plan = {pair: ("16", "50") for pair in pairs}
    plan[pairs[0]] = ("500", "50")  # larger than the shard: the service's refusal
    plan[pairs[1]] = ("16", "0")  # no share: the serializer's
    plan[pairs[2]] = ("", "50")  # blank: the serializer's
    plan[pairs[3]] = ("999", "50")  # larger than the shard too: the service's, past the first
    response = browser_client.post(
        f"/experiments/{experiment.id}/runs/", {"strategy": "manual", **_plan_fields(experiment, plan)}
    )
    assert response.status_code == 400
    html = response.content.decode()
    messages = re.findall(r'<span class="error">(.*?)</span>', html)
    assert any("plan[0].batch_size=500 is out of range: allowed 2 to" in unescape(m) for m in messages), messages
    assert any("plan[3].batch_size=999 is out of range" in unescape(m) for m in messages), messages
    assert any("must be at least 1" in m for m in messages), messages
    assert any("required" in m for m in messages), messages
    assert html.count('class="plan-cell has-error"') == 4
    assert '<details class="wide manual-plan" id="manual-plan" open>' in html
    assert not Run.objects.exists()


# ------------------------------------------------------------------------------------ pages and links


def test_the_workflow_pages_render_and_are_linked_where_a_researcher_looks(browser_client, make_device):
    device = make_device("dev-a")
    index = browser_client.get("/").content.decode()
    assert 'href="/profiling/new/"' in index and 'href="/predictors/new/"' in index
    assert f'href="/profiling/new/?device={device.id}"' in index
    predictors = browser_client.get("/predictors/").content.decode()
    assert 'href="/profiling/new/"' in predictors and 'href="/predictors/new/"' in predictors
    for url, button in (("/profiling/new/", "Start profiling"), ("/predictors/new/", "Fit the predictor")):
        html = browser_client.get(url).content.decode()
        assert f'method="post" action="{url}"' in html and "csrfmiddlewaretoken" in html and button in html


def test_the_experiment_form_says_superusers_see_every_experiment(browser_client):
    html = browser_client.get("/experiments/new/").content.decode()
    assert "only you, the collaborators you add and the lab's superusers see it" in html
