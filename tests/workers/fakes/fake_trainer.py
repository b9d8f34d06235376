"""A stand-in for ``python -m workers.training.trainer`` on a GPU host (tests have no GPU).

Same command line and protocol as the real trainer (``MODE SPEC.json RESULT.json``; READY on
stdout, GO on stdin, RESULT.json). It records its environment (``CUDA_*``, ``MTFL_*``) as a JSON
line in ``FAKE_MPS_RECORD``. Standing in for the CUDA driver and the MPS server: when its
``CUDA_MPS_PIPE_DIRECTORY`` holds a (fake) running daemon, it writes what the MPS server logs
when a client connects to ``CUDA_MPS_LOG_DIRECTORY/server.log`` (the server's active thread
percentage is ``FAKE_MPS_SERVER_SHARE``, default 100.0), and reports the SM count MPS would
leave it (tests/workers/fakes/fake_gpu.py) as ``visible_sm_count``; ``FAKE_MPS_IGNORED=1`` stands
for a client that never reached the daemon (no log line, every SM).

``serve`` stands in for the warm mode (``JOB {json}`` lines, ``DONE <code>`` after each job;
the connection to the MPS server is logged once per process, as a CUDA context connects once).

Behaviour by task name: ``crash-cuda`` exits 1 with a CUDA error after GO, ``crash-oom`` with
a CUDA out-of-memory error, ``crash-killed`` kills itself with SIGKILL, ``slow`` trains for 60 s;
anything else trains 0.3 s and succeeds.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fake_gpu import visible_sms  # noqa: E402


def connect() -> None:
    """Write what the MPS server logs when this process connects as a client (once per process,
    as a real CUDA context connects once)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    if not (pipe and log and (Path(pipe) / "control").exists() and os.environ.get("FAKE_MPS_IGNORED") != "1"):
        return
    server = (Path(pipe) / "fake-server-pid").read_text().strip()
    server_log = Path(log) / "server.log"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S.000")
    lines = []
    if f"Server {server}]" not in (server_log.read_text() if server_log.exists() else ""):
        share = os.environ.get("FAKE_MPS_SERVER_SHARE", "100.0")
        lines += [
            f"[{stamp} Server {server}] Creating server context on device 0 (Fake GPU)",
            f"[{stamp} Server {server}] Active Threads Percentage set to {share}",
            f"[{stamp} Server {server}] Server has started",
        ]
    lines += [
        f"[{stamp} Server {server}] Received new client request for {{PID: {os.getpid()}, Context ID: 0}}",
        f"[{stamp} Server {server}] Client {{PID: {os.getpid()}, Context ID: 0}} connected",
    ]
    with open(server_log, "a") as handle:
        handle.write("\n".join(lines) + "\n")


def job(mode: str, spec_path: str, result_path: str, stdin) -> int:
    """One job, as the real trainer's one-shot mode runs it; returns the exit code."""
    spec = json.loads(Path(spec_path).read_text())
    env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "MTFL_"))}
    record = os.environ.get("FAKE_MPS_RECORD")
    if record:
        with open(record, "a") as handle:
            handle.write(
                json.dumps({"trainer": os.getpid(), "mode": mode, "assignment": spec.get("assignment_id"), "env": env})
                + "\n"
            )
    if mode == "standalone":
        result = {
            "run_id": spec["run_id"],
            "device": spec["device"],
            "status": "succeeded",
            "measurements": [
                {"task_id": item["task"]["task_id"], "batch_size": item["batch_size"], "throughput_sps": 100.0}
                for item in spec["items"]
            ],
        }
        Path(result_path).write_text(json.dumps(result))
        return 0

    print("READY", flush=True)
    if stdin.readline().strip() != "GO":
        return 1
    name = spec["task"]["name"]
    failure = {
        "crash-cuda": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "crash-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    }
    if name in failure:
        time.sleep(0.2)
        print(failure[name], file=sys.stderr)
        Path(result_path).write_text(
            json.dumps(
                {
                    "assignment_id": spec["assignment_id"],
                    "task_id": spec["task"]["task_id"],
                    "status": "failed",
                    "error": failure[name],
                }
            )
        )
        return 1
    if name == "crash-killed":
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.time()
    time.sleep(60 if name == "slow" else 0.3)
    finished = time.time()
    count = spec["shard"]["count"]
    Path(result_path).write_text(
        json.dumps(
            {
                "assignment_id": spec["assignment_id"],
                "task_id": spec["task"]["task_id"],
                "status": "succeeded",
                "samples_trained": count,
                "iterations": 4,
                "timed_iterations": 3,
                "seconds": finished - started,
                "throughput_sps": count / (finished - started),
                "started_at": started,
                "finished_at": finished,
                "weights": spec["output_weights"],
                "threads": spec["threads"],
                "cores": spec["cores"],
                "torch_device": "cuda",
                "peak_memory_bytes": 123456789,
                "visible_sm_count": visible_sms(),
            }
        )
    )
    return 0


def serve() -> int:
    """The warm mode: ``JOB {json}`` lines on stdin, ``DONE <code>`` after each, exit at EOF."""
    connect()
    while line := sys.stdin.readline():
        payload = json.loads(line.split(" ", 1)[1])
        code = job(payload["mode"], payload["spec"], payload["result"], sys.stdin)
        print(f"DONE {code}", flush=True)
    return 0


if sys.argv[1] == "serve":
    sys.exit(serve())
connect()
sys.exit(job(sys.argv[1], sys.argv[2], sys.argv[3], sys.stdin))
