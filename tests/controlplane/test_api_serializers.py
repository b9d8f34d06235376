"""The API's serializers are split by resource (``controlplane/api/serializers/``) and stay
shapes and types: no serializer method calls a service or stores what it looked up in its
context (the views pass in what a page needs, read once by selectors), and every serializer is
re-exported by the package for ``from controlplane.api import serializers as s``."""

from __future__ import annotations

import ast
from pathlib import Path

from controlplane.api import serializers as s

PACKAGE = Path(s.__file__).parent
MODULES = sorted(p for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _service_names(tree: ast.Module) -> set[str]:
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and ".services" in (node.module or "")
        for alias in node.names
    }


def _methods(tree: ast.Module):
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            yield f"{cls.name}.{fn.name}", fn


def test_serializers_are_split_by_resource():
    assert {p.stem for p in MODULES} >= {
        "common",
        "devices",
        "tasks",
        "experiments",
        "lab",
        "runs",
        "storage",
        "plugins",
        "profiling",
    }


def test_no_serializer_method_calls_a_service_or_caches_in_its_context():
    found = []
    for path in MODULES:
        tree = ast.parse(path.read_text())
        services = _service_names(tree)
        for where, fn in _methods(tree):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in services:
                    found.append(f"{path.stem}: {where} calls {node.func.id}")
                context = [
                    t
                    for t in getattr(node, "targets", [])
                    if isinstance(t, ast.Subscript) and "context" in ast.unparse(t)
                ]
                if context or (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("context.setdefault")):
                    found.append(f"{path.stem}: {where} stores into its context")
    assert not found, found


def test_the_package_re_exports_every_serializer():
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                assert getattr(s, node.name, None) is not None, f"{path.stem}.{node.name} is not re-exported"
