"""Fleet state: the devices of a federation."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

from workers.messages import BACKENDS
from workers.queues import DEVICE_NAME_RE, device_queue


class Device(models.Model):
    """A device of the federation, served by one agent on the Celery queue ``device.<name>``.

    ``inventory`` is what the agent last reported (:class:`workers.messages.DeviceInventory`).
    """

    class Status(models.TextChoices):
        UNKNOWN = "unknown"
        ONLINE = "online"
        OFFLINE = "offline"

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[
            RegexValidator(
                DEVICE_NAME_RE, "use 1-63 lower-case letters, digits, '-' or '_', starting with a letter or digit"
            )
        ],
    )
    backend = models.CharField(max_length=32, choices=[(b, b) for b in BACKENDS], default="cpu")
    inventory = models.JSONField(default=dict, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this device's agent serves."""
        return device_queue(self.name)
