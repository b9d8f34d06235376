"""The dashboard's forms with plug-ins installed at run time as real entry points (a
``*.dist-info`` folder put on ``sys.path``, as tests/controlplane/test_plugins.py does): the task
form lists a plug-in model and data set with their package, the experiment form a plug-in
partition rule with an input for its parameter, and an experiment made through that form is split
by the plug-in's rule with the parameter typed in.
"""

from __future__ import annotations

import re
from html import escape

import pytest

from controlplane.experiments.models import Experiment
from tests.plugin_dist import installed_distribution
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY

pytestmark = pytest.mark.django_db

PLUGIN = '''
"""A researcher's plug-in as it would ship: a model, a data set and a partition rule."""

import numpy as np

from workers.registry.partitioners import PartitionParameter, Partitioner


def tiny_rows_mlp(num_classes, input_shape):
    """A one-layer perceptron on feature rows."""
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def noise_rows(root):
    """Random feature rows with random labels."""
    from workers.registry.datasets import ArraySplits

    rng = np.random.default_rng(0)
    return ArraySplits(
        rng.standard_normal((60, 5), dtype=np.float32),
        rng.integers(0, 3, 60).astype(np.int64),
        rng.standard_normal((20, 5), dtype=np.float32),
        rng.integers(0, 3, 20).astype(np.int64),
    )


def _first_takes(labels, num_devices, params, seed):
    """The first device holds `fraction` of the samples, the others share the rest evenly."""
    n = len(labels)
    order = np.random.default_rng(seed).permutation(n)
    first = int(round(params["fraction"] * n)) if num_devices > 1 else n
    rest = np.array_split(order[first:], max(1, num_devices - 1))
    return [np.sort(order[:first])] + [np.sort(part) for part in rest][: num_devices - 1]


FIRST_TAKES = Partitioner(
    "first_takes",
    "first_takes — one device holds a fraction of every task",
    _first_takes,
    parameters=(PartitionParameter("fraction", "share of the first device", "float", 0.0, 1.0, True, 0.5),),
)
'''


ENTRY_POINTS = """\
[mtfl.models]
tiny_rows_mlp = fake_mtfl_task_plugin:tiny_rows_mlp
broken_net = fake_mtfl_task_plugin_missing:build

[mtfl.datasets]
noise_rows = fake_mtfl_task_plugin:noise_rows

[mtfl.partitioners]
first_takes = fake_mtfl_task_plugin:FIRST_TAKES
"""


@pytest.fixture
def installed_task_plugin(tmp_path):
    """``fake_mtfl_task_plugin`` (distribution ``fake-mtfl-task-plugin 0.2``) installed on
    ``sys.path`` with a model, a data set and a partition rule, then removed; a second entry point
    of the model group names a module that is not there (a broken plug-in)."""
    modules = {"fake_mtfl_task_plugin": PLUGIN}
    with installed_distribution(tmp_path, "fake-mtfl-task-plugin", "0.2", modules, ENTRY_POINTS):
        yield


SOURCE = "fake-mtfl-task-plugin 0.2"


def test_the_task_form_lists_the_plugin_model_and_data_set_with_their_package(installed_task_plugin, browser_client):
    from controlplane.dashboard.forms import TaskForm

    assert MODEL_REGISTRY.source("tiny_rows_mlp") == SOURCE
    models = dict(TaskForm().fields["architecture"].widget.choices)
    assert SOURCE in models["tiny_rows_mlp"] and models["tiny_rows_mlp"].startswith("tiny_rows_mlp")
    assert "broken_net" not in models  # failed to load: not offered

    html = browser_client.get("/tasks/new/").content.decode()
    assert '<option value="tiny_rows_mlp"' in html and SOURCE in html
    noise = DATASET_REGISTRY.get("noise_rows")
    # its shape and classes follow from its arrays: the form cannot say them before reading them
    assert escape(f"{noise.label} (shape from the files)") in html
    assert re.search(r'<option value="noise_rows"[^>]* data-needs-root="false"', html)


def test_the_experiment_form_offers_the_plugin_rule_and_its_parameter(installed_task_plugin, browser_client):
    html = browser_client.get("/experiments/new/").content.decode()
    assert '<option value="first_takes">' in html and escape(f"· {SOURCE}") in html
    start = html.index('name="partition-first_takes-fraction"')
    tag = html[html.rindex("<input", 0, start) : html.index(">", start)]
    assert 'data-partition-rule="first_takes"' in tag and 'min="0.0"' in tag and 'max="1.0"' in tag
    assert 'value="0.5"' in tag
    assert "share of the first device" in html and "first_takes only: in (0, 1]; blank: the default" in html


def test_an_experiment_split_by_the_plugin_rule_through_the_form(
    installed_task_plugin, browser_client, make_device, make_task
):
    devices = [make_device("dev-a"), make_device("dev-b"), make_device("dev-c")]
    task = make_task("t-digits", "mobilenet_v3_small")
    form = {
        "name": "first-takes",
        "tasks": [task.id],
        "devices": [d.id for d in devices],
        "rounds": "1",
        "local_epochs": "1",
        "seed": "0",
        "partition_rule": "first_takes",
        "partition-first_takes-fraction": "0.8",
    }

    response = browser_client.post("/experiments/new/", form)

    assert response.status_code == 302, response.content.decode()[:3000]
    experiment = Experiment.objects.get(name="first-takes")
    assert experiment.partition_rule == "first_takes" and experiment.partition_params == {"fraction": 0.8}
    counts = {s.device.name: s.num_samples for s in experiment.shards.select_related("device")}
    assert counts["dev-a"] == round(0.8 * task.train_size)
    assert counts["dev-b"] + counts["dev-c"] == task.train_size - counts["dev-a"]

    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert '<span class="partition-param"><abbr title="share of the first device">fraction</abbr> = 0.8</span>' in page


def test_a_parameter_out_of_the_plugins_range_is_refused_at_its_input(
    installed_task_plugin, browser_client, api, make_device, make_task
):
    device, task = make_device("dev-a"), make_task("t-digits", "mobilenet_v3_small")
    body = {"name": "x", "tasks": [task.id], "devices": [device.id], "rounds": 1, "partition_rule": "first_takes"}
    refused = api.post("/api/experiments/", {**body, "partition_params": {"fraction": 0}}, format="json")
    assert refused.status_code == 400
    message = next(iter(refused.json()["errors"].values()))[0]

    form = {**body, "rounds": "1", "partition-first_takes-fraction": "0"}
    response = browser_client.post("/experiments/new/", form)

    assert response.status_code == 400
    html = response.content.decode()
    start = html.index('id="field-partition-first_takes-fraction"')
    assert escape(message) in html[start : html.index("</label>", start)]
