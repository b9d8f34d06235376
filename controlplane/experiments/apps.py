from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "controlplane.experiments"
    label = "experiments"

    def ready(self) -> None:
        from controlplane.experiments.receivers import liveness_on_heartbeat
        from controlplane.fleet.signals import device_heartbeat_received

        device_heartbeat_received.connect(liveness_on_heartbeat, dispatch_uid="experiments.liveness_on_heartbeat")
