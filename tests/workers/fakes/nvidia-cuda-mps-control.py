"""A stand-in for ``nvidia-cuda-mps-control`` at the process boundary (tests have no GPU).

Installed by the tests as an executable named ``nvidia-cuda-mps-control`` first on ``PATH``.
It keeps its state in ``CUDA_MPS_PIPE_DIRECTORY`` as the real daemon does (a ``control`` file
stands for the control socket, ``fake-server-pid`` for the MPS server it would start), writes
``control.log`` in ``CUDA_MPS_LOG_DIRECTORY``, and appends every invocation (arguments, the
command read on stdin, the ``CUDA_*`` environment) as a JSON line to ``FAKE_MPS_RECORD``.

``FAKE_MPS_MODE``: ``hang`` (``-d`` succeeds but no command is ever answered), ``fail_start``
(``-d`` exits 1 with a message), ``stuck`` (``-d`` leaves a real background process standing for
the daemon, its pid in ``nvidia-cuda-mps-control.pid``, and one for its server as that process's
child; ``quit`` is answered but neither ever exits). ``terminate_client S C`` is answered when
``S`` is the server's pid (and recorded).
"""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
mode = os.environ.get("FAKE_MPS_MODE", "")
args = sys.argv[1:]
command = "" if args else sys.stdin.read().strip()

record = os.environ.get("FAKE_MPS_RECORD")
if record:
    with open(record, "a") as handle:
        env = {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}
        handle.write(json.dumps({"argv": args, "command": command, "env": env}) + "\n")


def log_line(name, who, message):
    log.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S.000")
    with open(log / name, "a") as handle:
        handle.write(f"[{stamp} {who} {os.getpid()}] {message}\n")


if args == ["-d"]:
    if mode == "fail_start":
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    pipe.mkdir(parents=True, exist_ok=True)
    (pipe / "control").write_text("stands for the control socket\n")
    if mode == "stuck":
        # A daemon that ignores `quit`, with its server as its child, as the real daemon forks it.
        code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
        daemon = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        (pipe / "nvidia-cuda-mps-control.pid").write_text(str(daemon.pid))
    (pipe / "fake-server-pid").write_text(str(random.randint(30000, 60000)))
    log_line("control.log", "Control", f"Starting control daemon using socket {pipe}/control")
    sys.exit(0)

if not (pipe / "control").exists():
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
if mode == "hang":
    time.sleep(3600)
if command == "get_server_list":
    print((pipe / "fake-server-pid").read_text())
elif command.startswith("terminate_client "):
    server = (pipe / "fake-server-pid").read_text().strip()
    if command.split()[1] != server:
        print(f"no server {command.split()[1]}", file=sys.stderr)
        sys.exit(1)
elif command == "quit" and mode == "stuck":
    pass
elif command == "quit":
    (pipe / "control").unlink()
    log_line("control.log", "Control", "Exit")
sys.exit(0)
