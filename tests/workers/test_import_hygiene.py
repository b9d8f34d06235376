"""Light modules stay light: no torch at import, never Django or the control plane."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import workers

LIGHT_MODULES = [
    "workers",
    "workers.protocol.messages",
    "workers.protocol.queues",
    "workers.config",
    "workers.training.partition",
    "workers.fl.fedavg",
    "workers.fl.artifacts",
    "workers.fl.transfer",
    "workers.agent.app",
    "workers.backends",
    "workers.backends.simulated",
    "workers.backends.cuda",
    "workers.backends.gpu",
    "workers.backends.gpu_mps",
    "workers.training.trainer",
    "workers.training.zoo",
    "workers.training.datasets",
    "workers.registry.dataset_sources",
    "workers.registry",
    "workers.registry.base",
    "workers.registry.models",
    "workers.registry.datasets",
    "workers.registry.partitioners",
    "workers.training.plugin_check",
    "workers.registry.inventory",
    "workers.registry.names",
    "workers.registry.backends",
    "workers.registry.aggregators",
    "workers.training.evaluate",
    "workers.training.features",
    "workers.profiling.sweep",
    "workers.training.profiler",
]


def test_importing_worker_modules_does_not_import_torch():
    code = (
        f"import sys; import {', '.join(LIGHT_MODULES)}; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'pynvml' not in sys.modules, 'pynvml imported'; "
        # the sweep design's scipy.stats costs the agent a second at start; it is imported
        # when a sweep runs
        "assert 'scipy' not in sys.modules, 'scipy imported'; "
        "assert not [m for m in sys.modules if m.startswith('controlplane')], "
        "'controlplane imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(workers.__file__).parents[1], timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_worker_sources_never_import_django_or_controlplane():
    pattern = re.compile(r"^\s*(from|import)\s+(django|controlplane)\b", re.MULTILINE)
    offenders = [str(path) for path in Path(workers.__file__).parent.rglob("*.py") if pattern.search(path.read_text())]
    assert offenders == []


def test_every_public_module_class_and_function_has_a_docstring():
    import ast

    missing = []
    for path in sorted(Path(workers.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if not ast.get_docstring(tree):
            missing.append(f"{path.name}: module")
        stack = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                public = not getattr(child, "name", "_").startswith("_")
                if isinstance(child, (ast.FunctionDef, ast.ClassDef)) and public:
                    if not ast.get_docstring(child):
                        missing.append(f"{path.name}: {prefix}{child.name}")
                    if isinstance(child, ast.ClassDef):
                        stack.append((child, f"{child.name}."))
    assert missing == []
