"""``mtfl plugins``: what this host has installed, what failed to load, and what each online
device declared.

The host's part lists every registry (models, data sets, partitioners, strategies, aggregators,
backends): kind, name, source (``"<distribution> <version>"``, ``mtfl-lab <version>`` for the
built-ins) and label, then every entry point that failed to load with its error on one line. The
devices' part compares each online device's declaration (``Device.plugins``, from its agent's
inventory: models, data sets and partitioners) with this host's: what it lacks, what it has in
another version, what it has that this host does not. ``--json`` prints the same as one JSON
object for scripts. Always exits 0 (a report, not a check); a database that cannot be read is said
in the devices' part.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.management.base import BaseCommand
from django.db import DatabaseError

from controlplane.fleet import selectors as fleet_selectors
from controlplane.fleet.models import Device
from controlplane.planning.strategies import STRATEGY_REGISTRY
from workers.registry.aggregators import AGGREGATOR_REGISTRY
from workers.registry.backends import BACKEND_REGISTRY
from workers.registry.base import Registry
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.registry.partitioners import PARTITIONER_REGISTRY

REGISTRIES: dict[str, Registry[Any]] = {
    "models": MODEL_REGISTRY,
    "datasets": DATASET_REGISTRY,
    "partitioners": PARTITIONER_REGISTRY,
    "strategies": STRATEGY_REGISTRY,
    "aggregators": AGGREGATOR_REGISTRY,
    "backends": BACKEND_REGISTRY,
}
"""Every kind this host lists, by the name its plural is known by (the first three are what
agents declare, ``DeviceInventory.plugins``)."""

DECLARED_KINDS = ("models", "datasets", "partitioners")
"""The kinds an agent declares: what a device must have to train a task of an experiment."""


def host_plugins() -> dict[str, list[dict[str, str]]]:
    """Every registered entry of this process, by kind: ``[{"name", "source", "label"}, …]`` in
    registry order (built-ins first)."""
    return {
        kind: [{"name": r.name, "source": registry.source(r.name), "label": r.label} for r in registry.records()]
        for kind, registry in REGISTRIES.items()
    }


def host_failures() -> list[dict[str, str]]:
    """Every entry point that failed to load, over all registries: ``{"group", "name", "value",
    "error"}`` with the error's first line (the registries keep the whole message)."""
    failures = []
    for registry in REGISTRIES.values():
        registry.names()  # loads the plug-ins, filling ``failures``
        for f in registry.failures:
            lines = f.error.strip().splitlines() or [""]
            failures.append({"group": f.group, "name": f.name, "value": f.value, "error": lines[0]})
    return failures


def compare_declaration(
    host: Mapping[str, Mapping[str, str]], declared: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, Any]]:
    """A device's declaration against this host's, per kind of :data:`DECLARED_KINDS`.

    Args:
        host: kind → name → source, this host's (:func:`host_declaration`).
        declared: the same, as the device's agent declared it (``Device.plugins``).

    Returns:
        ``{"lacks": {kind: {name: host source}}, "differs": {kind: {name: {"host", "device"}}},
        "extra": {kind: {name: device source}}}``, each holding only the kinds with an entry:
        names this host has and the device does not, names both have from different sources
        (another distribution or version), and names only the device has.
    """
    lacks: dict[str, dict[str, str]] = {}
    differs: dict[str, dict[str, dict[str, str]]] = {}
    extra: dict[str, dict[str, str]] = {}
    for kind in DECLARED_KINDS:
        mine, theirs = host.get(kind, {}), declared.get(kind, {})
        missing = {name: source for name, source in mine.items() if name not in theirs}
        other = {
            name: {"host": source, "device": theirs[name]}
            for name, source in mine.items()
            if name in theirs and theirs[name] != source
        }
        more = {name: source for name, source in theirs.items() if name not in mine}
        for out, found in ((lacks, missing), (differs, other), (extra, more)):
            if found:
                out[kind] = found
    return {"lacks": lacks, "differs": differs, "extra": extra}


def host_declaration() -> dict[str, dict[str, str]]:
    """This host's entries of the kinds agents declare, as an agent would declare them:
    kind → name → source (the shape of ``DeviceInventory.plugins``)."""
    return {
        kind: {r.name: REGISTRIES[kind].source(r.name) for r in REGISTRIES[kind].records()} for kind in DECLARED_KINDS
    }


def device_reports(host: Mapping[str, Mapping[str, str]]) -> tuple[list[dict[str, Any]], int]:
    """Each online device (by name, :func:`controlplane.fleet.selectors.device_plugin_declarations`)
    with its declaration compared to ``host``'s (:func:`compare_declaration`): ``{"name",
    "backend", "declares_nothing", "plugins", "lacks", "differs", "extra"}``; and how many
    devices are not online (not listed).

    A device whose agent declares nothing (one older than plug-in declarations) is taken to have
    mtfl-lab's built-ins, as the run checks take it (:func:`controlplane.fleet.selectors.device_declares`):
    what it lacks is then every plug-in of another package.

    Raises:
        DatabaseError: the devices cannot be read (no database, or not migrated).
    """
    online = fleet_selectors.device_plugin_declarations()
    others = Device.objects.count() - len(online)
    builtins = {
        kind: {name: source for name, source in names.items() if fleet_selectors.is_builtin_source(source)}
        for kind, names in host.items()
    }
    reports = []
    for device in online:
        declared = builtins if device["declares_nothing"] else device["plugins"]
        reports.append(
            {
                "name": device["name"],
                "backend": device["backend"],
                "declares_nothing": device["declares_nothing"],
                "plugins": device["plugins"],
                **compare_declaration(host, declared),
            }
        )
    return reports, others


def _listing(found: Mapping[str, Mapping[str, Any]], describe) -> str:
    return "; ".join(
        f"{kind}: " + ", ".join(describe(name, v) for name, v in names.items()) for kind, names in found.items()
    )


class Command(BaseCommand):
    help = (
        "List the plug-ins installed on this host (models, data sets, partitioners, strategies, aggregators, "
        "backends) and any that failed to load, then what each online device declared and what it lacks "
        "compared to this host."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")

    def handle(self, *args, **opts):
        host = host_plugins()
        failures = host_failures()
        try:
            devices, others = device_reports(host_declaration())
            devices_error = None
        except DatabaseError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            devices, others = [], 0
            devices_error = (
                f"cannot read devices from the database ({first}): if it is new, start `mtfl up` or run `mtfl migrate`"
            )
        if opts["json"]:
            report = {
                "host": host,
                "failures": failures,
                "devices": devices,
                "devices_not_online": others,
                "devices_error": devices_error,
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        self._host_text(host, failures)
        self._devices_text(devices, others, devices_error)

    def _host_text(self, host: dict[str, list[dict[str, str]]], failures: list[dict[str, str]]) -> None:
        rows = [(kind, e["name"], e["source"], e["label"]) for kind, entries in host.items() for e in entries]
        header = ("kind", "name", "source", "label")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
        self.stdout.write(f"Installed on this host ({len(rows)} entries):")
        for row in [header, *rows]:
            self.stdout.write("  " + "  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3])
        if failures:
            self.stdout.write(f"\nFailed to load ({len(failures)}):")
            for f in failures:
                self.stdout.write(f"  {f['group']} {f['name']} ({f['value']}): {f['error']}")
        else:
            self.stdout.write("\nFailed to load: none")

    def _devices_text(self, devices: list[dict[str, Any]], others: int, error: str | None) -> None:
        if error:
            self.stdout.write(f"\nDevices: {error}")
            return
        not_listed = f"; {others} more not online, not listed" if others else ""
        self.stdout.write(f"\nOnline devices ({len(devices)}{not_listed}):")
        if not devices:
            self.stdout.write("  none (start an agent: mtfl agent --device NAME)")
        for d in devices:
            self.stdout.write(f"  {d['name']} ({d['backend']})")
            if d["declares_nothing"]:
                self.stdout.write(
                    "    declares nothing (an agent older than plug-in declarations): mtfl-lab's built-ins assumed"
                )
            else:
                counts = ", ".join(f"{len(d['plugins'].get(kind, {}))} {kind}" for kind in DECLARED_KINDS)
                self.stdout.write(f"    declares {counts}")
            if d["lacks"]:
                self.stdout.write("    lacks: " + _listing(d["lacks"], lambda name, source: f"{name} ({source})"))
            else:
                self.stdout.write("    lacks nothing this host has")
            if d["differs"]:
                self.stdout.write(
                    "    other versions: "
                    + _listing(d["differs"], lambda name, v: f"{name} ({v['device']} there, {v['host']} here)")
                )
            if d["extra"]:
                self.stdout.write(
                    "    not on this host: " + _listing(d["extra"], lambda name, source: f"{name} ({source})")
                )
