"""A fake installed distribution for the plug-in tests: modules plus a ``*.dist-info`` folder with
its entry points, put on ``sys.path`` (as ``pip install`` would) for the length of a ``with``."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from workers.registry.base import Registry


def every_registry() -> tuple[Registry, ...]:
    """The registries of workers.registry and the control plane's strategy registry."""
    from controlplane.planning.strategies import STRATEGY_REGISTRY
    from workers.registry.aggregators import AGGREGATOR_REGISTRY
    from workers.registry.backends import BACKEND_REGISTRY
    from workers.registry.datasets import DATASET_REGISTRY
    from workers.registry.models import MODEL_REGISTRY
    from workers.registry.partitioners import PARTITIONER_REGISTRY

    return (
        MODEL_REGISTRY,
        DATASET_REGISTRY,
        PARTITIONER_REGISTRY,
        AGGREGATOR_REGISTRY,
        BACKEND_REGISTRY,
        STRATEGY_REGISTRY,
    )


@contextmanager
def installed_distribution(
    folder: Path,
    dist: str,
    version: str,
    modules: dict[str, str],
    entry_points: str,
    *,
    registries: Iterable[Registry] | None = None,
    pythonpath: bool = False,
) -> Iterator[Path]:
    """Install distribution ``dist`` ``version`` into ``folder`` and yield the folder.

    Writes ``<module>.py`` for each of ``modules`` (name → source) and a
    ``<dist>-<version>.dist-info`` with METADATA and ``entry_points`` (dedented), puts ``folder``
    first on ``sys.path`` (and on ``PYTHONPATH`` for child processes with ``pythonpath``) and
    reloads the plug-ins of ``registries`` (``None``: :func:`every_registry`; tests of
    ``workers`` pass theirs, to stay free of the control plane). On exit the folder leaves
    ``sys.path`` (and ``PYTHONPATH``), the modules leave ``sys.modules``, the names the
    distribution registered are unregistered, and the registries read their plug-ins again.
    """
    folder = Path(folder)
    registries = every_registry() if registries is None else tuple(registries)
    for name, code in modules.items():
        (folder / f"{name}.py").write_text(code)
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    source = f"{dist} {version}"
    with pytest.MonkeyPatch.context() as patch:
        if pythonpath:
            inherited = os.environ.get("PYTHONPATH")
            patch.setenv("PYTHONPATH", f"{folder}{os.pathsep}{inherited}" if inherited else str(folder))
        sys.path.insert(0, str(folder))
        try:
            importlib.invalidate_caches()
            for registry in registries:
                registry.reload_plugins()
            yield folder
        finally:
            sys.path.remove(str(folder))
            for name in modules:
                sys.modules.pop(name, None)
            importlib.invalidate_caches()
            for registry in registries:
                for name in registry.names():
                    if registry.source(name) == source:
                        registry.unregister(name)
                registry.reload_plugins()
