"""Signals the fleet sends, for the apps above it (the fleet imports none of them)."""

from __future__ import annotations

from django.dispatch import Signal

device_heartbeat_received = Signal()
"""Sent by the control worker after it recorded an agent's heartbeat (``DEVICE_HEARTBEAT``),
with ``device_name``: a clock the control plane has for as long as any agent is alive."""
