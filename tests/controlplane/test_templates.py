"""Built-in experiment templates (the task mixes of Yu et al. 2022, §5): the service, the API,
the ``mtfl create-experiment`` command and the dashboard form."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils.html import escape

from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Experiment, Task
from controlplane.experiments.services import experiment_create_from_template
from controlplane.experiments.services.templates import (
    CIFAR10_BATCH_MIN_BYTES,
    CIFAR10_BATCHES,
    TEMPLATES,
    cifar10_problem,
    template_dataset_default,
)
from workers.training.plugin_check import TaskCheck

DIGITS_TRAIN = 1437

pytestmark = pytest.mark.django_db

MIXES = {
    "heavy": {"densenet121", "vgg16", "resnet101"},
    "light": {"resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"},
    "mixed": {"resnet50", "vgg16", "mobilenet_v3_large"},
}


@pytest.fixture
def devices(make_device):
    return [make_device("dev-a"), make_device("dev-b"), make_device("dev-c")]


def fake_cifar10(root: Path, *, skip: str | None = None, small: str | None = None) -> Path:
    """A folder shaped like extracted CIFAR-10 (sparse files of a batch's size: no download,
    no disk space); ``skip`` leaves a file out, ``small`` makes one too short."""
    batches = root / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    for name in (*CIFAR10_BATCHES, "batches.meta"):
        if name == skip:
            continue
        path = batches / name
        path.write_bytes(b"")
        if name != "batches.meta":
            os.truncate(path, 100 if name == small else CIFAR10_BATCH_MIN_BYTES + 1000)
    return root


@pytest.fixture
def cifar10_at(settings):
    """Point ``MTFL_CIFAR10_ROOT`` (``settings.MTFL["CIFAR10_ROOT"]``) at a folder."""

    def point(root: Path | str) -> None:
        settings.MTFL = {**settings.MTFL, "CIFAR10_ROOT": str(root)}

    return point


@pytest.fixture
def cifar10_checked(monkeypatch):
    """The fake CIFAR-10 folders below only look like the data (sparse files of a batch's size, for
    the template's choice of data set); a cifar10 task's check, which reads the batches, answers
    as the real data would instead."""
    from controlplane.experiments.services import catalog

    real = catalog._task_check

    def check(**kw):
        if kw["dataset"] != "cifar10":
            return real(**kw)
        return TaskCheck((3, 32, 32), 10, 50_000, 10_000, np.arange(50_000) % 10, np.arange(10_000) % 10)

    monkeypatch.setattr(catalog, "_task_check", check)


def _counts(experiment: Experiment) -> dict[str, list[int]]:
    """``{architecture: [|D_ij| for each device by id]}``."""
    out: dict[str, list[int]] = {}
    for shard in experiment.shards.select_related("task").order_by("device_id"):
        out.setdefault(shard.task.architecture, []).append(shard.num_samples)
    return out


# --- the service ---------------------------------------------------------------------------


def test_the_templates_are_the_papers_three_mixes():
    assert {name: set(t.architectures) for name, t in TEMPLATES.items()} == MIXES
    assert all("Yu et al. 2022, §5" in t.description for t in TEMPLATES.values())


@pytest.mark.parametrize("template", sorted(MIXES))
def test_each_template_creates_its_three_tasks_with_the_defaults(template, devices):
    experiment = experiment_create_from_template(template=template, device_ids=[d.id for d in devices])

    assert {t.architecture for t in experiment.tasks.all()} == MIXES[template]
    assert {t.dataset for t in experiment.tasks.all()} == {"digits"}
    assert experiment.name == f"{template} mix"
    assert (experiment.rounds, experiment.local_epochs, experiment.seed) == (3, 1, 0)
    assert (experiment.partition_rule, experiment.partition_params) == ("quantity", {"alpha": 0.5})
    assert experiment.dirichlet_alpha == 0.5
    assert experiment.shards.count() == 3 * len(devices)
    assert "Yu et al. 2022, §5" in experiment.description


def test_data_volumes_are_skewed_per_task_and_device(devices):
    experiment = experiment_create_from_template(template="light", device_ids=[d.id for d in devices])

    counts = _counts(experiment)
    train_size = DIGITS_TRAIN
    for per_device in counts.values():
        assert sum(per_device) == train_size  # every task covers its whole split
        assert len(set(per_device)) > 1  # ...unevenly across devices
        assert max(per_device) > 1.25 * min(per_device)
    assert len({tuple(v) for v in counts.values()}) == 3  # each task has its own skew
    per_device_totals = [sum(v[j] for v in counts.values()) for j in range(len(devices))]
    assert len(set(per_device_totals)) == len(devices)


def test_a_smaller_alpha_skews_more(devices):
    ids = [d.id for d in devices]
    mild = _counts(experiment_create_from_template(template="light", device_ids=ids, dirichlet_alpha=100.0))
    strong = _counts(experiment_create_from_template(template="light", device_ids=ids, dirichlet_alpha=0.1))

    def spread(c):
        return sum(max(v) - min(v) for v in c.values())

    assert spread(strong) > 2 * spread(mild)


def test_identical_tasks_are_reused_and_the_default_name_is_numbered(devices):
    ids = [d.id for d in devices]
    first = experiment_create_from_template(template="light", device_ids=ids)
    second = experiment_create_from_template(template="light", device_ids=ids, seed=1)

    assert second.name == "light mix 2"
    assert set(second.tasks.values_list("id", flat=True)) == set(first.tasks.values_list("id", flat=True))
    assert Task.objects.count() == 3


def test_a_task_name_holding_another_definition_is_not_reused(devices, make_task):
    other = make_task("digits-resnet18", "resnet18", optimizer="sgd")

    experiment = experiment_create_from_template(template="light", device_ids=[devices[0].id])

    resnet = experiment.tasks.get(architecture="resnet18")
    assert resnet.id != other.id and resnet.name == "digits-resnet18-2"
    assert resnet.optimizer == "adam"


def test_cifar10_is_used_when_its_folder_holds_the_data(devices, tmp_path, cifar10_at, cifar10_checked):
    root = fake_cifar10(tmp_path / "data")
    cifar10_at(root)

    experiment = experiment_create_from_template(template="heavy", device_ids=[d.id for d in devices])

    tasks = list(experiment.tasks.all())
    assert {t.dataset for t in tasks} == {"cifar10"}
    assert {t.dataset_root for t in tasks} == {str(root.resolve())}
    assert {t.name for t in tasks} == {"cifar10-densenet121", "cifar10-vgg16", "cifar10-resnet101"}
    assert sum(_counts(experiment)["vgg16"]) == 50_000
    assert "on cifar10" in experiment.description


def test_the_setting_may_name_the_batches_folder_itself(tmp_path, cifar10_at):
    root = fake_cifar10(tmp_path / "data")
    cifar10_at(root / "cifar-10-batches-py")

    assert cifar10_problem() is None and template_dataset_default() == "cifar10"


def test_an_explicit_dataset_overrides_the_default(devices, tmp_path, cifar10_at):
    cifar10_at(fake_cifar10(tmp_path / "data"))

    experiment = experiment_create_from_template(template="light", device_ids=[devices[0].id], dataset="digits")

    assert {t.dataset for t in experiment.tasks.all()} == {"digits"}


@pytest.mark.parametrize(
    "shape,reason",
    [
        ({"skip": "test_batch"}, "test_batch is missing"),
        ({"skip": "batches.meta"}, "batches.meta is missing"),
        ({"small": "data_batch_3"}, "data_batch_3 is too small to be a CIFAR-10 batch"),
    ],
)
def test_an_incomplete_cifar10_folder_falls_back_to_digits(shape, reason, devices, tmp_path, cifar10_at):
    cifar10_at(fake_cifar10(tmp_path / "data", **shape))

    experiment = experiment_create_from_template(template="light", device_ids=[devices[0].id])

    assert {t.dataset for t in experiment.tasks.all()} == {"digits"}
    assert reason in cifar10_problem()


def test_asking_for_cifar10_without_the_data_names_the_field(devices, tmp_path, cifar10_at):
    with pytest.raises(ApplicationError) as unset:
        experiment_create_from_template(template="light", device_ids=[devices[0].id], dataset="cifar10")
    cifar10_at(tmp_path / "nowhere")
    with pytest.raises(ApplicationError) as missing:
        experiment_create_from_template(template="light", device_ids=[devices[0].id], dataset="cifar10")

    assert unset.value.field == "dataset" and "MTFL_CIFAR10_ROOT is not set" in unset.value.message
    assert missing.value.field == "dataset" and "nowhere" in missing.value.message
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "kwargs,field,text",
    [
        ({"template": "huge"}, "template", "template 'huge' is not a built-in template; allowed: heavy, light, mixed"),
        ({"rounds": 0}, "rounds", "rounds=0 is out of range: allowed [1, 10000]"),
        ({"rounds": 10**400}, "rounds", "out of range: allowed [1, 10000]"),
        ({"rounds": 2.5}, "rounds", "rounds must be an integer"),
        ({"local_epochs": 1001}, "local_epochs", "allowed [1, 1000]"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha", "allowed (0, 1000]"),
        ({"dirichlet_alpha": float("nan")}, "dirichlet_alpha", "must be a finite number"),
        ({"dirichlet_alpha": 10**400}, "dirichlet_alpha", "allowed (0, 1000]"),
        ({"seed": -1}, "seed", "allowed [0, 2147483647]"),
        ({"dataset": "imagenet"}, "dataset", "allowed: digits, cifar10"),
        ({"device_ids": []}, "devices", "devices must list at least one"),
        ({"device_ids": [987654]}, "devices", "no device with id 987654"),
        ({"name": "x" * 201}, "name", "allowed at most 200"),
    ],
)
def test_bad_input_names_the_field_and_creates_nothing(kwargs, field, text, devices):
    arguments = {"template": "light", "device_ids": [devices[0].id], **kwargs}

    with pytest.raises(ApplicationError) as error:
        experiment_create_from_template(**arguments)

    assert error.value.field == field and text in error.value.message
    assert not Task.objects.exists() and not Experiment.objects.exists()


def test_an_explicit_name_that_is_taken_is_refused(devices):
    experiment_create_from_template(template="light", device_ids=[devices[0].id], name="mine")

    with pytest.raises(ApplicationError) as error:
        experiment_create_from_template(template="heavy", device_ids=[devices[0].id], name="mine")

    assert error.value.field == "name" and "already exists" in error.value.message


# --- the API -------------------------------------------------------------------------------


def test_api_lists_the_templates_with_their_models(api):
    response = api.get("/api/experiment-templates/")

    assert response.status_code == 200
    rows = {row["name"]: row for row in response.json()}
    assert {name: set(row["architectures"]) for name, row in rows.items()} == MIXES
    assert all(row["dataset"] == "digits" and "Yu et al. 2022" in row["description"] for row in rows.values())


def test_api_creates_an_experiment_from_a_template(api, devices):
    response = api.post(
        "/api/experiments/from-template/",
        {"template": "mixed", "devices": [d.id for d in devices], "rounds": 2, "seed": 7},
        format="json",
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "mixed mix" and body["rounds"] == 2 and body["seed"] == 7
    assert body["partition_rule"] == "quantity" and body["partition_params"] == {"alpha": 0.5}
    assert body["dirichlet_alpha"] == 0.5
    assert len(body["shards"]) == 9 and {s["task_name"] for s in body["shards"]} == {
        "digits-resnet50",
        "digits-vgg16",
        "digits-mobilenet_v3_large",
    }
    assert api.get(f"/api/experiments/{body['id']}/").json() == body


@pytest.mark.parametrize(
    "body,field,text",
    [
        ({"template": "huge"}, "template", "allowed: heavy, light, mixed"),
        ({"rounds": 0}, "rounds", "allowed [1, 10000]"),
        ({"rounds": "many"}, "rounds", "must be an integer"),
        ({"dirichlet_alpha": -1}, "dirichlet_alpha", "allowed (0, 1000]"),
        ({"dataset": "cifar10"}, "dataset", "MTFL_CIFAR10_ROOT is not set"),
        ({"devices": []}, "devices", "at least one"),
        ({"devices": [2**70]}, "devices[0]", "allowed 1 to"),
        ({"colour": "red"}, "colour", "unknown field"),
    ],
)
def test_api_bad_input_is_400_naming_the_field(body, field, text, api, devices):
    response = api.post(
        "/api/experiments/from-template/", {"template": "light", "devices": [devices[0].id], **body}, format="json"
    )

    assert response.status_code == 400
    payload = response.json()
    assert set(payload) == {"message", "errors"}
    assert any(text in message for message in payload["errors"][field]), payload
    assert not Experiment.objects.exists()


def test_api_template_endpoints_need_authentication(client):
    assert client.get("/api/experiment-templates/").status_code in (401, 403)
    assert client.post("/api/experiments/from-template/", {"template": "light"}).status_code in (401, 403)


def test_openapi_schema_documents_the_template_endpoints_without_warnings(api, tmp_path):
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(tmp_path / "schema.yaml"))
    schema = (tmp_path / "schema.yaml").read_text()

    assert "/api/experiment-templates/:" in schema and "/api/experiments/from-template/:" in schema
    assert "ExperimentFromTemplateRequest" in schema


# --- the CLI -------------------------------------------------------------------------------


def test_cli_creates_an_experiment_and_prints_its_data_table(devices, capsys):
    call_command("create_experiment", template="light", devices="dev-a,dev-c", rounds="2")

    experiment = Experiment.objects.get()
    out = capsys.readouterr().out
    assert f"experiment {experiment.id} 'light mix'" in out
    assert "dataset: digits" in out
    assert experiment.rounds == 2 and set(experiment.devices.values_list("name", flat=True)) == {"dev-a", "dev-c"}
    for shard in experiment.shards.select_related("device"):
        row = next(line for line in out.splitlines() if f" {shard.device.name} " in line)
        assert f" {shard.num_samples} " in row


def test_cli_without_a_running_stack_computes_the_workload_features_itself(devices, monkeypatch, capsys):
    from controlplane.core.management.commands import create_experiment

    def no_broker():
        raise RuntimeError("no broker")

    computed = []
    monkeypatch.setattr(create_experiment, "use_running_broker", no_broker)
    monkeypatch.setattr("controlplane.celery.use_broker", lambda *urls: None)
    monkeypatch.setattr(create_experiment, "workload_ensure", lambda **kw: computed.append(kw["architecture"]))

    call_command("create_experiment", template="heavy", devices="dev-a")

    assert sorted(computed) == ["densenet121", "resnet101", "vgg16"]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"devices": "dev-a,nope"}, "--devices: 'nope' is not a registered device; known devices: dev-a, dev-b, dev-c"),
        ({"devices": "dev-a", "rounds": "0"}, "rounds=0 is out of range: allowed [1, 10000]"),
        ({"devices": "dev-a", "dataset": "cifar10"}, "dataset 'cifar10' is not available"),
        ({"devices": "dev-a,dev-a"}, "--devices lists 'dev-a' more than once"),
    ],
)
def test_cli_bad_input_is_a_usage_error(options, message, devices):
    with pytest.raises(CommandError) as error:
        call_command("create_experiment", template="light", **options)

    assert message in str(error.value) and error.value.returncode == 2
    assert not Experiment.objects.exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--template", "huge", "--devices", "a"],
            "template 'huge' is not a built-in template; allowed: heavy, light, mixed",
        ),
        (["--template", "light", "--devices", "a", "--rounds", "many"], "--rounds must be an integer, got 'many'"),
        (["--devices", "a"], "--template is required: one of heavy, light, mixed"),
    ],
)
def test_cli_bad_input_is_one_line_with_exit_status_2(args, message, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"}}
    env["MTFL_HOME"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "create-experiment", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )

    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# --- the dashboard -------------------------------------------------------------------------


def test_index_shows_the_template_form(browser_client, devices):
    html = browser_client.get("/").content.decode()

    assert "New experiment from a template" in html
    assert 'action="/experiments/from-template/"' in html and "csrfmiddlewaretoken" in html
    for name in MIXES:
        assert f'<option value="{name}"' in html
    for device in devices:
        assert f'<option value="{device.id}">{device.name}</option>' in html


def test_dashboard_form_creates_the_experiment_and_goes_to_its_page(browser_client, devices):
    response = browser_client.post(
        "/experiments/from-template/",
        {"template": "heavy", "devices": [devices[0].id, devices[1].id], "name": "", "rounds": "2"},
    )

    experiment = Experiment.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/experiments/{experiment.id}/"
    assert experiment.name == "heavy mix" and experiment.rounds == 2 and experiment.devices.count() == 2


@pytest.mark.parametrize(
    "form,api_body,field",
    [
        ({"rounds": "0"}, {"rounds": 0}, "rounds"),
        ({"template": "huge"}, {"template": "huge"}, "template"),
        ({"devices": []}, {"devices": []}, "devices"),
    ],
)
def test_dashboard_form_shows_the_apis_message(form, api_body, field, browser_client, api, devices):
    api_message = api.post(
        "/api/experiments/from-template/", {"template": "light", "devices": [devices[0].id], **api_body}, format="json"
    ).json()["errors"][field][0]

    response = browser_client.post(
        "/experiments/from-template/", {"template": "light", "devices": [devices[0].id], **form}
    )

    assert response.status_code == 400
    assert f'<span class="error">{escape(api_message)}</span>' in response.content.decode()
    assert not Experiment.objects.exists()


def test_dashboard_form_needs_login_and_a_csrf_token(user, devices):
    anonymous = Client().post("/experiments/from-template/", {"template": "light", "devices": [devices[0].id]})
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    forged = strict.post("/experiments/from-template/", {"template": "light", "devices": [devices[0].id]})
    assert forged.status_code == 403
    assert not Experiment.objects.exists()
