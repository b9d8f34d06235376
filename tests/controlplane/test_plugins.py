"""A strategy and an execution backend installed at run time as real entry points (a
``*.dist-info`` folder put on ``sys.path``), with no code of the project changed and no
migration: the API accepts them, refuses unknown names listing them, and the dashboard lists them.
"""

from __future__ import annotations

import pytest

from controlplane.planning.strategies import STRATEGY_REGISTRY
from tests.plugin_dist import installed_distribution
from workers.registry.backends import BACKEND_REGISTRY

PLUGIN = '''
"""A third-party plug-in as it would ship: a strategy and a backend, built on the public records."""

from controlplane.planning.strategies import Strategy, plan_isolation
from workers.registry.backends import Backend


def _plan(spec, ctx):
    return plan_isolation(spec, batch_size=32)


def _create():
    from workers.backends.simulated import SimulatedBackend

    return SimulatedBackend()


STRATEGY = Strategy("half_batch", "half_batch — isolation at batch 32 (plug-in)", "mps", _plan)
BACKEND = Backend("plugin-sim", "plugin-sim — the simulated model under another name (plug-in)", _create,
                  simulated=True)
'''

ENTRY_POINTS = """\
[mtfl.strategies]
half_batch = fake_mtfl_plugin:STRATEGY

[mtfl.backends]
plugin-sim = fake_mtfl_plugin:BACKEND
"""


@pytest.fixture
def installed_plugin(tmp_path):
    """``fake_mtfl_plugin`` installed on ``sys.path`` with its entry points, then removed."""
    with installed_distribution(tmp_path, "fake-mtfl-plugin", "0.1", {"fake_mtfl_plugin": PLUGIN}, ENTRY_POINTS):
        yield


def test_a_plugin_strategy_and_backend_are_accepted_by_the_api(installed_plugin, api, make_experiment, make_device):
    assert STRATEGY_REGISTRY.failures == [] and BACKEND_REGISTRY.failures == []
    created = api.post("/api/devices/", {"name": "plug-a", "backend": "plugin-sim"}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["backend"] == "plugin-sim"
    changed = api.patch(f"/api/devices/{created.json()['id']}/", {"backend": "plugin-sim"}, format="json")
    assert changed.status_code == 200, changed.json()

    devices = [make_device("plug-b", "plugin-sim"), make_device("plug-c", "plugin-sim")]  # their agents report it
    experiment = make_experiment(devices=devices)
    run = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "half_batch"}, format="json")
    assert run.status_code == 201, run.json()
    assert run.json()["strategy"] == "half_batch"


def test_unknown_names_are_refused_listing_the_plugins_too(installed_plugin, api, make_experiment):
    bad_backend = api.post("/api/devices/", {"name": "plug-d", "backend": "tpu"}, format="json")
    assert bad_backend.status_code == 400
    message = bad_backend.json()["errors"]["backend"][0]
    assert "'tpu' is not allowed; allowed: cpu" in message and "plugin-sim" in message

    experiment = make_experiment()
    bad_strategy = api.post(f"/api/experiments/{experiment.id}/runs/", {"strategy": "fastest"}, format="json")
    assert bad_strategy.status_code == 400
    message = bad_strategy.json()["errors"]["strategy"][0]
    assert "'fastest' is not allowed; allowed: temporal" in message and "half_batch" in message


def test_the_dashboard_forms_list_the_plugins(installed_plugin, browser_client, make_experiment):
    from controlplane.dashboard.forms import DeviceForm, RunForm

    assert ("plugin-sim", BACKEND_REGISTRY.get("plugin-sim").label) in DeviceForm().fields["backend"].widget.choices
    assert ("half_batch", STRATEGY_REGISTRY.get("half_batch").label) in RunForm().fields["strategy"].widget.choices
    page = browser_client.get("/devices/new/")
    assert page.status_code == 200 and b'value="plugin-sim"' in page.content
    experiment = make_experiment()
    page = browser_client.get(f"/experiments/{experiment.id}/")
    assert page.status_code == 200 and b'value="half_batch"' in page.content


def test_without_the_plugin_its_names_are_refused(api):
    assert "plugin-sim" not in BACKEND_REGISTRY and "half_batch" not in STRATEGY_REGISTRY
    refused = api.post("/api/devices/", {"name": "plug-e", "backend": "plugin-sim"}, format="json")
    assert refused.status_code == 400 and "backend" in refused.json()["errors"]
