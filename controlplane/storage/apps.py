from django.apps import AppConfig


class StorageConfig(AppConfig):
    """The artifacts' lifecycle: retention, gc, agent artifacts, exports (see
    :mod:`controlplane.storage`)."""

    name = "controlplane.storage"
    label = "storage"
