"""``mtfl device-pause NAME [--reason TEXT]``: an admin pauses a device: the lab scheduler leases
it to no new round (a round training on it finishes) until ``mtfl device-resume NAME``."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from controlplane.core.lab_cli import device_named, read_lab
from controlplane.lab.services.admin import device_pause


class Command(BaseCommand):
    help = "Pause a device: no new round gets it until `mtfl device-resume NAME`; a round training on it finishes."

    def add_arguments(self, parser):
        parser.add_argument("device", help="the device's name")
        parser.add_argument("--reason", default="", help="why (shown on the queue page and by `mtfl queue`)")

    def handle(self, *args, **opts):
        device = read_lab("devices", lambda: device_named(opts["device"]))
        reason = opts["reason"].strip()
        device = read_lab("devices", lambda: device_pause(device=device, user=None, reason=reason))
        why = f" ({device.paused_reason})" if device.paused_reason else ""
        self.stdout.write(f"paused {device.name}{why}: no new round gets it until `mtfl device-resume {device.name}`")
