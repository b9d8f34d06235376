"""The plug-in check (issue 21 item 4) on real plug-ins installed as entry points (a ``*.dist-info``
folder on ``sys.path``): every bad case is refused naming its field, in this process and in the
child process, which also survives a plug-in that hangs or kills its process."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from tests.plugin_dist import installed_distribution
from workers.protocol.messages import DatasetRef
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.training.datasets import load_split, load_splits
from workers.training.plugin_check import (
    PluginCheckError,
    TaskCheck,
    check_task,
    check_task_in_child,
    clear_check_cache,
    default_timeout_s,
)

PLUGIN = '''
"""Models and data sets for the check's tests, good and broken."""

import os
import time
from types import SimpleNamespace

import numpy as np

from workers.registry.datasets import ArraySplits


def mlp(num_classes, input_shape):
    """A two-layer perceptron over flattened samples.

    More text that is not the label.
    """
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 16), nn.ReLU(), nn.Linear(16, num_classes))


def raising_model(num_classes, input_shape):
    raise RuntimeError("this model cannot be built")


def not_a_module(num_classes, input_shape):
    return "a string"


def wrong_output(num_classes, input_shape):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes + 1))


def exiting_model(num_classes, input_shape):
    os._exit(3)


def _tabular(n=64, features=20, classes=3):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = np.arange(n) % classes
    return x, y


def tabular(root):
    """Generated tabular data: 20 features, 3 classes."""
    x, y = _tabular()
    return SimpleNamespace(x_train=x[:48], y_train=y[:48], x_test=x[48:], y_test=y[48:])


def tabular_dict(root):
    """The same tabular data as a mapping of the four arrays."""
    x, y = _tabular()
    return {"x_train": x[:48], "y_train": y[:48], "x_test": x[48:], "y_test": y[48:]}


def dict_no_test(root):
    x, y = _tabular()
    return {"x_train": x, "y_train": y}


def mismatched(root):
    x, y = _tabular()
    return ArraySplits(x[:48], y[:47], x[48:], y[48:])


def negative_labels(root):
    x, y = _tabular()
    y = y.copy()
    y[3] = -1
    return ArraySplits(x[:48], y[:48], x[48:], y[48:])


def float64_x(root):
    x, y = _tabular()
    return ArraySplits(x[:48].astype(np.float64), y[:48], x[48:], y[48:])


def no_test(root):
    x, y = _tabular()
    return SimpleNamespace(x_train=x, y_train=y)


def raising_dataset(root):
    raise ValueError("no data today")


def slow_dataset(root):
    time.sleep(60)
'''

BROKEN = """
raise ImportError("this plug-in's import fails")
"""

ENTRY_POINTS = """\
[mtfl.models]
ck_mlp = mtfl_check_plugin:mlp
ck_raising = mtfl_check_plugin:raising_model
ck_not_module = mtfl_check_plugin:not_a_module
ck_wrong_output = mtfl_check_plugin:wrong_output
ck_exit = mtfl_check_plugin:exiting_model
ck_broken = mtfl_check_plugin_broken:mlp

[mtfl.datasets]
ck_tabular = mtfl_check_plugin:tabular
ck_tabular_dict = mtfl_check_plugin:tabular_dict
ck_dict_no_test = mtfl_check_plugin:dict_no_test
ck_mismatched = mtfl_check_plugin:mismatched
ck_negative = mtfl_check_plugin:negative_labels
ck_float64 = mtfl_check_plugin:float64_x
ck_no_test = mtfl_check_plugin:no_test
ck_raising = mtfl_check_plugin:raising_dataset
ck_slow = mtfl_check_plugin:slow_dataset
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """``mtfl-check-plugin 1.2`` installed on ``sys.path`` (seen by the check's child too)."""
    try:
        with installed_distribution(
            tmp_path_factory.mktemp("site"),
            "mtfl-check-plugin",
            "1.2",
            {"mtfl_check_plugin": PLUGIN, "mtfl_check_plugin_broken": BROKEN},
            ENTRY_POINTS,
            registries=(MODEL_REGISTRY, DATASET_REGISTRY),
        ) as folder:
            clear_check_cache()
            yield folder
    finally:
        clear_check_cache()


def refused(call, *args, **kwargs) -> PluginCheckError:
    with pytest.raises(PluginCheckError) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert str(error) == f"{error.field}: {error.reason}" and isinstance(error, ValueError)
    return error


# ------------------------------------------------------------------------------ in-process


def test_a_good_plugin_pair_passes_with_its_shape_and_classes(plugin):
    stages: list[tuple[str, str]] = []

    check = check_task("ck_mlp", "ck_tabular", None, on_stage=lambda field, what: stages.append((field, what)))

    assert check.input_shape == (20,) and check.num_classes == 3
    assert (check.train_size, check.test_size) == (48, 16)
    assert check.train_labels.dtype == np.int64 and check.train_labels.tolist() == [i % 3 for i in range(48)]
    assert check.test_labels.tolist() == [i % 3 for i in range(48, 64)]
    assert ("dataset", "loading 'ck_tabular'") in stages and stages[-1][0] == "architecture"


@pytest.mark.parametrize("dataset", ["ck_tabular", "ck_tabular_dict"], ids=["object", "mapping"])
def test_a_loader_may_return_an_object_or_a_mapping_of_the_four_arrays(plugin, dataset):
    """The natural first try, a dict of the four arrays, works as the object with attributes does:
    in the check and where trainers read the arrays."""
    check = check_task("ck_mlp", dataset, None)
    assert (check.input_shape, check.num_classes, check.train_size, check.test_size) == ((20,), 3, 48, 16)

    splits = load_splits(DatasetRef(name=dataset))
    assert splits.x_train.shape == (48, 20) and splits.y_test.tolist() == [i % 3 for i in range(48, 64)]
    x, y = load_split(DatasetRef(name=dataset), "test", np.array([0, 2]))
    assert tuple(x.shape) == (2, 20) and y.tolist() == [48 % 3, 50 % 3]


def test_a_stated_num_classes_above_the_labels_is_kept(plugin):
    assert check_task("ck_mlp", "ck_tabular", None, num_classes=5).num_classes == 5


def test_a_builtin_pair_passes(plugin):
    check = check_task("resnet18", "digits", None)
    assert (check.input_shape, check.num_classes, check.train_size, check.test_size) == ((3, 32, 32), 10, 1437, 360)


@pytest.mark.parametrize(
    ("architecture", "dataset", "field", "words"),
    [
        ("ck_broken", "ck_tabular", "architecture", ["'ck_broken'", "failed to load", "this plug-in's import fails"]),
        ("ck_raising", "ck_tabular", "architecture", ["RuntimeError: this model cannot be built"]),
        ("ck_not_module", "ck_tabular", "architecture", ["returned str, not a torch.nn.Module"]),
        ("ck_wrong_output", "ck_tabular", "architecture", ["shape (2, 4)", "expected float logits of shape (2, 3)"]),
        ("resnet18", "ck_tabular", "architecture", ["input_shape", "(20,)"]),
        ("ck_mlp", "ck_mismatched", "dataset", ["x_train has 48 samples, y_train 47 labels"]),
        ("ck_mlp", "ck_negative", "dataset", ["label -1", "[0, num_classes)"]),
        ("ck_mlp", "ck_float64", "dataset", ["float64", "must be float32"]),
        ("ck_mlp", "ck_no_test", "dataset", ["no x_test"]),
        ("ck_mlp", "ck_no_test", "dataset", ["(SimpleNamespace) have no x_test, y_test"]),
        ("ck_mlp", "ck_dict_no_test", "dataset", ["(dict) have no x_test, y_test", "a mapping with the keys"]),
        ("ck_mlp", "ck_raising", "dataset", ["ValueError: no data today"]),
        ("nope", "ck_tabular", "architecture", ["'nope' is not allowed; allowed: resnet18", "ck_mlp"]),
        ("ck_mlp", "nope", "dataset", ["'nope' is not allowed; allowed: digits", "ck_tabular"]),
    ],
)
def test_each_bad_plugin_is_refused_naming_its_field(plugin, architecture, dataset, field, words):
    error = refused(check_task, architecture, dataset, None)

    assert error.field == field
    for word in words:
        assert word in error.reason


def test_labels_beyond_a_stated_num_classes_name_num_classes(plugin):
    error = refused(check_task, "ck_mlp", "ck_tabular", None, num_classes=2)
    assert error.field == "num_classes" and "labels reach 2" in error.reason and "allowed 3 to 100000" in error.reason


def test_a_missing_path_names_dataset_root(tmp_path):
    missing = tmp_path / "nowhere"

    error = refused(check_task, "resnet18", "npz", str(missing))
    assert error.field == "dataset_root" and str(missing) in error.reason and "does not exist" in error.reason

    error = refused(check_task, "resnet18", "cifar10", str(tmp_path))  # exists, but holds no CIFAR-10
    assert error.field == "dataset_root" and "cifar-10-batches-py" in error.reason

    error = refused(check_task, "resnet18", "npz", None)
    assert error.field == "dataset_root" and "is required for npz" in error.reason


def test_npz_arrays_in_a_file_pass_and_labels_out_of_range_are_refused(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 3, 32, 32)).astype(np.float32)
    y = np.arange(30) % 4
    np.savez(tmp_path / "good.npz", x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])

    check = check_task("resnet18", "npz", str(tmp_path / "good.npz"))
    assert (check.input_shape, check.num_classes, check.train_size) == ((3, 32, 32), 4, 20)

    error = refused(check_task, "resnet18", "npz", str(tmp_path / "good.npz"), num_classes=3)
    assert error.field == "num_classes"


# ------------------------------------------------------------------------------ in a child


def test_the_child_gives_the_same_answer_and_caches_it(plugin):
    sys.modules.pop("mtfl_check_plugin", None)
    started = time.monotonic()
    check = check_task_in_child("ck_mlp", "ck_tabular", None, timeout_s=120)
    first = time.monotonic() - started

    assert "mtfl_check_plugin" not in sys.modules  # the child imported the plug-in, not this process

    assert isinstance(check, TaskCheck)
    assert check.input_shape == (20,) and check.num_classes == 3 and check.train_size == 48
    assert check.train_labels.tolist() == [i % 3 for i in range(48)] and check.test_labels.dtype == np.int64
    started = time.monotonic()
    assert check_task_in_child("ck_mlp", "ck_tabular", None, timeout_s=120) is check
    assert time.monotonic() - started < min(0.5, first)


def test_the_child_refuses_bad_plugins_naming_the_field(plugin, tmp_path):
    error = refused(check_task_in_child, "ck_wrong_output", "ck_tabular", None, timeout_s=120)
    assert error.field == "architecture" and "shape (2, 4)" in error.reason

    error = refused(check_task_in_child, "ck_mlp", "ck_mismatched", None, timeout_s=120)
    assert error.field == "dataset" and "y_train 47 labels" in error.reason

    error = refused(check_task_in_child, "resnet18", "npz", str(tmp_path / "missing.npz"), timeout_s=120)
    assert error.field == "dataset_root" and "does not exist" in error.reason


def test_a_slow_plugin_is_stopped_at_the_time_limit_naming_its_stage(plugin):
    started = time.monotonic()

    error = refused(check_task_in_child, "ck_mlp", "ck_slow", None, timeout_s=3)

    assert time.monotonic() - started < 30
    assert error.field == "dataset"
    assert error.reason == "loading 'ck_slow' did not finish within 3 s"


def test_a_plugin_that_ends_its_process_is_reported_not_fatal(plugin):
    error = refused(check_task_in_child, "ck_exit", "ck_tabular", None, timeout_s=120)

    assert error.field == "architecture"
    assert error.reason.startswith("building 'ck_exit'") and "exited with status 3 without an answer" in error.reason


def test_the_default_time_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("MTFL_PLUGIN_CHECK_TIMEOUT_S", raising=False)
    assert default_timeout_s() == 120
    monkeypatch.setenv("MTFL_PLUGIN_CHECK_TIMEOUT_S", "7.5")
    assert default_timeout_s() == 7.5
    monkeypatch.setenv("MTFL_PLUGIN_CHECK_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="MTFL_PLUGIN_CHECK_TIMEOUT_S must be a positive number"):
        default_timeout_s()
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        check_task_in_child("resnet18", "digits", None, timeout_s=0)


# ------------------------------------------------------------------------------- inventory


def test_the_inventory_lists_builtins_and_plugins_with_their_sources(plugin, monkeypatch, tmp_path):
    from importlib.metadata import version

    from workers.agent import app as agent
    from workers.registry.inventory import installed_plugins

    builtin = f"mtfl-lab {version('mtfl-lab')}"

    plugins = installed_plugins()

    assert set(plugins) == {"models", "datasets", "partitioners"}
    assert plugins["models"]["resnet18"] == builtin and plugins["models"]["ck_mlp"] == "mtfl-check-plugin 1.2"
    assert "ck_broken" not in plugins["models"]  # its import failed: nothing to declare
    assert plugins["datasets"]["npz"] == builtin and plugins["datasets"]["ck_tabular"] == "mtfl-check-plugin 1.2"
    assert plugins["partitioners"]["iid"] == builtin

    monkeypatch.setenv(agent.ENV_DEVICE, "dev-p")
    monkeypatch.setenv(agent.ENV_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.delenv(agent.ENV_CORES, raising=False)
    inventory = agent.build_inventory(agent.agent_settings())
    assert inventory.plugins == plugins


def test_a_task_without_plugins_is_answered_here_as_the_full_check_would(monkeypatch):
    """The built-in digits with a built-in architecture start no child process (nothing a
    researcher installed runs), and the answer is the full in-process check's."""
    from workers.training import plugin_check as check

    clear_check_cache()

    def no_child(*args, **kwargs):
        raise AssertionError("a child process was started for a task without plug-ins")

    monkeypatch.setattr(check, "_run_child", no_child)
    quick = check_task_in_child("mobilenet_v3_small", "digits", None)
    full = check_task("mobilenet_v3_small", "digits", None)
    assert (quick.input_shape, quick.num_classes, quick.train_size, quick.test_size) == (
        full.input_shape,
        full.num_classes,
        full.train_size,
        full.test_size,
    )
    assert np.array_equal(quick.train_labels, full.train_labels) and np.array_equal(quick.test_labels, full.test_labels)
    with pytest.raises(PluginCheckError) as refused:
        check_task_in_child("mobilenet_v3_small", "digits", None, num_classes=5)
    assert refused.value.field == "num_classes"
    clear_check_cache()
