"""``mtfl device-token DEVICE``: issue a device agent's token and print it (once)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.common.errors import ApplicationError
from controlplane.fleet import services
from controlplane.fleet.models import Device
from workers.registry.backends import BACKEND_REGISTRY


class Command(BaseCommand):
    help = (
        "Issue the agent token of DEVICE (registering the device if new) and print the key on "
        "stdout; the previous token stops working. Give it to the agent as MTFL_AGENT_TOKEN."
    )

    def add_arguments(self, parser):
        parser.add_argument("device", help="device name (the agent's --device)")
        parser.add_argument(
            "--backend",
            default="cpu",
            choices=BACKEND_REGISTRY.names(),
            help="backend of a device registered here (default: cpu; its agent reports the real one)",
        )

    def handle(self, *args, **options):
        name = options["device"]
        device = Device.objects.filter(name=name).first()
        try:
            if device is None:
                device = services.device_create(name=name, backend=options["backend"])
                self.stderr.write(f"registered device {name!r} ({options['backend']})")
            _, key = services.device_token_issue(device=device)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(
            f"agent token of device {name!r} (shown once; any previous token of the device no longer works):"
        )
        self.stdout.write(key)
