from django.contrib import admin

from controlplane.fleet.models import Device, DevicePool, DeviceToken


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "backend", "status", "pool", "paused", "last_heartbeat_at", "created_at"]
    list_filter = ["backend", "status", "pool", "paused"]
    search_fields = ["name"]
    readonly_fields = ["inventory", "last_heartbeat_at", "created_at"]


@admin.register(DevicePool)
class DevicePoolAdmin(admin.ModelAdmin):
    """Device pools (devices of one class; set a device's pool on the device, or with
    ``mtfl pool set`` / ``PATCH /api/pools/{id}/``, which check the class)."""

    list_display = ["name", "description", "created_at"]
    search_fields = ["name"]


@admin.register(DeviceToken)
class DeviceTokenAdmin(admin.ModelAdmin):
    """Agent tokens can be seen and revoked (deleted) here; they are issued with
    ``mtfl device-token DEVICE`` or ``POST /api/devices/{id}/token/`` (the key is shown once)."""

    list_display = ["device", "created_at", "created_by", "last_used_at"]
    readonly_fields = ["device", "key_hash", "created_at", "created_by", "last_used_at"]

    def has_add_permission(self, request) -> bool:
        return False
