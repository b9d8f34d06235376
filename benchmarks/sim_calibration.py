"""Calibration: the ``simulated`` backend's model against real GPU measurements.

    python benchmarks/sim_calibration.py [--quick] [--fit] [--data DIR] [--miso DIR] [--gavel DIR] [--h200 DIR]

Three data sets measured by others and one of this project's, vendored in
``benchmarks/reference-data/`` (MIT licences; its README describes them):

- **ParvaGPU** (``parvagpu-a100``, SC'24): inference of torchvision models on an A100 80GB, in
  MIG instances of 1, 2, 3, 4 and 7 GPCs, with 1 to 5 identical processes per instance under MPS
  (each at the MPS default, 100 % of the instance). Throughput there is per process. The four
  models also in the zoo are compared: resnet50, resnet101, vgg16, densenet121, at 224×224
  with 1000 classes, in the model's ``inference`` mode (forward FLOPs, one kernel per layer).
  A MIG instance of ``g`` GPCs is simulated as a device of ``14·g`` SMs, ``g/7`` of the
  compute, its memory slices' share of the bandwidth (1/8, 2/8, 4/8, 4/8, 8/8) and memory.
  PyTorch runs convolutions in TF32 on Ampere by default, so the compute peak is the TF32 one
  (156 TFLOP/s) times a fitted efficiency.
- **MISO** (``miso-a100-mig``, SoCC'22): TensorFlow/Keras training jobs alone on MIG slices of
  an A100 40GB (``1g.5gb`` … ``7g.40gb``), samples/s by slice and batch size. Only Keras
  ResNet50 on CIFAR-10 has a zoo counterpart (``resnet50`` at 32×32, 10 classes,
  :data:`MISO_ZOO`); the other jobs are left out and counted (:data:`MISO_LEFT_OUT`). Slices
  as for ParvaGPU on the ``a100-40gb`` preset, training mode, TF32 peak (TensorFlow's default
  on Ampere).
- **Gavel** (``gavel-p100-k80``, OSDI'20): PyTorch training jobs on a P100 and a K80 die, alone
  and co-located in pairs. ResNet-18 (CIFAR-10) and ResNet-50 (ImageNet) have zoo counterparts
  (:data:`GAVEL_ZOO`); pairs with another job are left out and counted. A pair is simulated on
  the ``p100``/``k80`` preset as two tasks at 100 % under the ``mps`` law (whether Gavel's runs
  had MPS on is not recorded; ``timeslice`` is printed beside it).
- **mtfl H200** (``mtfl-h200``, this project's ``benchmarks/gpu_check.py`` on one H200,
  2026-12-04): eager PyTorch training at 32×32 of resnet18, mobilenet_v3_large,
  shufflenet_v2_x1_0 and resnet50, alone and co-located under MPS (profiling configurations)
  and the light mix's measured plans of ``temporal`` (time slicing), ``isolation``,
  ``sharing`` and ``vres_greedy``. Every configuration was host-bound. Simulated on the
  ``h200`` preset, eager, each task's launch term its counted operations per step times a
  host time per operation.

Printed:

1. Shape checks on the simulation over every ParvaGPU configuration, and on the measurements
   for comparison: (a) one process's throughput grows with the batch size and saturates
   (the last doubling gains < 15 %); (b) per-process throughput falls as co-located processes
   are added; (c) the total of ``k`` processes lies between 1× and ``k``× one process's.
2. Per model, at the full A100 (7 GPCs): throughput of one process against the batch size
   (measured / simulated), and the per-process ratio ``P_k / P_1`` for k = 2..5 at batch
   sizes 1, 8, 32, 128 (measured / simulated).
3. Errors over every ParvaGPU configuration, with the module's constants: RMSLE of the
   absolute per-process throughput, and of the two shapes (``P_1(B) / max_B P_1`` and
   ``P_k / P_1``).
4. The paper's three mixes on the Titan V (CIFAR-10 training, batch 128): speedup in raw and
   fair throughput of ``isolation``, ``sharing`` and the best 10 %-grid shares over
   ``temporal``. The paper reports 2.16-2.38× raw for its planner (Yu et al. 2022, Fig. 4).
   (Left out with ``--quick``.)
5. Held out, per data set: constants fitted on one part, the RMSLE (root mean squared log
   ratio, simulated against measured) on the other. The split is deterministic: the data
   set's groups sorted, every other one held out, starting with the second
   (:func:`held_out_groups`). The quantity each data set measures, and its groups:

   - ParvaGPU: per-process samples/s of every (MIG size, batch, processes) configuration;
     groups (model, MIG size, batch). Fitted: the grid of ``--fit`` (device-level
     ``kernel_s`` and TF32 efficiency, global WIDTH_HALF, INTENSITY_HALF, SMOOTH_MAX_P,
     RECLAIM, CONTENTION).
   - MISO: training samples/s of every (slice, batch) row, absolute (its slice shape
     ``P(g)/P(7g)`` printed beside); groups (model, batch): whole curves over the slices are
     held out. Fitted: the device-level ``kernel_s`` and TF32 efficiency only; the global
     constants stay the module's.
   - Gavel: each job's co-located over alone throughput (one value for a job beside a copy
     of itself); groups (GPU, pair). Fitted: per GPU the device-level ``kernel_s``, and the
     global RECLAIM and CONTENTION. Beside it: the module's constants unfitted, time slicing,
     and the predictor's physical baseline (``P_solo · ρ`` with the pooled physics' sharing
     rate, controlplane/planning/predictor/physics/gpu.py: ``ρ = 1/2`` for two tasks at 100 %).

   - mtfl H200: each task's samples/s in each profiled configuration and measured plan;
     groups (run, configuration or plan). Fitted: the device-level ``host_op_s`` only (the
     data are host-bound and say nothing of the device's own speed). Beside it: the ``h200``
     preset as shipped and the per-layer launch term of the other presets.

   Device-level constants are :class:`~workers.backends.simulated.DeviceSpec` fields, so a
   fit can become a preset's; global constants are the module's, shared by every device: the
   held-out fits change them only inside the benchmark (:func:`module_constants`), never the
   backend's.

6. The H200 set in detail: the held-out tasks measured against simulated, each strategy's raw
   throughput (its plan's tasks summed, mean over the runs that measured it) and the two
   orderings of the strategies: neighbours further apart than the measured run-to-run spread
   of a strategy (:func:`tie_tolerance`) are ordered (``>``), closer ones tied (``~``). The
   simulator predicts the ordering when every pair of strategies compares the same way
   (faster, slower or tied) in both, with the ``h200`` preset.

Last lines, ``name=value``: each data set's held-out RMSLE, whether the simulator predicts the
H200 ordering of the strategies (with both orderings), the predictor baseline's RMSLE on Gavel,
and ``sim_calibration_worst_rmsle``, the worst data set's (target ≤ 0.15).

``--fit`` first searches the model constants on all of ParvaGPU (the grid above) for the lowest
RMSLE of the absolute per-process throughput plus that of the co-location shape, prints the
best, then reports sections 1-4 with them. The module's constants are the result of this
search. ``--quick`` uses small grids in section 5 and skips section 4 (seconds, for tests).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import dataclasses
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.backends import simulated as sim  # noqa: E402

MODELS = ["resnet50", "resnet101", "vgg16", "densenet121"]
GPC_SMS = 14
MEMORY_SLICES = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
A100_TF32_FLOPS = 156e12
MAX_K = 5
PAPER_MIXES = {
    "D121+V16+R101 (heavy)": ["densenet121", "vgg16", "resnet101"],
    "R18+M3+S2 (light)": ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"],
    "R50+V16+M3 (mixed)": ["resnet50", "vgg16", "mobilenet_v3_large"],
}


def default_data() -> Path:
    """The vendored ParvaGPU profiles (``benchmarks/reference-data/parvagpu-a100``)."""
    return Path(__file__).resolve().parent / "reference-data" / "parvagpu-a100"


def load(data: Path) -> dict[str, dict[tuple[int, int, int], float]]:
    """``{model: {(gpcs, batch, processes): per-process samples/s}}``; zero rows (out of memory
    or not measured) left out."""
    table = {}
    for model in MODELS:
        rows = {}
        with open(data / f"{model}.csv", newline="") as handle:
            for row in csv.DictReader(handle):
                throughput = float(row["Throughput"])
                if throughput > 0:
                    key = (int(row["Mig instance"]), int(row["Batch size"]), int(row["Workload Number"]))
                    rows[key] = throughput
        table[model] = rows
    return table


def mig_slice(
    preset: str, memory_slices: dict[int, int], gpcs: int, kernel_s: float, efficiency: float
) -> sim.DeviceSpec:
    """A MIG slice of ``gpcs`` of an A100 preset's 7 GPCs: ``14·gpcs`` SMs, ``gpcs/7`` of the
    TF32 peak (PyTorch's convolutions and TensorFlow both run TF32 on Ampere by default) and its
    memory slices' share (``memory_slices[gpcs]`` of 8) of the bandwidth and memory."""
    a100 = sim.device_spec(preset)
    slices = memory_slices[gpcs]
    return dataclasses.replace(
        a100,
        name=f"{preset}-{gpcs}g",
        peak_flops=A100_TF32_FLOPS * gpcs / 7,
        sms=GPC_SMS * gpcs,
        memory_bandwidth=a100.memory_bandwidth * slices / 8,
        memory_bytes=a100.memory_bytes * slices / 8,
        kernel_s=kernel_s,
        flops_efficiency=efficiency,
    )


def mig_device(gpcs: int, kernel_s: float, efficiency: float) -> sim.DeviceSpec:
    """A MIG slice of the ParvaGPU host, the ``a100-80gb`` preset (:func:`mig_slice`)."""
    return mig_slice("a100-80gb", MEMORY_SLICES, gpcs, kernel_s, efficiency)


def inference_workloads() -> dict[str, tuple[float, float, float, int]]:
    from workers.training.features import leaf_module_count, workload_features

    out = {}
    for model in MODELS:
        f = workload_features(model, 1000, (3, 224, 224))
        out[model] = (
            f.forward_flops_per_sample,
            f.activation_bytes_per_sample,
            float(f.param_bytes),
            leaf_module_count(model, 1000, (3, 224, 224)),
        )
    return out


def simulate_reference(table, workloads, kernel_s: float, efficiency: float):
    """Simulated per-process throughput for every key of ``table``: ``{model: {key: sps}}``."""
    out = {}
    for model, rows in table.items():
        flops, act, params, layers = workloads[model]
        by_gpcs: dict[int, list[tuple[int, int, int]]] = {}
        for key in rows:
            by_gpcs.setdefault(key[0], []).append(key)
        result = {}
        for gpcs, keys in by_gpcs.items():
            batch = np.array([[k[1]] * MAX_K for k in keys], dtype=float)
            present = np.array([[j < k[2] for j in range(MAX_K)] for k in keys])
            prediction = sim.simulate_throughput(
                flops,
                act,
                params,
                layers,
                batch,
                100,
                mig_device(gpcs, kernel_s, efficiency),
                present=present,
                inference=True,
            )
            for key, sps in zip(keys, prediction.throughput_sps[:, 0], strict=True):
                result[key] = float(sps)
        out[model] = result
    return out


def rmsle(pairs) -> float:
    pairs = [(a, b) for a, b in pairs if a > 0 and b > 0 and math.isfinite(b)]
    return math.sqrt(sum((math.log(a) - math.log(b)) ** 2 for a, b in pairs) / len(pairs))


def shape_pairs(table, simulated):
    """(measured, simulated) pairs of the two normalised shapes."""
    batch_shape, k_shape = [], []
    for model, rows in table.items():
        s = simulated[model]
        for gpcs in sorted({k[0] for k in rows}):
            singles = {k[1]: v for k, v in rows.items() if k[0] == gpcs and k[2] == 1}
            top_m = max(singles.values())
            top_s = max(s[(gpcs, b, 1)] for b in singles)
            batch_shape += [(v / top_m, s[(gpcs, b, 1)] / top_s) for b, v in singles.items()]
            for (g, b, k), v in rows.items():
                if g == gpcs and k > 1 and (g, b, 1) in rows:
                    k_shape.append((v / rows[(g, b, 1)], s[(g, b, k)] / s[(g, b, 1)]))
    return batch_shape, k_shape


def shape_checks(rows: dict[tuple[int, int, int], float]) -> dict[str, tuple[int, int]]:
    """``{check: (passed, total)}`` over one model's configurations."""
    grow, saturate, fall, bounded = [0, 0], [0, 0], [0, 0], [0, 0]
    for gpcs in sorted({k[0] for k in rows}):
        singles = sorted((b, v) for (g, b, k), v in rows.items() if g == gpcs and k == 1)
        for (_, a), (_, b) in itertools.pairwise(singles):
            grow[0] += b >= a * 0.98  # a measured 2 % dip is noise, not a trend
            grow[1] += 1
        if len(singles) >= 2:
            saturate[0] += singles[-1][1] / singles[-2][1] < 1.15
            saturate[1] += 1
        for batch in sorted({k[1] for k in rows if k[0] == gpcs}):
            series = [rows.get((gpcs, batch, k)) for k in range(1, MAX_K + 1)]
            series = [v for v in series if v is not None]
            for a, b in itertools.pairwise(series):
                fall[0] += b <= a * 1.02
                fall[1] += 1
            for k, v in enumerate(series[1:], start=2):
                ratio = k * v / series[0]
                bounded[0] += 0.98 <= ratio <= k * 1.02
                bounded[1] += 1
    return {
        "(a) grows with batch": tuple(grow),
        "(a) saturates": tuple(saturate),
        "(b) per-process falls with k": tuple(fall),
        "(c) 1x <= total <= kx": tuple(bounded),
    }


def report_checks(table, simulated) -> None:
    print("1. Shape checks (passed/total over all MIG sizes; measured shown for comparison)")
    totals_m: dict[str, list[int]] = {}
    totals_s: dict[str, list[int]] = {}
    for model in MODELS:
        measured = shape_checks(table[model])
        modelled = shape_checks(simulated[model])
        for name in measured:
            totals_m.setdefault(name, [0, 0])
            totals_s.setdefault(name, [0, 0])
            for acc, value in ((totals_m[name], measured[name]), (totals_s[name], modelled[name])):
                acc[0] += value[0]
                acc[1] += value[1]
    for name in totals_m:
        s, m = totals_s[name], totals_m[name]
        verdict = "PASS" if s[0] == s[1] else "FAIL"
        print(f"   {name:32s} simulated {s[0]:3d}/{s[1]:<3d} {verdict}   measured {m[0]:3d}/{m[1]:<3d}")


def report_curves(table, simulated) -> None:
    print("\n2. Full A100 (7 GPCs), measured / simulated")
    for model in MODELS:
        rows, s = table[model], simulated[model]
        singles = sorted(b for (g, b, k) in rows if g == 7 and k == 1)
        print(f"   {model}: one process, samples/s by batch size")
        print("     B   " + " ".join(f"{b:>11d}" for b in singles))
        print("     P_1 " + " ".join(f"{rows[(7, b, 1)]:5.0f}/{s[(7, b, 1)]:<5.0f}" for b in singles))
        print("     per-process P_k/P_1 (measured/simulated)")
        for batch in (1, 8, 32, 128):
            if (7, batch, 1) not in rows:
                continue
            cells = []
            for k in range(2, MAX_K + 1):
                if (7, batch, k) in rows:
                    cells.append(
                        f"k{k} {rows[(7, batch, k)] / rows[(7, batch, 1)]:.2f}/"
                        f"{s[(7, batch, k)] / s[(7, batch, 1)]:.2f}"
                    )
            print(f"     B={batch:<4d}" + "  ".join(cells))


def report_errors(table, simulated) -> None:
    absolute = [(v, simulated[m][k]) for m, rows in table.items() for k, v in rows.items()]
    batch_shape, k_shape = shape_pairs(table, simulated)
    print(f"\n3. RMSLE over every reference configuration ({len(absolute)} per-process throughputs)")
    print(f"   absolute per-process throughput        {rmsle(absolute):.3f}")
    print(f"   batch shape P_1(B)/max P_1             {rmsle(batch_shape):.3f}")
    print(f"   co-location shape P_k/P_1              {rmsle(k_shape):.3f}")
    for model in MODELS:
        pairs = [(v, simulated[model][k]) for k, v in table[model].items()]
        print(f"     {model:12s} absolute {rmsle(pairs):.3f}")


def report_paper() -> None:
    print(
        "\n4. The paper's mixes on the Titan V (CIFAR-10 training, batch 128); "
        "speedup over temporal, raw / fair throughput"
    )
    device = sim.device_spec("titan-v")
    grid = np.arange(10, 101, 10)
    for label, models in PAPER_MIXES.items():
        loads = [sim.simulation_workload(m) for m in models]
        cols = [
            np.array([getattr(w, f) for w in loads], dtype=float)
            for f in ("flops_per_sample", "activation_bytes_per_sample", "param_bytes", "layers")
        ]
        alone = np.array([sim.alone_throughput(w, 128, device) for w in loads])

        def run(shares, partitioning="mps", cols=cols):
            p = sim.simulate_throughput(*cols, 128, shares, device, partitioning=partitioning)
            return p.throughput_sps

        def metrics(p, alone=alone):
            return p.sum(axis=-1), (p / alone).sum(axis=-1)

        temporal_raw, temporal_fair = metrics(run(np.full(3, 100), "timeslice"))
        rows = {
            "isolation": metrics(run(np.full(3, 100 / 3))),
            "sharing": metrics(run(np.full(3, 100))),
        }
        shares = np.array(list(itertools.product(grid, repeat=3)), dtype=float)
        raw, fair = metrics(run(shares))
        best = int(np.argmax(raw))
        rows[f"best raw {tuple(int(x) for x in shares[best])}"] = (raw[best], fair[best])
        print(f"   {label}: alone {', '.join(f'{m} {a:.0f}' for m, a in zip(models, alone, strict=True))} samples/s")
        for name, (r, f) in rows.items():
            print(f"     {name:28s} {r / temporal_raw:.2f}x / {f / temporal_fair:.2f}x")


CONSTANTS = ("WIDTH_HALF", "INTENSITY_HALF", "SMOOTH_MAX_P", "RECLAIM", "CONTENTION")


def objective(table, simulated) -> float:
    """What ``--fit`` minimises: RMSLE of the absolute per-process throughput plus RMSLE of the
    co-location shape ``P_k / P_1`` (the contention the model is for)."""
    absolute = [(v, simulated[m][k]) for m, rows in table.items() for k, v in rows.items()]
    return rmsle(absolute) + rmsle(shape_pairs(table, simulated)[1])


def fit(table, workloads) -> tuple[float, float]:
    """Grid search of the constants for the lowest :func:`objective`; sets the module's
    constants and returns ``(kernel_s, tf32_efficiency)``."""
    best = (math.inf, None)
    grid = parvagpu_grid(quick=False)
    for kernel_s, eff, *constants in grid:
        for name, value in zip(CONSTANTS, constants, strict=True):
            setattr(sim, name, value)
        simulated = simulate_reference(table, workloads, kernel_s, eff)
        error = objective(table, simulated)
        if error < best[0]:
            best = (error, (kernel_s, eff, *constants))
    kernel_s, eff, *constants = best[1]
    for name, value in zip(CONSTANTS, constants, strict=True):
        setattr(sim, name, value)
    print(
        f"fit: objective {best[0]:.3f} with kernel_s={kernel_s * 1e6:.0f} us, TF32 efficiency "
        f"{eff}, " + ", ".join(f"{n}={v}" for n, v in zip(CONSTANTS, constants, strict=True)) + "\n"
    )
    return kernel_s, eff


# ------------------------------------------------------------------ held-out calibration


def held_out_groups(groups) -> set:
    """The held-out part of a data set: every other group in sorted order, starting with the
    second (deterministic, no seed; about half the groups). The fit sees the others."""
    ordered = sorted(set(groups))
    return set(ordered[1::2])


@contextlib.contextmanager
def module_constants(**values: float):
    """Set the simulator's global constants (names of :data:`CONSTANTS`) for a block, then put
    the old values back: the backend's constants never change behind the report's back."""
    old = {name: getattr(sim, name) for name in values}
    try:
        for name, value in values.items():
            setattr(sim, name, value)
        yield
    finally:
        for name, value in old.items():
            setattr(sim, name, value)


def msle(pairs) -> tuple[float, int]:
    """(sum of squared log ratios, count) over finite positive pairs: RMSLEs of unions add up."""
    pairs = [(a, b) for a, b in pairs if a > 0 and b > 0 and math.isfinite(b)]
    return sum((math.log(a) - math.log(b)) ** 2 for a, b in pairs), len(pairs)


def device_grid(quick: bool) -> tuple[np.ndarray, np.ndarray]:
    """The device-level constants the MISO and Gavel fits search: ``kernel_s`` from 10 to
    160 µs and ``flops_efficiency`` from 0.05 to 0.8, each a geometric grid of ratio
    ``2^(1/4)`` (17 values), or ``2^(1/2)`` quick (9 values)."""
    steps = 2.0 ** (np.arange(0, 17, 2 if quick else 1) / 4)
    return 10e-6 * steps, 0.05 * steps


# ParvaGPU -----------------------------------------------------------------------------


def parvagpu_group(model: str, key: tuple[int, int, int]) -> tuple[str, int, int]:
    """The unit of ParvaGPU's split: a model's batch size on one MIG size, all its process
    counts together (the co-location series stays whole on one side)."""
    return (model, key[0], key[1])


def parvagpu_split(table):
    """``(fit, held_out)`` tables of the same shape as ``table``, by :func:`held_out_groups`
    over :func:`parvagpu_group`."""
    held = held_out_groups(parvagpu_group(m, k) for m, rows in table.items() for k in rows)
    fit_part = {m: {k: v for k, v in rows.items() if parvagpu_group(m, k) not in held} for m, rows in table.items()}
    held_part = {m: {k: v for k, v in rows.items() if parvagpu_group(m, k) in held} for m, rows in table.items()}
    return fit_part, held_part


def parvagpu_grid(quick: bool):
    """The constants :func:`fit` searches: ``(kernel_s, TF32 efficiency, *CONSTANTS)``; quick:
    the module's values and one neighbour of the two device-level ones."""
    if quick:
        return itertools.product((20e-6, 30e-6), (0.5,), *[(getattr(sim, n),) for n in CONSTANTS])
    return itertools.product(
        (20e-6, 30e-6, 40e-6),  # kernel_s
        (0.45, 0.5, 0.55),  # TF32 efficiency at long reductions
        (1.0, 2.0, 3.0),  # WIDTH_HALF
        (250.0, 500.0, 1000.0),  # INTENSITY_HALF
        (3.0, 4.0),  # SMOOTH_MAX_P
        (0.4, 0.6, 0.8),  # RECLAIM
        (0.15, 0.3, 0.5),  # CONTENTION
    )


def parvagpu_held_out(table, workloads, quick: bool) -> dict:
    """Fit on one part of ParvaGPU (:func:`parvagpu_split`), score on the other; the quantity is
    the per-process throughput of every (MIG size, batch, processes) configuration."""
    fit_part, held_part = parvagpu_split(table)
    best = (math.inf, None)
    for kernel_s, eff, *constants in parvagpu_grid(quick):
        with module_constants(**dict(zip(CONSTANTS, constants, strict=True))):
            error = objective(fit_part, simulate_reference(fit_part, workloads, kernel_s, eff))
        if error < best[0]:
            best = (error, (kernel_s, eff, *constants))
    kernel_s, eff, *constants = best[1]
    fitted = dict(zip(CONSTANTS, constants, strict=True))
    with module_constants(**fitted):
        simulated = simulate_reference(held_part, workloads, kernel_s, eff)
    absolute = [(v, simulated[m][k]) for m, rows in held_part.items() for k, v in rows.items()]
    as_shipped = simulate_reference(held_part, workloads, 30e-6, 0.5)
    shipped = [(v, as_shipped[m][k]) for m, rows in held_part.items() for k, v in rows.items()]
    return {
        "fit": sum(len(r) for r in fit_part.values()),
        "held_out": len(absolute),
        "kernel_s": kernel_s,
        "tf32_efficiency": eff,
        "constants": fitted,
        "rmsle": rmsle(absolute),
        "rmsle_colocation_shape": rmsle(shape_pairs(held_part, simulated)[1]),
        "rmsle_module_constants": rmsle(shipped),
    }


# MISO ---------------------------------------------------------------------------------

MISO_ZOO = {"resnet": ("resnet50", 10, (3, 32, 32))}
"""MISO's jobs the zoo has: Keras ResNet50 on CIFAR-10 is the zoo's ``resnet50`` at 32×32, 10
classes (same stages and strides; Keras' v1 puts the stride on the 1×1 convolution, torchvision's
v1.5 on the 3×3, the same FLOPs to a few percent)."""
MISO_LEFT_OUT = {
    "mobilenet": "Keras MobileNetV2: the zoo has MobileNetV3, another network",
    "bert": "no transformer in the zoo",
    "transformer": "no transformer in the zoo",
    "cyclegan": "no GAN in the zoo",
    "deepspeech2": "no recurrent speech model in the zoo",
    "embedding": "no embedding model in the zoo",
    "gnn": "no graph network in the zoo",
}
"""MISO's jobs left out, and why."""
A100_40GB_MIG_MEMORY = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
"""Memory slices (of 8) of the A100 40GB's MIG profiles ``1g.5gb`` … ``7g.40gb``."""


class MisoRow(NamedTuple):
    """One MISO measurement: a training job alone on a MIG slice of an A100 40GB.

    Attributes:
        model: MISO's job name (``resnet``, ``mobilenet``, ``bert``, …).
        gpcs: the slice's GPCs of 7 (7: the whole GPU).
        batch_size: samples per iteration.
        samples_per_s: ``batch_size`` over the median iteration time.
    """

    model: str
    gpcs: int
    batch_size: int
    samples_per_s: float


def default_miso_data() -> Path:
    """The vendored MISO measurements (``benchmarks/reference-data/miso-a100-mig``)."""
    return Path(__file__).resolve().parent / "reference-data" / "miso-a100-mig"


def load_miso(data: Path) -> list[MisoRow]:
    """Every row of ``training_iterations.csv`` in ``data`` (all models; zero throughputs left
    out).

    Raises:
        FileNotFoundError: no ``training_iterations.csv`` in ``data``.
        ValueError: a row whose ``gpcs`` is not a MIG profile's (1, 2, 3, 4, 7).
    """
    rows = []
    with open(data / "training_iterations.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            gpcs = int(row["gpcs"])
            if gpcs not in A100_40GB_MIG_MEMORY:
                raise ValueError(f"gpcs must be one of 1, 2, 3, 4, 7; got {gpcs} in {row}")
            sps = float(row["samples_per_s"])
            if sps > 0:
                rows.append(MisoRow(row["model"], gpcs, int(row["batch_size"]), sps))
    return rows


def miso_group(row: MisoRow) -> tuple[str, int]:
    """The unit of MISO's split: a model's batch size, its whole curve over the slices."""
    return (row.model, row.batch_size)


def a100_40gb_slice(gpcs: int, kernel_s: float, efficiency: float) -> sim.DeviceSpec:
    """A MIG slice of MISO's host, the ``a100-40gb`` preset (:func:`mig_slice`)."""
    return mig_slice("a100-40gb", A100_40GB_MIG_MEMORY, gpcs, kernel_s, efficiency)


def simulate_miso(rows: list[MisoRow], kernel_s: float, efficiency: float, device=None) -> list[float]:
    """Simulated training samples/s of each row (mapped models only), alone on its slice;
    ``device(gpcs)`` overrides the slice (default :func:`a100_40gb_slice`)."""
    out = []
    for row in rows:
        architecture, classes, shape = MISO_ZOO[row.model]
        w = sim.simulation_workload(architecture, classes, shape)
        spec = device(row.gpcs) if device else a100_40gb_slice(row.gpcs, kernel_s, efficiency)
        out.append(sim.alone_throughput(w, row.batch_size, spec) or math.nan)
    return out


def miso_shape(rows: list[MisoRow], values: list[float]) -> list[tuple[MisoRow, float]]:
    """Each row's value over the same model and batch size's value on the whole GPU (7 GPCs),
    for the rows below 7 GPCs that have a whole-GPU row."""
    full = {(r.model, r.batch_size): v for r, v in zip(rows, values, strict=True) if r.gpcs == 7}
    return [
        (r, v / full[(r.model, r.batch_size)])
        for r, v in zip(rows, values, strict=True)
        if r.gpcs < 7 and (r.model, r.batch_size) in full
    ]


def miso_held_out(rows: list[MisoRow], quick: bool) -> dict:
    """Fit the device-level constants (``kernel_s``, TF32 efficiency) on one part of MISO's
    mapped rows, score on the other; the quantity is the training samples/s of each (slice,
    batch) row, absolute."""
    mapped = [r for r in rows if r.model in MISO_ZOO]
    held = held_out_groups(miso_group(r) for r in mapped)
    fit_rows = [r for r in mapped if miso_group(r) not in held]
    held_rows = [r for r in mapped if miso_group(r) in held]
    kernels, efficiencies = device_grid(quick)
    best = (math.inf, None)
    measured_fit = [r.samples_per_s for r in fit_rows]
    for kernel_s, eff in itertools.product(kernels, efficiencies):
        error = rmsle(zip(measured_fit, simulate_miso(fit_rows, kernel_s, eff), strict=True))
        if error < best[0]:
            best = (error, (kernel_s, eff))
    kernel_s, eff = best[1]
    simulated = simulate_miso(held_rows, kernel_s, eff)
    measured = [r.samples_per_s for r in held_rows]
    shape_m = miso_shape(held_rows, measured)
    shape_s = miso_shape(held_rows, simulated)
    preset = sim.device_spec("a100-40gb")

    def preset_slice(gpcs: int) -> sim.DeviceSpec:
        slices = A100_40GB_MIG_MEMORY[gpcs]
        return dataclasses.replace(
            preset,
            peak_flops=preset.peak_flops * gpcs / 7,
            sms=GPC_SMS * gpcs,
            memory_bandwidth=preset.memory_bandwidth * slices / 8,
            memory_bytes=preset.memory_bytes * slices / 8,
        )

    unfitted = simulate_miso(held_rows, 0.0, 0.0, device=preset_slice)
    left_out: dict[str, int] = {}
    for r in rows:
        if r.model not in MISO_ZOO:
            left_out[r.model] = left_out.get(r.model, 0) + 1
    return {
        "fit": len(fit_rows),
        "held_out": len(held_rows),
        "held_out_batches": sorted({r.batch_size for r in held_rows}),
        "left_out": left_out,
        "kernel_s": kernel_s,
        "tf32_efficiency": eff,
        "rmsle": rmsle(zip(measured, simulated, strict=True)),
        "rmsle_slice_shape": rmsle((a[1], b[1]) for a, b in zip(shape_m, shape_s, strict=True)),
        "rmsle_preset_defaults": rmsle(zip(measured, unfitted, strict=True)),
        "rows": [(r, m, s) for r, m, s in zip(held_rows, measured, simulated, strict=True)],
    }


# Gavel --------------------------------------------------------------------------------

GAVEL_ZOO = {
    "ResNet-18": ("resnet18", 10, (3, 128, 128)),
    "ResNet-50": ("resnet50", 1000, (3, 224, 224)),
}
"""Gavel's jobs the zoo has. ResNet-50 is ImageNet at 224×224. Gavel's ResNet-18 is the CIFAR-10
variant (3×3 stem, no max-pool, stages at 32, 16, 8, 4 pixels); the zoo's torchvision
``resnet18`` at 128×128 has the same stages at the same sizes (its stem and max-pool divide by
4), so that is the input shape used: 3.5 GFLOP per trained sample against the CIFAR variant's
3.3. At 32×32 the zoo's model would do 16× less work than Gavel's did."""
GAVEL_LEFT_OUT = {
    "Transformer": "no transformer in the zoo",
    "LM": "no recurrent language model in the zoo",
    "Recommendation": "no recommendation model in the zoo",
    "A3C": "no reinforcement-learning model in the zoo",
    "CycleGAN": "no GAN in the zoo",
}
"""Gavel's jobs left out, and why."""
GAVEL_GPUS = ("p100", "k80")


class GavelJob(NamedTuple):
    """A Gavel job type: its name (``ResNet-18``, ``LM``, …) and batch size (0: none given)."""

    name: str
    batch_size: int


class GavelPair(NamedTuple):
    """Two jobs measured together on one GPU (scale 1), in steps/s.

    Attributes:
        gpu: ``p100`` or ``k80``.
        jobs: the two job types, sorted (the same type twice for a job beside a copy of itself).
        colocated: each job's steps/s beside the other.
        alone: each job's steps/s alone on the GPU.
    """

    gpu: str
    jobs: tuple[GavelJob, GavelJob]
    colocated: tuple[float, float]
    alone: tuple[float, float]

    @property
    def ratios(self) -> tuple[float, ...]:
        """Co-located over alone throughput, one per job; one for a job beside itself (the
        two copies are recorded as equal)."""
        both = tuple(c / a for c, a in zip(self.colocated, self.alone, strict=True))
        return both[:1] if self.jobs[0] == self.jobs[1] else both


def default_gavel_data() -> Path:
    """The vendored Gavel throughputs (``benchmarks/reference-data/gavel-p100-k80``)."""
    return Path(__file__).resolve().parent / "reference-data" / "gavel-p100-k80"


def _gavel_job(label: str) -> GavelJob:
    match = re.fullmatch(r"(.+) \(batch size (\d+)\)", label)
    return GavelJob(match[1], int(match[2])) if match else GavelJob(label, 0)


def load_gavel(data: Path) -> tuple[list[GavelPair], dict[str, int]]:
    """The scale-1 pairs of ``throughputs.json`` in ``data``, each unordered pair once, and how
    many were left out by reason: ``failed`` (``[0, 0]``: failed or out of memory),
    ``placeholder`` (a co-located value equal to the job's alone value exactly) and
    ``no alone value``.

    Raises:
        FileNotFoundError: no ``throughputs.json`` in ``data``.
        ValueError: a GPU other than ``p100``/``k80``, or a pair whose two entries disagree.
    """
    raw = json.loads((data / "throughputs.json").read_text())
    pairs, left_out = [], {"failed": 0, "placeholder": 0, "no alone value": 0}
    for gpu, jobs in raw.items():
        if gpu not in GAVEL_GPUS:
            raise ValueError(f"gpu must be one of {', '.join(GAVEL_GPUS)}; got {gpu!r}")
        alone = {}
        for key, entry in jobs.items():
            label, scale = ast.literal_eval(key)
            if scale == 1:
                alone[label] = entry["null"]
        for key, entry in jobs.items():
            label, scale = ast.literal_eval(key)
            if scale != 1:
                continue
            for other_key, values in entry.items():
                if other_key == "null":
                    continue
                other, _ = ast.literal_eval(other_key)
                a, b = _gavel_job(label), _gavel_job(other)
                if b < a:
                    mirrored = jobs[other_key].get(key)
                    if mirrored is not None and list(mirrored) != list(values)[::-1]:
                        raise ValueError(f"{gpu}: the pair {label} + {other} is recorded twice, differently")
                    continue
                if list(values) == [0.0, 0.0]:
                    left_out["failed"] += 1
                elif not (alone.get(label, 0) > 0 and alone.get(other, 0) > 0):
                    left_out["no alone value"] += 1
                elif values[0] == alone[label] or values[1] == alone[other]:
                    left_out["placeholder"] += 1
                else:
                    pairs.append(GavelPair(gpu, (a, b), (values[0], values[1]), (alone[label], alone[other])))
    return pairs, left_out


def gavel_group(pair: GavelPair) -> tuple[str, GavelJob, GavelJob]:
    """The unit of Gavel's split: one pair on one GPU (both its jobs on the same side)."""
    return (pair.gpu, *pair.jobs)


def gavel_device(gpu: str, kernel_s: float, efficiency: float) -> sim.DeviceSpec:
    """The ``p100`` or ``k80`` preset with the given host and compute constants (PyTorch trains
    in fp32 on both)."""
    return dataclasses.replace(sim.device_spec(gpu), kernel_s=kernel_s, flops_efficiency=efficiency)


def gavel_columns(pairs: list[GavelPair]):
    """The simulator's per-task inputs for ``pairs``, ``(n, 2)`` each."""
    loads = [[sim.simulation_workload(*GAVEL_ZOO[j.name]) for j in p.jobs] for p in pairs]
    cols = [
        np.array([[getattr(w, f) for w in pair] for pair in loads], dtype=float)
        for f in ("flops_per_sample", "activation_bytes_per_sample", "param_bytes", "layers")
    ]
    batch = np.array([[j.batch_size for j in p.jobs] for p in pairs], dtype=float)
    return cols, batch


def simulate_gavel_ratios(pairs: list[GavelPair], device: sim.DeviceSpec, partitioning: str = "mps") -> np.ndarray:
    """``(n, 2)`` simulated co-located over alone throughput of each pair's jobs on ``device``,
    both at 100 % (NaN where the simulator finds no room in memory)."""
    cols, batch = gavel_columns(pairs)
    together = sim.simulate_throughput(*cols, batch, 100, device, partitioning=partitioning).throughput_sps
    alone = np.stack(
        [
            sim.simulate_throughput(*cols, batch, 100, device, present=np.arange(2) == i).throughput_sps[:, i]
            for i in range(2)
        ],
        axis=1,
    )
    ratios: np.ndarray = together / alone
    return ratios


def ratio_pairs(pairs: list[GavelPair], simulated: np.ndarray) -> list[tuple[float, float]]:
    """(measured, simulated) ratios, one or two per pair as :attr:`GavelPair.ratios`."""
    return [
        (m, float(s))
        for pair, row in zip(pairs, simulated, strict=True)
        for m, s in zip(pair.ratios, row, strict=False)
    ]


def predictor_ratios(pairs: list[GavelPair]) -> np.ndarray:
    """The predictor's physical baseline for each pair, ``(n, 2)``: ``P_i = P_solo · ρ_i``
    (controlplane.planning.predictor.physical) with ``ρ`` the pooled (MPS) physics' sharing
    rate (physics/gpu.py) at 100 % each, while ``P_solo`` at the whole device is the alone
    throughput: the co-located over alone ratio is ``ρ``."""
    from controlplane.planning.predictor.physics import sharing_rate

    rates = []
    for pair in pairs:
        units = int(sim.device_spec(pair.gpu).sms)
        share = np.array([[100.0, 100.0]])
        rates.append(sharing_rate(share, np.ones((1, 2), dtype=bool), units, "pooled")[0])
    return np.array(rates)


def gavel_held_out(pairs: list[GavelPair], quick: bool, left_out: dict[str, int] | None = None) -> dict:
    """Fit on one part of Gavel's mapped pairs, score on the other; the quantity is each job's
    co-located over alone throughput. Fitted: per GPU the device-level ``kernel_s``, for both
    GPUs the global ``RECLAIM`` and ``CONTENTION``. ``flops_efficiency`` stays at
    :class:`DeviceSpec`'s default: a ratio depends on it and on ``kernel_s`` only through the
    balance of host and device time, so fitting both would fit one thing twice."""
    unmapped: dict[str, int] = {}
    mapped = []
    for p in pairs:
        missing = sorted({j.name for j in p.jobs if j.name not in GAVEL_ZOO})
        if missing:
            unmapped[" / ".join(missing)] = unmapped.get(" / ".join(missing), 0) + 1
        else:
            mapped.append(p)
    # Where the simulator refuses a pair for memory, it predicts no ratio: left out, counted.
    oom = set()
    for gpu in GAVEL_GPUS:
        on_gpu = [p for p in mapped if p.gpu == gpu]
        if on_gpu:
            cols, batch = gavel_columns(on_gpu)
            refused = sim.simulate_throughput(*cols, batch, 100, sim.device_spec(gpu)).oom.any(axis=1)
            oom |= {gavel_group(p) for p, r in zip(on_gpu, refused, strict=True) if r}
    kept = [p for p in mapped if gavel_group(p) not in oom]
    held = held_out_groups(gavel_group(p) for p in kept)
    fit_pairs = {g: [p for p in kept if p.gpu == g and gavel_group(p) not in held] for g in GAVEL_GPUS}
    held_pairs = {g: [p for p in kept if p.gpu == g and gavel_group(p) in held] for g in GAVEL_GPUS}

    kernels, _ = device_grid(quick)
    reclaims = (sim.RECLAIM,) if quick else (0.2, 0.4, 0.6, 0.8, 1.0)
    contentions = (sim.CONTENTION,) if quick else (0.0, 0.15, 0.3, 0.5, 1.0)
    eff = sim.DeviceSpec.flops_efficiency  # a ratio sees it only through the host/device balance, as kernel_s
    best = (math.inf, None)
    for reclaim, contention in itertools.product(reclaims, contentions):
        with module_constants(RECLAIM=reclaim, CONTENTION=contention):
            total, devices = 0.0, {}
            for gpu in GAVEL_GPUS:
                if not fit_pairs[gpu]:
                    continue
                scores = []
                for kernel_s in kernels:
                    ratios = simulate_gavel_ratios(fit_pairs[gpu], gavel_device(gpu, kernel_s, eff))
                    scores.append((msle(ratio_pairs(fit_pairs[gpu], ratios))[0], (kernel_s, eff)))
                error, devices[gpu] = min(scores)
                total += error
        if total < best[0]:
            best = (total, (reclaim, contention, devices))
    reclaim, contention, devices = best[1]

    def score(ratios_by_gpu) -> dict[str, float]:
        out = {g: rmsle(ratio_pairs(held_pairs[g], ratios_by_gpu[g])) for g in GAVEL_GPUS if held_pairs[g]}
        out["all"] = rmsle(p for g in GAVEL_GPUS if held_pairs[g] for p in ratio_pairs(held_pairs[g], ratios_by_gpu[g]))
        return out

    with module_constants(RECLAIM=reclaim, CONTENTION=contention):
        fitted = {g: simulate_gavel_ratios(held_pairs[g], gavel_device(g, *devices[g])) for g in devices}
    shipped = {g: simulate_gavel_ratios(held_pairs[g], sim.device_spec(g)) for g in GAVEL_GPUS if held_pairs[g]}
    timeslice = {
        g: simulate_gavel_ratios(held_pairs[g], sim.device_spec(g), "timeslice") for g in GAVEL_GPUS if held_pairs[g]
    }
    baseline = {g: predictor_ratios(held_pairs[g]) for g in GAVEL_GPUS if held_pairs[g]}
    measured = [m for g in GAVEL_GPUS for p in held_pairs[g] for m in p.ratios]
    return {
        "pairs": len(pairs),
        "left_out_by_loader": dict(left_out or {}),
        "unmapped": unmapped,
        "simulator_oom": len(oom),
        "fit": sum(len(v) for v in fit_pairs.values()),
        "held_out": sum(len(v) for v in held_pairs.values()),
        "held_out_ratios": len(measured),
        "devices": devices,
        "RECLAIM": reclaim,
        "CONTENTION": contention,
        "rmsle": score(fitted),
        "rmsle_module_constants": score(shipped),
        "rmsle_timeslice": score(timeslice),
        "rmsle_predictor_baseline": score(baseline),
        "measured_ratio_range": (min(measured), float(np.median(measured)), max(measured)),
    }


# mtfl H200 --------------------------------------------------------------------------------

H200_INPUT = (10, (3, 32, 32))
"""Classes and sample shape of every H200 measurement (CIFAR-10-shaped synthetic data)."""
H200_PARTITIONINGS = ("mps", "timeslice")
H200_STRATEGY_ORDER_TOLERANCE_DEFAULT = 0.1
"""Relative difference under which two strategies' raw throughputs count as tied when the
data set has no strategy measured twice to take the run-to-run spread from."""


class H200Row(NamedTuple):
    """One task measured on this project's H200 (``benchmarks/reference-data/mtfl-h200``).

    Attributes:
        run: the gpu_check run (``full_default``, ``light_short``).
        kind: ``profile`` (a sweep configuration) or ``plan`` (a strategy's measured plan).
        group: ``configNN`` or ``<mix>/<strategy>``.
        strategy: the plan's strategy, ``""`` for a profile row.
        partitioning: ``mps`` or ``timeslice``.
        task_index: the task's position in ``configuration``.
        configuration: every task of the configuration, ``(architecture, batch_size, share)``.
        samples_per_s: the task's measured throughput.
    """

    run: str
    kind: str
    group: str
    strategy: str
    partitioning: str
    task_index: int
    configuration: tuple[tuple[str, int, int], ...]
    samples_per_s: float


def default_h200_data() -> Path:
    """The vendored H200 measurements (``benchmarks/reference-data/mtfl-h200``)."""
    return Path(__file__).resolve().parent / "reference-data" / "mtfl-h200"


def load_h200(data: Path) -> list[H200Row]:
    """Every row of ``measurements.csv`` in ``data``.

    Raises:
        FileNotFoundError: no ``measurements.csv`` in ``data``.
        ValueError: a row whose ``partitioning`` is not ``mps``/``timeslice``, whose
            ``configuration`` cannot be read, or whose own task disagrees with it.
    """
    rows = []
    with open(data / "measurements.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["partitioning"] not in H200_PARTITIONINGS:
                raise ValueError(f"partitioning must be one of {', '.join(H200_PARTITIONINGS)}; got {row}")
            try:
                configuration = tuple(
                    (arch, int(batch), int(share))
                    for arch, batch, share in (task.split("@") for task in row["configuration"].split("+"))
                )
            except ValueError:
                raise ValueError(f"configuration must be arch@batch@share joined by '+'; got {row}") from None
            k = int(row["task_index"])
            own = (row["architecture"], int(row["batch_size"]), int(row["share"]))
            if not 0 <= k < len(configuration) or configuration[k] != own:
                raise ValueError(f"task {k} {own} is not the configuration's task {k}: {row}")
            rows.append(
                H200Row(
                    row["run"],
                    row["kind"],
                    row["group"],
                    row["strategy"],
                    row["partitioning"],
                    k,
                    configuration,
                    float(row["samples_per_s"]),
                )
            )
    return rows


def h200_group(row: H200Row) -> tuple[str, str]:
    """The unit of the H200 split: one measured configuration or plan of one run (its tasks
    stay together on one side)."""
    return (row.run, row.group)


def h200_device(host_op_s: float, base: str = "h200") -> sim.DeviceSpec:
    """The ``h200`` preset with host time per operation ``host_op_s`` (0: the per-layer
    ``kernel_s`` term the other presets have)."""
    return dataclasses.replace(sim.device_spec(base), host_op_s=host_op_s)


def simulate_h200(rows: list[H200Row], device: sim.DeviceSpec, *, graphs: bool = False) -> list[float]:
    """Simulated samples/s of each row's task in its configuration on ``device``, eager (as
    measured) or as CUDA graph replays; each configuration simulated once."""
    cache: dict[tuple[tuple[tuple[str, int, int], ...], str], np.ndarray] = {}
    out = []
    for row in rows:
        key = (row.configuration, row.partitioning)
        if key not in cache:
            loads = [sim.simulation_workload(arch, *H200_INPUT) for arch, _, _ in row.configuration]
            cache[key] = sim.simulate_throughput(
                [w.flops_per_sample for w in loads],
                [w.activation_bytes_per_sample for w in loads],
                [w.param_bytes for w in loads],
                [w.layers for w in loads],
                [b for _, b, _ in row.configuration],
                [s for _, _, s in row.configuration],
                device,
                partitioning=row.partitioning,
                ops_per_step=[w.ops_per_step for w in loads],
                graphs=graphs,
            ).throughput_sps
        out.append(float(cache[key][row.task_index]))
    return out


def host_op_grid(quick: bool) -> np.ndarray:
    """Host seconds per operation the H200 fit searches: 8 to 64 µs, a geometric grid of ratio
    ``2^(1/16)`` (49 values), or ``2^(1/4)`` quick (13 values)."""
    return 8e-6 * 2.0 ** (np.arange(0, 49, 4 if quick else 1) / 16)


def fit_host_op_s(rows: list[H200Row], quick: bool) -> float:
    """The host seconds per operation of the grid with the lowest RMSLE on ``rows``."""
    measured = [r.samples_per_s for r in rows]
    grid = [float(h) for h in host_op_grid(quick)]
    return min(grid, key=lambda h: rmsle(zip(measured, simulate_h200(rows, h200_device(h)), strict=True)))


def strategy_throughputs(rows: list[H200Row], values: list[float]) -> dict[str, list[float]]:
    """Each strategy's raw throughput (its plan's tasks summed) per run that measured it."""
    plans: dict[tuple[str, str], float] = {}
    for row, value in zip(rows, values, strict=True):
        if row.kind == "plan":
            plans[(row.strategy, row.run)] = plans.get((row.strategy, row.run), 0.0) + value
    out: dict[str, list[float]] = {}
    for (strategy, _), raw in sorted(plans.items()):
        out.setdefault(strategy, []).append(raw)
    return out


def tie_tolerance(by_strategy: dict[str, list[float]]) -> float:
    """The measured run-to-run spread of a strategy's raw throughput, ``|a - b| / mean``,
    median over the strategies measured in two runs or more (their first two runs);
    :data:`H200_STRATEGY_ORDER_TOLERANCE_DEFAULT` when none was."""
    spreads = [abs(v[0] - v[1]) / (0.5 * (v[0] + v[1])) for v in by_strategy.values() if len(v) >= 2]
    return float(np.median(spreads)) if spreads else H200_STRATEGY_ORDER_TOLERANCE_DEFAULT


def ordering(raw: dict[str, float], tolerance: float) -> tuple[str, dict[tuple[str, str], int]]:
    """The strategies from fastest to slowest as text (``>`` between neighbours further apart
    than ``tolerance`` relative, ``~`` within), and each ordered pair's comparison: +1 when the
    first is faster by more than ``tolerance``, -1 slower, 0 tied."""
    names = sorted(raw, key=lambda s: -raw[s])
    text = names[0] if names else ""
    for a, b in itertools.pairwise(names):
        text += f" {'~' if raw[a] <= raw[b] * (1 + tolerance) else '>'} {b}"

    def compare(a: str, b: str) -> int:
        if raw[a] > raw[b] * (1 + tolerance):
            return 1
        if raw[b] > raw[a] * (1 + tolerance):
            return -1
        return 0

    return text, {(a, b): compare(a, b) for a in names for b in names if a < b}


def h200_held_out(rows: list[H200Row], quick: bool) -> dict[str, Any]:
    """Fit the device-level host seconds per operation on one part of the H200 set, score the
    per-task samples/s on the other; check the ``h200`` preset's ordering of the strategies.

    Fitted: ``host_op_s`` only. ``flops_efficiency`` stays the default: every measured
    configuration was host-bound (the simulator agrees: device time is a fraction of the launch
    term), so the data say nothing of the device's speed, and fitting it would fit noise.
    """
    held = held_out_groups(h200_group(r) for r in rows)
    fit_rows = [r for r in rows if h200_group(r) not in held]
    held_rows = [r for r in rows if h200_group(r) in held]
    measured = [r.samples_per_s for r in held_rows]
    host_op_s = fit_host_op_s(fit_rows, quick)
    fitted = simulate_h200(held_rows, h200_device(host_op_s))
    preset = simulate_h200(held_rows, sim.device_spec("h200"))
    per_layer = simulate_h200(held_rows, h200_device(0.0))
    graphs = simulate_h200(held_rows, sim.device_spec("h200"), graphs=True)

    measured_all = strategy_throughputs(rows, [r.samples_per_s for r in rows])
    simulated_all = strategy_throughputs(rows, simulate_h200(rows, sim.device_spec("h200")))
    tolerance = tie_tolerance(measured_all)
    measured_raw = {s: float(np.mean(v)) for s, v in measured_all.items()}
    simulated_raw = {s: float(np.mean(v)) for s, v in simulated_all.items()}
    measured_text, measured_pairs = ordering(measured_raw, tolerance)
    simulated_text, simulated_pairs = ordering(simulated_raw, tolerance)
    return {
        "rows": len(rows),
        "groups": len({h200_group(r) for r in rows}),
        "fit": len(fit_rows),
        "held_out": len(held_rows),
        "host_op_s": host_op_s,
        "host_op_s_all": fit_host_op_s(rows, quick),
        "rmsle": rmsle(zip(measured, fitted, strict=True)),
        "rmsle_preset": rmsle(zip(measured, preset, strict=True)),
        "rmsle_per_layer_term": rmsle(zip(measured, per_layer, strict=True)),
        "graphs_over_eager_median": float(np.median(np.array(graphs) / np.array(preset))),
        "tie_tolerance": tolerance,
        "measured_raw": measured_raw,
        "simulated_raw": simulated_raw,
        "measured_ordering": measured_text,
        "simulated_ordering": simulated_text,
        "ordering_matches": measured_pairs == simulated_pairs,
        "held_out_rows": list(zip(held_rows, measured, fitted, strict=True)),
    }


def report_held_out(parvagpu: dict, miso: dict, gavel: dict) -> None:
    print("\n5. Held out: constants fitted on one part of each data set, scored on the other (RMSLE)")
    p = parvagpu
    print(
        f"   ParvaGPU A100 80GB inference, per-process samples/s of each (MIG size, batch, processes): "
        f"fit {p['fit']}, held out {p['held_out']} (every other (model, MIG size, batch) group)"
    )
    print(
        f"     fitted: kernel_s {p['kernel_s'] * 1e6:.0f} us, TF32 efficiency {p['tf32_efficiency']}, "
        + ", ".join(f"{k}={v}" for k, v in p["constants"].items())
    )
    print(
        f"     held out {p['rmsle']:.3f} (co-location shape P_k/P_1 {p['rmsle_colocation_shape']:.3f}; "
        f"with the module's constants, fitted on all of it: {p['rmsle_module_constants']:.3f})"
    )
    m = miso
    left = ", ".join(f"{k} {v}" for k, v in sorted(m["left_out"].items()))
    print(
        f"   MISO A100 40GB training alone on MIG slices, samples/s of each (slice, batch): fit {m['fit']}, "
        f"held out {m['held_out']} (batch sizes {', '.join(map(str, m['held_out_batches']))})"
    )
    print(f"     left out {sum(m['left_out'].values())} rows, no model in the zoo: {left}")
    print(
        f"     fitted (device-level): kernel_s {m['kernel_s'] * 1e6:.0f} us, TF32 efficiency {m['tf32_efficiency']:.3g}"
    )
    print(
        f"     held out {m['rmsle']:.3f} (slice shape P(g)/P(7g) {m['rmsle_slice_shape']:.3f}; the a100-40gb "
        f"preset unfitted, fp32 peak and DeviceSpec defaults: {m['rmsle_preset_defaults']:.3f})"
    )
    for batch in m["held_out_batches"]:
        cells = [f"{r.gpcs}g {meas:5.0f}/{s:<5.0f}" for r, meas, s in m["rows"] if r.batch_size == batch]
        print(f"       resnet B={batch:<4d} measured/simulated " + "  ".join(cells))
    g = gavel
    unmapped = sum(g["unmapped"].values())
    lo, med, hi = g["measured_ratio_range"]
    print(
        f"   Gavel P100/K80 training pairs, co-located / alone steps/s of each job: {g['pairs']} pairs measured; "
        f"left out {unmapped} with a job not in the zoo, {g['simulator_oom']} the simulator finds out of memory"
    )
    if g["left_out_by_loader"]:
        print(
            "     not counted as measured: "
            + ", ".join(f"{v} {k}" for k, v in g["left_out_by_loader"].items())
            + " (failed: [0, 0], a pair that failed or ran out of memory)"
        )
    print(
        f"     fit {g['fit']} pairs, held out {g['held_out']} pairs ({g['held_out_ratios']} ratios; "
        f"measured min/median/max {lo:.2f}/{med:.2f}/{hi:.2f})"
    )
    print(
        "     fitted: "
        + "; ".join(f"{k} kernel_s {v[0] * 1e6:.0f} us" for k, v in g["devices"].items())
        + f" (device-level; flops_efficiency the default {sim.DeviceSpec.flops_efficiency}); "
        + f"RECLAIM={g['RECLAIM']}, CONTENTION={g['CONTENTION']} (global)"
    )
    for label, key in (
        ("simulator, fitted", "rmsle"),
        ("simulator, module constants", "rmsle_module_constants"),
        ("simulator, time slicing", "rmsle_timeslice"),
        ("predictor's physical baseline", "rmsle_predictor_baseline"),
    ):
        print(f"     {label:30s} " + "  ".join(f"{k} {v:.3f}" for k, v in g[key].items()))


def report_h200(h: dict[str, Any]) -> None:
    print(
        f"\n6. This project's H200 (eager PyTorch, 32x32, host-bound), samples/s of each task of each "
        f"configuration and plan: {h['rows']} tasks in {h['groups']} groups; fit {h['fit']}, held out "
        f"{h['held_out']} (every other (run, configuration or plan) group)"
    )
    print(
        f"   fitted (device-level): host_op_s {h['host_op_s'] * 1e6:.1f} us per operation "
        f"(on all of it: {h['host_op_s_all'] * 1e6:.1f} us; the h200 preset has "
        f"{sim.device_spec('h200').host_op_s * 1e6:.1f} us)"
    )
    print(
        f"   held out {h['rmsle']:.3f} (the h200 preset {h['rmsle_preset']:.3f}; the per-layer launch term "
        f"3*N*kernel_s of the other presets {h['rmsle_per_layer_term']:.3f})"
    )
    for row, measured, simulated in h["held_out_rows"]:
        arch, batch, share = row.configuration[row.task_index]
        where = row.strategy or row.group
        print(
            f"     {row.run:12s} {where:12s} {arch:18s} B={batch:<4d} {share:3d} %  "
            f"measured/simulated {measured:6.0f}/{simulated:<6.0f}"
        )
    print(
        f"   strategies, raw samples/s (mean over runs; ties within {h['tie_tolerance']:.0%}, the measured "
        f"run-to-run spread):"
    )
    for name in sorted(h["measured_raw"], key=lambda n: -h["measured_raw"][n]):
        print(f"     {name:12s} measured {h['measured_raw'][name]:6.0f}  simulated {h['simulated_raw'][name]:6.0f}")
    print(f"   measured ordering:  {h['measured_ordering']}")
    print(f"   simulated ordering: {h['simulated_ordering']} (the h200 preset)")
    print(
        f"   the same steps as CUDA graphs (not measured yet): median {h['graphs_over_eager_median']:.2f}x "
        f"the eager throughput of the held-out tasks"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=default_data(), help="folder of the ParvaGPU CSV files (default: %(default)s)"
    )
    parser.add_argument(
        "--miso", type=Path, default=default_miso_data(), help="folder of MISO's training_iterations.csv"
    )
    parser.add_argument("--gavel", type=Path, default=default_gavel_data(), help="folder of Gavel's throughputs.json")
    parser.add_argument(
        "--h200", type=Path, default=default_h200_data(), help="folder of the H200 set's measurements.csv"
    )
    parser.add_argument("--fit", action="store_true", help="search the constants on all of ParvaGPU first")
    parser.add_argument(
        "--quick", action="store_true", help="small grids in the held-out fits and no paper mixes (a few seconds)"
    )
    parser.add_argument(
        "--kernel-us", type=float, default=30.0, help="host microseconds per kernel on the reference host (default 30)"
    )
    parser.add_argument(
        "--tf32-efficiency",
        type=float,
        default=0.5,
        help="attained fraction of the A100's TF32 peak at long reductions (default 0.5)",
    )
    args = parser.parse_args(argv)
    for folder, name in (
        (args.data, "resnet50.csv"),
        (args.miso, "training_iterations.csv"),
        (args.gavel, "throughputs.json"),
        (args.h200, "measurements.csv"),
    ):
        if not (folder / name).is_file():
            print(f"no {name} in {folder}: pass --data, --miso, --gavel or --h200", file=sys.stderr)
            return 2
    table = load(args.data)
    workloads = inference_workloads()
    kernel_s, efficiency = args.kernel_us * 1e-6, args.tf32_efficiency
    if args.fit:
        kernel_s, efficiency = fit(table, workloads)
    simulated = simulate_reference(table, workloads, kernel_s, efficiency)
    print(
        "constants: "
        + " ".join(f"{n}={getattr(sim, n)}" for n in CONSTANTS)
        + f"; reference host kernel_s={kernel_s * 1e6:.0f} us, TF32 efficiency {efficiency}\n"
    )
    report_checks(table, simulated)
    report_curves(table, simulated)
    report_errors(table, simulated)
    if not args.quick:
        report_paper()
    gavel_pairs, gavel_left_out = load_gavel(args.gavel)
    figures = {
        "parvagpu": parvagpu_held_out(table, workloads, args.quick),
        "miso": miso_held_out(load_miso(args.miso), args.quick),
        "gavel": gavel_held_out(gavel_pairs, args.quick, gavel_left_out),
    }
    h200 = h200_held_out(load_h200(args.h200), args.quick)
    report_held_out(figures["parvagpu"], figures["miso"], figures["gavel"])
    report_h200(h200)
    worst = max(figures["parvagpu"]["rmsle"], figures["miso"]["rmsle"], figures["gavel"]["rmsle"]["all"], h200["rmsle"])
    print()
    print(f"sim_calibration_parvagpu_rmsle={figures['parvagpu']['rmsle']:.3f}")
    print(f"sim_calibration_miso_rmsle={figures['miso']['rmsle']:.3f}")
    print(f"sim_calibration_gavel_rmsle={figures['gavel']['rmsle']['all']:.3f}")
    print(f"sim_calibration_mtfl_h200_rmsle={h200['rmsle']:.3f}")
    print(
        f"sim_calibration_mtfl_h200_ordering={h200['ordering_matches']} "
        f"(measured: {h200['measured_ordering']}; simulated: {h200['simulated_ordering']})"
    )
    print(f"predictor_baseline_gavel_rmsle={figures['gavel']['rmsle_predictor_baseline']['all']:.3f}")
    print(f"sim_calibration_worst_rmsle={worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
