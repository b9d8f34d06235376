"""The registries: registration rules, entry-point plug-ins (good, broken, wrong), and the
built-in models, data sets, partitioners and backends every caller reads."""

from __future__ import annotations

import textwrap
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import pytest
from pydantic import ValidationError

from tests.plugin_dist import installed_distribution
from workers.registry.backends import BACKEND_REGISTRY, Backend, get_backend
from workers.registry.base import PluginLoadError, Registry, UnknownEntryError
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY, Model
from workers.registry.partitioners import PARTITIONER_REGISTRY

GROUP = "mtfl.test_widgets"


@dataclass(frozen=True)
class Widget:
    name: str
    size: int = 1


def widgets() -> Registry[Widget]:
    return Registry("widget", GROUP, Widget)


def test_duplicate_names_are_refused_unless_replaced():
    registry = widgets()
    first = registry.register(Widget("a"))
    assert registry.register(first) is first  # the same record again is no duplicate
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        registry.register(Widget("a", 2))
    registry.register(Widget("a", 2), replace=True)
    assert registry.get("a").size == 2


def test_records_of_another_type_and_empty_names_are_refused():
    registry = widgets()
    with pytest.raises(TypeError, match="widget registry takes Widget records, got Model"):
        registry.register(Model("a", "a", lambda n, s: None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty name"):
        registry.register(Widget(""))


def test_an_unknown_name_names_the_field_and_lists_the_allowed_ones():
    registry = widgets()
    registry.register(Widget("a"))
    registry.register(Widget("b"))
    with pytest.raises(UnknownEntryError) as caught:
        registry.get("c", field="gadget")
    assert str(caught.value) == "gadget: 'c' is not allowed; allowed: a, b"
    assert caught.value.allowed == ("a", "b") and isinstance(caught.value, ValueError)
    assert registry.check("a") == "a" and "a" in registry and "c" not in registry


WIDGET_PLUGIN = """\
from tests.workers.test_registry import Widget

BIG = Widget("big", 10)


def make_small():
    return Widget("small", 0)


NOT_A_WIDGET = "big"
"""


@pytest.fixture
def install_widgets(tmp_path):
    """``install_widgets(entry_points)`` installs ``widget-plugin 0.1`` with ``entry_points`` of
    :data:`GROUP` on ``sys.path``; it is removed after the test."""
    with ExitStack() as installed:

        def install(entry_points: str) -> None:
            entry_points = f"[{GROUP}]\n" + textwrap.dedent(entry_points)
            modules = {"widget_plugin": WIDGET_PLUGIN}
            installed.enter_context(
                installed_distribution(tmp_path, "widget-plugin", "0.1", modules, entry_points, registries=())
            )

        yield install


def test_entry_points_give_records_or_callables_returning_them(install_widgets):
    install_widgets(
        """\
        big = widget_plugin:BIG
        small = widget_plugin:make_small
        """,
    )
    registry = widgets()
    registry.register(Widget("builtin"))
    assert registry.names() == ("builtin", "big", "small")  # built-ins first, then plug-ins
    assert registry.get("big").size == 10 and registry.get("small").size == 0
    assert registry.failures == []


def test_a_broken_plugin_is_reported_and_the_others_still_load(install_widgets):
    install_widgets(
        """\
        big = widget_plugin:BIG
        missing = widget_plugin_that_is_not_installed:THING
        wrong = widget_plugin:NOT_A_WIDGET
        renamed = widget_plugin:BIG
        """,
    )
    registry = widgets()
    assert registry.names() == ("big",)
    failures = {f.name: f for f in registry.failures}
    assert set(failures) == {"missing", "wrong", "renamed"}
    assert failures["missing"].error.startswith("ModuleNotFoundError")
    assert failures["wrong"].error.startswith(PluginLoadError.__name__) and "gave str" in failures["wrong"].error
    assert "gave a record named 'big'" in failures["renamed"].error
    assert (
        failures["missing"].group == GROUP and failures["missing"].value == "widget_plugin_that_is_not_installed:THING"
    )


def test_reload_plugins_sees_a_plugin_installed_after_the_first_read(install_widgets):
    registry = widgets()
    assert registry.names() == ()
    install_widgets("big = widget_plugin:BIG\n")
    assert "big" not in registry  # entry points are read once...
    registry.reload_plugins()
    assert "big" in registry  # ...until asked again


def test_entries_registered_in_code_come_from_mtfl_lab():
    from importlib.metadata import version

    registry = widgets()
    registry.register(Widget("a"))
    registry.register(Widget("b"), source="someone-else 2.0")

    assert registry.source("a") == f"mtfl-lab {version('mtfl-lab')}" == MODEL_REGISTRY.source("resnet18")
    assert registry.source("b") == "someone-else 2.0"
    registry.register(registry.get("b"))  # the same record again keeps its source
    assert registry.source("b") == "someone-else 2.0"
    with pytest.raises(UnknownEntryError, match="widget: 'c' is not allowed"):
        registry.source("c")


def test_an_entry_points_source_is_its_distribution_and_version(install_widgets):
    install_widgets("big = widget_plugin:BIG\nsmall = widget_plugin:make_small\n")
    registry = widgets()

    assert registry.source("big") == registry.source("small") == "widget-plugin 0.1"


MODEL_PLUGIN = '''
import numpy as np


def tiny_mlp(num_classes, input_shape):
    """A one-layer perceptron over flattened samples.

    Not part of the label.
    """
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def undocumented(num_classes, input_shape):
    from torch import nn

    return nn.Linear(input_shape[0], num_classes)


def features(root):
    """Twelve samples of 5 features."""
    from workers.registry.datasets import ArraySplits

    x = np.arange(60, dtype=np.float32).reshape(12, 5)
    y = np.arange(12) % 2
    return ArraySplits(x[:8], y[:8], x[8:], y[8:])


features.num_classes = 2
features.input_shape = (5,)


def rooted(root):
    """Arrays from a folder."""
    raise FileNotFoundError(root)


rooted.needs_root = True


def bad_shape(root):
    return None


bad_shape.input_shape = (0,)
'''


CALLABLE_ENTRY_POINTS = """\
[mtfl.models]
tiny_mlp = callable_plugin:tiny_mlp
undocumented = callable_plugin:undocumented

[mtfl.datasets]
features = callable_plugin:features
rooted = callable_plugin:rooted
bad_shape = callable_plugin:bad_shape
"""


@pytest.fixture
def callable_plugins(tmp_path):
    """``callable-plugin 3.1`` with models and data sets as plain callables (issue 21's form)."""
    modules = {"callable_plugin": MODEL_PLUGIN}
    registries = (MODEL_REGISTRY, DATASET_REGISTRY)
    with installed_distribution(
        tmp_path, "callable-plugin", "3.1", modules, CALLABLE_ENTRY_POINTS, registries=registries
    ):
        yield


def test_a_model_entry_point_is_a_builder_wrapped_into_a_record(callable_plugins):
    import torch

    from workers.training.zoo import build_model

    record = MODEL_REGISTRY.get("tiny_mlp")
    assert record.label == "tiny_mlp — A one-layer perceptron over flattened samples."
    assert MODEL_REGISTRY.get("undocumented").label == "undocumented (callable-plugin 3.1)"
    assert MODEL_REGISTRY.source("tiny_mlp") == "callable-plugin 3.1"
    assert MODEL_REGISTRY.names()[-2:] == ("tiny_mlp", "undocumented")  # after the built-ins

    model = build_model("tiny_mlp", 4, 0, (5,))
    assert model(torch.zeros(3, 5)).shape == (3, 4)


def test_a_dataset_entry_point_is_a_loader_wrapped_into_a_record(callable_plugins):
    from workers.protocol.messages import DatasetRef
    from workers.training.datasets import load_split

    record = DATASET_REGISTRY.get("features")
    assert record.label == "features — Twelve samples of 5 features."
    assert (record.input_shape, record.num_classes, record.needs_root) == ((5,), 2, False)
    assert DATASET_REGISTRY.get("rooted").needs_root
    assert DATASET_REGISTRY.source("features") == "callable-plugin 3.1"

    x, y = load_split(DatasetRef(name="features"), "test", np.array([3, 0]))
    assert x.tolist() == [[55.0, 56.0, 57.0, 58.0, 59.0], [40.0, 41.0, 42.0, 43.0, 44.0]] and y.tolist() == [1, 0]

    failures = {f.name: f.error for f in DATASET_REGISTRY.failures}
    assert set(failures) == {"bad_shape"}
    assert "bad_shape.input_shape must be 1 to 4 positive ints, got (0,)" in failures["bad_shape"]


def test_reloading_keeps_a_callable_plugin_without_a_failure(callable_plugins):
    record = MODEL_REGISTRY.get("tiny_mlp")

    MODEL_REGISTRY.reload_plugins()

    assert MODEL_REGISTRY.failures == [] and MODEL_REGISTRY.get("tiny_mlp") == record


def test_the_builtin_models_refuse_shapes_that_are_not_3_channel_images():
    build = MODEL_REGISTRY.get("resnet18").build
    with pytest.raises(
        ValueError, match=r"input_shape: resnet18 takes images of shape \(3, height, width\), got \(20,\)"
    ):
        build(10, (20,))
    with pytest.raises(ValueError, match="input_shape: resnet18 takes 3 input channels, got 1"):
        build(10, (1, 32, 32))


def test_the_builtins_are_registered():
    assert MODEL_REGISTRY.names() == (
        "resnet18",
        "resnet50",
        "resnet101",
        "vgg16",
        "mobilenet_v3_small",
        "mobilenet_v3_large",
        "shufflenet_v2_x1_0",
        "densenet121",
    )
    assert DATASET_REGISTRY.names() == ("digits", "cifar10", "npz", "imagefolder")
    assert not DATASET_REGISTRY.get("digits").needs_root
    assert all(DATASET_REGISTRY.get(name).needs_root for name in ("cifar10", "npz", "imagefolder"))
    assert (
        DATASET_REGISTRY.get("digits").input_shape == (3, 32, 32) and DATASET_REGISTRY.get("digits").num_classes == 10
    )
    assert DATASET_REGISTRY.get("npz").input_shape is None and DATASET_REGISTRY.get("npz").num_classes is None
    assert DATASET_REGISTRY.get("imagefolder").input_shape == (3, 32, 32)
    assert PARTITIONER_REGISTRY.names() == ("iid", "quantity", "dirichlet_labels", "shards")
    assert BACKEND_REGISTRY.names() == ("cpu", "simulated", "cuda-mps", "cuda-timeslice")
    assert BACKEND_REGISTRY.get("cuda-timeslice").partitionings == ("timeslice",)
    assert BACKEND_REGISTRY.get("simulated").simulated and not BACKEND_REGISTRY.get("cpu").simulated
    assert get_backend("simulated").name == "simulated"


def test_a_backend_record_checks_its_partitionings():
    with pytest.raises(ValueError, match="partitionings must be a non-empty subset of timeslice, mps"):
        Backend("x", "x", object, partitionings=("mig",))
    with pytest.raises(ValueError, match="partitionings"):
        Backend("x", "x", object, partitionings=())


def test_messages_take_a_name_registered_at_run_time():
    from workers.protocol.messages import DatasetRef, TaskRef
    from workers.registry.names import check_names

    def task(architecture: str) -> TaskRef:
        return check_names(
            TaskRef(task_id=1, name="t", architecture=architecture, num_classes=10, dataset=DatasetRef())
        )

    with pytest.raises(ValidationError, match="architecture\n  'tiny' is not allowed; allowed: resnet18"):
        task("tiny")
    MODEL_REGISTRY.register(Model("tiny", "tiny — a test model", lambda n, s: None))
    try:
        assert task("tiny").architecture == "tiny"
    finally:
        MODEL_REGISTRY.unregister("tiny")


def test_an_assignments_aggregator_is_checked_against_the_aggregators_registry():
    """The aggregator a trainer must build a client term for is a registry name like the model's:
    an agent without that plug-in refuses the assignment naming the field, before any trainer starts."""
    from workers.protocol.messages import AssignmentSpec, DatasetRef, ShardRef, TaskRef
    from workers.registry.names import check_names

    def spec(aggregator: str | None) -> AssignmentSpec:
        return check_names(
            AssignmentSpec(
                assignment_id=1,
                task=TaskRef(task_id=1, name="t", architecture="resnet18", num_classes=10, dataset=DatasetRef()),
                batch_size=8,
                active_thread_percentage=100,
                shard=ShardRef(permutation_seed=0, offset=0, count=8),
                local_epochs=1,
                global_weights="g",
                output_weights="o",
                aggregator=aggregator,
            )
        )

    assert spec("fedprox").aggregator == "fedprox"
    assert spec(None).aggregator is None
    with pytest.raises(ValidationError, match="aggregator\n  'fedmystery' is not allowed; allowed: fedavg"):
        spec("fedmystery")
