"""The device agent: a Celery worker (no Django) serving one device's queue.

Run on each device host::

    python -m workers.agent --device gpu-a --backend cpu --cores 0-3

or, for a device that exists only as a model (tests, planning at scale; every number it reports
is labelled simulated; ``MTFL_SIM_DEVICE`` picks the GPU, see
:mod:`workers.backends.simulated`)::

    MTFL_SIM_DEVICE=titan-v python -m workers.agent --device sim-0 --backend simulated

or, on a GPU host (one agent per GPU; see :mod:`workers.backends.cuda`)::

    python -m workers.agent --device gpu-a --backend cuda-mps --gpu 0

It registers the device with the control plane (:data:`TaskName.DEVICE_REGISTER` on the
``control`` queue), sends a heartbeat with the same inventory every ``--heartbeat-s`` seconds,
and serves ``device.<name>`` with a solo pool (one round at a time; the trainers it launches
are its parallelism). Its tasks, :func:`train_round`, :func:`measure_standalone` and
:func:`profile_sweep`, take and return plain JSON validated by :mod:`workers.protocol.messages`, and
report every failure as data (``status="failed"``) instead of raising, so the control plane's
chord callback always runs.

The agent's configuration reaches the tasks through environment variables that :func:`main`
sets (so ``celery -A workers.agent.app worker`` works too when they are exported):
``MTFL_AGENT_DEVICE``, ``MTFL_AGENT_BACKEND`` (default ``cpu``), ``MTFL_AGENT_CORES``
(e.g. ``"0-3,6"``; default this process's affinity), ``MTFL_AGENT_STATE_DIR`` (default
``$MTFL_HOME/agents/<device>``), ``MTFL_AGENT_TRAINER_TIMEOUT_S`` (default 10800),
``MTFL_AGENT_HEARTBEAT_S`` (the default of ``--heartbeat-s``, 15), ``MTFL_AGENT_CANCEL_POLL_S``
(how often a running device task looks for its cancellation, default 2). The broker comes from
``CELERY_BROKER_URL`` / ``CELERY_RESULT_BACKEND`` (:mod:`workers.config`).

Reliability: device tasks are acknowledged on receipt (none is safe to run twice) and record
which agent process runs them (``STARTED`` with its pid); the control plane cancels one by
storing a marker in the result backend (:func:`workers.protocol.queues.cancel_marker_id`), which the task
checks before it starts and every ``MTFL_AGENT_CANCEL_POLL_S`` while it runs, killing its
trainers when it appears. Results echo the request's ``attempt`` and ``idempotency_key``.

Weights: by default the agent shares ``ARTIFACT_ROOT`` with the control plane (one host, or a
shared folder). On a host that shares no disk with it, set ``MTFL_CONTROL_URL`` and
``MTFL_AGENT_TOKEN`` (or ``MTFL_AGENT_TOKEN_FILE``; options ``--control-url`` /
``--agent-token``): the agent then fetches global weights from and sends trained weights to the
control plane over HTTP, keeping its copies under ``<state-dir>/artifacts``
(:mod:`workers.fl.transfer`). At start it checks the token names this device.

On SIGTERM Celery starts a warm shutdown; the ``worker_shutting_down`` hook below terminates the
running round's trainers, so the round returns failed at once instead of running for hours, and
stops the backend (``cuda-mps``: quits the agent's MPS control daemon, which :func:`main`
started). The backend is also stopped when the worker returns and at exit.

Exit codes of :func:`main`: 0 normal stop, 2 bad arguments or configuration (including an
unavailable backend — no GPU or driver for ``cuda-*`` — unset broker, or an agent token the
control plane refuses or that belongs to another device), 3 the broker could not be reached to
register, 4 the device could not be prepared (the MPS control daemon did not start or answer),
5 the control plane (``MTFL_CONTROL_URL``) could not be reached. Importing this module imports neither torch nor pynvml, and the agent process
never initialises CUDA (GPU inventory and telemetry use NVML).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import logging
import math
import os
import platform
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from celery import Celery, Task, signals
from pydantic import BaseModel, ValidationError

import workers
from workers import config
from workers.agent.broker_compat import patch_kombu_redis_restore
from workers.agent.lifecycle import exit_with_parent
from workers.backends import (
    AgentContext,
    BackendUnavailableError,
    ExecutionBackend,
    cancel_requested,
    clear_cancel,
    request_cancel,
    request_shutdown,
    shutdown_requested,
    terminate_children,
)
from workers.fl.transfer import (
    ENV_AGENT_TOKEN,
    ENV_CONTROL_URL,
    ArtifactClient,
    TransferError,
    TransferSettings,
    run_round_remote,
    transfer_settings,
)
from workers.profiling.sweep import run_sweep
from workers.protocol.messages import (
    DeviceInventory,
    DeviceRoundResult,
    ProfileConfigResult,
    ProfileSweepRequest,
    ProfileSweepSummary,
    StandaloneRequest,
    StandaloneResult,
    TrainRoundRequest,
)
from workers.protocol.queues import CANCELLED_STATE, CONTROL_QUEUE, TaskName, cancel_marker_id, device_queue
from workers.registry.backends import BACKEND_REGISTRY, get_backend
from workers.registry.inventory import installed_plugins
from workers.registry.names import check_names

logger = logging.getLogger(__name__)

ENV_DEVICE = "MTFL_AGENT_DEVICE"
ENV_BACKEND = "MTFL_AGENT_BACKEND"
ENV_CORES = "MTFL_AGENT_CORES"
ENV_STATE_DIR = "MTFL_AGENT_STATE_DIR"
ENV_TRAINER_TIMEOUT_S = "MTFL_AGENT_TRAINER_TIMEOUT_S"
ENV_GPU = "MTFL_AGENT_GPU"
ENV_HEARTBEAT_S = "MTFL_AGENT_HEARTBEAT_S"
ENV_CANCEL_POLL_S = "MTFL_AGENT_CANCEL_POLL_S"

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_BROKER = 3
EXIT_DEVICE = 4
EXIT_CONTROL_PLANE = 5

DEFAULT_TRAINER_TIMEOUT_S = 3 * 3600.0
DEFAULT_HEARTBEAT_S = 15.0
DEFAULT_CANCEL_POLL_S = 2.0

# A broker restart must not stop the agent (see workers.agent.broker_compat).
patch_kombu_redis_restore()

# No fix-ups: Celery would otherwise run django.setup() whenever DJANGO_SETTINGS_MODULE is
# inherited (agents started by the embedded control plane), and the agent never uses Django.
app = Celery("mtfl-agent", fixups=[])
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    # Rounds are long: never reserve a second one behind the running one.
    worker_prefetch_multiplier=1,
    # No device task is safe to run twice: a round overwrites weights the control plane may be
    # reading, and a redelivery would arrive long after its round's deadline. Messages are
    # acked on receipt; a lost agent shows up as a missing result, which the control plane's
    # round watchdog fails (or retries) within the deadline.
    task_acks_late=False,
    broker_transport_options={"visibility_timeout": config.broker_visibility_timeout_s()},
    result_backend_transport_options={"visibility_timeout": config.broker_visibility_timeout_s()},
    # A round's result is written once, at its end: if the broker restarts just then, retry
    # the write (with backoff, for up to about 10 minutes) instead of losing the round.
    result_backend_always_retry=True,
    result_backend_max_retries=60,
    result_backend_max_sleep_between_retries_ms=10_000,
    result_expires=24 * 3600,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
)


def configure_broker() -> None:
    """Point :data:`app` at ``CELERY_BROKER_URL`` / ``CELERY_RESULT_BACKEND``.

    Raises:
        RuntimeError: if ``CELERY_BROKER_URL`` is unset.
    """
    app.conf.broker_url = config.broker_url()
    app.conf.result_backend = config.result_backend_url()


if os.environ.get("CELERY_BROKER_URL", "").strip():
    configure_broker()


# ------------------------------------------------------------------------------ settings


def parse_cores(text: str) -> list[int]:
    """Parse a CPU list like ``"0-3,6"`` into sorted unique ids ``[0, 1, 2, 3, 6]``.

    Raises:
        ValueError: naming the bad part, for empty text, non-integers or ``a-b`` with ``a > b``.
    """
    cores: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                low_text, high_text = part.split("-", 1)
                low, high = int(low_text), int(high_text)
                if low < 0 or low > high:
                    raise ValueError
                cores.update(range(low, high + 1))
            else:
                core = int(part)
                if core < 0:
                    raise ValueError
                cores.add(core)
        except ValueError:
            raise ValueError(
                f"cores {text!r}: bad part {part!r}; use comma-separated ids or ranges like '0-3,6'"
            ) from None
    if not cores:
        raise ValueError(f"cores {text!r} lists no CPU")
    return sorted(cores)


def format_cores(cores: Sequence[int]) -> str:
    """Format CPU ids as ``parse_cores`` reads them (``[0, 1, 2, 6]`` → ``"0-2,6"``)."""
    parts = []
    ordered = sorted(set(cores))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class AgentSettings:
    """The agent's configuration as the tasks read it from the environment.

    Attributes:
        device: device name (validated by :func:`workers.protocol.queues.device_queue`).
        backend: execution backend name (:data:`workers.registry.backends.BACKEND_REGISTRY`).
        cores: CPU ids the device may use.
        state_dir: the agent's work folder.
        trainer_timeout_s: seconds a round's trainers may run after the start barrier.
        transfer: the control plane's URL and this agent's token when it shares no disk with
            it (``MTFL_CONTROL_URL``), else ``None``.
    """

    device: str
    backend: str
    cores: list[int]
    state_dir: Path
    trainer_timeout_s: float
    transfer: TransferSettings | None = None


def agent_settings() -> AgentSettings:
    """Read :class:`AgentSettings` from the ``MTFL_AGENT_*`` variables.

    Raises:
        RuntimeError: naming the variable, if ``MTFL_AGENT_DEVICE`` is unset or a value is
            invalid.
    """
    device = os.environ.get(ENV_DEVICE, "").strip()
    if not device:
        raise RuntimeError(f"{ENV_DEVICE} is not set: start the agent with `--device NAME`")
    try:
        device_queue(device)
        backend = os.environ.get(ENV_BACKEND, "cpu").strip() or "cpu"
        BACKEND_REGISTRY.check(backend, field=ENV_BACKEND)
        cores_text = os.environ.get(ENV_CORES, "").strip()
        cores = parse_cores(cores_text) if cores_text else sorted(os.sched_getaffinity(0))
        timeout_text = os.environ.get(ENV_TRAINER_TIMEOUT_S, "").strip()
        timeout = float(timeout_text) if timeout_text else DEFAULT_TRAINER_TIMEOUT_S
        if not timeout > 0:
            raise ValueError(f"{ENV_TRAINER_TIMEOUT_S} must be > 0 seconds, got {timeout_text!r}")
        transfer = transfer_settings()
    except (ValueError, RuntimeError) as exc:
        raise RuntimeError(f"agent misconfigured: {exc}") from exc
    state_text = os.environ.get(ENV_STATE_DIR, "").strip()
    if state_text:
        state_dir = Path(state_text).expanduser()
    else:
        state_dir = config.mtfl_home() / "agents" / device
    return AgentSettings(device, backend, cores, state_dir, timeout, transfer)


_BACKEND_CACHE: dict[str, ExecutionBackend] = {}


def _backend(name: str) -> ExecutionBackend:
    if name not in _BACKEND_CACHE:
        _BACKEND_CACHE[name] = get_backend(name)
    return _BACKEND_CACHE[name]


def _context(settings: AgentSettings) -> AgentContext:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    if settings.transfer is None:
        artifact_root = config.artifact_root()
    else:  # no shared disk: the agent's own copies, fetched and sent by workers.fl.transfer
        artifact_root = settings.state_dir / "artifacts"
        artifact_root.mkdir(parents=True, exist_ok=True)
    return AgentContext(
        device=settings.device,
        cores=list(settings.cores),
        state_dir=settings.state_dir,
        artifact_root=artifact_root,
        trainer_timeout_s=settings.trainer_timeout_s,
    )


def _int_or(value: Any, default: int = -1) -> int:
    """An id from an unvalidated request, for labelling a failed result."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


TRAINING_SOURCES: tuple[str, ...] = ("training", "backends", "warm.py", "launch.py")
"""The parts of the ``workers`` package (folders and modules) whose code decides what a trainer
does and how fast: their digest is part of :func:`agent_version`."""


@functools.cache
def agent_version() -> str:
    """This agent's code version as it reports it (``DeviceInventory.agent_version``):
    mtfl-lab's version and the first 12 hex digits of a SHA-256 over the source files of
    :data:`TRAINING_SOURCES`, e.g. ``"0.1.0+src.1a2b3c4d5e6f"``. The package's version alone
    does not change between commits, and the control plane keeps measurements per code version
    (the cross-run ``P_alone`` cache), so a change to the trainer must change it."""
    root = Path(workers.__file__).resolve().parent
    files: list[Path] = []
    for part in TRAINING_SOURCES:
        path = root / part
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return f"{workers.__version__}+src.{digest.hexdigest()[:12]}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _report_progress(round_id: int, device: str, phase: str) -> None:
    """Tell the control plane this device's trainers are starting (the live progress view).

    Best effort: a lost progress message changes nothing but the display, so a broker hiccup
    here is logged and the round goes on.
    """
    try:
        app.send_task(
            TaskName.ROUND_PROGRESS,
            args=[round_id, device, phase, time.time()],
            queue=CONTROL_QUEUE,
            ignore_result=True,
        )
    except Exception:  # noqa: BLE001 - see docstring: display only
        logger.warning("could not report round %s progress", round_id, exc_info=True)


JsonDict = dict[str, Any]
"""A task's request or result as JSON (what Celery's JSON serializer carries)."""

_Routed = TypeVar("_Routed", TrainRoundRequest, StandaloneRequest, ProfileSweepRequest)
"""A device task's request: it names the device and the backend it is meant for."""


def _task(**options: Any) -> Callable[[Callable[..., JsonDict]], Task]:
    """``app.task(**options)`` with a type: Celery ships no type information, so mypy would see
    the decorator as untyped (the decorated function becomes a Celery task, typed ``Any``)."""
    decorator: Callable[[Callable[..., JsonDict]], Task] = app.task(**options)
    return decorator


def _serve(
    request: JsonDict,
    schema: type[_Routed],
    failed: Callable[[str, str], JsonDict],
    work: Callable[[_Routed, AgentSettings], BaseModel],
) -> JsonDict:
    """Validate a device task's request, check it was routed to this agent, do the work.

    Every problem — an invalid request, one meant for another device or backend, a
    misconfigured agent, an unexpected error — comes back as ``failed(error, device)`` data;
    this never raises, so a chord's callback always runs.
    """
    try:
        settings = agent_settings()
        device = settings.device
        parsed = check_names(schema.model_validate(request))  # its names against this host's registries
        if parsed.device != settings.device:
            return failed(f"request for device {parsed.device!r} reached agent {settings.device!r}", device)
        if parsed.backend != settings.backend:
            return failed(f"request for backend {parsed.backend!r} reached a {settings.backend!r} agent", device)
        return work(parsed, settings).model_dump(mode="json")
    except ValidationError as exc:
        return failed(f"invalid {schema.__name__}: {exc}", "")
    except Exception as exc:  # noqa: BLE001 - failures are data; the chord callback must run
        logger.exception("%s failed in the agent", schema.__name__)
        return failed(_describe(exc), "")


# ------------------------------------------------------------------- cancellation watch


def _positive_env(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        logger.warning("%s=%r is not a number > 0; using %g", name, text, default)
        return default
    return value


def _cancel_reason(task_id: str | None) -> str | None:
    """The reason the control plane cancelled device task ``task_id``, or ``None``.

    Reads the task's cancel marker (:func:`workers.protocol.queues.cancel_marker_id`) from the result
    backend. A backend that cannot be read is logged and counts as not cancelled: the round
    goes on, and the control plane's deadline still bounds it.
    """
    if not task_id:
        return None
    try:
        meta = app.backend.get_task_meta(cancel_marker_id(task_id))
    except Exception:  # noqa: BLE001 - see docstring
        logger.warning("could not read the cancel marker of task %s", task_id, exc_info=True)
        return None
    if meta.get("status") != CANCELLED_STATE:
        return None
    result = meta.get("result")
    reason = result.get("reason") if isinstance(result, dict) else None
    return str(reason or "cancelled by the control plane")


class _CancelWatch:
    """While a device task runs, poll its cancel marker every ``MTFL_AGENT_CANCEL_POLL_S``
    seconds (default 2) in a thread; when it appears, :func:`~workers.launch.request_cancel`
    kills the task's trainers and the task returns failed with the reason.

    A poll of the result backend rather than a Celery broadcast: the agent's solo pool runs the
    task on the thread that would read broadcasts, so a ``revoke`` reaches it only after the
    task has ended.
    """

    def __init__(self, task_id: str | None) -> None:
        self.task_id = task_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _CancelWatch:
        clear_cancel()
        if self.task_id:
            self._thread = threading.Thread(target=self._run, daemon=True, name="mtfl-cancel-watch")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        clear_cancel()

    def _run(self) -> None:
        interval = _positive_env(ENV_CANCEL_POLL_S, DEFAULT_CANCEL_POLL_S)
        while not self._stop.wait(interval):
            reason = _cancel_reason(self.task_id)
            if reason is not None:
                killed = request_cancel(reason)
                logger.warning(
                    "task %s cancelled by the control plane (%s): %d trainer(s) terminated",
                    self.task_id,
                    reason,
                    killed,
                )
                return


def _already_done(task_id: str | None) -> JsonDict | None:
    """The stored result of ``task_id`` if it already succeeded (a redelivered message of a
    task this device finished), else ``None``: the round is not trained twice."""
    if not task_id:
        return None
    try:
        meta = app.backend.get_task_meta(task_id)
    except Exception:  # noqa: BLE001 - unreadable: run the task (the control plane dedupes by key)
        return None
    return meta.get("result") if meta.get("status") == "SUCCESS" and isinstance(meta.get("result"), dict) else None


def _mark_started(task: Task) -> None:
    """Record in the result backend which agent process runs the task (state ``STARTED``
    with ``pid`` and ``hostname``): a restarted agent has another pid, so the control plane
    can tell that the task was lost with the old process."""
    if not task.request.id:  # called directly, not as a Celery task
        return
    try:
        task.update_state(
            state="STARTED", meta={"pid": os.getpid(), "hostname": socket.gethostname(), "started_at": time.time()}
        )
    except Exception:  # noqa: BLE001 - bookkeeping only; the round goes on
        logger.warning("could not record that task %s started", task.request.id, exc_info=True)


# --------------------------------------------------------------------------------- tasks


@_task(name=TaskName.TRAIN_ROUND, bind=True)
def train_round(self: Task, request: JsonDict) -> JsonDict:
    """Train this device's assignments of one round; return a ``DeviceRoundResult`` as JSON.

    The result echoes the request's ``attempt`` and ``idempotency_key``. A task the control
    plane cancelled (:func:`workers.protocol.queues.cancel_marker_id`) before it started is not run; one
    cancelled while running has its trainers killed; a redelivered message of a task this
    device already finished returns the stored result without training again.

    Args:
        request: a :class:`~workers.protocol.messages.TrainRoundRequest` as JSON.

    Returns:
        ``DeviceRoundResult.model_dump(mode="json")``. An invalid request, a request for another
        device or backend, a misconfigured agent, trainer failures, a cancellation and
        unexpected errors all come back as ``status="failed"`` with ``error`` saying why; this
        task never raises.
    """
    request = request if isinstance(request, dict) else {}
    raw_attempt, raw_key = request.get("attempt"), request.get("idempotency_key")
    attempt = raw_attempt if isinstance(raw_attempt, int) else 0
    key = raw_key if isinstance(raw_key, str) else ""

    def failed(error: str, device: str = "") -> JsonDict:
        return DeviceRoundResult(
            run_id=_int_or(request.get("run_id")),
            round_id=_int_or(request.get("round_id")),
            device=device or str(request.get("device", "")),
            status="failed",
            error=error,
            host=socket.gethostname(),
            attempt=max(0, min(attempt, 100)),
            idempotency_key=key[:200],
        ).model_dump(mode="json")

    def work(parsed: TrainRoundRequest, settings: AgentSettings) -> DeviceRoundResult:
        _report_progress(parsed.round_id, settings.device, "started")
        backend, ctx = _backend(settings.backend), _context(settings)
        if settings.transfer is None:
            result = backend.run_round(parsed, ctx)
        else:
            result = run_round_remote(
                lambda r: backend.run_round(r, ctx), parsed, ctx.artifact_root, ArtifactClient(settings.transfer)
            )
        return result.model_copy(update={"attempt": parsed.attempt, "idempotency_key": parsed.idempotency_key})

    task_id = self.request.id
    done = _already_done(task_id)
    if done is not None:
        logger.warning(
            "task %s (%s) was redelivered after it finished; its stored result is returned", task_id, key or "no key"
        )
        return done
    reason = _cancel_reason(task_id)
    if reason is not None:
        return failed(f"{reason} (before it started)")
    _mark_started(self)
    with _CancelWatch(task_id):
        return _serve(request, TrainRoundRequest, failed, work)


@_task(name=TaskName.MEASURE_STANDALONE, bind=True)
def measure_standalone(self: Task, request: JsonDict) -> JsonDict:
    """Measure each task alone on this device; return a ``StandaloneResult`` as JSON.

    Cancelled (run cancelled) before it starts: not run; while it runs: its trainer killed.

    Args:
        request: a :class:`~workers.protocol.messages.StandaloneRequest` as JSON.

    Returns:
        ``StandaloneResult.model_dump(mode="json")``; every failure is ``status="failed"`` data,
        this task never raises.
    """
    request = request if isinstance(request, dict) else {}

    def failed(error: str, device: str = "") -> JsonDict:
        return StandaloneResult(
            run_id=_int_or(request.get("run_id")),
            device=device or str(request.get("device", "")),
            status="failed",
            error=error,
        ).model_dump(mode="json")

    def work(parsed: StandaloneRequest, settings: AgentSettings) -> StandaloneResult:
        return _backend(settings.backend).measure_standalone(parsed, _context(settings))

    reason = _cancel_reason(self.request.id)
    if reason is not None:
        return failed(f"{reason} (before it started)")
    _mark_started(self)
    with _CancelWatch(self.request.id):
        return _serve(request, StandaloneRequest, failed, work)


def _send_to_control(name: str, payload: JsonDict) -> None:
    """Send ``payload`` to the control plane's task ``name``; best effort.

    A profiling record lost to a broker hiccup costs one training sample of the predictor, not
    the sweep, so a failure is logged and the sweep goes on.
    """
    try:
        app.send_task(name, args=[payload], queue=CONTROL_QUEUE, ignore_result=True)
    except Exception:  # noqa: BLE001 - see docstring
        logger.warning("could not send %s to the control plane", name, exc_info=True)


@_task(name=TaskName.PROFILE_SWEEP, bind=True)
def profile_sweep(self: Task, request: JsonDict) -> JsonDict:
    """Run a profiling sweep on this device; return its ``ProfileSweepSummary`` as JSON.

    Every measured configuration goes to :data:`TaskName.PROFILE_RECORD` on the ``control``
    queue as soon as it is measured (a ``ProfileConfigResult`` as JSON), and the summary to
    :data:`TaskName.PROFILE_DONE` at the end — also when the sweep was refused or failed, so
    the control plane always learns it ended. Both sends are best effort (logged on failure).
    The sweep stops starting configurations when the agent shuts down
    (:func:`~workers.launch.shutdown_requested`) or the control plane cancels it (its cancel
    marker, :func:`workers.protocol.queues.cancel_marker_id`, read before it starts and every
    few seconds while it runs); the running configuration is killed with its trainers. A sweep
    cancelled before it starts is not run. The agent serves one task at a time, so rounds wait
    for a running sweep.

    Args:
        request: a :class:`~workers.protocol.messages.ProfileSweepRequest` as JSON.

    Returns:
        ``ProfileSweepSummary.model_dump(mode="json")``; every failure is ``status="failed"``
        data, this task never raises.
    """
    request = request if isinstance(request, dict) else {}

    def failed(error: str, device: str = "") -> JsonDict:
        return ProfileSweepSummary(
            sweep_id=_int_or(request.get("sweep_id")),
            device=device or str(request.get("device", "")),
            status="failed",
            error=error,
        ).model_dump(mode="json")

    def emit(result: ProfileConfigResult) -> None:
        _send_to_control(TaskName.PROFILE_RECORD, result.model_dump(mode="json"))

    def stop() -> bool:
        return shutdown_requested() or cancel_requested() is not None

    def work(parsed: ProfileSweepRequest, settings: AgentSettings) -> ProfileSweepSummary:
        return run_sweep(parsed, _context(settings), _backend(settings.backend), emit, should_stop=stop)

    reason = _cancel_reason(self.request.id)
    if reason is not None:
        summary = failed(f"{reason} (before it started)")
    else:
        with _CancelWatch(self.request.id):
            summary = _serve(request, ProfileSweepRequest, failed, work)
    _send_to_control(TaskName.PROFILE_DONE, summary)
    return summary


# ------------------------------------------------------------------------ shutdown hooks

_STOP_HEARTBEAT = threading.Event()


def stop_backends() -> None:
    """Stop every backend this process created (``cuda-mps``: quit its MPS control daemon).
    Idempotent; never raises (a backend that cannot stop logs why)."""
    for backend in list(_BACKEND_CACHE.values()):
        try:
            backend.stop()
        except Exception:  # noqa: BLE001 - shutting down: log and stop the others
            logger.exception("could not stop backend %s", backend.name)


def _on_worker_shutting_down(**_: Any) -> None:
    """Celery's SIGTERM/SIGINT handler: stop heartbeats, terminate running trainers, stop the
    backend (the MPS daemon waits for its terminated clients to exit before it quits)."""
    _STOP_HEARTBEAT.set()
    request_shutdown()
    stop_backends()


# Connected by a call rather than as a decorator: Celery has no type information, and an
# untyped decorator would leave the handler untyped. The same registration either way.
signals.worker_shutting_down.connect(_on_worker_shutting_down)

# atexit runs handlers last-registered first: trainers are terminated before the daemon quits.
atexit.register(stop_backends)
atexit.register(terminate_children)


# ---------------------------------------------------------------------------------- main


def build_inventory(settings: AgentSettings) -> DeviceInventory:
    """Describe this device for registration and heartbeats (torch version read from package
    metadata, without importing torch; a GPU backend adds its GPU through NVML; the models, data
    sets and partitioners installed on this host, :func:`workers.registry.inventory.installed_plugins`,
    so the control plane refuses a run needing one this device lacks).

    Raises:
        BackendUnavailableError: the backend cannot describe its accelerator.
    """
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = ""
    fields = {
        "name": settings.device,
        "backend": settings.backend,
        "host": socket.gethostname(),
        "cores": list(settings.cores),
        "memory_bytes": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_version": torch_version,
        "agent_version": agent_version(),
        "agent_pid": os.getpid(),
        "plugins": installed_plugins(),
    }
    # The accelerator's own description (its memory, not the host's) wins.
    return check_names(DeviceInventory.model_validate({**fields, **_backend(settings.backend).describe()}))


def _heartbeat_loop(payload: JsonDict, interval_s: float, stop: threading.Event) -> None:
    # Stale heartbeats are worthless, so they expire instead of piling up in the queue.
    expires = max(60.0, 4 * interval_s)
    while not stop.wait(interval_s):
        try:
            app.send_task(TaskName.DEVICE_HEARTBEAT, args=[payload], queue=CONTROL_QUEUE, expires=expires)
        except Exception:  # noqa: BLE001 - a missed heartbeat is logged; the next one retries
            logger.exception("heartbeat for device %s could not be sent", payload.get("name"))


def _hold_device_lock(state_dir: Path) -> IO[str] | None:
    """Take this device's agent lock (``state_dir/agent.lock``) for the life of the process.

    Returns:
        The open lock file (keep it referenced), or ``None`` if another agent holds it.
    """
    handle = open(state_dir / "agent.lock", "a+")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _agents_serving(device: str, timeout_s: float = 1.0) -> list[str]:
    """Workers already answering as ``agent.<device>@host`` on the broker (any host)."""
    try:
        replies = app.control.ping(timeout=timeout_s) or []
    except Exception:  # noqa: BLE001 - an unreachable broker is reported by the registration
        return []
    return sorted(name for reply in replies for name in reply if name.split("@")[0] == f"agent.{device}")


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Device agent: serve device.<name> and train the device's share of rounds.",
    )
    parser.add_argument("--device", required=True, help="device name (lower-case, digits, - _)")
    parser.add_argument("--backend", default="cpu", choices=BACKEND_REGISTRY.names(), help="execution backend")
    parser.add_argument(
        "--cores", default=None, help="CPU ids the device may use, e.g. '0-3,6' (default: this process's affinity)"
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="work folder (default: $MTFL_HOME/agents/<device>)"
    )
    parser.add_argument("--loglevel", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    parser.add_argument(
        "--heartbeat-s",
        type=float,
        default=None,
        help=f"seconds between heartbeats (> 0; default ${ENV_HEARTBEAT_S} or {DEFAULT_HEARTBEAT_S:g})",
    )
    parser.add_argument(
        "--gpu", default=None, help=f"GPU backends: the GPU, an NVML index or a UUID (default: ${ENV_GPU} or 0)"
    )
    parser.add_argument(
        "--control-url",
        default=None,
        help=f"no shared disk: the control plane's URL to fetch and send weights "
        f"through (default: ${ENV_CONTROL_URL}; unset: shared ARTIFACT_ROOT)",
    )
    parser.add_argument(
        "--agent-token",
        default=None,
        help=f"the device's agent token from `mtfl device-token DEVICE` (default: "
        f"${ENV_AGENT_TOKEN}; prefer the variable or MTFL_AGENT_TOKEN_FILE, "
        f"options show in the process list)",
    )
    return parser


def _check_control_plane(device: str, refuse: Callable[..., int]) -> int | None:
    """With ``MTFL_CONTROL_URL`` set, check the control plane answers and the token is this
    device's. Returns an exit code to stop with, or ``None`` to go on."""
    try:
        transfer = transfer_settings()
    except RuntimeError as exc:
        return refuse(str(exc))
    if transfer is None:
        return None
    try:
        owner = ArtifactClient(transfer, attempts=3).whoami()
    except TransferError as exc:
        if exc.status in (401, 403):
            return refuse(
                f"the control plane at {transfer.control_url} refused the agent token: issue one with "
                f"`mtfl device-token {device}`"
            )
        if exc.status is None:
            return refuse(str(exc), EXIT_CONTROL_PLANE)
        return refuse(str(exc))
    if owner != device:
        return refuse(f"the agent token belongs to device {owner!r}, not {device!r}")
    return None


class _Refused(Exception):
    """Why the agent does not start: one line for stderr and the exit code (:func:`main`)."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def main(argv: Sequence[str] | None = None, prog: str = "python -m workers.agent") -> int:
    """Start the agent: validate, register, start heartbeats, then serve the device queue.

    Returns:
        The exit code: 0 after a normal stop, 2 for bad arguments/configuration (one line on
        stderr says what, e.g. no NVIDIA driver for a GPU backend), 3 if the broker cannot be
        reached, 4 if the device cannot be prepared (the MPS control daemon), 5 if the control
        plane (``MTFL_CONTROL_URL``) cannot be reached.
    """
    exit_with_parent()  # a local agent of `mtfl up`/`mtfl demo` stops with it
    args = _parser(prog).parse_args(argv)

    def refuse(message: str, code: int = EXIT_CONFIG) -> int:
        print(f"{prog}: {message}", file=sys.stderr)
        return code

    try:
        queue, cores = _checked_options(args)
        _prepare_settings(args)
    except _Refused as exc:
        return refuse(exc.message, exc.code)
    stop = _check_control_plane(args.device, refuse)
    if stop is not None:
        return stop
    try:
        settings, lock = _claim_device(args, queue, cores)  # the lock is held while the agent runs
        payload = _start_device(args, settings)
    except _Refused as exc:
        return refuse(exc.message, exc.code)
    _STOP_HEARTBEAT.clear()
    threading.Thread(
        target=_heartbeat_loop,
        args=(payload, args.heartbeat_s, _STOP_HEARTBEAT),
        daemon=True,
        name="mtfl-heartbeat",
    ).start()

    app.worker_main(
        [
            "worker",
            "-Q",
            queue,
            "--pool",
            "solo",
            "--concurrency",
            "1",
            "-n",
            f"agent.{args.device}@%h",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            args.loglevel,
        ]
    )
    _STOP_HEARTBEAT.set()
    stop_backends()
    return EXIT_OK


def _checked_options(args: argparse.Namespace) -> tuple[str, list[int]]:
    """The device's queue and cores from the command line, ``args.heartbeat_s`` filled from
    ``MTFL_AGENT_HEARTBEAT_S`` (or its default) when not given.

    Raises:
        _Refused: a bad device name, heartbeat period (allowed ``(0, 3600]`` s) or core list (one
            this process may not use).
    """
    try:
        queue = device_queue(args.device)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if args.heartbeat_s is None:
        try:
            args.heartbeat_s = float(os.environ.get(ENV_HEARTBEAT_S, "").strip() or DEFAULT_HEARTBEAT_S)
        except ValueError:
            raise _Refused(
                f"{ENV_HEARTBEAT_S}={os.environ.get(ENV_HEARTBEAT_S)!r} is not a number of seconds"
            ) from None
    if not (math.isfinite(args.heartbeat_s) and 0 < args.heartbeat_s <= 3600):
        raise _Refused(f"--heartbeat-s={args.heartbeat_s} is out of range: allowed (0, 3600] seconds")
    available = sorted(os.sched_getaffinity(0))
    if args.cores is None:
        return queue, available
    try:
        cores = parse_cores(args.cores)
    except ValueError as exc:
        raise _Refused(f"--cores: {exc}") from None
    outside = sorted(set(cores) - set(available))
    if outside:
        raise _Refused(
            f"--cores {args.cores!r} includes CPUs {format_cores(outside)} this process may "
            f"not use; available: {format_cores(available)}"
        )
    return queue, cores


def _prepare_settings(args: argparse.Namespace) -> None:
    """Put the command line's GPU, control-plane URL and token into the environment and check
    the backend, the warm-trainer settings and the broker's.

    Raises:
        _Refused: the backend is unavailable or misconfigured, or a setting is invalid.
    """
    if args.gpu is not None:
        os.environ[ENV_GPU] = args.gpu
    try:
        _backend(args.backend).check_available()
    except BackendUnavailableError as exc:
        raise _Refused(f"backend {args.backend!r} unavailable: {exc}") from None
    except ValueError as exc:  # the backend's own settings, e.g. MTFL_SIM_DEVICE, MTFL_AGENT_GPU
        raise _Refused(f"backend {args.backend!r} misconfigured: {exc}") from None
    try:
        config.warm_trainers()
        config.warm_trainers_memory_bytes()
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    try:
        configure_broker()
    except RuntimeError as exc:
        raise _Refused(str(exc)) from None
    if args.control_url is not None:
        os.environ[ENV_CONTROL_URL] = args.control_url
    if args.agent_token is not None:
        os.environ[ENV_AGENT_TOKEN] = args.agent_token


def _claim_device(args: argparse.Namespace, queue: str, cores: list[int]) -> tuple[AgentSettings, IO[str]]:
    """The agent's settings (written to the ``MTFL_AGENT_*`` variables the tasks read) and its
    state dir's lock, taken (:func:`_hold_device_lock`: keep it referenced).

    Raises:
        _Refused: the state dir is not usable, or another agent holds this device's lock or
            already serves its queue.
    """
    state_dir = args.state_dir or config.mtfl_home() / "agents" / args.device
    os.environ[ENV_DEVICE] = args.device
    os.environ[ENV_BACKEND] = args.backend
    os.environ[ENV_CORES] = format_cores(cores)
    os.environ[ENV_STATE_DIR] = str(state_dir)
    settings = agent_settings()
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        lock = _hold_device_lock(settings.state_dir)
    except OSError as exc:
        raise _Refused(f"--state-dir {str(settings.state_dir)!r} is not usable: {exc.strerror or exc}") from None
    if lock is None:
        raise _Refused(f"an agent for device {args.device!r} already runs with state dir {str(settings.state_dir)!r}")
    others = _agents_serving(args.device)
    if others:
        raise _Refused(f"an agent for device {args.device!r} is already serving {queue}: {', '.join(others)}")
    return settings, lock


def _start_device(args: argparse.Namespace, settings: AgentSettings) -> JsonDict:
    """Prepare the device (the backend's :meth:`start`: the MPS control daemon) and register it
    with the control plane through the broker. Returns the registration's inventory payload
    (JSON), which the heartbeats repeat.

    Raises:
        _Refused: the inventory cannot be built (code 2), the device cannot be prepared
            (:data:`EXIT_DEVICE`) or the broker cannot be reached (:data:`EXIT_BROKER`); the
            backend is stopped again in the last two cases.
    """
    try:
        payload = build_inventory(settings).model_dump(mode="json")
    except BackendUnavailableError as exc:
        raise _Refused(f"backend {args.backend!r} unavailable: {exc}") from None
    # Until Celery installs its own handlers, SIGTERM exits through atexit, which stops the
    # backend: an MPS daemon started below never outlives an agent stopped while starting.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _backend(args.backend).start(_context(settings))
    except BackendUnavailableError as exc:
        stop_backends()
        raise _Refused(
            f"backend {args.backend!r} could not prepare device {args.device!r}: {exc}", EXIT_DEVICE
        ) from None
    try:
        app.send_task(TaskName.DEVICE_REGISTER, args=[payload], queue=CONTROL_QUEUE)
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a kombu traceback
        stop_backends()
        raise _Refused(
            f"cannot register with the broker at {app.conf.broker_url}: {_describe(exc)}", EXIT_BROKER
        ) from None
    return payload


if __name__ == "__main__":
    sys.exit(main())
