"""What this host can run: the installed models, data sets and partitioners, with their sources.

An agent declares this in its :class:`~workers.protocol.messages.DeviceInventory` (``plugins``)
so the control plane can refuse, before dispatch, a run that needs a plug-in one of its devices
lacks (issue 21 item 5); ``mtfl plugins`` shows it for the local host. Reading the registries
imports the plug-in modules (entry points are loaded), but calls no builder or loader.
"""

from __future__ import annotations

from typing import Any

from workers.registry.base import Registry
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.registry.partitioners import PARTITIONER_REGISTRY

KINDS: tuple[str, ...] = ("models", "datasets", "partitioners")
"""The kinds of plug-in a device host declares: those its trainers run."""


def _registries() -> dict[str, Registry[Any]]:
    return {"models": MODEL_REGISTRY, "datasets": DATASET_REGISTRY, "partitioners": PARTITIONER_REGISTRY}


def installed_plugins() -> dict[str, dict[str, str]]:
    """Every registered model, data set and partitioner of this process, by kind.

    Returns:
        ``{"models": {name: source}, "datasets": {...}, "partitioners": {...}}``, names in
        registration order (built-ins first), each source ``"<distribution> <version>"``
        (:meth:`workers.registry.base.Registry.source`; ``"mtfl-lab <version>"`` for a
        built-in). Plug-ins that failed to load are absent (their registry's ``failures``
        says why).
    """
    return {
        kind: {name: registry.source(name) for name in registry.names()} for kind, registry in _registries().items()
    }
