"""A stand-in for ``pynvml`` (nvidia-ml-py) at the library boundary, for tests without a GPU.

Put this folder first on ``sys.path``/``PYTHONPATH`` (or load this file as ``pynvml``). Its
configuration is JSON read at ``nvmlInit`` from the file named by ``FAKE_NVML_CONFIG``, then kept
in :data:`CONFIG` (tests in the same process may change it)::

    {"driver": true, "driver_version": "550.54.15", "cuda_version": 12040,
     "gpus": [{"uuid": "GPU-…", "name": "NVIDIA H200", "memory_total": 150000000000,
               "memory_used": 500000000, "util": 37, "sm_count": 132, "capability": [9, 0],
               "compute_mode": 0, "attributes": true}]}

``"driver": false`` makes ``nvmlInit`` fail as it does on a host without the NVIDIA driver.
"""

import json
import os
from types import SimpleNamespace

CONFIG: dict = {}
INITIALISED = 0


class NVMLError(Exception):
    """Base of every NVML error, as in pynvml."""


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


def nvmlInit():
    global CONFIG, INITIALISED
    path = os.environ.get("FAKE_NVML_CONFIG")
    if path:
        with open(path) as handle:
            CONFIG = json.load(handle)
    if not CONFIG.get("driver", True):
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    INITIALISED += 1


def nvmlShutdown():
    global INITIALISED
    INITIALISED = max(0, INITIALISED - 1)


def _check():
    if not INITIALISED:
        raise NVMLError_Uninitialized("Uninitialized")


def _gpus():
    _check()
    return CONFIG.get("gpus", [])


def nvmlDeviceGetCount():
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index):
    gpus = _gpus()
    if not 0 <= index < len(gpus):
        raise NVMLError_InvalidArgument("Invalid Argument")
    return index


def nvmlDeviceGetHandleByUUID(uuid):
    for index, gpu in enumerate(_gpus()):
        if gpu["uuid"] == uuid:
            return index
    raise NVMLError_InvalidArgument("Not Found")


def nvmlDeviceGetIndex(handle):
    return handle


def nvmlDeviceGetUUID(handle):
    return _gpus()[handle]["uuid"]


def nvmlDeviceGetName(handle):
    return _gpus()[handle]["name"]


def nvmlDeviceGetMemoryInfo(handle):
    gpu = _gpus()[handle]
    return SimpleNamespace(
        total=gpu["memory_total"], used=gpu["memory_used"], free=gpu["memory_total"] - gpu["memory_used"]
    )


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=_gpus()[handle]["util"], memory=0)


def nvmlDeviceGetComputeMode(handle):
    return _gpus()[handle].get("compute_mode", 0)


def nvmlDeviceGetAttributes_v2(handle):
    gpu = _gpus()[handle]
    if not gpu.get("attributes", True):
        raise NVMLError_NotSupported("Not Supported")
    return SimpleNamespace(multiprocessorCount=gpu["sm_count"])


def nvmlDeviceGetCudaComputeCapability(handle):
    return tuple(_gpus()[handle]["capability"])


def nvmlSystemGetDriverVersion():
    _check()
    return CONFIG["driver_version"]


def nvmlSystemGetCudaDriverVersion():
    _check()
    return CONFIG["cuda_version"]
