"""Devices (``/api/devices/``)."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.api.serializers.common import RegisteredField, StrictCharField, StrictSerializer
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_effective_status
from workers.registry.backends import BACKEND_REGISTRY

# --- devices -------------------------------------------------------------------------------


class DeviceSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(read_only=True)
    status = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = [
            "id",
            "name",
            "backend",
            "queue",
            "status",
            "inventory",
            "plugins",
            "last_heartbeat_at",
            "created_at",
        ]
        read_only_fields = fields

    def get_status(self, device: Device) -> str:
        return device_effective_status(device)


class DeviceCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=63)
    backend = RegisteredField(BACKEND_REGISTRY.names, default="cpu")


class DeviceUpdateSerializer(StrictSerializer):
    backend = RegisteredField(BACKEND_REGISTRY.names, required=False)
    fixed_fields = {"name": "cannot change: a device's name is its Celery queue; register a new device"}
