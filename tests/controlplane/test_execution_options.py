"""Issue 31, item 1 on the control plane: a task's execution options (``execution_mode``
auto/eager/graphs, ``precision`` fp32/bf16, ``channels_last``) are defined with the task (API,
CLI, OpenAPI), refused with a 400 where a device holding the task's data cannot run them (an
explicit ``graphs`` or ``bf16`` on ``cpu``; ``auto`` never, ``simulated`` never), carried by
every ``AssignmentSpec`` and ``StandaloneItem`` the control plane builds, part of the ``P_alone``
cache key, and what each trainer reports it ran (mode, fallback reason) is recorded and shown.

What the control plane sends to agents is recorded instead of sent (:func:`capture_dispatch`);
device results are built as agents send them (the message schema is the process boundary).
"""

from __future__ import annotations

import csv
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.common.errors import ApplicationError
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Round
from controlplane.experiments.services.rounds.requests import round_device_request_load
from controlplane.fleet.models import Device
from controlplane.fleet.services import device_update
from tests.controlplane.test_aggregation_resume import capture_dispatch, device_results, global_state, trained
from workers.protocol.messages import ExecutionOptions

pytestmark = pytest.mark.django_db

REFUSAL = "execution_mode 'graphs' needs a GPU backend (cuda-mps, cuda-timeslice); device 'dev-a' is cpu"


def _counts(devices, tasks, n: int = 30) -> list[dict]:
    return [{"device": d.id, "task": t.id, "num_samples": n} for d in devices for t in tasks]


def _experiment_body(devices, tasks, name: str = "exp") -> dict:
    return {
        "name": name,
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": 1,
        "partition_rule": "explicit",
        "sample_counts": _counts(devices, tasks),
    }


# --- the task's options: API and schema --------------------------------------------------------


def test_a_tasks_execution_options_are_written_and_read_through_the_api(api):
    created = api.post(
        "/api/tasks/",
        {
            "name": "t-graphs",
            "architecture": "mobilenet_v3_small",
            "execution_mode": "graphs",
            "precision": "bf16",
            "channels_last": True,
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["execution_mode"], body["precision"], body["channels_last"]) == ("graphs", "bf16", True)

    default = api.post("/api/tasks/", {"name": "t-default", "architecture": "mobilenet_v3_small"}, format="json")
    assert (default.json()["execution_mode"], default.json()["precision"], default.json()["channels_last"]) == (
        "auto",
        "fp32",
        False,
    )

    changed = api.patch(f"/api/tasks/{body['id']}/", {"execution_mode": "eager"}, format="json")
    assert changed.status_code == 200, changed.content
    assert api.get(f"/api/tasks/{body['id']}/").json()["execution_mode"] == "eager"


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("execution_mode", "fast", "'fast' is not allowed; allowed: auto, eager, graphs"),
        ("precision", "fp16", "'fp16' is not allowed; allowed: fp32, bf16"),
        ("channels_last", "yes", "must be true or false"),
    ],
)
def test_a_bad_execution_option_is_refused_naming_the_field(api, field, value, text):
    response = api.post("/api/tasks/", {"name": "t", "architecture": "mobilenet_v3_small", field: value}, format="json")
    assert response.status_code == 400
    assert text in response.json()["errors"][field][0]


def test_the_openapi_schema_gives_the_execution_options_and_their_choices(api):
    schema = api.get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    write = components["TaskWriteRequest"]["properties"]
    assert write["channels_last"]["type"] == "boolean"
    assert "not a strategy's" in write["execution_mode"]["description"]
    assert components["ExecutionModeEnum"]["enum"] == ["auto", "eager", "graphs"]
    assert components["ExecutedModeEnum"]["enum"] == ["eager", "graphs"]
    assert components["PrecisionEnum"]["enum"] == ["fp32", "bf16"]
    assert {"execution_mode", "execution_fallback"} <= set(components["Assignment"]["properties"])


# --- refused where a device cannot run them ----------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"execution_mode": "graphs"}, REFUSAL),
        (
            {"precision": "bf16"},
            "precision 'bf16' needs a GPU backend (cuda-mps, cuda-timeslice); device 'dev-a' is cpu",
        ),
    ],
)
def test_an_experiment_with_a_gpu_option_on_a_cpu_device_is_a_400(api, make_device, make_task, options, message):
    devices = [make_device("dev-a"), make_device("gpu-b", backend="cuda-mps")]
    task = make_task("t-gpu", **options)

    response = api.post("/api/experiments/", _experiment_body(devices, [task]), format="json")

    assert response.status_code == 400
    assert response.json()["errors"]["devices"] == [f"task 't-gpu': {message}"]


def test_auto_runs_anywhere_and_simulated_devices_take_every_option(api, make_device, make_task):
    cpu = [make_device("dev-a"), make_device("dev-b")]
    auto = make_task("t-auto", channels_last=True)
    assert api.post("/api/experiments/", _experiment_body(cpu, [auto]), format="json").status_code == 201

    sim = [make_device("sim-a", backend="simulated")]
    gpu_only = make_task("t-graphs-bf16", execution_mode="graphs", precision="bf16")
    assert api.post("/api/experiments/", _experiment_body(sim, [gpu_only], "sim"), format="json").status_code == 201


def test_a_cpu_device_holding_none_of_the_tasks_data_does_not_refuse_it(make_experiment, make_device, make_task):
    cpu, gpu = make_device("dev-a"), make_device("gpu-b", backend="cuda-mps")
    task = make_task("t-graphs", execution_mode="graphs")
    other = make_task("t-auto")
    counts = [
        {"device": gpu.id, "task": task.id, "num_samples": 30},
        {"device": cpu.id, "task": other.id, "num_samples": 30},
    ]
    experiment = make_experiment(devices=[cpu, gpu], tasks=[task, other], counts=counts, partition_rule="explicit")
    assert set(experiment.tasks.values_list("name", flat=True)) == {"t-graphs", "t-auto"}


def test_changing_a_task_to_graphs_is_refused_where_its_experiment_has_a_cpu_device(api, make_experiment, make_task):
    task = make_task("t-auto")
    make_experiment(tasks=[task], name="on cpu")

    response = api.patch(f"/api/tasks/{task.id}/", {"execution_mode": "graphs"}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"]["devices"] == [
        "task 't-auto': execution_mode 'graphs' needs a GPU backend (cuda-mps, cuda-timeslice); device 'dev-a' "
        "(experiment 'on cpu') is cpu"
    ]
    task.refresh_from_db()
    assert task.execution_mode == "auto"


def test_a_run_is_refused_when_a_devices_backend_changed_to_cpu_since(api, make_experiment, make_device, make_task):
    devices = [make_device("dev-a", backend="simulated"), make_device("dev-b", backend="simulated")]
    experiment = make_experiment(devices=devices, tasks=[make_task("t-graphs", execution_mode="graphs")])
    device_update(device=devices[0], backend="cpu")

    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing"}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"]["devices"] == [f"task 't-graphs': {REFUSAL}"]
    assert not experiment.runs.exists()


def test_the_cli_refuses_graphs_on_a_cpu_device_in_one_line(make_device):
    make_device("dev-a")
    with pytest.raises(CommandError) as err:
        call_command(
            "create_experiment",
            "--template",
            "light",
            "--devices",
            "dev-a",
            "--execution-mode",
            "graphs",
            "--rounds",
            "1",
        )
    assert str(err.value) == f"task 'digits-resnet18': {REFUSAL}"
    with pytest.raises(CommandError) as err:
        call_command("create_experiment", "--template", "light", "--devices", "dev-a", "--precision", "fp16")
    assert str(err.value) == "--precision: 'fp16' is not allowed; allowed: fp32, bf16"


# --- carried to the agents, recorded from them ------------------------------------------------


def test_every_request_carries_its_tasks_options_and_the_results_say_how_it_ran(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks, api, browser_client
):
    sent = capture_dispatch(monkeypatch)
    devices = [make_device("dev-a", backend="simulated"), make_device("dev-b", backend="simulated")]
    graphs = make_task("t-graphs", "mobilenet_v3_small", execution_mode="graphs", precision="bf16", channels_last=True)
    eager = make_task("t-eager", "shufflenet_v2_x1_0", execution_mode="eager")
    experiment = make_experiment(
        devices=devices, tasks=[graphs, eager], counts=_counts(devices, [graphs, eager]), partition_rule="explicit"
    )
    expected = {
        "t-graphs": ExecutionOptions(mode="graphs", precision="bf16", channels_last=True),
        "t-eager": ExecutionOptions(mode="eager"),
    }

    run = services.run_create(experiment=experiment, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)
    # P_alone is measured the way the rounds train: every standalone item has its task's options.
    items = [i for (_, requests, *_) in sent["standalone"] for r in requests for i in r.items]
    assert len(items) == 4
    assert all(i.execution == expected[i.task.name] for i in items)

    answers = [
        {
            "run_id": run.id,
            "device": d.name,
            "status": "succeeded",
            "measurements": [
                {
                    "task_id": t.id,
                    "batch_size": 30,
                    "throughput_sps": 100.0,
                    "execution_mode": "graphs" if t == graphs else "eager",
                }
                for t in (graphs, eager)
            ],
        }
        for d in devices
    ]
    with django_capture_on_commit_callbacks(execute=True):
        services.standalone_record(run_id=run.id, results=answers)
    rnd = Round.objects.get(run=run, index=0)
    specs = [s for round_id, requests in sent["round"] if round_id == rnd.id for r in requests for s in r.assignments]
    assert len(specs) == 4
    assert all(s.execution == expected[s.task.name] for s in specs)
    # a retry rebuilds the same request from the database
    retried = round_device_request_load(rnd=rnd, device_id=devices[1].id, attempt=1).assignments
    assert {s.task.name: s.execution for s in retried} == expected

    results = device_results(
        rnd,
        {
            (d.name, t.name): trained(global_state(run, t.name, None), seed=k)
            for k, (d, t) in enumerate((d, t) for d in devices for t in (graphs, eager))
        },
    )
    fallback = "capture failed: RuntimeError: operation not permitted when stream is capturing"
    for device in results:
        for a in device["assignments"]:
            ran_graphs = a["task_id"] == graphs.id and device["device"] == "dev-a"
            a["execution_mode"] = "graphs" if ran_graphs else "eager"
            a["execution_fallback"] = fallback if a["task_id"] == graphs.id and not ran_graphs else ""
    services.round_record(round_id=rnd.id, results=results)

    rows = {
        (a.device.name, a.task.name): (a.execution_mode, a.execution_fallback)
        for a in Assignment.objects.filter(round=rnd).select_related("device", "task")
    }
    assert rows == {
        ("dev-a", "t-graphs"): ("graphs", ""),
        ("dev-a", "t-eager"): ("eager", ""),
        ("dev-b", "t-graphs"): ("eager", fallback),
        ("dev-b", "t-eager"): ("eager", ""),
    }
    served = {
        (row["device_name"], row["task_name"]): (row["execution_mode"], row["execution_fallback"])
        for row in api.get(f"/api/assignments/?run={run.id}").json()["results"]
    }
    assert served == rows
    exported = list(
        csv.DictReader(
            io.StringIO(b"".join(browser_client.get(f"/runs/{run.id}/assignments.csv").streaming_content).decode())
        )
    )
    assert {(r["device"], r["task"], r["execution_mode"], r["execution_fallback"]) for r in exported} == {
        (d, t, *v) for (d, t), v in rows.items()
    }
    page = browser_client.get(f"/runs/{run.id}/").content.decode()
    assert f"eager (graphs failed: {fallback})" in page


def test_an_assignment_without_a_reported_mode_records_none(started_round):
    run, rnd = started_round()
    from tests.controlplane.test_round_protocol import _device_results

    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    assert set(Assignment.objects.filter(round=rnd).values_list("execution_mode", "execution_fallback")) == {("", "")}


# --- the P_alone cache -------------------------------------------------------------------------


def test_p_alone_of_one_execution_mode_is_not_used_for_another(
    make_experiment, make_device, make_task, monkeypatch, django_capture_on_commit_callbacks
):
    from tests.controlplane.test_standalone_cache import _first_run_measured, _measured_devices, _one_task

    sent = capture_dispatch(monkeypatch)
    experiment, devices = _one_task(make_experiment, make_device, make_task)
    _first_run_measured(experiment, devices, django_capture_on_commit_callbacks)
    # The same workload, asked to run eager rather than auto: its own key, measured again.
    eager = make_task("t-mobilenet-eager", "mobilenet_v3_small", execution_mode="eager")
    other, _ = _one_task(make_experiment, lambda n: devices[0 if n == "dev-a" else 1], make_task, task=eager, name="b")

    sent.clear()
    run = services.run_create(experiment=other, strategy="sharing")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_begin(run_id=run.id)

    assert _measured_devices(sent) == ["dev-a", "dev-b"]


def test_the_cache_key_digests_the_execution_options(make_task):
    from controlplane.experiments.services.standalone_cache import workload_identity, workload_key

    auto = workload_identity(make_task("t-auto"))
    graphs = workload_identity(make_task("t-graphs", execution_mode="graphs"))
    channels_last = workload_identity(make_task("t-cl", channels_last=True))
    assert auto["execution"] == {"mode": "auto", "precision": "fp32", "channels_last": False}
    assert len({workload_key(auto), workload_key(graphs), workload_key(channels_last)}) == 3


def test_a_gpu_option_is_refused_by_the_service_naming_the_option(make_experiment, make_device, make_task):
    with pytest.raises(ApplicationError) as err:
        make_experiment(devices=[make_device("dev-a")], tasks=[make_task("t", execution_mode="graphs")])
    assert err.value.field == "devices" and err.value.status_code == 400
    assert err.value.message == f"task 't': {REFUSAL}"
    assert not Device.objects.filter(experiments__isnull=False).exists()
