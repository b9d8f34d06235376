"""Profiling: sweeps of co-located mixes and standalone measurements (:mod:`workers.profiling.sweep`)
and the host probes (speed, cross-core round trips).

The process a sweep measures with (:mod:`workers.training.profiler`) and the workload features
(:mod:`workers.training.features`) live in :mod:`workers.training`, below this package: the
trainer runs profile jobs in its warm processes and the simulated backend needs the features, so
neither may import profiling.
"""
