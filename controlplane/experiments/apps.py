from django.apps import AppConfig

from controlplane.fleet.signals import device_heartbeat_received


class ExperimentsConfig(AppConfig):
    """Tasks, experiments, runs, rounds, assignments and checkpoints (see
    :mod:`controlplane.experiments.models`)."""

    name = "controlplane.experiments"
    label = "experiments"

    def ready(self) -> None:
        # deferred: the receivers import the services and models, which only a ready app registry can give
        from controlplane.experiments.receivers import liveness_on_heartbeat

        device_heartbeat_received.connect(liveness_on_heartbeat, dispatch_uid="experiments.liveness_on_heartbeat")
