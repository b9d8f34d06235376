"""The artifact store (``/api/storage/``)."""

from __future__ import annotations

from rest_framework import serializers

# --- storage ------------------------------------------------------------------------------


class ExperimentStorageSerializer(serializers.Serializer):
    """What one experiment's runs hold in the artifact store."""

    experiment = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    files = serializers.IntegerField(read_only=True)
    bytes = serializers.IntegerField(read_only=True, help_text="a file with several hard links counted once")


class StorageSerializer(serializers.Serializer):
    """The artifact store (``ARTIFACT_ROOT``): its size, its file system's free space against the
    threshold below which rounds refuse to start, and each visible experiment's share."""

    artifact_root = serializers.CharField(read_only=True)
    files = serializers.IntegerField(read_only=True, help_text="every file in ARTIFACT_ROOT (runs, predictors, ...)")
    bytes = serializers.IntegerField(read_only=True)
    free_bytes = serializers.IntegerField(read_only=True, help_text="free space of ARTIFACT_ROOT's file system")
    min_free_bytes = serializers.IntegerField(
        read_only=True, help_text="MTFL_MIN_FREE_BYTES: below this much free space, rounds refuse to start"
    )
    problem = serializers.CharField(
        read_only=True, allow_null=True, help_text="why rounds refuse to start now; null: enough free space"
    )
    experiments = ExperimentStorageSerializer(
        many=True, read_only=True, help_text="the experiments the caller may see, largest first"
    )
