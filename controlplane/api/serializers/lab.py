"""The shared lab: its queue, pools and an admin's pause (``/api/queue/``, ``/api/pools/``, ``/api/lab/``)."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.api.serializers.common import MAX_LIST, IdOrNameField, StrictCharField, StrictSerializer
from controlplane.api.serializers.devices import DeviceSerializer
from controlplane.common.limits import (
    PRIORITY,
)

# --- the lab: queue, pools, an admin's pause ------------------------------------------------


class QueueHolderSerializer(serializers.Serializer):
    """The round holding a device."""

    run = serializers.IntegerField(read_only=True)
    run_strategy = serializers.CharField(read_only=True)
    experiment = serializers.IntegerField(read_only=True)
    experiment_name = serializers.CharField(read_only=True)
    owner = serializers.CharField(read_only=True, allow_null=True, help_text="the experiment owner's user name")
    round = serializers.IntegerField(read_only=True)
    round_index = serializers.IntegerField(read_only=True)
    since = serializers.DateTimeField(read_only=True, help_text="when the device was leased to the round")
    expected_free_at = serializers.DateTimeField(
        read_only=True,
        help_text="the round's start plus its predicted round time (else its run's last round's wall time, else "
        "MTFL_ROUND_DEADLINE_S)",
    )


class QueueBlockerSerializer(serializers.Serializer):
    """A device a waiting round needs that it cannot have now."""

    device = serializers.CharField(read_only=True)
    paused = serializers.BooleanField(read_only=True, help_text="an admin paused it")
    paused_reason = serializers.CharField(read_only=True, help_text="the admin's reason, when paused")
    holder_run = serializers.IntegerField(read_only=True, allow_null=True)
    holder_owner = serializers.CharField(read_only=True, allow_null=True)
    since = serializers.DateTimeField(read_only=True, allow_null=True)
    expected_free_at = serializers.DateTimeField(read_only=True, allow_null=True)
    profiling_sweep = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="the profiling sweep pending or running on it, if any"
    )


class QueueWaitingSerializer(serializers.Serializer):
    """A round waiting (``queued``) for its devices."""

    position = serializers.IntegerField(read_only=True, help_text="1: served first by the policy")
    round = serializers.IntegerField(read_only=True)
    round_index = serializers.IntegerField(read_only=True)
    run = serializers.IntegerField(read_only=True)
    run_strategy = serializers.CharField(read_only=True)
    experiment = serializers.IntegerField(read_only=True)
    experiment_name = serializers.CharField(read_only=True)
    owner = serializers.CharField(read_only=True, allow_null=True)
    priority = serializers.IntegerField(read_only=True, help_text=f"{PRIORITY.span}; higher first")
    queued_at = serializers.DateTimeField(read_only=True, allow_null=True)
    waited_s = serializers.FloatField(read_only=True, allow_null=True, help_text="seconds queued so far")
    devices = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="the first 5 devices it needs; [] for a pool round"
    )
    devices_count = serializers.IntegerField(read_only=True, help_text="devices it needs (a pool round: its slots)")
    pool = serializers.CharField(read_only=True, allow_null=True, help_text="a pool round's pool")
    slots = serializers.IntegerField(read_only=True, allow_null=True, help_text="devices of the pool it fills")
    expected_s = serializers.FloatField(read_only=True, help_text="its expected round time, seconds")
    estimated_start = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="replaying the scheduler's passes as held devices come free; null: no pass can start it (a "
        "paused device, or more devices than its pool has)",
    )
    blockers = QueueBlockerSerializer(many=True, read_only=True, help_text="the first 5 devices it waits for")
    blockers_count = serializers.IntegerField(read_only=True)


class QueueProfilingSerializer(serializers.Serializer):
    sweep = serializers.IntegerField(read_only=True)
    since = serializers.DateTimeField(read_only=True)
    expected_end = serializers.DateTimeField(read_only=True, help_text="its start plus its budget")


class QueueDeviceSerializer(serializers.Serializer):
    """A device that is held, paused, or needed by a waiting round."""

    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    pool = serializers.CharField(read_only=True, allow_null=True)
    paused = serializers.BooleanField(read_only=True)
    paused_reason = serializers.CharField(read_only=True)
    paused_at = serializers.DateTimeField(read_only=True, allow_null=True)
    holder = QueueHolderSerializer(read_only=True, allow_null=True)
    profiling = QueueProfilingSerializer(
        read_only=True, allow_null=True, help_text="a profiling sweep pending or running on it: no round gets it"
    )
    waiting = serializers.ListField(
        child=serializers.IntegerField(), read_only=True, help_text="ids of the first 10 rounds waiting for it"
    )
    waiting_count = serializers.IntegerField(read_only=True)
    next_start = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="the estimated start of the first round waiting for it"
    )


class QueuePoolSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    devices = serializers.IntegerField(read_only=True)
    held = serializers.IntegerField(read_only=True)
    paused = serializers.IntegerField(read_only=True)
    free = serializers.IntegerField(read_only=True)
    waiting = serializers.IntegerField(read_only=True, help_text="rounds of its runs waiting")


class QueueSerializer(serializers.Serializer):
    """The shared lab's queue (``controlplane.lab.selectors.queue_state``)."""

    policy = serializers.ChoiceField(
        choices=("fifo", "fair"),
        read_only=True,
        help_text="MTFL_SCHEDULER_POLICY: fifo (arrival) or fair (least weighted device-seconds in the window)",
    )
    fair_window_s = serializers.FloatField(read_only=True)
    now = serializers.DateTimeField(read_only=True)
    waiting = QueueWaitingSerializer(many=True, read_only=True, help_text="in the order the policy serves them")
    waiting_total = serializers.IntegerField(read_only=True)
    devices = QueueDeviceSerializer(many=True, read_only=True, help_text="by name, at most 200")
    devices_listed = serializers.IntegerField(read_only=True)
    devices_involved = serializers.IntegerField(read_only=True, help_text="held, paused or waited for")
    devices_held = serializers.IntegerField(read_only=True)
    devices_paused = serializers.IntegerField(read_only=True)
    devices_total = serializers.IntegerField(read_only=True)
    pools = QueuePoolSerializer(many=True, read_only=True)


class LabDeviceSerializer(DeviceSerializer):
    """A device with its pool and pause."""

    pool = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta(DeviceSerializer.Meta):
        fields = [*DeviceSerializer.Meta.fields, "pool", "paused", "paused_reason", "paused_at"]
        read_only_fields = fields


class DevicePauseSerializer(StrictSerializer):
    reason = StrictCharField(
        max_length=200, allow_blank=True, required=False, default="", help_text="why (shown on the queue page)"
    )


class DeviceResumeSerializer(StrictSerializer):
    """No fields."""


class PoolSerializer(serializers.Serializer):
    """A device pool: devices of one device class that runs may name instead of devices."""

    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    devices = serializers.SerializerMethodField()
    device_names = serializers.SerializerMethodField()
    runs = serializers.IntegerField(source="run_count", read_only=True, help_text="runs that name it")
    created_at = serializers.DateTimeField(read_only=True)
    warnings = serializers.SerializerMethodField(
        help_text="after a create or change: running runs of pools that lost a device (their next rounds train on "
        "fewer devices)"
    )

    def get_warnings(self, pool) -> list[str]:
        return list(getattr(pool, "warnings", []))

    def get_devices(self, pool) -> list[int]:
        return [d.id for d in pool.devices.all()]

    def get_device_names(self, pool) -> list[str]:
        return [d.name for d in pool.devices.all()]


POOL_DEVICES_HELP = (
    "its devices by id or name, all of one device class (a device of another pool moves to this one); "
    "PATCH: the pool's devices from now on"
)


class PoolCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=63, help_text="a slug: letters, digits, - and _")
    description = StrictCharField(max_length=2000, allow_blank=True, required=False, default="")
    devices = serializers.ListField(
        child=IdOrNameField(), max_length=MAX_LIST, required=False, default=list, help_text=POOL_DEVICES_HELP
    )


class PoolUpdateSerializer(StrictSerializer):
    fixed_fields = {
        "name": "a pool's name cannot change: runs name it",
        "description": "a pool's description is set when it is created",
    }

    devices = serializers.ListField(
        child=IdOrNameField(), max_length=MAX_LIST, required=False, help_text=POOL_DEVICES_HELP
    )
