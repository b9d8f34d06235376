"""GPU check: the paper's light and mixed mixes under the five strategies, measured on one device.

    benchmarks/gpu_check.sh [options]                 # on a GPU host: nvidia-smi, imports, this
    python benchmarks/gpu_check.py [--backend cuda-mps] [--budget 150] [--mixes light,mixed]
    python benchmarks/gpu_check.py --backend cpu --quick --budget 20   # the same pipeline on CPU

It needs only ``workers/`` and ``controlplane/planning/`` (pydantic, numpy, scipy,
scikit-learn, torch, torchvision; nvidia-ml-py for ``cuda-mps``): no Django, Celery or Redis, no
network. Phases, each time-boxed and reporting progress as ``[  12.3 s] phase: ...`` lines:

1. ``preflight`` — the Python packages, the backend (``check_available``; ``cuda-mps`` starts its
   private MPS control daemon), the device (GPU name, SMs, memory).
2. ``features`` — workload features ``F_i`` of every model (:func:`workers.training.features.workload_features`).
3. ``profile`` — :func:`workers.profiling.sweep.run_sweep` over the mixes' models on synthetic
   CIFAR-shaped batches (``3×32×32``): co-located mixes of 1 to 3 tasks under MPS-style shares,
   each (model, batch size) measured alone first (``P_alone``). It stops once ``--budget``
   seconds are spent *and* ``--min-configs`` configurations succeeded (the predictor needs 10),
   or, once they have, when the time left is only what the later phases need at the pace
   measured so far.
4. ``fit`` — :func:`controlplane.planning.predictor.fit_predictor` (``placement`` ``pooled`` on
   a GPU, ``packed`` on ``cpu``; allocation units: the GPU's SMs or the cores).
5. ``plan`` — per mix, one device holding ``--samples-per-task`` samples of every task
   (``--data equal``, the default: CIFAR-10's 50,000 training images over 10 devices), or
   Dirichlet(``--alpha``) proportions of the same total (``--data dirichlet``): every strategy
   a comparison runs (:func:`controlplane.planning.strategies.compared_strategies`, the
   control plane's registry, plug-ins included) planned by
   :func:`~controlplane.planning.strategies.make_plan`, those that need a predictor with the
   fitted one; the others (``temporal``, ``isolation``, ``sharing``) at ``--baseline-batch``
   (the paper's 128).
6. ``measure`` — every plan as one co-located configuration, run by the same launch engine as a
   round (:func:`workers.profiling.sweep.measure_configuration` on :class:`workers.launch.ProcessGroup`)
   with the partitioning the strategy's record gives: ``timeslice`` for ``temporal`` (plain
   CUDA contexts, no MPS: the driver time-slices them; on ``cpu`` the per-iteration device
   lock), ``mps`` with their shares for the others. Throughput is each task's steady-state
   samples/s while all of the mix trained. On a GPU, whole-GPU utilisation is sampled through
   NVML meanwhile.
7. ``alone`` — ``P_alone`` of every (model, batch size) the plans use: from the profile when it
   measured that pair alone, else measured now (one task, ``timeslice``: the whole device) while
   time is left, else interpolated from the profiled batch sizes (marked ``~`` in the table).
8. ``report`` — the table and the JSON.

``--issue31`` (issue 31, item 6; :func:`run_issue31`): the light mix only, in this order:
``preflight``, ``features``, ``profile`` (in ``--execution``, graphs by default, until the later
phases need the time), ``fit``, ``plan`` (``temporal``, ``isolation``, ``sharing`` at batch 128,
``vres_sync``), ``alone`` (:func:`alone_modes`: each task alone at batch 128, eager then graphs),
``compare`` (:func:`compare`: the four plans in ``--blocks`` interleaved blocks, 95 % intervals,
``vres_sync`` over the best baseline paired on the log scale), ``e2e`` (:func:`e2e_phase`:
``benchmarks/gpu_e2e.py`` in a child process, the control plane on its embedded defaults with one
local agent, 2 FL rounds of ``sharing`` then ``vres_sync``; the only phase that imports Django,
after this process has quit its MPS daemon) and ``report`` (:func:`targets`, :func:`print_issue31`:
Markdown tables with the issue's targets beside the figures). ``--backend simulated`` runs every
phase on the analytic model of ``--sim-device`` (the suite's test of the check), every figure
labelled simulated.

Metrics: the control plane's (:mod:`controlplane.planning.metrics`, docs/DESIGN.md §1), each
strategy's measurement scored as a one-device round: raw throughput ``T = Σ_i P_i``, fair
throughput ``T_f = Σ_i P_i / P_i^alone``; speedups are each over the same mix's baseline
strategy (:func:`~controlplane.planning.strategies.baseline_strategy`, ``temporal``: 1.00 by
definition). The paper reports 2.16–2.38× raw
speedup inside one device (Titan V).

Exit codes: 0 everything measured; 1 a phase or a measurement failed; 2 a missing package, a bad
option or an unavailable backend (nothing measured); 3 stopped (time limit or signal). A failure
ends with one line ``gpu_check: FAILED: <why>``; success with ``gpu_check: OK ...``.

JSON (``$OUT/gpu_check.json`` when ``OUT`` is set, and/or ``--json PATH``), written at the end
whether the check succeeded or not, and by the watchdog if the time limit is overrun (with
``--issue31`` also ``alone_modes``, ``compare``, ``e2e``, ``targets`` and ``targets_simulated``,
``null`` otherwise; see :func:`alone_modes`, :func:`compare`, :func:`e2e_phase`, :func:`targets`)::

    {"schema": "mtfl-gpu-check/2", "status": "succeeded" | "failed", "exit_code": int,
     "error": str, "started_at": unix s, "elapsed_s": float, "args": {option: value},
     "host": {"hostname", "python", "torch", "backend", "cores": [int], "device": {GPU
              description from the backend: accelerator, memory_bytes, sm_count, gpu_uuid, ...},
              "django_imported": false, "celery_imported": false},
     "phases": [{"name", "started_s", "elapsed_s", "status": "succeeded" | "failed"}],
     "profile": {"request": ProfileSweepRequest, "summary": ProfileSweepSummary,
                 "configs": [ProfileConfigResult], "succeeded": int, "seconds_per_config": float},
     "predictor": {"family", "samples", "configurations", "groups", "folds", "fit_seconds",
                   "units", "placement", "families": [{"family", "rmsle", "mape"}]},
     "alone": [{"architecture", "batch_size", "throughput_sps",
                "source": "profiled" | "measured" | "interpolated"}],
     "mixes": [{"name", "architectures": [str], "data": {"policy", "samples": [int], "alpha"},
                "strategies": [{"strategy", "partitioning", "status": "succeeded" | "failed" |
                                "skipped", "error",
                                "predicted_round_time_s",
                                "tasks": [{"architecture", "batch_size", "share", "samples",
                                           "predicted_sps", "measured_sps", "alone_sps",
                                           "alone_source", "timed_iterations",
                                           "peak_memory_bytes"}],
                                "raw_sps", "fair", "raw_speedup", "fair_speedup",
                                "gpu_util_mean_percent", "gpu_util_busy_percent",
                                "launch_bound", "gpu_memory_max_bytes",
                                "measured_s", "measurement": ProfileConfigResult}]}],
     "paper": {"raw_speedup_one_device": [2.16, 2.38]}}

Missing numbers are ``null``; ``raw_speedup``/``fair_speedup`` of ``temporal`` are 1.0.
``gpu_util_busy_percent`` is the mean NVML utilisation over the samples from the first to the
last that saw GPU work (:func:`busy_utilisation`: the processes' start-up and loading, before,
are left out); ``launch_bound`` is true when it is below :data:`LAUNCH_BOUND_UTIL_PERCENT`: the
trainers were training but the GPU was idle most of the time, so kernel launches, not the GPU,
set the pace (the table flags the row ``launch-bound``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIXES: dict[str, tuple[str, ...]] = {
    "light": ("resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"),
    "mixed": ("resnet50", "vgg16", "mobilenet_v3_large"),
    "heavy": ("densenet121", "vgg16", "resnet101"),
    # Not a paper mix: the two smallest models, so --quick runs in minutes on two CPU cores.
    "tiny": ("mobilenet_v3_small", "shufflenet_v2_x1_0"),
}
"""The paper's mixes (Yu et al. 2022, §5) by name, and ``tiny`` for ``--quick``."""

PAPER_RAW_SPEEDUP = (2.16, 2.38)
SCHEMA = "mtfl-gpu-check/2"
"""Version of the JSON: 2 added ``e2e``, ``alone_modes``, ``compare`` and ``targets`` (``null``
outside --issue31) and the ``simulated`` backend."""
REQUIRED_PACKAGES = (
    ("pydantic", "pydantic", "workers/ validates its messages with it"),
    ("numpy", "numpy", "planning and the simulated backend"),
    ("scipy", "scipy", "the profiling design (scipy.stats.qmc)"),
    ("sklearn", "scikit-learn", "the throughput predictor"),
    ("safetensors", "safetensors", "workers/ stores weights with it"),
    ("torch", "torch", "the profiler processes"),
    ("torchvision", "torchvision", "the model zoo"),
)
LAUNCH_BOUND_UTIL_PERCENT = 50.0
"""A configuration whose GPU was busy less than this percentage of the time while its trainers
trained (NVML ``utilization.gpu``: the share of the sample period in which a kernel ran) is
flagged launch-bound."""
PREDICTOR_MIN_CONFIGS = 10
""":func:`controlplane.planning.predictor.fit_predictor` needs at least 10 measured configurations."""

EXIT_OK, EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_STOPPED = 0, 1, 2, 3
WATCHDOG_GRACE_S = 45.0
FIT_AND_PLAN_RESERVE_S = 30.0

# Defaults: (GPU, --quick). Options given on the command line win.
DEFAULTS = {
    "mixes": ("light,mixed", "tiny"),
    "budget": (150.0, 20.0),
    "profile_batch_sizes": ("32,128,256", "8,16"),
    "baseline_batch": (128, 16),
    "samples_per_task": (5000, 512),
    "min_configs": (PREDICTOR_MIN_CONFIGS, PREDICTOR_MIN_CONFIGS),
    "time_limit": (420.0, 900.0),
    "config_timeout": (90.0, 240.0),
    "profile_warmup": (3, 1),
    "profile_iterations": (5, 2),
    "profile_window": (1.5, 0.3),
    "measure_warmup": (5, 1),
    "measure_iterations": (10, 3),
    "measure_window": (2.0, 0.5),
    # Gradient boosting's cross-validation thrashes a loaded 2-core machine (minutes of OpenMP
    # spinning on a dozen rows); the CPU smoke run compares the other three.
    "families": ("baseline,random_forest,gradient_boosting,extra_trees", "baseline,random_forest,extra_trees"),
}

# --issue31's defaults: (GPU, simulated). Options given on the command line win. The profile
# budget is wall seconds on a GPU and virtual seconds on simulated (the sweep's own clock there).
ISSUE31_DEFAULTS = {
    "mixes": ("light", "light"),
    "budget": (90.0, 400.0),
    "min_configs": (60, 60),
    "profile_batch_sizes": ("32,64,128,256", "32,64,128,256"),
    "baseline_batch": (128, 128),
    "samples_per_task": (5000, 5000),
    "time_limit": (460.0, 420.0),
    "config_timeout": (60.0, 60.0),
    "profile_warmup": (3, 3),
    "profile_iterations": (5, 5),
    "profile_window": (0.5, 0.5),
    "measure_warmup": (5, 5),
    "measure_iterations": (10, 10),
    "measure_window": (1.5, 1.5),
    "families": ("baseline,random_forest,gradient_boosting,extra_trees", "baseline,random_forest"),
    "e2e_time_limit": (170.0, 240.0),
}
ISSUE31_STRATEGIES = ("temporal", "isolation", "sharing", "vres_sync")
"""What --issue31 compares: the paper's three baselines and the planner for the round time."""
ISSUE31_BATCH = 128
"""The batch size of --issue31's alone phase (the paper's baselines' batch size)."""
EAGER_TEMPORAL_H200_SPS = 20885.5
"""Raw throughput of the light mix under eager ``temporal`` on the H200 before issue 31
(benchmarks/results/gpu_check_h200/full_default.json): the yardstick of the graphs target."""
TARGETS = {
    "graphs_over_eager_alone": 2.0,
    "best_over_eager_temporal_h200": 3.0,
    "vres_sync_over_best_baseline": 1.2,
    "profile_seconds_per_config": 2.0,
    "e2e_rounds": 2,
}
"""Issue 31's targets on a real H100/H200 (benchmarks, not tests): graphs at least 2x eager
alone per task; the best strategy with graphs at least 3x :data:`EAGER_TEMPORAL_H200_SPS`;
vres_sync at least 1.2x the best baseline with the 95 % interval above 1.0; profiling at most
2 s per configuration; 2 FL rounds through the control plane."""


class CheckFailed(Exception):
    """Ends the check: ``str(exc)`` is the one line printed; ``code`` the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for line in str(text).splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def finite(value):
    """``value`` with every NaN or infinite float (at any depth) replaced by ``None`` (JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in list(value.items())}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in list(value)]
    return value


def missing_packages() -> list[str]:
    """One description per required package that cannot be imported (``[]`` when all can)."""
    out = []
    for module, package, why in REQUIRED_PACKAGES:
        if importlib.util.find_spec(module) is None:
            out.append(f"{package} ({why})")
    return out


# ------------------------------------------------------------------------------- the check


class Check:
    """State of one run: the clock, the report, the backend, the stop flag, the watchdog."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.time_limit
        self.phase = "start"
        self.stop_reason = ""
        self.backend = None
        self.e2e_proc: subprocess.Popen[str] | None = (
            None  # the e2e phase's child (benchmarks/gpu_e2e.py) while it runs
        )
        self.state_dir: Path | None = None
        self.finished = threading.Event()
        self.report: dict = {
            "schema": SCHEMA,
            "status": "failed",
            "exit_code": None,
            "error": "",
            "started_at": time.time(),
            "elapsed_s": None,
            "args": {k: v for k, v in vars(args).items()},
            "host": {
                "hostname": socket.gethostname(),
                "python": platform.python_version(),
                "torch": None,
                "backend": args.backend,
                "cores": None,
                "device": None,
                "django_imported": None,
                "celery_imported": None,
            },
            "phases": [],
            "profile": None,
            "predictor": None,
            "alone": [],
            "mixes": [],
            "alone_modes": None,
            "compare": None,
            "e2e": None,
            "targets": None,
            "paper": {"raw_speedup_one_device": list(PAPER_RAW_SPEEDUP)},
        }

    # -- clock and output

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {self.phase}: {message}", flush=True)

    def detail(self, text: str) -> None:
        """Print a multi-line text (an error with a stderr tail) indented under a progress line."""
        for line in str(text).splitlines():
            print(f"      | {line}", flush=True)

    @contextmanager
    def stage(self, name: str, *, strict: bool = True):
        """Time one phase into ``report["phases"]``. A stop request (signal, time limit) ends the
        check after a ``strict`` phase; the measuring phases are not strict, so what was
        measured before the time ran out is still scored and printed."""
        self.phase = name
        entry = {"name": name, "started_s": round(self.elapsed(), 2), "elapsed_s": None, "status": "failed"}
        self.report["phases"].append(entry)
        started = time.monotonic()
        try:
            yield
            if strict or self.stop_reason:
                self.raise_if_stopping()
            entry["status"] = "succeeded"
        finally:
            entry["elapsed_s"] = round(time.monotonic() - started, 2)

    # -- stopping

    def stopping(self) -> bool:
        """Whether everything should stop now: a signal, or past the time limit."""
        return bool(self.stop_reason) or time.monotonic() > self.deadline

    def raise_if_stopping(self) -> None:
        if self.stop_reason:
            raise CheckFailed(f"{self.stop_reason} during phase {self.phase}", EXIT_STOPPED)
        if time.monotonic() > self.deadline:
            raise CheckFailed(
                f"time limit of {self.args.time_limit:g} s reached during phase "
                f"{self.phase} (raise --time-limit or lower --budget)",
                EXIT_STOPPED,
            )

    def on_signal(self, signum, _frame) -> None:
        self.stop_reason = f"stopped by {signal.Signals(signum).name}"
        # Terminate the profiler processes (their configuration then fails at once). Before
        # workers/ is imported (perhaps half-way, in this very thread) there are none.
        request_shutdown = getattr(sys.modules.get("workers.launch"), "request_shutdown", None)
        if request_shutdown is not None:
            request_shutdown()
        proc = self.e2e_proc
        if proc is not None and proc.poll() is None:
            proc.terminate()  # it stops its stack (and the agent its MPS daemon) on the way out

    def start_watchdog(self) -> None:
        """If the check is still running ``WATCHDOG_GRACE_S`` after the time limit (a phase that
        cannot be interrupted hung), say so, kill everything, write the JSON and exit 3."""

        def watch() -> None:
            if self.finished.wait(self.args.time_limit + WATCHDOG_GRACE_S):
                return
            message = (
                f"still in phase {self.phase} {WATCHDOG_GRACE_S:g} s after the time limit "
                f"of {self.args.time_limit:g} s: killed"
            )
            try:
                from workers.launch import request_shutdown

                request_shutdown()
                self.close_backend()
                self.write_json(EXIT_STOPPED, message)
            finally:
                print(f"gpu_check: FAILED: {message}", flush=True)
                os._exit(EXIT_STOPPED)

        threading.Thread(target=watch, daemon=True, name="gpu-check-watchdog").start()

    def close_backend(self) -> None:
        if self.backend is not None:
            self.backend.stop()  # cuda-mps: quit the MPS control daemon; never raises

    # -- output files

    def json_paths(self) -> list[Path]:
        paths = []
        if os.environ.get("OUT"):
            paths.append(Path(os.environ["OUT"]) / "gpu_check.json")
        if self.args.json:
            paths.append(Path(self.args.json))
        return paths

    def write_json(self, code: int, error: str) -> None:
        self.report.update(
            status="succeeded" if code == EXIT_OK else "failed",
            exit_code=code,
            error=error,
            elapsed_s=round(self.elapsed(), 2),
        )
        try:
            text = json.dumps(finite(self.report), indent=1, default=str, allow_nan=False)
        except (TypeError, ValueError, RuntimeError) as exc:  # changed while dumped (watchdog)
            text = json.dumps(
                {
                    **{k: self.report[k] for k in ("schema", "status", "exit_code", "error", "elapsed_s")},
                    "dump_error": f"{type(exc).__name__}: {exc}",
                }
            )
        for path in self.json_paths():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"[{self.elapsed():6.1f} s] report: JSON written to {path}", flush=True)
            except OSError as exc:
                print(f"[{self.elapsed():6.1f} s] report: could not write {path}: {exc}", flush=True)


# ----------------------------------------------------------------------------------- phases


def preflight(check: Check):
    """Packages, backend, device; returns ``(backend, ctx, units, memory_bytes, placement)``."""
    missing = missing_packages()
    if missing:
        raise CheckFailed(
            f"missing Python package{'s' if len(missing) > 1 else ''}: {'; '.join(missing)} — "
            "install it, or carry its wheels (README, 'GPU hosts')",
            EXIT_UNAVAILABLE,
        )
    try:
        from workers.backends import AgentContext, BackendUnavailableError
        from workers.registry.backends import get_backend

        importlib.import_module("controlplane.planning.strategies")  # fail now, not after profiling
    except ImportError as exc:
        raise CheckFailed(f"cannot import workers/ or controlplane/planning/: {exc}", EXIT_UNAVAILABLE) from None

    args = check.args
    if args.backend == "simulated":
        from workers.backends.simulated import ENV_DEVICE

        os.environ[ENV_DEVICE] = args.sim_device  # this process's backend and the e2e phase's agent
    try:
        backend = get_backend(args.backend)
        backend.check_available()
    except (ValueError, BackendUnavailableError) as exc:
        raise CheckFailed(first_line(str(exc)), EXIT_UNAVAILABLE) from None
    cores = parse_ints(args.cores, "--cores") if args.cores else sorted(os.sched_getaffinity(0))
    check.state_dir = Path(tempfile.mkdtemp(prefix="mtfl-gpu-check-"))
    ctx = AgentContext(
        device="gpu-check",
        cores=cores,
        state_dir=check.state_dir,
        artifact_root=check.state_dir / "artifacts",
        trainer_timeout_s=args.config_timeout,
        ready_timeout_s=args.config_timeout,
    )
    check.backend = backend
    try:
        backend.start(ctx)
        device = backend.describe()
    except BackendUnavailableError as exc:
        raise CheckFailed(first_line(str(exc)), EXIT_UNAVAILABLE) from None
    check.report["host"].update(cores=cores, device=device or None)
    if args.backend == "simulated":
        units = int(device["allocation_units"])
        memory = float(device["memory_bytes"])
        check.say(
            f"simulated {device['accelerator']} (MTFL_SIM_DEVICE): {units} SMs, {memory / 2**30:.1f} GiB; "
            "every figure below is the analytic model's, not a measurement"
        )
        return backend, ctx, units, memory, "pooled"
    if args.backend == "cpu":
        units = len(cores)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        check.say(f"cpu backend on cores {cores}, {memory / 2**30:.1f} GiB of memory")
        return backend, ctx, units, float(memory), "packed"
    units = int(device.get("allocation_units") or 0) or len(cores)
    memory = device.get("memory_bytes")
    check.say(
        f"{device.get('accelerator')} {device.get('gpu_uuid')}: {device.get('sm_count')} SMs, "
        f"{(memory or 0) / 2**30:.1f} GiB, driver {device.get('driver_version')}, CUDA "
        f"{device.get('cuda_version')}, compute mode {device.get('compute_mode') or '?'}, "
        f"MPS control daemon started, {len(cores)} CPU cores"
    )
    if device.get("compute_mode") and device["compute_mode"] != "Default":
        raise CheckFailed(
            f"GPU compute mode is {device['compute_mode']}: temporal needs several "
            "CUDA contexts at once (nvidia-smi -c DEFAULT)",
            EXIT_UNAVAILABLE,
        )
    return backend, ctx, units, float(memory) if memory else None, "pooled"


def features(check: Check, architectures: Sequence[str]):
    """Workload features of every model, as the predictor's ModelWorkload."""
    import torch

    from controlplane.planning.predictor import ModelWorkload
    from workers.training.features import workload_features

    check.report["host"]["torch"] = torch.__version__
    out = {}
    for arch in architectures:
        f = workload_features(arch, 10)
        out[arch] = ModelWorkload(f.train_flops_per_sample, f.activation_bytes_per_sample, f.params, f.param_bytes)
        check.say(
            f"{arch}: {f.train_flops_per_sample / 1e9:.3f} GFLOP per training sample, {f.params / 1e6:.1f} M parameters"
        )
        check.raise_if_stopping()
    return out


def profile_request(check: Check, ctx, architectures: Sequence[str], max_mix: int):
    """The sweep's request (its budget is set when it starts); checks the profiling options."""
    args = check.args
    return sweep_request(
        sweep_id=1,
        device=ctx.device,
        backend=args.backend,
        budget_s=5.0,
        architectures=list(architectures),
        batch_sizes=parse_ints(args.profile_batch_sizes, "--profile-batch-sizes"),
        share_min=args.share_step,
        share_step=args.share_step,
        max_mix=max_mix,
        warmup_iterations=args.profile_warmup,
        min_timed_iterations=args.profile_iterations,
        min_window_s=args.profile_window,
        config_timeout_s=args.config_timeout,
        repeat_every=args.repeat_every,
        seed=args.seed,
        execution={"mode": args.execution},
    )


def profile(check: Check, backend, ctx, request, reserve: Callable[[float], float]):
    """The profiling sweep; returns (succeeded results, profiled P_alone by (arch, batch)).

    ``request.budget_s`` becomes the time left: the sweep stops through ``should_stop`` (the
    budget, ``--min-configs``, the reserve), never through its own budget."""
    from workers.backends.base import AnalyticBackend
    from workers.profiling.sweep import run_sweep

    args = check.args
    sweep_started = time.monotonic()
    hard_stop = sweep_started + max(5.0, check.remaining())
    # An analytic backend's sweep runs on a virtual clock: its own budget (virtual seconds)
    # ends it, and the wall clock only guards the time limit.
    analytic = isinstance(backend, AnalyticBackend)
    budget_s = args.budget if analytic else max(5.0, min(7 * 24 * 3600.0, hard_stop - sweep_started))
    request = request.model_copy(update={"budget_s": budget_s})
    architectures, max_mix = request.architectures, request.max_mix
    results: list = []
    state = {"succeeded": 0, "abort": "", "last": sweep_started, "reserve_said": False}

    def seconds_per_config() -> float | None:
        """Mean seconds of the configurations finished so far (``None`` before the first)."""
        return (state["last"] - sweep_started) / len(results) if results else None

    def budget_done() -> bool:
        return time.monotonic() - sweep_started >= args.budget and state["succeeded"] >= args.min_configs

    def emit(result) -> None:
        results.append(result)
        state["last"] = time.monotonic()
        if result.status == "succeeded":
            state["succeeded"] += 1
        mix = " + ".join(f"{t.architecture}/B{t.batch_size}/{t.active_thread_percentage}%" for t in result.tasks)
        rates = ", ".join(f"{m.throughput_sps:.1f}" if m.throughput_sps else "—" for m in result.measurements)
        status = result.status
        if status != "succeeded" and (budget_done() or state["reserve_said"]):
            status = "abandoned at the end of the profiling time"
        check.say(f"config {result.config_index:3d} {status:9s} {mix} → {rates} samples/s")
        if result.status != "succeeded" and status == result.status and not check.stopping():
            check.detail(first_line(result.error, 1000))
        if len(results) >= 2 and state["succeeded"] == 0 and not state["abort"]:
            state["abort"] = f"the first {len(results)} configurations failed; first: {results[0].error}"

    def should_stop() -> bool:
        now = time.monotonic()
        if check.stopping() or state["abort"] or now > hard_stop:
            return True
        if analytic:
            return False
        # Once the predictor has what it needs, leave the later phases their time at the pace
        # measured so far (before that, stopping would only make the fit fail).
        # Past --min-configs the budget may be overrun, never the reserve: once the predictor has
        # its minimum, the later phases' time wins over more configurations.
        pace = seconds_per_config()
        enough = min(args.min_configs, PREDICTOR_MIN_CONFIGS)
        if pace is not None and state["succeeded"] >= enough and check.deadline - now < reserve(pace):
            if not state["reserve_said"]:
                state["reserve_said"] = True
                check.say(
                    f"stopping to leave time for fitting, planning and measuring "
                    f"({pace:.1f} s per configuration so far)"
                )
            return True
        return budget_done()

    check.say(
        f"sweep over {', '.join(architectures)} at batch sizes {request.batch_sizes}, "
        f"mixes of 1 to {max_mix}, budget {args.budget:g} s (and at least {args.min_configs} "
        "configurations)"
    )
    summary = run_sweep(request, ctx, backend, emit, should_stop=should_stop)
    check.report["profile"] = {
        "request": request.model_dump(mode="json"),
        "summary": summary.model_dump(mode="json"),
        "configs": [r.model_dump(mode="json") for r in results],
        "succeeded": state["succeeded"],
        # Wall seconds per configuration as this check saw them; the sweep's own figure (virtual
        # seconds on an analytic backend) is summary.seconds_per_config.
        "seconds_per_config": seconds_per_config(),
        "sweep_seconds_per_config": summary.seconds_per_config
        if summary.seconds_per_config is not None
        else (summary.elapsed_s / summary.configs if summary.configs else None),
        "execution": args.execution,
    }
    check.raise_if_stopping()
    if state["abort"]:
        raise CheckFailed(f"profile: {first_line(state['abort'], 500)}")
    succeeded = [r for r in results if r.status == "succeeded"]
    check.say(
        f"{len(succeeded)} of {len(results)} configurations measured in "
        f"{time.monotonic() - sweep_started:.0f} s ({seconds_per_config() or 0:.1f} s each)"
    )
    if not succeeded:
        first = results[0].error if results else summary.error
        raise CheckFailed(f"profile: no configuration was measured; {first_line(first, 500)}")
    alone: dict[tuple[str, int], list[float]] = {}
    for r in succeeded:
        if len(r.tasks) == 1 and r.tasks[0].active_thread_percentage == 100:
            m = r.measurements[0]
            if m.throughput_sps:
                alone.setdefault((m.architecture, m.batch_size), []).append(m.throughput_sps)
    profiled = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in alone.items()}
    return succeeded, profiled


def sweep_request(**fields):
    """A :class:`~workers.protocol.messages.ProfileSweepRequest` (profiling and measuring settings).

    Raises:
        CheckFailed: an option out of the range the request allows (one line naming it).
    """
    from pydantic import ValidationError

    from workers.protocol.messages import ProfileSweepRequest
    from workers.registry.names import check_names

    try:
        return check_names(ProfileSweepRequest(**fields))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise CheckFailed(
            f"bad option for {where}: {error['msg']} (got {error.get('input')!r})", EXIT_UNAVAILABLE
        ) from None


def to_samples(results) -> list:
    """Profile results as the predictor's ProfiledTask samples (as benchmarks/predictor.py)."""
    from controlplane.planning.predictor import MixTask, ProfiledTask

    samples = []
    for r in results:
        mix = tuple(MixTask(t.architecture, t.batch_size, t.active_thread_percentage) for t in r.tasks)
        for m in r.measurements:
            if m.throughput_sps:
                samples.append(
                    ProfiledTask(
                        f"c{r.config_index}", mix, m.task_index, m.throughput_sps, m.standalone_sps, m.peak_memory_bytes
                    )
                )
    return samples


def fit(check: Check, samples, workloads, units: int, placement: str):
    from controlplane.planning.predictor import PredictorError, fit_predictor

    try:
        families = [f.strip() for f in check.args.families.split(",") if f.strip()]
        predictor, report = fit_predictor(
            samples,
            workloads,
            cores=units,
            placement=placement,
            families=families,
            seed=check.args.seed,
            progress=check.say,
        )
    except PredictorError as exc:
        profiled = check.report["profile"] or {}
        raise CheckFailed(
            f"fit: {exc} (profiled {profiled.get('succeeded')} configurations at "
            f"{profiled.get('seconds_per_config') or 0:.1f} s each: raise --budget or --time-limit, "
            "or profile fewer batch sizes)"
        ) from None
    kept = next(f for f in report.families if f.family == report.kept)
    check.report["predictor"] = {
        "family": report.kept,
        "samples": report.samples,
        "configurations": report.configurations,
        "groups": report.groups,
        "folds": report.folds,
        "fit_seconds": round(report.fit_seconds, 2),
        "units": units,
        "placement": placement,
        "families": [{"family": f.family, "rmsle": f.rmsle, "mape": f.mape} for f in report.families],
    }
    check.say(
        f"kept {report.kept}: held-out RMSLE {kept.rmsle:.3f}, MAPE {100 * kept.mape:.1f} % on "
        f"{report.samples} task samples in {report.configurations} configurations"
    )
    return predictor


def data_volumes(args, count: int, mix_index: int) -> list[int]:
    """Samples of each task on the one device: equal, or Dirichlet proportions of the total."""
    if args.data == "equal":
        return [args.samples_per_task] * count
    import numpy as np

    rng = np.random.default_rng(args.seed + mix_index)
    shares = rng.dirichlet([args.alpha] * count)
    return [max(64, int(round(p * count * args.samples_per_task))) for p in shares]


def plan_mix(
    check: Check,
    name: str,
    architectures: Sequence[str],
    samples: Sequence[int],
    predictor,
    memory_bytes: float | None,
    strategies: Sequence[str] | None = None,
) -> dict:
    """Every strategy's plan (``strategies``, default every one a comparison runs) for one
    device holding the mix; returns the mix's report entry."""
    from controlplane.planning.planner import DeviceCapacity, PlannerContext
    from controlplane.planning.predictor import MixTask, PredictorError
    from controlplane.planning.strategies import (
        compared_strategies,
        get_strategy,
        make_plan,
    )
    from controlplane.planning.types import PlanningError, PlanningInput

    args = check.args
    task_ids = tuple(range(1, len(architectures) + 1))
    spec = PlanningInput(
        device_ids=(1,),
        task_ids=task_ids,
        samples={(1, t): n for t, n in zip(task_ids, samples, strict=True)},
        local_epochs=1,
    )
    context = PlannerContext(
        architectures=dict(zip(task_ids, architectures, strict=True)),
        devices={1: DeviceCapacity(predictor, memory_bytes)},
        objective=args.objective,
        seed=args.seed,
    )
    entry = {
        "name": name,
        "architectures": list(architectures),
        "data": {
            "policy": args.data,
            "samples": list(samples),
            "alpha": args.alpha if args.data == "dirichlet" else None,
        },
        "strategies": [],
    }
    for strategy in strategies or compared_strategies():
        row = {
            "strategy": strategy,
            "partitioning": None,
            "status": "skipped",
            "error": "",
            "predicted_round_time_s": None,
            "notes": [],
            "tasks": [],
            "raw_sps": None,
            "fair": None,
            "raw_speedup": None,
            "fair_speedup": None,
            "gpu_util_mean_percent": None,
            "gpu_util_busy_percent": None,
            "launch_bound": None,
            "gpu_memory_max_bytes": None,
            "measured_s": None,
            "measurement": None,
        }
        entry["strategies"].append(row)
        started = time.monotonic()
        try:
            plan = make_plan(strategy, spec, planner=context)
            # A planner that kept the device on a baseline's configuration (never predicted
            # worse than a baseline: its notes say so) trains that baseline, which this check
            # measures at --baseline-batch, as it does the baselines themselves.
            if not get_strategy(strategy).needs_predictor or plan.notes:
                plan = at_batch_size(plan, args.baseline_batch)
        except PlanningError as exc:
            row.update(status="failed", error=f"plan: {exc}")
            check.say(f"{name}/{strategy}: cannot plan: {exc}")
            continue
        row["partitioning"] = plan.partitioning_of(1)
        row["notes"] = list(plan.notes)
        row["predicted_round_time_s"] = plan.predicted_round_time_s
        assignments = plan.on_device(1)
        predicted = [a.predicted_throughput_sps for a in assignments]
        if row["partitioning"] == "mps" and any(p is None for p in predicted):
            mix = [MixTask(architectures[a.task_id - 1], a.batch_size, a.active_thread_percentage) for a in assignments]
            try:
                predicted = predictor.predict([mix])[0]
            except PredictorError:
                predicted = [None] * len(assignments)
        for a, p in zip(assignments, predicted, strict=True):
            row["tasks"].append(
                {
                    "architecture": architectures[a.task_id - 1],
                    "batch_size": a.batch_size,
                    "share": a.active_thread_percentage,
                    "samples": a.samples,
                    "predicted_sps": p,
                    "measured_sps": None,
                    "alone_sps": None,
                    "alone_source": None,
                    "timed_iterations": None,
                    "peak_memory_bytes": None,
                }
            )
        check.say(
            f"{name}/{strategy} ({row['partitioning']}, {time.monotonic() - started:.1f} s): "
            + ", ".join(
                f"{t['architecture']} B{t['batch_size']} R{t['share']}%"
                + (f" → {t['predicted_sps']:.0f} sps predicted" if t["predicted_sps"] else "")
                for t in row["tasks"]
            )
            + "".join(f"; {note}" for note in row["notes"])
        )
    return entry


def at_batch_size(plan, batch_size: int):
    """``plan`` with every assignment's batch size ``min(batch_size, samples)``: the strategies
    that plan without a predictor train at the paper's batch size (128) in the control plane;
    ``--baseline-batch`` sets it here, so a CPU run can use the small batches it profiled."""
    from dataclasses import replace

    return replace(plan, assignments=tuple(replace(a, batch_size=min(batch_size, a.samples)) for a in plan.assignments))


class Measurer:
    """Measures configurations one after another, each time-boxed by what is left."""

    def __init__(self, check: Check, backend, ctx) -> None:
        from workers.backends.base import TrainerProcessBackend

        self.check, self.backend, self.ctx = check, backend, ctx
        # On the GPU backends a configuration's processes come from the backend's warm pool, as
        # a sweep's do (model, CUDA context and MPS share kept from one configuration to the
        # next): seconds per configuration instead of 15-27 s of process start and context.
        self.launcher = (
            backend.profiler_pool() if isinstance(backend, TrainerProcessBackend) and backend.profiles_warm else None
        )
        self.index = 0
        self.durations: list[float] = []
        args = check.args
        self.request = sweep_request(
            sweep_id=2,
            device=ctx.device,
            backend=args.backend,
            budget_s=5,
            architectures=["resnet18"],
            warmup_iterations=args.measure_warmup,
            min_timed_iterations=args.measure_iterations,
            min_window_s=args.measure_window,
            config_timeout_s=args.config_timeout,
            repeat_every=0,
            seed=args.seed,
            execution={"mode": args.execution},
        )

    def expected_s(self, fallback: float) -> float:
        return max(self.durations) if self.durations else fallback

    def measure(self, tasks, partitioning: str, execution: str | None = None):
        """One configuration; returns ``(result, seconds, telemetry samples)``.

        Args:
            tasks: :class:`~workers.protocol.messages.ProfileTaskSpec` of the configuration.
            partitioning: ``"mps"`` or ``"timeslice"``.
            execution: ``ExecutionOptions.mode`` of its trainers (default ``--execution``).

        Raises:
            CheckFailed: less than 10 s left.
        """
        from workers.backends.base import AnalyticBackend

        left = self.check.remaining()
        if left < 10:
            raise CheckFailed("no time left to measure", EXIT_STOPPED)
        update: dict[str, Any] = {"config_timeout_s": max(1.0, min(self.check.args.config_timeout, left - 5))}
        if execution is not None:
            update["execution"] = self.request.execution.model_copy(update={"mode": execution})
        request = self.request.model_copy(update=update)
        telemetry = self._telemetry()
        started = time.monotonic()
        try:
            from workers.profiling.sweep import measure_configuration

            if isinstance(self.backend, AnalyticBackend):
                result = simulated_configuration(
                    self.backend, tasks, request, self.ctx, config_index=self.index, partitioning=partitioning
                )
            else:
                result = measure_configuration(
                    tasks,
                    request,
                    self.ctx,
                    self.backend,
                    config_index=self.index,
                    partitioning=partitioning,
                    should_stop=self.check.stopping,
                    launcher=self.launcher,
                )
        finally:
            samples = telemetry.stop() if telemetry is not None else []
        self.index += 1
        seconds = time.monotonic() - started
        self.durations.append(seconds)
        return result, seconds, samples

    def _telemetry(self):
        device = self.check.report["host"].get("device") or {}
        if not device.get("gpu_uuid"):
            return None
        from workers.backends import gpu

        telemetry = gpu.GpuTelemetry(device["gpu_uuid"], 0.5)
        telemetry.start()
        return telemetry


def simulated_configuration(
    backend: Any, tasks: Sequence[Any], request: Any, ctx: Any, *, config_index: int, partitioning: str
) -> Any:
    """One configuration answered by an analytic backend (``simulated``), as
    :func:`workers.profiling.sweep.measure_configuration` measures it on a real one.

    ``mps``: the backend's own :meth:`~workers.backends.base.AnalyticBackend.profile_configuration`
    (the execution mode of ``request.execution`` modelled). ``timeslice`` (``temporal``: shares
    ignored, the driver's time slices): the same model,
    :func:`workers.backends.simulated.simulate_throughput` with ``partitioning="timeslice"``, with
    the same seeded noise, since ``profile_configuration`` answers MPS shares only. Nothing
    runs and nothing is slept: the result's timestamps are the virtual cost.
    """
    if partitioning == "mps":
        return backend.profile_configuration(
            tasks, request, ctx, config_index=config_index, repeat_of=None, started_at=time.time()
        )
    from workers.backends.simulated import PROFILE_STARTUP_S, simulate_configuration, simulated_execution_mode
    from workers.protocol.messages import ProfileConfigResult, ProfileMeasurement

    mode = simulated_execution_mode(request.execution)
    prediction = simulate_configuration(
        request, tasks, backend.device, device_name=ctx.device, config_index=config_index, partitioning=partitioning
    )
    slowest = float(prediction.iteration_s.max())
    window = max(request.min_window_s, (request.min_timed_iterations + 1) * slowest)
    started = time.time()
    oom = bool(prediction.oom.any())
    measurements = [
        ProfileMeasurement(
            task_index=k,
            architecture=t.architecture,
            batch_size=t.batch_size,
            active_thread_percentage=t.active_thread_percentage,
            execution_mode=mode,
            throughput_sps=None if oom else float(prediction.throughput_sps[k]),
            peak_memory_bytes=int(prediction.peak_memory_bytes[k]),
            timed_iterations=max(request.min_timed_iterations, int(window // prediction.iteration_s[k])),
            host_step_s=float(prediction.host_step_s[k]),
            gpu_busy_fraction=float(prediction.gpu_busy_fraction),
            error="out of memory (simulated)" if oom else "",
            simulated=True,
        )
        for k, t in enumerate(tasks)
    ]
    return ProfileConfigResult(
        sweep_id=request.sweep_id,
        device=ctx.device,
        backend=request.backend,
        config_index=config_index,
        tasks=list(tasks),
        measurements=measurements,
        started_at=started,
        finished_at=started + PROFILE_STARTUP_S + (request.warmup_iterations + 1) * slowest + window,
        status="failed" if oom else "succeeded",
        error="out of memory (simulated)" if oom else "",
        simulated=True,
    )


def measure_mixes(check: Check, measurer: Measurer, mixes: list[dict]) -> None:
    """Measure every planned strategy of every mix (a failure is recorded, the rest go on)."""
    from workers.protocol.messages import ProfileTaskSpec

    for entry in mixes:
        for row in entry["strategies"]:
            if row["partitioning"] is None:
                continue
            label = f"{entry['name']}/{row['strategy']}"
            if check.stopping():
                row.update(status="skipped", error="not measured: the check was stopping")
                continue
            tasks = [
                ProfileTaskSpec(
                    architecture=t["architecture"], batch_size=t["batch_size"], active_thread_percentage=t["share"]
                )
                for t in row["tasks"]
            ]
            try:
                result, seconds, telemetry = measurer.measure(tasks, row["partitioning"])
            except CheckFailed as exc:
                row.update(status="skipped", error=f"not measured: {exc}")
                check.say(f"{label}: skipped, {exc}")
                continue
            row["measurement"] = result.model_dump(mode="json")
            row["measured_s"] = round(seconds, 2)
            if telemetry:
                utils = [s.gpu_util_percent for s in telemetry]
                row["gpu_util_mean_percent"] = sum(utils) / len(utils)
                row["gpu_util_busy_percent"] = busy_utilisation(utils)
                row["gpu_memory_max_bytes"] = max(s.memory_used_bytes for s in telemetry)
            for task, m in zip(row["tasks"], result.measurements, strict=True):
                task.update(
                    measured_sps=m.throughput_sps,
                    timed_iterations=m.timed_iterations,
                    peak_memory_bytes=m.peak_memory_bytes,
                )
            if result.status != "succeeded" and (check.stopping() or check.remaining() < 10):
                # Cut short by the time limit (its timeout is what was left): not a failure of
                # the strategy, and not measured.
                row.update(
                    status="skipped",
                    error=f"not measured: the time limit was reached ({first_line(result.error, 200)})",
                )
                check.say(f"{label}: cut short by the time limit after {seconds:.0f} s")
                continue
            if result.status != "succeeded":
                row.update(status="failed", error=result.error)
                check.say(f"{label} FAILED after {seconds:.0f} s: {first_line(result.error)}")
                check.detail(result.error)
                continue
            row["status"] = "succeeded"
            row["launch_bound"] = launch_bound(row["gpu_util_busy_percent"])
            util = (
                f", GPU busy {row['gpu_util_mean_percent']:.0f} %" if row["gpu_util_mean_percent"] is not None else ""
            ) + (", launch-bound" if row["launch_bound"] else "")
            check.say(
                f"{label} ({row['partitioning']}, {seconds:.0f} s{util}): "
                + ", ".join(f"{t['architecture']} {t['measured_sps']:.1f}" for t in row["tasks"])
                + " samples/s"
            )


def busy_utilisation(utils: Sequence[int]) -> float | None:
    """Mean GPU utilisation (percent) while a configuration's trainers were busy: over the
    samples from the first to the last one showing GPU work, so the seconds of starting the
    processes and loading models (before) and of reaping them (after) do not dilute it.

    Returns:
        ``None`` without samples; ``0.0`` when no sample saw GPU work at all.
    """
    busy = [k for k, util in enumerate(utils) if util > 0]
    if not busy:
        return 0.0 if utils else None
    window = utils[busy[0] : busy[-1] + 1]
    return sum(window) / len(window)


def launch_bound(busy_percent: float | None) -> bool | None:
    """Whether a configuration was bound by kernel launches rather than the GPU: busy less than
    :data:`LAUNCH_BOUND_UTIL_PERCENT` of the time while it trained (``None``: no telemetry)."""
    return None if busy_percent is None else busy_percent < LAUNCH_BOUND_UTIL_PERCENT


def fill_alone(check: Check, measurer: Measurer, mixes: list[dict], profiled: dict, predictor, workloads) -> None:
    """``P_alone`` of every measured task: profiled, else measured now, else interpolated."""
    import numpy as np

    from workers.protocol.messages import ProfileTaskSpec

    table: dict[tuple[str, int], tuple[float, str]] = {k: (v, "profiled") for k, v in profiled.items()}
    needed = sorted(
        {
            (t["architecture"], t["batch_size"])
            for e in mixes
            for r in e["strategies"]
            if r["status"] == "succeeded"
            for t in r["tasks"]
        }
    )
    for arch, batch in needed:
        if (arch, batch) in table:
            continue
        if check.stopping() or check.remaining() < measurer.expected_s(30.0) + 10:
            check.say(f"{arch} B{batch}: no time left to measure it alone; interpolating")
        else:
            task = ProfileTaskSpec(architecture=arch, batch_size=batch, active_thread_percentage=100)
            try:
                result, seconds, _ = measurer.measure([task], "timeslice")
            except CheckFailed:
                result = None
            if result is not None and result.status == "succeeded" and result.measurements[0].throughput_sps:
                sps = result.measurements[0].throughput_sps
                table[(arch, batch)] = (sps, "measured")
                check.say(f"{arch} B{batch} alone: {sps:.1f} samples/s ({seconds:.0f} s)")
                continue
            if result is not None:
                check.say(f"{arch} B{batch} alone FAILED: {first_line(result.error)}; interpolating")
        value = float(predictor.space.solo.alone(arch, np.array([batch]), workloads)[0])
        table[(arch, batch)] = (value, "interpolated")
    check.report["alone"] = [
        {"architecture": a, "batch_size": b, "throughput_sps": v, "source": s}
        for (a, b), (v, s) in sorted(table.items())
    ]
    for entry in mixes:
        for row in entry["strategies"]:
            for task in row["tasks"]:
                key = (task["architecture"], task["batch_size"])
                if key in table:
                    task["alone_sps"], task["alone_source"] = table[key]


def score(mixes: list[dict]) -> None:
    """Raw and fair throughput of every measured strategy, scored by the control plane's
    metrics as a one-device round (:func:`controlplane.planning.metrics.round_metrics`: a
    failed measurement counts for nothing, fair throughput needs every task's ``P_alone``), and
    speedups over the baseline strategy's (:func:`~controlplane.planning.strategies.baseline_strategy`)."""
    from controlplane.planning.metrics import (
        DeviceTotals,
        TaskMeasurement,
        round_metrics,
        speedup,
    )
    from controlplane.planning.strategies import baseline_strategy

    baseline = baseline_strategy().name
    for entry in mixes:
        for row in entry["strategies"]:
            if row["status"] != "succeeded":
                continue
            totals = DeviceTotals.from_tasks(
                TaskMeasurement(
                    succeeded=True,
                    throughput_sps=t["measured_sps"],
                    standalone_sps=t["alone_sps"] if is_finite(t["alone_sps"]) else None,
                )
                for t in row["tasks"]
            )
            device = round_metrics({"device": totals}).devices["device"]
            row["raw_sps"], row["fair"] = device.raw_throughput_sps, device.fair_throughput
        reference = next((r for r in entry["strategies"] if r["strategy"] == baseline), None)
        for row in entry["strategies"]:
            row["raw_speedup"] = speedup(row["raw_sps"], reference and reference["raw_sps"])
            row["fair_speedup"] = speedup(row["fair"], reference and reference["fair"])


def is_finite(value) -> bool:
    """Whether ``value`` is a finite number (not ``None``, NaN or infinite)."""
    return value is not None and math.isfinite(value)


def fmt(value, spec: str, suffix: str = "") -> str:
    return "—" if value is None else format(value, spec) + suffix


def print_table(check: Check, mixes: list[dict]) -> None:
    """The speedup table, then measured throughput per task."""
    device = check.report["host"].get("device") or {}
    cores = len(check.report["host"]["cores"] or [])
    where = device.get("accelerator") or f"{cores} CPU core{'s' if cores != 1 else ''}"
    from controlplane.planning.strategies import baseline_strategy

    baseline = baseline_strategy().name
    print(
        f"\nspeedups over {baseline} (backend {check.args.backend}, {where}; data {check.args.data}; "
        "~ = some P_alone interpolated)",
        flush=True,
    )
    print(
        f"{'mix':<7}{'strategy':<13}{'partition':<11}{'raw sps':>10}{'fair':>7}{'raw ×':>8}"
        f"{'fair ×':>8}{'GPU %':>7}  status"
    )
    for entry in mixes:
        for row in entry["strategies"]:
            interpolated = any(t["alone_source"] == "interpolated" for t in row["tasks"])
            mark = "~" if interpolated and row["fair"] is not None else ""
            status = (
                row["status"] if row["status"] == "succeeded" else f"{row['status']}: {first_line(row['error'], 60)}"
            )
            if row.get("launch_bound"):
                status += f" launch-bound (GPU busy {row['gpu_util_busy_percent']:.0f} % while training)"
            print(
                f"{entry['name']:<7}{row['strategy']:<13}{row['partitioning'] or '—':<11}"
                f"{fmt(row['raw_sps'], '.1f'):>10}{fmt(row['fair'], '.2f') + mark:>7}"
                f"{fmt(row['raw_speedup'], '.2f', '×'):>8}{fmt(row['fair_speedup'], '.2f', '×') + mark:>8}"
                f"{fmt(row['gpu_util_mean_percent'], '.0f'):>7}  {status}"
            )
    print("\nmeasured throughput per task (B = batch size, R = share %, alone = P_alone at B, pred = predictor)")
    for entry in mixes:
        for row in entry["strategies"]:
            for task in row["tasks"]:
                src = {"profiled": "", "measured": "", "interpolated": "~"}.get(task["alone_source"], "")
                print(
                    f"  {entry['name']:<7}{row['strategy']:<13}{task['architecture']:<20}"
                    f"B{task['batch_size']:<5}R{task['share']:<5}"
                    f"{fmt(task['measured_sps'], '.1f'):>9} sps  alone {fmt(task['alone_sps'], '.1f')}{src}"
                    f"  pred {fmt(task['predicted_sps'], '.1f')}"
                )
    print(
        f"\npaper (Titan V, CIFAR-10): raw speedup {PAPER_RAW_SPEEDUP[0]:.2f}–{PAPER_RAW_SPEEDUP[1]:.2f}× "
        f"over {baseline} inside one device",
        flush=True,
    )


# ----------------------------------------------------------------------------- --issue31


def alone_modes(check: Check, measurer: Measurer, architectures: Sequence[str]) -> list[dict[str, Any]]:
    """Each task alone on the whole device (``timeslice``: no MPS share) at :data:`ISSUE31_BATCH`,
    eager then graphs, one after the other; returns (and reports as ``alone_modes``) one row per
    task: ``{"architecture", "batch_size", "eager_sps", "graphs_sps", "graphs_over_eager",
    "eager_ran", "graphs_ran", "eager_host_step_s", "graphs_host_step_s", "error"}`` (``*_ran``:
    the mode the trainer reports it ran, ``eager`` where graphs fell back)."""
    from workers.protocol.messages import ProfileTaskSpec

    rows: list[dict[str, Any]] = []
    check.report["alone_modes"] = rows
    for arch in architectures:
        row: dict[str, Any] = {
            "architecture": arch,
            "batch_size": ISSUE31_BATCH,
            "graphs_over_eager": None,
            "error": "",
        }
        rows.append(row)
        for mode in ("eager", "graphs"):
            row.update({f"{mode}_sps": None, f"{mode}_ran": None, f"{mode}_host_step_s": None})
            task = ProfileTaskSpec(architecture=arch, batch_size=ISSUE31_BATCH, active_thread_percentage=100)
            try:
                result, seconds, _ = measurer.measure([task], "timeslice", execution=mode)
            except CheckFailed as exc:
                row["error"] = f"{mode}: not measured: {exc}"
                break
            m = result.measurements[0]
            if result.status != "succeeded" or not m.throughput_sps:
                row["error"] += f"{mode}: {first_line(result.error, 300)} "
                check.say(f"{arch} B{ISSUE31_BATCH} {mode} FAILED: {first_line(result.error)}")
                continue
            row.update(
                {f"{mode}_sps": m.throughput_sps, f"{mode}_ran": m.execution_mode, f"{mode}_host_step_s": m.host_step_s}
            )
            check.say(
                f"{arch} B{ISSUE31_BATCH} {mode} (ran {m.execution_mode}): {m.throughput_sps:.1f} samples/s ({seconds:.1f} s)"
            )
        if row["eager_sps"] and row["graphs_sps"]:
            row["graphs_over_eager"] = row["graphs_sps"] / row["eager_sps"]
        row["error"] = row["error"].strip()
    return rows


def alone_table(
    check: Check,
    architectures_batches: set[tuple[str, int]],
    profiled: dict[tuple[str, int], float],
    modes: list[dict[str, Any]],
    predictor: Any,
    workloads: Any,
) -> dict[tuple[str, int], tuple[float, str]]:
    """``P_alone`` at ``--execution`` of every (model, batch size) the comparison trains: measured
    by the alone phase, else profiled alone, else interpolated by the predictor (``~``)."""
    import numpy as np

    table: dict[tuple[str, int], tuple[float, str]] = {k: (v, "profiled") for k, v in profiled.items()}
    mode = "eager" if check.args.execution == "eager" else "graphs"
    for row in modes:
        if row.get(f"{mode}_sps"):
            table[(row["architecture"], row["batch_size"])] = (row[f"{mode}_sps"], "measured")
    for arch, batch in sorted(architectures_batches - set(table)):
        table[(arch, batch)] = (
            float(predictor.space.solo.alone(arch, np.array([batch]), workloads)[0]),
            "interpolated",
        )
    return table


def compare(
    check: Check, measurer: Measurer, entry: dict[str, Any], table: dict[tuple[str, int], tuple[float, str]]
) -> dict[str, Any]:
    """The mix's planned strategies measured in ``--blocks`` interleaved blocks: each block
    measures every strategy once, its order rotated by one from the block before, so no
    strategy always runs first or last and a drift of the device (clocks, heat) falls on all
    of them alike. Each figure is a mean over blocks with its 95 % Student-t interval
    (:func:`controlplane.planning.metrics.estimate`); ``vres_sync`` over the best baseline (the
    baseline of the highest mean raw throughput) is paired over blocks on the log scale,
    ``exp(mean ± t·sd/√n)`` of the per-block ``log(vres_sync / baseline)``, so it is a ratio
    whose interval cannot cross zero. Returns (and reports as ``compare``) ``{"blocks",
    "execution", "strategies": [...], "vres_sync_over_best_baseline": {...}}``."""
    from controlplane.planning.metrics import estimate
    from workers.protocol.messages import ProfileTaskSpec

    rows = [r for r in entry["strategies"] if r["partitioning"] is not None]
    out: dict[str, Any] = {"mix": entry["name"], "blocks": [], "execution": check.args.execution, "strategies": []}
    check.report["compare"] = out
    for b in range(check.args.blocks):
        k = b % len(rows)
        order = rows[k:] + rows[:k]
        block: dict[str, Any] = {"block": b, "order": [r["strategy"] for r in order], "measurements": {}}
        out["blocks"].append(block)
        for row in order:
            tasks = [
                ProfileTaskSpec(
                    architecture=t["architecture"], batch_size=t["batch_size"], active_thread_percentage=t["share"]
                )
                for t in row["tasks"]
            ]
            record: dict[str, Any] = {
                "status": "skipped",
                "raw_sps": None,
                "fair": None,
                "tasks_sps": [],
                "ran": [],
                "error": "",
            }
            block["measurements"][row["strategy"]] = record
            try:
                result, seconds, telemetry = measurer.measure(tasks, row["partitioning"])
            except CheckFailed as exc:
                record["error"] = f"not measured: {exc}"
                continue
            record.update(
                status=result.status,
                error=result.error,
                seconds=round(seconds, 2),
                tasks_sps=[m.throughput_sps for m in result.measurements],
                ran=[m.execution_mode for m in result.measurements],
                gpu_busy_fraction=[m.gpu_busy_fraction for m in result.measurements],
                gpu_util_busy_percent=busy_utilisation([t.gpu_util_percent for t in telemetry]) if telemetry else None,
            )
            if result.status == "succeeded" and all(record["tasks_sps"]):
                record["raw_sps"] = sum(record["tasks_sps"])
                alone = [table.get((t.architecture, t.batch_size), (None, ""))[0] for t in tasks]
                if all(alone):
                    record["fair"] = sum(p / a for p, a in zip(record["tasks_sps"], alone, strict=True))
                check.say(
                    f"block {b} {row['strategy']} ({row['partitioning']}): {record['raw_sps']:.1f} samples/s "
                    f"({', '.join(f'{t.architecture} {p:.0f}' for t, p in zip(tasks, record['tasks_sps'], strict=True))})"
                )
            else:
                record["status"] = "failed"
                check.say(f"block {b} {row['strategy']} FAILED: {first_line(result.error)}")
    for row in rows:
        name = row["strategy"]
        records = [blk["measurements"].get(name, {}) for blk in out["blocks"]]
        raw = estimate(r.get("raw_sps") for r in records)
        fair = estimate(r.get("fair") for r in records)
        out["strategies"].append(
            {
                "strategy": name,
                "partitioning": row["partitioning"],
                "tasks": [
                    {
                        "architecture": t["architecture"],
                        "batch_size": t["batch_size"],
                        "share": t["share"],
                        "predicted_sps": t["predicted_sps"],
                        "measured_sps": estimate(
                            (r["tasks_sps"][i] if r.get("raw_sps") else None) for r in records
                        ).as_dict(),
                        "alone_sps": table.get((t["architecture"], t["batch_size"]), (None, ""))[0],
                        "alone_source": table.get((t["architecture"], t["batch_size"]), (None, None))[1],
                    }
                    for i, t in enumerate(row["tasks"])
                ],
                "raw_sps": raw.as_dict(),
                "fair": fair.as_dict(),
                "blocks_succeeded": raw.n,
                "raw_over_temporal": None,
            }
        )
    by_name = {r["strategy"]: r for r in out["strategies"]}
    temporal = by_name.get("temporal", {}).get("raw_sps", {}).get("mean")
    for r in out["strategies"]:
        if temporal and r["raw_sps"]["mean"]:
            r["raw_over_temporal"] = r["raw_sps"]["mean"] / temporal
    out["vres_sync_over_best_baseline"] = paired_ratio(out, "vres_sync", ("temporal", "isolation", "sharing"))
    return out


def paired_ratio(compare_out: dict[str, Any], candidate: str, baselines: Sequence[str]) -> dict[str, Any] | None:
    """``candidate`` over the baseline of the highest mean raw throughput, paired over blocks:
    ``{"baseline", "ratio", "low", "high", "n"}`` with ``ratio = exp(mean log r_b)`` and the
    interval ``exp(mean ± t_{0.975, n-1} · sd / √n)`` of the per-block log ratios ``r_b``
    (both measured in block ``b``); ``None`` without the candidate or any baseline."""
    from controlplane.planning.metrics import estimate

    means = {
        r["strategy"]: r["raw_sps"]["mean"]
        for r in compare_out["strategies"]
        if r["strategy"] in baselines and r["raw_sps"]["mean"]
    }
    if not means or candidate not in {r["strategy"] for r in compare_out["strategies"]}:
        return None
    best = max(means, key=lambda name: means[name])
    logs = []
    for block in compare_out["blocks"]:
        a = block["measurements"].get(candidate, {}).get("raw_sps")
        b = block["measurements"].get(best, {}).get("raw_sps")
        if a and b:
            logs.append(math.log(a / b))
    e = estimate(logs)
    return {
        "baseline": best,
        "ratio": math.exp(e.mean) if e.mean is not None else None,
        "low": math.exp(e.low) if e.low is not None else None,
        "high": math.exp(e.high) if e.high is not None else None,
        "n": e.n,
    }


def e2e_phase(check: Check, profile_file: Path | None) -> dict[str, Any]:
    """The end-to-end phase (``benchmarks/gpu_e2e.py``) in a child process of its own session:
    the control plane on its embedded defaults (their variables unset for it) with one local
    agent of ``--backend``, 2 FL rounds of the light mix, ``sharing`` then ``vres_sync``, its
    predictor fitted on ``profile_file`` (this check's sweep). Time-boxed by
    ``--e2e-time-limit``: past it, SIGTERM (the child stops its stack and the agent its MPS
    daemon), 20 s later SIGKILL to its whole process group. Its lines are printed as they come;
    its JSON becomes ``report["e2e"]``.

    Raises:
        CheckFailed: the child could not start, or did not write its JSON.
    """
    args = check.args
    assert check.state_dir is not None  # made by preflight
    out = check.state_dir / "e2e.json"
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_e2e.py"),
        "--backend",
        args.backend,
        "--json",
        str(out),
        "--home",
        str(check.state_dir / "e2e-home"),
        "--time-limit",
        f"{args.e2e_time_limit:g}",
        # The control plane's fit of the same samples: the two families that fit in seconds
        # (random forest is the one kept on every sweep so far); the check's own fit compares more.
        "--families",
        E2E_FAMILIES,
    ]
    if profile_file is not None:
        argv += ["--profile-results", str(profile_file)]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL", "MTFL_HOME", "ARTIFACT_ROOT"}
    }
    env["PYTHONUNBUFFERED"] = "1"
    check.say(f"the control plane on its embedded defaults, one {args.backend} agent, {args.e2e_time_limit:g} s")
    try:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    except OSError as exc:
        raise CheckFailed(f"e2e: cannot start {argv[1]}: {exc}") from None
    check.e2e_proc = proc

    def overrun() -> None:
        check.say(f"past its {args.e2e_time_limit:g} s: stopping it")
        with suppress(ProcessLookupError):
            proc.terminate()
        time.sleep(20)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(args.e2e_time_limit + 15, overrun)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"      | {line.rstrip()}", flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
        check.e2e_proc = None
    if not out.exists():
        raise CheckFailed(f"e2e: {argv[1]} exited with {code} without writing its JSON")
    if code != 0:
        keep_stack_logs(check.state_dir / "e2e-home" / "logs")
    report: dict[str, Any] = json.loads(out.read_text())
    report["exit_code"] = code
    check.report["e2e"] = report
    return report


E2E_FAMILIES = "baseline,random_forest"
"""Predictor families the e2e phase's control plane compares."""
E2E_LOG_TAIL_BYTES = 2 * 2**20
"""Bytes kept of each log of a failed e2e phase's stack (a device run returns 16 MiB per file)."""


def keep_stack_logs(folder: Path) -> None:
    """Copy the last :data:`E2E_LOG_TAIL_BYTES` of the control worker's and the agent's logs to
    ``$OUT`` as ``e2e-<name>.log`` (the check's temporary folder goes at its end, and a device
    run returns only what is under ``$OUT``); nothing without ``OUT``."""
    if not os.environ.get("OUT"):
        return
    for name in ("control-worker", "agent-gpu-0"):
        path = folder / f"{name}.log"
        if path.exists():
            data = path.read_bytes()[-E2E_LOG_TAIL_BYTES:]
            target = Path(os.environ["OUT"]) / f"e2e-{name}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            print(f"      | kept the last {len(data)} bytes of {path} as {target}", flush=True)


def e2e_rounds_succeeded(e2e: dict[str, Any] | None) -> int | None:
    """Fewest rounds with test accuracy recorded for every task over the e2e phase's runs
    (``None`` without an e2e report; 0 when a run did not succeed)."""
    if not e2e or not e2e.get("runs"):
        return None if not e2e else 0
    counts = []
    for run in e2e["runs"]:
        if run["status"] != "succeeded":
            counts.append(0)
            continue
        counts.append(
            sum(
                r["status"] == "succeeded"
                and bool(r["checkpoints"])
                and all(c["test_accuracy"] is not None for c in r["checkpoints"])
                for r in run["rounds"]
            )
        )
    return min(counts)


def targets(check: Check) -> list[dict[str, Any]]:
    """Issue 31's targets (:data:`TARGETS`) beside the figures: one row per target,
    ``{"name", "value", "low", "high", "target", "met"}`` (``met`` ``None`` when not measured).
    On ``simulated`` they are the model's answers, not the GPU's (``report["targets_simulated"]``)."""
    rows: list[dict[str, Any]] = []

    def add(
        name: str,
        value: float | None,
        target: str,
        met: bool | None,
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        rows.append({"name": name, "value": value, "low": low, "high": high, "target": target, "met": met})

    for row in check.report.get("alone_modes") or []:
        ratio = row["graphs_over_eager"]
        goal = TARGETS["graphs_over_eager_alone"]
        add(
            f"graphs / eager alone, {row['architecture']} B{row['batch_size']}",
            ratio,
            f">= {goal:g}x",
            None if ratio is None else ratio >= goal,
        )
    out = check.report.get("compare") or {}
    strategies = out.get("strategies") or []
    best = max(strategies, key=lambda r: r["raw_sps"]["mean"] or 0, default=None)
    if best is not None and best["raw_sps"]["mean"]:
        goal = TARGETS["best_over_eager_temporal_h200"]
        ratio = best["raw_sps"]["mean"] / EAGER_TEMPORAL_H200_SPS
        add(
            f"best with {out.get('execution')} ({best['strategy']}) / eager temporal on the H200 ({EAGER_TEMPORAL_H200_SPS:,.0f} samples/s)",
            ratio,
            f">= {goal:g}x",
            ratio >= goal,
            *(v / EAGER_TEMPORAL_H200_SPS if v else None for v in (best["raw_sps"]["low"], best["raw_sps"]["high"])),
        )
    else:
        add(
            "best strategy / eager temporal on the H200",
            None,
            f">= {TARGETS['best_over_eager_temporal_h200']:g}x",
            None,
        )
    paired = out.get("vres_sync_over_best_baseline")
    goal = TARGETS["vres_sync_over_best_baseline"]
    if paired and paired["ratio"] is not None:
        met = paired["ratio"] >= goal and paired["low"] is not None and paired["low"] > 1.0
        add(
            f"vres_sync / best baseline ({paired['baseline']})",
            paired["ratio"],
            f">= {goal:g}x, interval above 1",
            met,
            paired["low"],
            paired["high"],
        )
    else:
        add("vres_sync / best baseline", None, f">= {goal:g}x, interval above 1", None)
    profiled = check.report.get("profile") or {}
    per_config = profiled.get("sweep_seconds_per_config")
    goal = TARGETS["profile_seconds_per_config"]
    add(
        "profiling seconds per configuration",
        per_config,
        f"<= {goal:g} s",
        None if per_config is None else per_config <= goal,
    )
    configs = profiled.get("succeeded")
    add(
        "profiled configurations",
        configs,
        f">= {check.args.min_configs}",
        None if configs is None else configs >= check.args.min_configs,
    )
    rounds = e2e_rounds_succeeded(check.report.get("e2e"))
    goal = TARGETS["e2e_rounds"]
    add(
        "FL rounds through the control plane (each run)",
        rounds,
        f">= {goal}",
        None if rounds is None else rounds >= goal,
    )
    check.report["targets"] = rows
    check.report["targets_simulated"] = check.args.backend == "simulated"
    return rows


def print_issue31(check: Check) -> None:
    """The tables of --issue31, in Markdown (ready for docs/benchmarks.md)."""
    report = check.report
    device = report["host"].get("device") or {}
    where = device.get("accelerator") or check.args.backend
    simulated = " — SIMULATED (the analytic model, not a measurement)" if check.args.backend == "simulated" else ""
    print(f"\n### issue 31 check: {where}, backend {check.args.backend}{simulated}\n", flush=True)
    print("| task (alone, B128, 32×32) | eager samples/s | graphs samples/s | graphs / eager | ran as |")
    print("|---|---|---|---|---|")
    for row in report.get("alone_modes") or []:
        print(
            f"| {row['architecture']} | {fmt(row.get('eager_sps'), ',.0f')} | {fmt(row.get('graphs_sps'), ',.0f')} "
            f"| {fmt(row['graphs_over_eager'], '.2f', '×')} | {row.get('eager_ran') or '—'} / {row.get('graphs_ran') or '—'} |"
        )
    out = report.get("compare") or {}
    blocks = len(out.get("blocks") or [])
    print(
        f"\n| strategy ({out.get('execution')}, {blocks} blocks) | partition | raw samples/s (95 % interval) | × temporal | fair | batch / share per task |"
    )
    print("|---|---|---|---|---|---|")
    for r in out.get("strategies") or []:
        raw = r["raw_sps"]
        interval = f" ({fmt(raw['low'], ',.0f')}–{fmt(raw['high'], ',.0f')})" if raw["low"] is not None else ""
        shares = ", ".join(f"B{t['batch_size']}/{t['share']}%" for t in r["tasks"])
        print(
            f"| {r['strategy']} | {r['partitioning']} | {fmt(raw['mean'], ',.0f')}{interval} "
            f"| {fmt(r['raw_over_temporal'], '.2f', '×')} | {fmt(r['fair']['mean'], '.2f')} "
            f"| {shares} |"
        )
    e2e = report.get("e2e") or {}
    if e2e.get("runs"):
        print(
            "\n| run (control plane, 1 agent) | status | rounds | FL samples/s | round s | test accuracy, last round | execution |"
        )
        print("|---|---|---|---|---|---|---|")
        for run in e2e["runs"]:
            last = run["rounds"][-1] if run["rounds"] else {"checkpoints": [], "assignments": []}
            accuracy = ", ".join(f"{c['architecture']} {fmt(c['test_accuracy'], '.3f')}" for c in last["checkpoints"])
            modes = sorted({a["execution_mode"] or "—" for r in run["rounds"] for a in r["assignments"]})
            times = ", ".join(fmt(r["round_time_s"], ".2f") for r in run["rounds"])
            print(
                f"| {run['strategy']} | {run['status']} | {len(run['rounds'])} | {fmt(run['fl_throughput_sps'], ',.0f')} "
                f"| {times} | {accuracy or '—'} | {', '.join(modes)} |"
            )
    elif e2e:
        print(f"\nend to end: {e2e.get('status')}: {e2e.get('error')}")
    print("\n| target | value | 95 % interval | goal | met |")
    print("|---|---|---|---|---|")
    for t in report.get("targets") or []:
        value = t["value"]
        shown = fmt(value, ".2f") if isinstance(value, float) else ("—" if value is None else str(value))
        interval = f"{fmt(t['low'], '.2f')}–{fmt(t['high'], '.2f')}" if t["low"] is not None else ""
        met = {True: "yes", False: "NO", None: "—"}[t["met"]]
        print(f"| {t['name']} | {shown} | {interval} | {t['target']} | {met} |")
    print(flush=True)


def run_issue31(check: Check) -> str:
    """--issue31's phases (module docstring); returns the closing line's text.

    Raises:
        CheckFailed: the first phase that failed, or, at the end, the first part that did not
            produce its figures (the targets themselves are benchmarks: missing one is not a
            failure).
    """
    args = check.args
    if args.mixes != "light":
        raise CheckFailed(f"--issue31 checks the light mix only, got --mixes {args.mixes}", EXIT_UNAVAILABLE)
    architectures = list(MIXES["light"])
    total_limit = args.time_limit
    e2e_reserve = 0.0 if args.no_e2e else args.e2e_time_limit + 20
    if e2e_reserve >= total_limit:
        raise CheckFailed(
            f"--e2e-time-limit {args.e2e_time_limit:g} leaves nothing of --time-limit {total_limit:g}", EXIT_UNAVAILABLE
        )
    # The workers-only phases end in time to leave the e2e phase its own.
    check.deadline = check.t0 + total_limit - e2e_reserve
    check.say(
        f"issue 31 on backend {args.backend}: light mix, execution {args.execution}, profile budget "
        f"{args.budget:g} s and >= {args.min_configs} configurations, {args.blocks} blocks, e2e "
        f"{'skipped' if args.no_e2e else f'{args.e2e_time_limit:g} s'}, time limit {total_limit:g} s"
    )
    with check.stage("preflight"):
        backend, ctx, units, memory, placement = preflight(check)
    sweep = profile_request(check, ctx, architectures, 3)
    measurer = Measurer(check, backend, ctx)
    with check.stage("features"):
        workloads = features(check, architectures)
    with check.stage("profile"):
        configs = len(ISSUE31_STRATEGIES) * args.blocks + 2 * len(architectures)
        results, profiled = profile(
            check, backend, ctx, sweep, reserve=lambda pace: FIT_AND_PLAN_RESERVE_S + 1.3 * configs * pace
        )
    with check.stage("fit"):
        predictor = fit(check, to_samples(results), workloads, units, placement)
    with check.stage("plan"):
        samples = data_volumes(args, len(architectures), 0)
        entry = plan_mix(check, "light", architectures, samples, predictor, memory, ISSUE31_STRATEGIES)
        check.report["mixes"] = [entry]
    with check.stage("alone", strict=False):
        modes = alone_modes(check, measurer, architectures)
    with check.stage("compare", strict=False):
        needed = {(t["architecture"], t["batch_size"]) for r in entry["strategies"] for t in r["tasks"]}
        table = alone_table(check, needed, profiled, modes, predictor, workloads)
        compare(check, measurer, entry, table)
    check.report["host"]["django_imported"] = "django" in sys.modules
    check.report["host"]["celery_imported"] = "celery" in sys.modules
    # The e2e agent starts its own MPS control daemon: one per user and GPU, so this one goes first.
    check.close_backend()
    check.backend = None
    check.deadline = check.t0 + total_limit
    if not args.no_e2e:
        with check.stage("e2e", strict=False):
            profile_file = check.state_dir / "profile.json" if check.state_dir else None
            if profile_file is not None:
                profile_file.write_text(
                    json.dumps({k: check.report["profile"][k] for k in ("request", "summary", "configs")})
                )
            try:
                e2e_phase(check, profile_file)
            except CheckFailed as exc:  # reported with the targets below, not instead of them
                check.report["e2e"] = {"status": "failed", "error": str(exc), "runs": []}
                check.say(str(exc))
    with check.stage("report", strict=False):
        targets(check)
        print_issue31(check)

    problems = [
        f"plan {r['strategy']}: {first_line(r['error'], 200)}" for r in entry["strategies"] if r["partitioning"] is None
    ]
    for row in check.report["alone_modes"] or []:
        if row["graphs_over_eager"] is None:
            problems.append(f"alone {row['architecture']}: {row['error'] or 'not measured'}")
    for r in (check.report["compare"] or {}).get("strategies", []):
        if r["blocks_succeeded"] < args.blocks:
            problems.append(f"compare {r['strategy']}: {r['blocks_succeeded']} of {args.blocks} blocks measured")
    e2e = check.report["e2e"]
    if not args.no_e2e and (not e2e or e2e.get("status") != "succeeded"):
        problems.append(f"e2e: {(e2e or {}).get('error') or 'no report'}")
    if problems:
        raise CheckFailed("; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
    met = [t for t in check.report["targets"] if t["met"]]
    return (
        f"OK in {check.elapsed():.0f} s{' (simulated)' if args.backend == 'simulated' else ''}: "
        f"{len(met)} of {len(check.report['targets'])} targets met"
    )


# ------------------------------------------------------------------------------------- main


def parse_ints(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise CheckFailed(f"{option} must be comma-separated integers, got {text!r}", EXIT_UNAVAILABLE) from None
    if not values:
        raise CheckFailed(f"{option} must list at least one integer", EXIT_UNAVAILABLE)
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__.splitlines()[0],
        epilog="Defaults in brackets are for a GPU run, then for --quick.",
    )

    def default(key: str) -> str:
        gpu, quick = DEFAULTS[key]
        issue31 = f"; --issue31: {ISSUE31_DEFAULTS[key][0]}" if key in ISSUE31_DEFAULTS else ""
        return f"[{gpu} / {quick}{issue31}]"

    def default31(key: str) -> str:
        gpu, sim = ISSUE31_DEFAULTS[key]
        return f"[{gpu}; simulated {sim}]"

    add = parser.add_argument
    add(
        "--backend",
        choices=("cuda-mps", "cpu", "simulated"),
        default="cuda-mps",
        help="cuda-mps (an NVIDIA GPU under MPS; temporal without MPS), cpu, or simulated (the "
        "analytic GPU model of --sim-device, every figure labelled simulated) [cuda-mps]",
    )
    add(
        "--issue31",
        action="store_true",
        help="issue 31's check: the light mix end to end through the control plane (2 FL rounds, "
        "sharing then vres_sync), eager against graphs alone, >= 60 profiled configurations, "
        "temporal/isolation/sharing/vres_sync in interleaved blocks, the targets beside the figures",
    )
    add("--blocks", type=int, default=5, help="--issue31: interleaved blocks of the comparison [5]")
    add(
        "--execution",
        choices=("auto", "eager", "graphs"),
        default=None,
        help="--issue31: how the profiled and compared trainers run their steps [graphs; eager on cpu]",
    )
    add(
        "--e2e-time-limit",
        type=float,
        default=None,
        help=f"--issue31: seconds of the e2e phase {default31('e2e_time_limit')}",
    )
    add("--no-e2e", action="store_true", help="--issue31: leave out the end-to-end phase (no Django needed)")
    add("--sim-device", default="h200", help="--backend simulated: the simulated GPU preset [h200]")
    add(
        "--quick",
        action="store_true",
        help="tiny settings for a CPU: the tiny mix (mobilenet_v3_small + shufflenet_v2_x1_0), "
        "batches 8 and 16, short timing windows",
    )
    add("--mixes", default=None, help=f"comma-separated: {', '.join(MIXES)} {default('mixes')}")
    add("--budget", type=float, default=None, help=f"profiling seconds {default('budget')}")
    add(
        "--min-configs",
        type=int,
        default=None,
        help=f"profile at least this many configurations, past the budget if needed {default('min_configs')}",
    )
    add("--profile-batch-sizes", default=None, help=f"batch sizes profiled {default('profile_batch_sizes')}")
    add(
        "--baseline-batch",
        type=int,
        default=None,
        help=f"batch size of temporal, isolation and sharing {default('baseline_batch')}",
    )
    add(
        "--data",
        choices=("equal", "dirichlet"),
        default="equal",
        help="data volumes of the tasks on the device: equal, or Dirichlet proportions [equal]",
    )
    add("--alpha", type=float, default=0.5, help="Dirichlet alpha for --data dirichlet [0.5]")
    add(
        "--samples-per-task",
        type=int,
        default=None,
        help=f"samples of each task on the device (the mean, with dirichlet) {default('samples_per_task')}",
    )
    add("--objective", choices=("raw", "fair"), default="raw", help="vres_greedy's objective [raw]")
    add(
        "--families",
        default=None,
        help=f"predictor families compared (controlplane.planning.predictor.FAMILIES) {default('families')}",
    )
    add("--share-step", type=int, default=10, help="share grid of the profile, percent [10]")
    add("--repeat-every", type=int, default=0, help="profile: repeat every n-th configuration [0: never]")
    add("--time-limit", type=float, default=None, help=f"seconds for the whole check {default('time_limit')}")
    add(
        "--config-timeout",
        type=float,
        default=None,
        help=f"seconds one configuration may take {default('config_timeout')}",
    )
    add("--profile-warmup", type=int, default=None, help=f"{default('profile_warmup')}")
    add("--profile-iterations", type=int, default=None, help=f"min timed iterations {default('profile_iterations')}")
    add("--profile-window", type=float, default=None, help=f"min window seconds {default('profile_window')}")
    add("--measure-warmup", type=int, default=None, help=f"{default('measure_warmup')}")
    add("--measure-iterations", type=int, default=None, help=f"min timed iterations {default('measure_iterations')}")
    add("--measure-window", type=float, default=None, help=f"min window seconds {default('measure_window')}")
    add("--cores", default=None, help="CPU ids of the device, e.g. 0,1 [all]")
    add("--seed", type=int, default=0)
    add("--json", default=None, help="also write the JSON here (it goes to $OUT/gpu_check.json when OUT is set)")
    args = parser.parse_args(argv)
    if args.issue31:
        for key, (gpu, sim) in ISSUE31_DEFAULTS.items():
            if getattr(args, key, None) is None:
                setattr(args, key, sim if args.backend == "simulated" else gpu)
        if args.execution is None:
            args.execution = "eager" if args.backend == "cpu" else "graphs"
        if args.blocks < 2:
            raise CheckFailed(
                f"--blocks must be at least 2 (an interval needs two), got {args.blocks}", EXIT_UNAVAILABLE
            )
    for key, (gpu, quick) in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else gpu)
    if args.execution is None:
        args.execution = "auto"
    return args


def run(check: Check) -> str:
    """All the phases; returns the closing line's text.

    Raises:
        CheckFailed: the first thing that failed (the closing line and the exit code).
    """
    args = check.args
    names = [n.strip() for n in args.mixes.split(",") if n.strip()]
    unknown = [n for n in names if n not in MIXES]
    if unknown or not names:
        raise CheckFailed(
            f"--mixes: unknown mix {unknown[0] if unknown else '(none)'}; allowed: {', '.join(MIXES)}", EXIT_UNAVAILABLE
        )
    if args.budget < 5 or args.time_limit <= 0 or args.min_configs < 1:
        raise CheckFailed("--budget must be ≥ 5 s, --time-limit > 0, --min-configs ≥ 1", EXIT_UNAVAILABLE)
    mixes_arch = {n: MIXES[n] for n in names}
    architectures = list(dict.fromkeys(a for mix in mixes_arch.values() for a in mix))
    max_mix = max(len(m) for m in mixes_arch.values())

    check.say(
        f"backend {args.backend}, mixes {', '.join(names)}, profile budget {args.budget:g} s, "
        f"time limit {args.time_limit:g} s"
    )
    with check.stage("preflight"):
        backend, ctx, units, memory, placement = preflight(check)
    from controlplane.planning.strategies import baseline_strategy, compared_strategies

    strategy_configs = len(compared_strategies()) * len(names)
    # Both requests now: a bad option stops the check before it profiles.
    sweep = profile_request(check, ctx, architectures, max_mix)
    measurer = Measurer(check, backend, ctx)
    with check.stage("features"):
        workloads = features(check, architectures)
    with check.stage("profile"):
        # A strategy's configuration has more tasks and a longer window than the average
        # profiled one: 1.5 of them each, and two more for P_alone.
        results, profiled = profile(
            check,
            backend,
            ctx,
            sweep,
            reserve=lambda pace: FIT_AND_PLAN_RESERVE_S + (1.5 * strategy_configs + 2) * pace,
        )
    with check.stage("fit"):
        predictor = fit(check, to_samples(results), workloads, units, placement)
    mixes: list[dict] = []
    check.report["mixes"] = mixes
    with check.stage("plan"):
        for k, name in enumerate(names):
            samples = data_volumes(args, len(mixes_arch[name]), k)
            mixes.append(plan_mix(check, name, mixes_arch[name], samples, predictor, memory))
    with check.stage("measure", strict=False):
        measure_mixes(check, measurer, mixes)
    with check.stage("alone", strict=False):
        fill_alone(check, measurer, mixes, profiled, predictor, workloads)
    with check.stage("report", strict=False):
        score(mixes)
        print_table(check, mixes)
    # The check must run where neither exists: prove it never needed them.
    check.report["host"]["django_imported"] = "django" in sys.modules
    check.report["host"]["celery_imported"] = "celery" in sys.modules

    problems = [(e["name"], r) for e in mixes for r in e["strategies"] if r["status"] != "succeeded"]
    if problems:
        name, row = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        code = EXIT_STOPPED if row["status"] == "skipped" else EXIT_FAILED
        raise CheckFailed(f"{name}/{row['strategy']} {row['status']}: {first_line(row['error'], 200)}{more}", code)
    best = []
    for entry in mixes:
        top = max(entry["strategies"], key=lambda r: r["raw_speedup"] or 0)
        best.append(f"{entry['name']} {top['raw_speedup']:.2f}× ({top['strategy']})")
    return (
        f"OK in {check.elapsed():.0f} s: best raw speedup over {baseline_strategy().name} "
        + ", ".join(best)
        + f"; paper {PAPER_RAW_SPEEDUP[0]}–{PAPER_RAW_SPEEDUP[1]}×"
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except CheckFailed as exc:
        print(f"gpu_check: FAILED: {exc}", flush=True)
        return exc.code
    check = Check(args)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, check.on_signal)
    check.start_watchdog()
    code, error, closing = EXIT_FAILED, "", ""
    try:
        closing = run_issue31(check) if args.issue31 else run(check)
        code = EXIT_OK
    except CheckFailed as exc:
        code, error = exc.code, str(exc)
    except Exception as exc:  # noqa: BLE001 - one clear line, the traceback above it
        import traceback

        traceback.print_exc(file=sys.stdout)
        code, error = EXIT_FAILED, f"{check.phase}: {type(exc).__name__}: {first_line(str(exc))}"
    finally:
        check.close_backend()
        check.write_json(code, error)
        check.finished.set()
        if check.state_dir is not None:
            shutil.rmtree(check.state_dir, ignore_errors=True)
    print(f"gpu_check: {closing}" if code == EXIT_OK else f"gpu_check: FAILED: {error}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
