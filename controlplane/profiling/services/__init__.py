"""Writes to profiling state, one module per concern: :mod:`.workloads` (model workload
features), :mod:`.sweeps` (profiling sweeps and their samples; an FL round's samples are
stored by :mod:`controlplane.experiments.services.samples`), :mod:`.predictors` (fitting and loading predictors)."""

from controlplane.profiling.services.predictors import (
    predictor_current,
    predictor_fit,
    predictor_load,
    predictor_request,
)
from controlplane.profiling.services.sweeps import (
    profile_done,
    profile_record,
    sweep_cancel,
    sweep_execution,
    sweep_start,
    sweep_watchdog,
)
from controlplane.profiling.services.workloads import workload_ensure, workload_request

__all__ = [
    "predictor_current",
    "predictor_fit",
    "predictor_load",
    "predictor_request",
    "profile_done",
    "profile_record",
    "sweep_cancel",
    "sweep_execution",
    "sweep_start",
    "sweep_watchdog",
    "workload_ensure",
    "workload_request",
]
