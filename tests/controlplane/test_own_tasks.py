"""Bring your own task, on the control plane (issue 21): tasks checked and described by their data,
experiments partitioned over the tasks' labels with their histograms, shards shipped as
positions, devices' plug-in declarations checked before a run, the plug-ins listed by the API,
and every bad plug-in refused with a 400 naming the field.

Plug-ins are installed as real entry points (a ``*.dist-info`` folder on ``sys.path`` and on the
``PYTHONPATH`` the check's child process inherits), as tests/controlplane/test_plugins.py does.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Experiment, Shard, Task
from controlplane.experiments.services import experiment_create, run_create, task_create, task_update
from tests.plugin_dist import installed_distribution
from workers.protocol.indices import decode_indices
from workers.registry.models import MODEL_REGISTRY

pytestmark = pytest.mark.django_db

DIGITS_TRAIN = 1437

PLUGIN = '''
"""Plug-ins for the control plane's tests: a tabular MLP, tabular data, and broken ones."""

import types

import numpy as np


def _tabular(n_train=120, n_test=40, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y_train = np.arange(n_train, dtype=np.int64) % classes
    y_test = np.arange(n_test, dtype=np.int64) % classes
    x_train = (rng.standard_normal((n_train, features)) + y_train[:, None]).astype(np.float32)
    x_test = (rng.standard_normal((n_test, features)) + y_test[:, None]).astype(np.float32)
    return x_train, y_train, x_test, y_test


def tabular(root):
    """six features, three classes (generated)"""
    x_train, y_train, x_test, y_test = _tabular()
    return types.SimpleNamespace(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def tiny_mlp(num_classes, input_shape):
    """one hidden layer over any input"""
    import math

    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 8), nn.ReLU(), nn.Linear(8, num_classes))


def raising_model(num_classes, input_shape):
    raise RuntimeError("the builder of raising_model fails")


def not_a_module(num_classes, input_shape):
    return "a string, not a torch.nn.Module"


def wrong_outputs(num_classes, input_shape):
    import math

    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes + 3))


def raising_data(root):
    raise RuntimeError("the loader of raising_data fails")


def lengths_disagree(root):
    x_train, y_train, x_test, y_test = _tabular()
    return types.SimpleNamespace(x_train=x_train, y_train=y_train[:-5], x_test=x_test, y_test=y_test)


def negative_labels(root):
    x_train, y_train, x_test, y_test = _tabular()
    y_train = y_train.copy()
    y_train[0] = -1
    return types.SimpleNamespace(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
'''

ENTRY_POINTS = """\
[mtfl.models]
tiny_mlp = own_task_plugin:tiny_mlp
raising_model = own_task_plugin:raising_model
not_a_module = own_task_plugin:not_a_module
wrong_outputs = own_task_plugin:wrong_outputs
broken_import = own_task_plugin_missing:nothing

[mtfl.datasets]
tabular = own_task_plugin:tabular
raising_data = own_task_plugin:raising_data
lengths_disagree = own_task_plugin:lengths_disagree
negative_labels = own_task_plugin:negative_labels
"""


@pytest.fixture
def own_plugins(tmp_path):
    """``own_task_plugin`` installed with its entry points for this process and the check's
    child processes, then removed."""
    modules = {"own_task_plugin": PLUGIN}
    with installed_distribution(tmp_path, "own-task-plugin", "0.3", modules, ENTRY_POINTS, pythonpath=True) as folder:
        yield folder


# --- tasks ---------------------------------------------------------------------------------


def test_a_task_carries_what_its_data_says(api):
    response = api.post("/api/tasks/", {"name": "digits-mn", "architecture": "mobilenet_v3_small"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["num_classes"] == 10 and body["input_shape"] == [3, 32, 32]
    assert (body["train_size"], body["test_size"]) == (DIGITS_TRAIN, 360)
    assert len(body["label_counts"]) == 10 and sum(body["label_counts"]) == DIGITS_TRAIN
    assert min(body["label_counts"]) > 100  # the digits are about balanced
    task = Task.objects.get(id=body["id"])
    from controlplane.experiments.services.catalog import task_train_labels

    labels = task_train_labels(task)
    assert labels.shape == (DIGITS_TRAIN,) and labels.dtype == np.int64
    assert np.bincount(labels).tolist() == body["label_counts"]


def test_a_stated_class_count_may_exceed_the_datas_but_not_fall_below(api):
    more = api.post(
        "/api/tasks/", {"name": "t20", "architecture": "mobilenet_v3_small", "num_classes": 20}, format="json"
    )
    assert more.status_code == 201 and more.json()["num_classes"] == 20
    assert len(more.json()["label_counts"]) == 20
    fewer = api.post(
        "/api/tasks/", {"name": "t5", "architecture": "mobilenet_v3_small", "num_classes": 5}, format="json"
    )
    assert fewer.status_code == 400, fewer.json()
    assert "num_classes" in fewer.json()["errors"]


def test_cifar10_without_its_folder_is_refused_at_creation(api, tmp_path):
    missing = api.post(
        "/api/tasks/",
        {"name": "c", "architecture": "resnet18", "dataset": "cifar10", "dataset_root": str(tmp_path / "nowhere")},
        format="json",
    )
    assert missing.status_code == 400, missing.json()
    assert "dataset_root" in missing.json()["errors"]
    unset = api.post("/api/tasks/", {"name": "c", "architecture": "resnet18", "dataset": "cifar10"}, format="json")
    assert unset.status_code == 400 and "dataset_root" in unset.json()["errors"]
    assert not Task.objects.exists()


def test_only_a_change_of_model_or_data_checks_the_task_again(make_task, monkeypatch):
    task = make_task()
    calls = []
    from controlplane.experiments.services import catalog

    real = catalog._task_check
    monkeypatch.setattr(catalog, "_task_check", lambda **kw: calls.append(kw) or real(**kw))
    task_update(task=task, name="renamed", learning_rate=0.01)
    assert calls == []
    task_update(task=task, num_classes=12)
    assert len(calls) == 1 and calls[0]["num_classes"] == 12
    task.refresh_from_db()
    assert task.num_classes == 12 and len(task.label_counts) == 12
    task_update(task=task, num_classes=None)
    task.refresh_from_db()
    assert task.num_classes == 10


def test_a_task_saved_before_checks_is_checked_when_an_experiment_needs_its_labels(make_task, make_device):
    task = make_task()
    Task.objects.filter(id=task.id).update(train_labels=None, train_size=None, test_size=None, label_counts=[])
    task.refresh_from_db()
    device = make_device()
    experiment = experiment_create(
        name="late", task_ids=[task.id], device_ids=[device.id], rounds=1, partition_rule="iid"
    )
    task.refresh_from_db()
    assert task.train_size == DIGITS_TRAIN and task.train_labels is not None
    assert experiment.shards.get().num_samples == DIGITS_TRAIN


# --- partitions ----------------------------------------------------------------------------


def _label_skewed(api, tasks, devices, **extra):
    body = {
        "name": extra.pop("name", "skewed"),
        "tasks": [t.id for t in tasks],
        "devices": [d.id for d in devices],
        "rounds": 1,
        "partition_rule": "dirichlet_labels",
        "partition_params": {"alpha": 0.1},
        "seed": 4,
        **extra,
    }
    return api.post("/api/experiments/", body, format="json")


def test_a_label_skewed_experiment_stores_positions_and_histograms(api, make_task, make_device):
    tasks = [make_task("a", "mobilenet_v3_small"), make_task("b", "shufflenet_v2_x1_0")]
    devices = [make_device("d1"), make_device("d2"), make_device("d3")]
    response = _label_skewed(api, tasks, devices)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["partition_rule"] == "dirichlet_labels"
    assert body["partition_params"] == {"alpha": 0.1} and body["dirichlet_alpha"] == 0.1
    for task in tasks:
        task.refresh_from_db()
        shards = list(Shard.objects.filter(experiment_id=body["id"], task=task).order_by("device_id"))
        positions = [decode_indices(s.indices) for s in shards]
        assert [len(p) for p in positions] == [s.num_samples for s in shards]
        union = np.concatenate(positions)
        assert len(np.unique(union)) == len(union) == DIGITS_TRAIN  # disjoint, covering the split
        from controlplane.experiments.services.catalog import task_train_labels

        labels = task_train_labels(task)
        for shard, p in zip(shards, positions, strict=True):
            assert shard.label_counts == np.bincount(labels[p], minlength=10).tolist()
        assert np.sum([s.label_counts for s in shards], axis=0).tolist() == task.label_counts
        # Label skew: with alpha 0.1 some device holds most of some class.
        by_device = np.array([s.label_counts for s in shards], dtype=float)
        assert (by_device / by_device.sum(axis=0)).max() > 0.8

    histograms = api.get(f"/api/experiments/{body['id']}/label-histograms/")
    assert histograms.status_code == 200
    rows = histograms.json()
    assert len(rows) == 6 and {r["task_name"] for r in rows} == {"a", "b"}
    assert all(sum(r["label_counts"]) == r["num_samples"] for r in rows)
    assert [s["label_counts"] for s in body["shards"]] != []

    again = _label_skewed(api, tasks, devices, name="skewed again").json()
    assert [s["label_counts"] for s in again["shards"]] == [s["label_counts"] for s in body["shards"]]


def test_a_round_ships_the_chosen_positions(make_task, make_device, django_capture_on_commit_callbacks):
    from controlplane.experiments import selectors
    from controlplane.experiments.services.rounds.requests import shard_ref

    task = make_task()
    devices = [make_device(f"d{j}") for j in range(5)]
    experiment = experiment_create(
        name="shards",
        task_ids=[task.id],
        device_ids=[d.id for d in devices],
        rounds=1,
        partition_rule="shards",
        partition_params={"shards_per_device": 2},
    )
    spans = selectors.experiment_shards(experiment, with_indices=True)
    for device in devices:
        shard = Shard.objects.get(experiment=experiment, device=device)
        ref = shard_ref(experiment, spans[(device.id, task.id)])
        assert ref.indices == shard.indices and ref.count == shard.num_samples
        # Two label-sorted shards of about 144 samples (a class holds about 144) span few classes.
        assert sum(1 for c in shard.label_counts if c) <= 4
    assert selectors.experiment_shards(experiment)[(devices[0].id, task.id)].indices is None
    assert selectors.task_ref(task).input_shape == (3, 32, 32)


def test_explicit_counts_keep_windows_and_get_histograms(make_experiment):
    experiment = make_experiment()
    for shard in experiment.shards.all():
        assert shard.indices is None and sum(shard.label_counts) == shard.num_samples


@pytest.mark.parametrize(
    "extra,field,text",
    [
        ({"partition_params": {"beta": 1}}, "partition_params", "allowed: alpha"),
        ({"partition_params": {"alpha": 0}}, "partition_params.alpha", "allowed (0, "),
        ({"partition_params": {}}, "partition_params.alpha", "is required"),
        (
            {"partition_params": {"alpha": 0.5}, "dirichlet_alpha": 0.7},
            "dirichlet_alpha",
            "differ",
        ),
        ({"partition_rule": "iid", "partition_params": {"alpha": 0.5}}, "partition_params", "allowed: none"),
        ({"partition_rule": "iid", "partition_params": None, "dirichlet_alpha": 0.5}, "dirichlet_alpha", "quantity"),
        (
            {"partition_rule": "shards", "partition_params": {"shards_per_device": 1.5}},
            "partition_params.shards_per_device",
            "integer",
        ),
        (
            {"partition_rule": "shards", "partition_params": {"shards_per_device": 0}},
            "partition_params.shards_per_device",
            "partition_params.shards_per_device=0 is out of range: allowed [1, 10000]",
        ),
        ({"partition_rule": "explicit", "partition_params": {"alpha": 1}}, "partition_params", "explicit"),
    ],
)
def test_partition_params_are_checked_against_the_rule(api, make_task, make_device, extra, field, text):
    response = _label_skewed(api, [make_task()], [make_device()], **extra)
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert field in errors, errors
    assert text in errors[field][0]
    assert not Experiment.objects.exists()


def test_dirichlet_alpha_is_still_the_alpha_of_rules_that_take_one(api, make_task, make_device):
    response = _label_skewed(
        api, [make_task()], [make_device("d1"), make_device("d2")], partition_params=None, dirichlet_alpha=0.3
    )
    assert response.status_code == 201, response.json()
    assert response.json()["partition_params"] == {"alpha": 0.3}


def test_the_dirichlet_rule_becomes_quantity_with_its_alpha(make_experiment):
    from django.apps import apps

    migration = importlib.import_module("controlplane.experiments.migrations.0010_dirichlet_is_quantity")
    experiment = make_experiment()
    Experiment.objects.filter(id=experiment.id).update(partition_rule="dirichlet", dirichlet_alpha=0.25)
    migration.forwards(apps, None)
    experiment.refresh_from_db()
    assert (experiment.partition_rule, experiment.partition_params) == ("quantity", {"alpha": 0.25})


# --- plug-in declarations ------------------------------------------------------------------


def _declare(device, models=(), datasets=()):
    from controlplane.fleet.services import device_report
    from tests.conftest import inventory

    body = inventory(device.name, device.backend)
    body["plugins"] = {
        "models": {m: "mtfl-lab 0.1.0" for m in models},
        "datasets": {d: "mtfl-lab 0.1.0" for d in datasets},
        "partitioners": {},
    }
    return device_report(inventory=body)


def test_an_agents_declaration_is_stored_and_listed(api, make_device):
    device = _declare(make_device("decl"), models=["resnet18"], datasets=["digits"])
    assert device.plugins["models"] == {"resnet18": "mtfl-lab 0.1.0"}
    assert "plugins" not in device.inventory
    assert api.get(f"/api/devices/{device.id}/").json()["plugins"]["datasets"] == {"digits": "mtfl-lab 0.1.0"}
    listed = api.get("/api/plugins/").json()
    assert {(r["kind"], r["name"]) for r in listed["installed"]} >= {
        ("models", "resnet18"),
        ("datasets", "digits"),
        ("partitioners", "dirichlet_labels"),
    }
    digits = next(r for r in listed["installed"] if r["name"] == "digits")
    assert digits["builtin"] and digits["source"].startswith("mtfl-lab")
    shards = next(r for r in listed["installed"] if r["name"] == "shards")
    assert [p["name"] for p in shards["details"]["parameters"]] == ["shards_per_device"]
    assert [d["name"] for d in listed["devices"]] == ["decl"]
    assert listed["devices"][0]["plugins"]["models"] == {"resnet18": "mtfl-lab 0.1.0"}


def test_a_run_is_refused_when_a_device_lacks_a_tasks_model(api, make_experiment, make_device):
    lacking = _declare(make_device("lacking"), models=["resnet18"], datasets=["digits"])
    experiment = make_experiment(devices=[make_device("old-agent"), lacking])
    response = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing"}, format="json")
    assert response.status_code == 400, response.json()
    message = response.json()["errors"]["devices"][0]
    assert "device 'lacking' lacks model 'mobilenet_v3_small'" in message
    assert "its agent declares: resnet18" in message and "install the plug-in on that host" in message
    compare = api.post(f"/api/experiments/{experiment.id}/compare/", {}, format="json")
    assert compare.status_code == 400 and "devices" in compare.json()["errors"]
    _declare(lacking, models=["mobilenet_v3_small", "shufflenet_v2_x1_0"], datasets=["digits"])
    ok = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "sharing"}, format="json")
    assert ok.status_code == 201, ok.json()


# --- plug-in tasks and bad plug-ins --------------------------------------------------------


def test_a_plugin_task_on_tabular_data(own_plugins, api, make_device):
    response = api.post("/api/tasks/", {"name": "tab", "architecture": "tiny_mlp", "dataset": "tabular"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["input_shape"] == [6] and body["num_classes"] == 3
    assert (body["train_size"], body["test_size"], body["label_counts"]) == (120, 40, [40, 40, 40])
    task = Task.objects.get(id=body["id"])

    old = make_device("old-agent")
    declared = _declare(make_device("declared"), models=["tiny_mlp"], datasets=["tabular"])
    experiment = experiment_create(
        name="tab",
        task_ids=[task.id],
        device_ids=[old.id, declared.id],
        rounds=1,
        partition_rule="shards",
        partition_params={"shards_per_device": 1},
    )
    with pytest.raises(ApplicationError) as refused:
        run_create(experiment=experiment, strategy="sharing")
    assert refused.value.field == "devices"
    assert "device 'old-agent' lacks model 'tiny_mlp'" in refused.value.message
    assert "only mtfl-lab's built-ins are assumed" in refused.value.message

    listed = api.get("/api/plugins/").json()
    tiny = next(r for r in listed["installed"] if r["name"] == "tiny_mlp")
    assert tiny["source"] == "own-task-plugin 0.3" and not tiny["builtin"]
    assert any(f["name"] == "broken_import" for f in listed["failures"])

    # The control plane must be able to build it too.
    experiment2 = experiment_create(
        name="tab2", task_ids=[task.id], device_ids=[declared.id], rounds=1, partition_rule="iid"
    )
    MODEL_REGISTRY.unregister("tiny_mlp")
    with pytest.raises(ApplicationError) as cannot:
        run_create(experiment=experiment2, strategy="sharing")
    assert cannot.value.field == "tasks"
    assert "the control plane cannot build task 'tab': model 'tiny_mlp' is not installed here" in cannot.value.message


def test_a_sweep_profiles_a_tasks_model_at_its_shape(own_plugins, make_task, make_device):
    from controlplane.experiments.services.sweeps import sweep_start
    from controlplane.profiling.services.predictors import profiled_shapes

    tab = make_task("tab", "tiny_mlp", dataset="tabular")
    zoo = make_task("zoo", "mobilenet_v3_small")
    device = _declare(make_device("prof"), models=["tiny_mlp", "mobilenet_v3_small"], datasets=["tabular", "digits"])
    sweep = sweep_start(device=device, budget_s=10, tasks=[tab.id, zoo.id])
    assert sweep.request["architectures"] == ["tiny_mlp", "mobilenet_v3_small"]
    assert sweep.request["workloads"] == {"tiny_mlp": {"num_classes": 3, "input_shape": [6]}}
    assert profiled_shapes("cpu", {"tiny_mlp", "resnet18"}) == {
        "tiny_mlp": (3, [6]),
        "resnet18": (10, [3, 32, 32]),
    }
    by_name = sweep_start(device=device, budget_s=10, architectures=["mobilenet_v3_small"])
    assert by_name.request["architectures"] == ["mobilenet_v3_small"]
    with pytest.raises(ApplicationError) as shaped:
        sweep_start(device=device, budget_s=10, architectures=["tiny_mlp"])
    assert shaped.value.field == "architectures"
    assert "task 'tab' feeds it samples of shape (6,): name the tasks instead" in shaped.value.message
    lacking = _declare(make_device("no-mlp"), models=["mobilenet_v3_small"], datasets=["digits"])
    with pytest.raises(ApplicationError) as refused:
        sweep_start(device=lacking, budget_s=10, tasks=[tab.id])
    assert refused.value.field == "tasks" and "lacks model 'tiny_mlp'" in refused.value.message


def test_mtfl_profile_takes_tasks_at_their_shape(own_plugins, make_task, make_device, monkeypatch):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from controlplane.core.management.commands import profile
    from controlplane.profiling.models import ProfileSweep

    make_task("tab", "tiny_mlp", dataset="tabular")
    _declare(make_device("prof"), models=["tiny_mlp"], datasets=["tabular"])
    with pytest.raises(CommandError, match="--tasks: no task with id or name 'nope'"):
        call_command("profile", "--device", "prof", "--budget", "10", "--tasks", "nope")
    monkeypatch.setattr(profile, "use_running_broker", lambda: None)
    monkeypatch.setattr(profile.Command, "_require_control_worker", lambda self: None)
    monkeypatch.setattr(profile.Command, "_follow", lambda self, sweep: sweep)
    call_command("profile", "--device", "prof", "--budget", "10", "--tasks", "tab")
    sweep = ProfileSweep.objects.get()
    assert sweep.request["architectures"] == ["tiny_mlp"]
    assert sweep.request["workloads"] == {"tiny_mlp": {"num_classes": 3, "input_shape": [6]}}


@pytest.mark.parametrize(
    "body,field,text",
    [
        ({"architecture": "raising_model"}, "architecture", "raising_model fails"),
        ({"architecture": "not_a_module"}, "architecture", "Module"),
        ({"architecture": "wrong_outputs"}, "architecture", ""),
        ({"architecture": "broken_import"}, "architecture", "'broken_import' is not allowed"),
        ({"dataset": "raising_data"}, "dataset", "raising_data fails"),
        ({"dataset": "lengths_disagree"}, "dataset", ""),
        ({"dataset": "negative_labels"}, "dataset", ""),
        ({"dataset": "npz", "dataset_root": "/nowhere/at/all.npz"}, "dataset_root", ""),
    ],
)
def test_every_bad_plugin_is_refused_naming_the_field(own_plugins, api, body, field, text):
    request = {"name": "bad", "architecture": "tiny_mlp", "dataset": "tabular", **body}
    response = api.post("/api/tasks/", request, format="json")
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert field in errors, errors
    assert text in errors[field][0]
    assert not Task.objects.filter(name="bad").exists()


def test_a_plugin_task_created_in_the_service_gets_the_same_refusal(own_plugins):
    with pytest.raises(ApplicationError) as refused:
        task_create(name="bad", architecture="tiny_mlp", dataset="tabular", num_classes=2)
    assert refused.value.field == "num_classes"
