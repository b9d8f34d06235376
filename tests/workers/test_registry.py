"""The registries: registration rules, entry-point plug-ins (good, broken, wrong), and the
built-in models, data sets, partitioners and backends every caller reads."""

from __future__ import annotations

import importlib
import sys
import textwrap
from dataclasses import dataclass

import pytest
from pydantic import ValidationError

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


@pytest.fixture
def plugin_dir(tmp_path):
    """A folder on ``sys.path`` that a test fills with plug-in modules and a dist-info."""
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("widget_plugin",):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


def _install(folder, entry_points: str) -> None:
    (folder / "widget_plugin.py").write_text(
        textwrap.dedent("""\
        from tests.workers.test_registry import Widget

        BIG = Widget("big", 10)


        def make_small():
            return Widget("small", 0)


        NOT_A_WIDGET = "big"
        """)
    )
    info = folder / "widget_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widget-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n" + textwrap.dedent(entry_points))
    importlib.invalidate_caches()


def test_entry_points_give_records_or_callables_returning_them(plugin_dir):
    _install(
        plugin_dir,
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


def test_a_broken_plugin_is_reported_and_the_others_still_load(plugin_dir):
    _install(
        plugin_dir,
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


def test_reload_plugins_sees_a_plugin_installed_after_the_first_read(plugin_dir):
    registry = widgets()
    assert registry.names() == ()
    _install(plugin_dir, "big = widget_plugin:BIG\n")
    assert "big" not in registry  # entry points are read once...
    registry.reload_plugins()
    assert "big" in registry  # ...until asked again


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
    assert DATASET_REGISTRY.names() == ("digits", "cifar10")
    assert DATASET_REGISTRY.get("cifar10").needs_root and not DATASET_REGISTRY.get("digits").needs_root
    assert PARTITIONER_REGISTRY.names() == ("iid", "dirichlet")
    assert PARTITIONER_REGISTRY.get("dirichlet").uses_alpha and not PARTITIONER_REGISTRY.get("iid").uses_alpha
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

    def task(architecture: str) -> TaskRef:
        return TaskRef(task_id=1, name="t", architecture=architecture, num_classes=10, dataset=DatasetRef())

    with pytest.raises(ValidationError, match="architecture\n  'tiny' is not allowed; allowed: resnet18"):
        task("tiny")
    MODEL_REGISTRY.register(Model("tiny", "tiny — a test model", lambda n, s: None))
    try:
        assert task("tiny").architecture == "tiny"
    finally:
        MODEL_REGISTRY.unregister("tiny")
