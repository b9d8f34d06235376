"""Fleet state: the devices of a federation, the pools a lab groups them in, and their agents'
tokens."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from workers.protocol.queues import DEVICE_NAME_RE, device_queue


class DevicePool(models.Model):
    """A named group of devices of one device class (:func:`controlplane.fleet.selectors.device_class`)
    that runs may name instead of devices: the lab scheduler places a pool run's rounds on the
    pool's free devices (:mod:`controlplane.lab.services`)."""

    name = models.SlugField(max_length=63, unique=True)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Device(models.Model):
    """A device of the federation, served by one agent on the Celery queue ``device.<name>``.

    ``inventory`` is what the agent last reported (:class:`workers.protocol.messages.DeviceInventory`).
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
    backend = models.CharField(
        max_length=32,
        default="cpu",
        help_text="an execution backend of workers.registry.backends.BACKEND_REGISTRY (checked by the services, "
        "so a plug-in's backend needs no migration)",
    )
    inventory = models.JSONField(default=dict, blank=True)
    plugins = models.JSONField(
        default=dict,
        blank=True,
        help_text="what its agent declared it can run: {'models'|'datasets'|'partitioners': {name: 'dist version'}} "
        "(DeviceInventory.plugins); empty: an agent that declares nothing",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN)
    pool = models.ForeignKey(
        DevicePool,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="devices",
        help_text="the pool it serves in (all of one device class); null: none",
    )
    paused = models.BooleanField(
        default=False, help_text="an admin paused it: the lab scheduler leases it to no new round"
    )
    paused_reason = models.CharField(max_length=200, blank=True, default="")
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this device's agent serves."""
        return device_queue(self.name)


class DeviceToken(models.Model):
    """The secret a device's agent presents to the control plane (``Authorization: Agent <key>``).

    Only the SHA-256 of the key is stored; the key itself is shown once, when it is issued
    (:func:`controlplane.fleet.services.device_token_issue`). A device has at most one: issuing
    a new one replaces it, and the old key stops working at once. The key authenticates the
    device, never a user: it reaches only the agent endpoints (``/api/agent/``), and there only
    the artifacts of the device's own assignments.
    """

    device = models.OneToOneField(Device, on_delete=models.CASCADE, related_name="agent_token")
    key_hash = models.CharField(max_length=64, unique=True, help_text="hex SHA-256 of the key")
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="who issued it (empty when issued from the command line)",
    )
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["device__name"]

    def __str__(self) -> str:
        return f"agent token of {self.device.name}"
