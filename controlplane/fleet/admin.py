from django.contrib import admin

from controlplane.fleet.models import Device


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "backend", "status", "last_heartbeat_at", "created_at"]
    list_filter = ["backend", "status"]
    search_fields = ["name"]
    readonly_fields = ["inventory", "last_heartbeat_at", "created_at"]
