"""NVIDIA GPU inventory and telemetry through NVML, for the agent process.

The agent process and the Celery parent never initialise CUDA (docs/DESIGN.md §2): NVML
(``pynvml``, package ``nvidia-ml-py``) talks to the driver without creating a CUDA context, so
everything here uses NVML only. The one fact NVML cannot give on every GPU, the number of
streaming multiprocessors (``nvmlDeviceGetAttributes`` answers only for MIG devices on many
drivers), is asked of ``torch.cuda.get_device_properties`` in a short-lived *subprocess*
(:func:`probe_cuda_device`).

- :func:`nvml` loads and initialises NVML once per process;
- :func:`find_gpu` resolves the agent's GPU (``MTFL_AGENT_GPU``: an NVML index or a UUID);
- :func:`gpu_inventory` describes it (name, UUID, memory, driver and CUDA versions, SMs,
  compute capability and mode);
- :class:`GpuTelemetry` samples whole-GPU utilisation and memory about once a second in a
  thread of the agent during a round.

Every failure to reach the driver is a :class:`GpuUnavailableError` whose message is one line
saying what is missing. This module imports neither torch nor pynvml at import time.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

from workers.protocol.messages import GpuSample

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

ENV_GPU = "MTFL_AGENT_GPU"
"""Which GPU a device agent drives: an NVML index (``0``) or a UUID (``GPU-…``/``MIG-…``)."""

PROBE_TIMEOUT_S = 120.0
"""Seconds the SM-count probe subprocess may take (importing torch, creating a context)."""

_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")

_NVML_LOCK = threading.Lock()
_NVML: ModuleType | None = None
_PROBES: dict[str, tuple[int | None, str]] = {}


class GpuUnavailableError(RuntimeError):
    """NVML, the driver or the chosen GPU cannot be reached; the message is one line."""


def nvml() -> ModuleType:
    """Return the ``pynvml`` module, initialised (``nvmlInit``) once for this process.

    Raises:
        GpuUnavailableError: ``nvidia-ml-py`` is not installed, or NVML cannot be initialised
            (no NVIDIA driver: ``libnvidia-ml.so.1`` missing, driver not loaded, no permission).
    """
    global _NVML
    with _NVML_LOCK:
        if _NVML is not None:
            return _NVML
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            raise GpuUnavailableError("the Python NVML bindings are missing: pip install nvidia-ml-py") from None
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise GpuUnavailableError(
                f"no usable NVIDIA driver: NVML could not be initialised ({_nvml_text(exc)}); "
                "a GPU backend needs an NVIDIA GPU with its driver installed"
            ) from None
        _NVML = module
        return module


def reset_nvml() -> None:
    """Forget the initialised NVML module (``nvmlShutdown`` when it was initialised), so the
    next :func:`nvml` loads it again (tests replace ``pynvml`` by a stand-in)."""
    global _NVML
    with _NVML_LOCK:
        if _NVML is not None:
            try:
                _NVML.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library we are forgetting anyway
                logger.debug("nvmlShutdown failed", exc_info=True)
        _NVML = None
        _PROBES.clear()


def _nvml_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def parse_gpu_selector(text: str | None) -> str:
    """Validate a GPU selector (``MTFL_AGENT_GPU``): an NVML index or a GPU/MIG UUID.

    Args:
        text: ``"0"``, ``"3"``, ``"GPU-5f2c…"``, ``"MIG-…"``; ``None`` or blank means ``"0"``.

    Returns:
        The selector, stripped.

    Raises:
        ValueError: naming ``MTFL_AGENT_GPU`` and the allowed forms.
    """
    value = (text or "").strip() or "0"
    if value.isdigit() or _UUID.match(value):
        return value
    raise ValueError(
        f"{ENV_GPU}={value!r} is not a GPU: use an NVML index (0, 1, …) or a UUID (GPU-…, as `nvidia-smi -L` prints it)"
    )


@dataclass(frozen=True)
class GpuInfo:
    """What NVML (and the SM probe) know about one GPU.

    Attributes:
        index: NVML index on this host.
        uuid: ``GPU-…`` (or ``MIG-…``); what trainers put in ``CUDA_VISIBLE_DEVICES``.
        name: model name, e.g. ``"NVIDIA H200"``.
        memory_bytes: total device memory, bytes.
        driver_version: e.g. ``"550.54.15"``.
        cuda_version: highest CUDA version the driver supports, e.g. ``"12.4"``.
        compute_mode: ``Default``, ``Exclusive_Process``, ``Prohibited`` (or ``""``).
        sm_count: streaming multiprocessors, or ``None`` when unknown.
        compute_capability: e.g. ``"9.0"``, or ``""`` when unknown.
    """

    index: int
    uuid: str
    name: str
    memory_bytes: int
    driver_version: str
    cuda_version: str
    compute_mode: str
    sm_count: int | None
    compute_capability: str


def _handle(lib: ModuleType, selector: str) -> object:
    """The NVML handle of ``selector``; GpuUnavailableError naming what exists otherwise."""
    try:
        count = int(lib.nvmlDeviceGetCount())
    except lib.NVMLError as exc:
        raise GpuUnavailableError(f"NVML cannot count GPUs ({_nvml_text(exc)})") from None
    if count == 0:
        raise GpuUnavailableError("NVML reports no NVIDIA GPU on this host")
    try:
        if selector.isdigit():
            index = int(selector)
            if index >= count:
                raise GpuUnavailableError(
                    f"{ENV_GPU}={selector} but this host has {count} GPU(s): indices 0-{count - 1}"
                )
            return lib.nvmlDeviceGetHandleByIndex(index)
        return lib.nvmlDeviceGetHandleByUUID(selector)
    except lib.NVMLError as exc:
        raise GpuUnavailableError(
            f"{ENV_GPU}={selector}: no such GPU ({_nvml_text(exc)}); `nvidia-smi -L` lists them"
        ) from None


def find_gpu(selector: str) -> tuple[int, str, str, int]:
    """Resolve a GPU selector through NVML.

    Args:
        selector: from :func:`parse_gpu_selector`.

    Returns:
        ``(index, uuid, name, memory_bytes)``.

    Raises:
        GpuUnavailableError: no driver, no GPU, or no GPU matches ``selector``.
    """
    lib = nvml()
    handle = _handle(lib, selector)
    try:
        uuid = _text(lib.nvmlDeviceGetUUID(handle))
        name = _text(lib.nvmlDeviceGetName(handle))
        memory = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
        index = int(lib.nvmlDeviceGetIndex(handle))
    except lib.NVMLError as exc:
        raise GpuUnavailableError(f"NVML cannot describe GPU {selector} ({_nvml_text(exc)})") from None
    return index, uuid, name, memory


def gpu_inventory(selector: str, *, probe: bool = False) -> GpuInfo:
    """Describe the GPU ``selector`` names (NVML, plus :func:`probe_cuda_device` for the SM
    count when NVML has no answer and for the compute capability).

    Args:
        selector: from :func:`parse_gpu_selector`.
        probe: when NVML has no SM count, run the probe subprocess for it; without it the SM
            count may be ``None``.

    Returns:
        The :class:`GpuInfo`; fields NVML cannot read are ``""`` or ``None``.

    Raises:
        GpuUnavailableError: no driver, no GPU, or no GPU matches ``selector``.
    """
    lib = nvml()
    index, uuid, name, memory = find_gpu(selector)
    handle = _handle(lib, uuid)

    def optional(what: str, call: Callable[[], _T], default: _T) -> _T:
        # Inventory is best effort beyond name, UUID and memory: an old driver lacking one
        # query must not keep the agent from starting.
        try:
            return call()
        except (lib.NVMLError, AttributeError) as exc:
            logger.info("NVML could not read the %s of GPU %s: %s", what, uuid, _nvml_text(exc))
            return default

    driver = optional("driver version", lambda: _text(lib.nvmlSystemGetDriverVersion()), "")
    cuda_raw = optional("CUDA version", lambda: int(lib.nvmlSystemGetCudaDriverVersion()), 0)
    # NVML encodes CUDA 12.4 as 12040.
    cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if cuda_raw else ""
    mode = optional("compute mode", lambda: _COMPUTE_MODES.get(int(lib.nvmlDeviceGetComputeMode(handle)), ""), "")
    sm_count = optional(
        "SM count (device attributes)", lambda: int(lib.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount), None
    )
    capability = optional(
        "compute capability", lambda: "{:d}.{:d}".format(*lib.nvmlDeviceGetCudaComputeCapability(handle)), ""
    )
    if probe and not sm_count:
        probed_sms, probed_capability = probe_cuda_device(uuid)
        sm_count = probed_sms
        capability = capability or probed_capability
    return GpuInfo(
        index=index,
        uuid=uuid,
        name=name,
        memory_bytes=memory,
        driver_version=driver,
        cuda_version=cuda,
        compute_mode=mode,
        sm_count=sm_count or None,
        compute_capability=capability,
    )


_PROBE_CODE = """
import json, torch
if not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no GPU (built for CUDA %s)" % torch.version.cuda}))
else:
    p = torch.cuda.get_device_properties(0)
    print(json.dumps({"sm_count": p.multi_processor_count, "capability": "%d.%d" % (p.major, p.minor)}))
"""


PROBE_COMMAND: list[str] = [sys.executable, "-c", _PROBE_CODE]
"""The SM probe subprocess: prints one JSON line, ``{"sm_count": int, "capability": "9.0"}`` or
``{"error": str}`` (tests put a stand-in here)."""


def _run_probe(uuid: str, mps_env: dict[str, str] | None, timeout_s: float) -> tuple[int | None, str, str]:
    """Run :data:`PROBE_COMMAND` on GPU ``uuid``: outside MPS (an empty temporary pipe
    directory) when ``mps_env`` is ``None``, else as an MPS client with those variables.

    Returns:
        ``(sm_count, "major.minor", error)``: ``sm_count`` is ``None`` and ``error`` one line
        when the probe failed.
    """
    try:
        with tempfile.TemporaryDirectory(prefix="mtfl-probe-") as empty:
            env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
            env.update(CUDA_VISIBLE_DEVICES=uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_MPS_PIPE_DIRECTORY=empty)
            env.update(mps_env or {})
            done = subprocess.run(
                PROBE_COMMAND, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        lines = done.stdout.strip().splitlines()
        said = " ".join(done.stderr.split())[-300:]
        reply = json.loads(lines[-1]) if lines else {"error": said or f"exit code {done.returncode}, no answer"}
        if "sm_count" in reply:
            return int(reply["sm_count"]), str(reply.get("capability", "")), ""
        return None, "", str(reply.get("error", reply))
    except subprocess.TimeoutExpired:
        return None, "", f"no answer within {timeout_s:g} s"
    except (OSError, ValueError, TypeError) as exc:
        return None, "", f"{type(exc).__name__}: {exc}"


def probe_cuda_device(uuid: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int | None, str]:
    """Ask torch, in a subprocess, for the SM count and compute capability of GPU ``uuid``.

    The subprocess sees only that GPU (``CUDA_VISIBLE_DEVICES=uuid``) and an empty temporary
    MPS pipe directory, so it never becomes a client of any MPS daemon (its share would shrink
    the SM count it sees). The answer is cached per UUID for the life of the process; the
    agent process itself never initialises CUDA.

    Returns:
        ``(sm_count, "major.minor")``; ``(None, "")`` when the probe fails (logged with why).
    """
    if uuid in _PROBES:
        return _PROBES[uuid]
    sm_count, capability, error = _run_probe(uuid, None, timeout_s)
    if sm_count is None:
        logger.warning("GPU %s: SM probe failed: %s", uuid, error)
    _PROBES[uuid] = (sm_count, capability)
    return _PROBES[uuid]


def probe_mps_client(uuid: str, mps_env: dict[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int | None, str]:
    """The SM count a short-lived MPS client of GPU ``uuid`` sees (``multi_processor_count``
    of ``torch.cuda.get_device_properties(0)``, which MPS lowers to the client's share).

    Args:
        uuid: the GPU.
        mps_env: the client's MPS variables (:meth:`workers.backends.gpu_mps.MpsDaemon.client_env`).
        timeout_s: seconds the subprocess may take (importing torch, creating a context).

    Returns:
        ``(sm_count, "")``, or ``(None, why)`` in one line when the probe failed (no GPU, no
        torch, no answer). Never raises; never cached (a daemon may come and go).
    """
    sm_count, _, error = _run_probe(uuid, mps_env, timeout_s)
    return sm_count, error


def sample_gpu(uuid: str) -> GpuSample:
    """Take one whole-GPU sample now (NVML only).

    Raises:
        GpuUnavailableError: NVML cannot read the GPU.
    """
    lib = nvml()
    handle = _handle(lib, uuid)
    try:
        util = lib.nvmlDeviceGetUtilizationRates(handle)
        memory = lib.nvmlDeviceGetMemoryInfo(handle)
    except lib.NVMLError as exc:
        raise GpuUnavailableError(f"NVML cannot sample GPU {uuid} ({_nvml_text(exc)})") from None
    return GpuSample(
        t=time.time(),
        gpu_util_percent=max(0, min(100, int(util.gpu))),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
    )


class GpuTelemetry:
    """Samples one GPU's utilisation and memory every ``interval_s`` in a daemon thread.

    Usage: ``telemetry.start()`` just before the trainers start, ``samples = telemetry.stop()``
    once they have all ended. The first sample is taken at ``start()``; a sample NVML cannot
    read stops the sampling (logged once) and the round goes on: telemetry is a view of the
    round, never a reason to fail it.

    Args:
        uuid: the GPU.
        interval_s: seconds between samples, ``> 0``.

    Raises:
        ValueError: for ``interval_s <= 0``.
    """

    def __init__(self, uuid: str, interval_s: float = 1.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.uuid = uuid
        self.interval_s = interval_s
        self._samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error = ""

    def start(self) -> None:
        """Start sampling in a daemon thread."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="mtfl-gpu-telemetry")
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._samples.append(sample_gpu(self.uuid))
            except GpuUnavailableError as exc:
                self.error = str(exc)
                logger.warning("GPU telemetry stopped: %s", exc)
                return
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> list[GpuSample]:
        """Stop sampling; return the samples in time order."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 + self.interval_s)
        return list(self._samples)
