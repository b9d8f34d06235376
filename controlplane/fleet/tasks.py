"""Control-queue Celery tasks fed by device agents (registration and heartbeats)."""

from __future__ import annotations

from controlplane.celery import app
from controlplane.fleet import services
from controlplane.fleet.signals import device_heartbeat_received
from workers.protocol.queues import TaskName


@app.task(name=TaskName.DEVICE_REGISTER)
def device_register(inventory: dict) -> int:
    """An agent started: record its inventory (creating the device if new)."""
    return services.device_report(inventory=inventory).id


@app.task(name=TaskName.DEVICE_HEARTBEAT, ignore_result=True)
def device_heartbeat(inventory: dict) -> None:
    """An agent is alive: refresh its inventory and heartbeat time, then tell the apps that keep
    time by heartbeats (:data:`..signals.device_heartbeat_received`)."""
    device = services.device_report(inventory=inventory)
    device_heartbeat_received.send(sender=device_heartbeat, device_name=device.name)
