from django.apps import AppConfig

from controlplane.experiments.signals import devices_released, schedule_wanted


class LabConfig(AppConfig):
    """The shared lab: leases, the scheduler, pools and the queue (see :mod:`controlplane.lab`)."""

    name = "controlplane.lab"
    label = "lab"

    def ready(self) -> None:
        # deferred: the receivers import models, which only a ready app registry can give
        from controlplane.lab import receivers

        devices_released.connect(receivers.leases_release_on_signal, dispatch_uid="lab.leases_release_on_signal")
        schedule_wanted.connect(receivers.lab_schedule_on_signal, dispatch_uid="lab.lab_schedule_on_signal")
