"""``mtfl pool list`` / ``mtfl pool create NAME --devices a,b [--description TEXT]`` / ``mtfl pool
set NAME --devices a,b`` / ``mtfl pool delete NAME``: device pools, the sets of devices of one class that a run may name
instead of devices (``pool`` on ``POST /api/experiments/{id}/runs/``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.core.lab_cli import read_lab
from controlplane.core.options import list_option
from controlplane.lab.selectors import pool_by_ref, pool_list
from controlplane.lab.services import admin

ACTIONS = ("list", "create", "set", "delete")


class Command(BaseCommand):
    help = (
        "Device pools: `list` them, `create NAME --devices a,b` one (devices of one class; a device moves from "
        "any other pool), `set NAME --devices a,b` its devices, or `delete NAME` one that no run names."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", help=f"one of {', '.join(ACTIONS)}")
        parser.add_argument("name", nargs="?", help="the pool's name (create, set, delete)")
        parser.add_argument("--devices", default=None, help="comma-separated device names")
        parser.add_argument("--description", default="", help="what the pool is (create)")

    def handle(self, *args, **opts):
        action, name = opts["action"], opts["name"]
        if action not in ACTIONS:
            raise CommandError(f"action {action!r} is not allowed; allowed: {', '.join(ACTIONS)}")
        if action == "list":
            self._list()
            return
        if not name:
            raise CommandError(f"mtfl pool {action} needs the pool's name")
        if action == "delete":
            pool = read_lab("pools", lambda: pool_by_ref(name))
            read_lab("pools", lambda: admin.pool_delete(pool=pool))
            self.stdout.write(f"deleted pool {pool.name}")
            return
        if opts["devices"] is None:
            raise CommandError(f"mtfl pool {action} needs --devices: comma-separated device names")
        names = list_option("devices", opts["devices"], allow_empty=True)  # an empty pool, as the API allows
        if action == "create":
            pool = read_lab(
                "pools",
                lambda: admin.pool_create(name=name, description=opts["description"].strip(), devices=names),
            )
            self.stdout.write(f"created pool {pool.name} with {len(names)} device(s)")
        else:
            pool = read_lab("pools", lambda: pool_by_ref(name))
            pool = read_lab("pools", lambda: admin.pool_set_devices(pool=pool, devices=names))
            self.stdout.write(f"pool {pool.name} now has {len(names)} device(s)")
        for line in getattr(pool, "warnings", []):
            self.stdout.write(f"warning: {line}")

    def _list(self) -> None:
        pools = read_lab("pools", lambda: list(pool_list()))
        if not pools:
            self.stdout.write("no device pool yet: mtfl pool create NAME --devices a,b")
            return
        for p in pools:
            names = [d.name for d in p.devices.all()]
            about = f" — {p.description}" if p.description else ""
            self.stdout.write(
                f"{p.name}{about}: {len(names)} device(s) {', '.join(names) or '-'}; {p.run_count} run(s) name it"
            )
