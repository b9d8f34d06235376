"""An agent stand-in for the fork server's test of what outlives a killed agent: starts a
server, forks a child that sleeps, prints ``<server pid> <child pid>`` and waits to be killed."""

import os
import sys
import tempfile
import time
from pathlib import Path

from workers.forkserver import ForkServer

folder = Path(tempfile.mkdtemp(prefix="mtfl-fs-owner-"))
server = ForkServer(dict(os.environ), preload=("json",), stderr_path=folder / "server.log").start()
child = server.spawn(
    "tests.workers.fakes.forked_child", ["sleep", "120"], env=dict(os.environ), stderr_path=folder / "child.log"
)
child.stdout.readline()
print(server.pid, child.pid, flush=True)
time.sleep(120)
sys.exit(0)
