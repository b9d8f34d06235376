"""A stand-in for the SM probe subprocess (``workers.backends.gpu.PROBE_COMMAND``; tests have no GPU).

Prints one JSON line as the real probe does. Standing in for the CUDA driver under MPS: when its
``CUDA_MPS_PIPE_DIRECTORY`` holds a (fake) running daemon, the SM count it reports is its share
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, capped by ``FAKE_MPS_SERVER_SHARE``) of ``FAKE_GPU_SMS``
(default 132), rounded down to an even number; otherwise the whole GPU's.

``FAKE_PROBE_MODE``: ``no_gpu`` (the answer of a host whose torch sees no GPU), ``no_mps`` (the
client never reaches the daemon: it runs as a plain CUDA context and sees every SM), ``crash``
(exits 1 with a traceback on stderr and nothing on stdout).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fake_gpu import visible_sms  # noqa: E402

mode = os.environ.get("FAKE_PROBE_MODE", "")
if mode == "no_gpu":
    print(json.dumps({"error": "torch sees no GPU (built for CUDA 12.4)"}))
elif mode == "crash":
    print("Traceback (most recent call last):\nRuntimeError: CUDA driver initialization failed", file=sys.stderr)
    sys.exit(1)
else:
    print(json.dumps({"sm_count": visible_sms(ignore_mps=mode == "no_mps"), "capability": "9.0"}))
