"""Devices (GPU or CPU hosts that run a device agent), their inventory and heartbeats."""
