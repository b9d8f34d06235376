"""What the fake GPU's CUDA driver tells a process: the SM count MPS leaves it (shared by the
stand-in trainer and SM probe)."""

import os
from pathlib import Path


def visible_sms(*, ignore_mps: bool = False) -> int:
    """``FAKE_GPU_SMS`` (default 132), or, for a client of a (fake) running MPS daemon, its
    share of them (its ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` capped by the server's
    ``FAKE_MPS_SERVER_SHARE``), rounded down to whole TPCs (2 SMs); ``FAKE_MPS_IGNORED=1`` or
    ``ignore_mps`` stand for a client that never reached the daemon."""
    total = int(os.environ.get("FAKE_GPU_SMS", "132"))
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if ignore_mps or os.environ.get("FAKE_MPS_IGNORED") == "1" or not pipe or not (Path(pipe) / "control").exists():
        return total
    share = min(
        float(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")),
        float(os.environ.get("FAKE_MPS_SERVER_SHARE", "100")),
    )
    return max(2, int(total * share / 100) // 2 * 2)
