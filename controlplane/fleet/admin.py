from django.contrib import admin

from controlplane.fleet.models import Device, DeviceToken


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "backend", "status", "last_heartbeat_at", "created_at"]
    list_filter = ["backend", "status"]
    search_fields = ["name"]
    readonly_fields = ["inventory", "last_heartbeat_at", "created_at"]


@admin.register(DeviceToken)
class DeviceTokenAdmin(admin.ModelAdmin):
    """Agent tokens can be seen and revoked (deleted) here; they are issued with
    ``mtfl device-token DEVICE`` or ``POST /api/devices/{id}/token/`` (the key is shown once)."""

    list_display = ["device", "created_at", "created_by", "last_used_at"]
    readonly_fields = ["device", "key_hash", "created_at", "created_by", "last_used_at"]

    def has_add_permission(self, request) -> bool:
        return False
