"""Registries, one per kind of extension, and their entry-point loading (docs/extending.md).

:mod:`workers.registry.base` holds the generic :class:`Registry`; each kind whose entries run on a
device host (models, datasets, partitioners, aggregators, backends) has its own module here. The
strategy registry lives with the planners, in :mod:`controlplane.planning.strategies`.
"""

from workers.registry.base import PluginFailure, PluginLoadError, Registry, UnknownEntryError

__all__ = ["PluginFailure", "PluginLoadError", "Registry", "UnknownEntryError"]
