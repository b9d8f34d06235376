"""``mtfl device-resume NAME``: resume a paused device; waiting rounds may have it at once."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from controlplane.core.lab_cli import device_named, read_lab
from controlplane.lab.services.admin import device_resume


class Command(BaseCommand):
    help = "Resume a paused device: the lab scheduler may lease it to waiting rounds again."

    def add_arguments(self, parser):
        parser.add_argument("device", help="the device's name")

    def handle(self, *args, **opts):
        device = read_lab("devices", lambda: device_named(opts["device"]))
        if not device.paused:
            self.stdout.write(f"{device.name} was not paused: nothing to resume")
            return
        device = read_lab("devices", lambda: device_resume(device=device, user=None))
        self.stdout.write(f"resumed {device.name}")
