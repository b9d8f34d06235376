"""Installed plug-ins (``/api/plugins/``)."""

from __future__ import annotations

from rest_framework import serializers

# --- plug-ins ------------------------------------------------------------------------------


class InstalledPluginSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=("models", "datasets", "partitioners"), read_only=True)
    name = serializers.CharField(read_only=True)
    label = serializers.CharField(read_only=True)
    source = serializers.CharField(read_only=True, help_text="the distribution providing it and its version")
    builtin = serializers.BooleanField(read_only=True, help_text="part of mtfl-lab itself")
    details = serializers.DictField(
        read_only=True,
        help_text="datasets: input_shape, num_classes (null when they follow from the files), needs_root; "
        "partitioners: parameters (name, label, kind, minimum, maximum, minimum_open, default)",
    )


class PluginFailureSerializer(serializers.Serializer):
    kind = serializers.CharField(read_only=True)
    group = serializers.CharField(read_only=True)
    name = serializers.CharField(read_only=True)
    value = serializers.CharField(read_only=True)
    error = serializers.CharField(read_only=True)


class DevicePluginsSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    backend = serializers.CharField(read_only=True)
    status = serializers.CharField(read_only=True)
    declares_nothing = serializers.BooleanField(
        read_only=True, help_text="an agent older than plug-in declarations: mtfl-lab's built-ins are assumed"
    )
    plugins = serializers.DictField(read_only=True, help_text="{kind: {name: 'distribution version'}}")


class PluginsSerializer(serializers.Serializer):
    installed = InstalledPluginSerializer(many=True, read_only=True, help_text="registered on the control plane")
    failures = PluginFailureSerializer(many=True, read_only=True, help_text="entry points that failed to load here")
    devices = DevicePluginsSerializer(many=True, read_only=True, help_text="what each online device's agent declared")
