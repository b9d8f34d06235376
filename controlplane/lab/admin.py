"""The Django admin of the lab's models."""

from django.contrib import admin

from controlplane.lab.models import DeviceLease, UserShare


@admin.register(UserShare)
class UserShareAdmin(admin.ModelAdmin):
    """A lab admin's weights for the fair scheduling policy (MTFL_SCHEDULER_POLICY=fair): a user's
    device-seconds count divided by the weight; users without a row weigh 1."""

    list_display = ["user", "weight"]
    search_fields = ["user__username"]


@admin.register(DeviceLease)
class DeviceLeaseAdmin(admin.ModelAdmin):
    """Who held which device when (read-only: the lab scheduler grants and releases leases)."""

    list_display = ["device", "run", "round", "owner", "granted_at", "released_at", "release_reason"]
    list_filter = ["released_at"]
    search_fields = ["device__name", "owner__username"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
