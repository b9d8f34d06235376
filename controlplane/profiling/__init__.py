"""Profiling: workload features of models, profile sweeps and samples, fitted predictors."""
