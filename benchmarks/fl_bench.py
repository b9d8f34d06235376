"""Shared steps of the FL benchmarks (``compare.py``, ``closed_loop.py``): the paper's mixes, a
data set of CIFAR-10's size for the ``simulated`` backend, profiling and fitting on a local
stack, experiments on a mix, and following runs to their end.

Call :func:`setup_django` first: it points ``MTFL_HOME`` at a folder (a new temporary one by
default) and sets Django up, so every benchmark runs on a fresh embedded stack.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAPER_MIXES: dict[str, tuple[str, ...]] = {
    # Yu et al. 2022, §5: the three mixes of three tasks each.
    "light": ("resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"),
    "mixed": ("resnet50", "vgg16", "mobilenet_v3_large"),
    "heavy": ("densenet121", "vgg16", "resnet101"),
}

CIFAR10_TRAIN, CIFAR10_TEST = 50_000, 10_000
SIZED_TEST = 500
"""Test samples of the sized data set: the control plane evaluates every round's global models
on them (on its CPU), and the simulated backend trains nothing, so more would only cost time."""


def setup_django(home: str | None) -> Path:
    """Point ``MTFL_HOME`` at ``home`` (default: a new temporary folder) and set Django up."""
    path = Path(home or tempfile.mkdtemp(prefix="mtfl-bench-"))
    os.environ["MTFL_HOME"] = str(path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from controlplane.core.cli_support import prepare_database

    prepare_database()
    return path


def sized_dataset(folder: Path, *, train: int = CIFAR10_TRAIN, test: int = SIZED_TEST, seed: int = 0) -> Path:
    """A folder of ``.npy`` files (the built-in ``npz`` data set's folder form) of CIFAR-10's
    shape: ``train`` images of 3×32×32 with 10 balanced random labels, ``test`` test images.

    The images are zeros in sparse, memory-mapped files (no disk is written for them): the
    ``simulated`` backend trains nothing and needs only the sizes and shapes, which decide its
    throughput. Labeled as what it is; not for training on a real backend.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, n in (("train", train), ("test", test)):
        x = np.lib.format.open_memmap(folder / f"x_{split}.npy", mode="w+", dtype=np.float32, shape=(n, 3, 32, 32))
        del x  # flushes the header; the data stay holes in the file
        np.save(folder / f"y_{split}.npy", rng.permutation(np.arange(n) % 10).astype(np.int64))
    return folder


def mix_experiment(
    *,
    mix: str,
    device_ids: Sequence[int],
    rounds: int,
    dataset_root: Path | None,
    alpha: float = 0.5,
    seed: int = 0,
    local_epochs: int = 1,
    name: str | None = None,
):
    """An experiment of one of :data:`PAPER_MIXES` on the devices, with the ``quantity`` skew of
    the data volumes (Dirichlet ``alpha``), on the sized data set (``dataset_root``) or, when it
    is ``None``, on scikit-learn's digits."""
    from controlplane.experiments.models import Task
    from controlplane.experiments.services import experiment_create, task_create

    tasks = []
    for arch in PAPER_MIXES[mix]:
        dataset = "digits" if dataset_root is None else "npz"
        task_name = f"{arch}-{dataset}"
        task = Task.objects.filter(name=task_name).first()
        if task is None:
            task = task_create(
                name=task_name,
                architecture=arch,
                dataset=dataset,
                dataset_root="" if dataset_root is None else str(dataset_root),
                learning_rate=0.05,
            )
        tasks.append(task)
    return experiment_create(
        name=name or f"{mix} mix",
        task_ids=[t.id for t in tasks],
        device_ids=list(device_ids),
        rounds=rounds,
        local_epochs=local_epochs,
        partition_rule="quantity",
        partition_params={"alpha": alpha},
        seed=seed,
    )


def profile_and_fit(stack, device, *, budget: float, architectures: Sequence[str], backend: str, max_mix: int = 3):
    """Profile ``device`` for ``budget`` seconds over ``architectures`` and fit its class's
    predictor; returns the predictor row.

    Raises:
        RuntimeError: the sweep or the fit failed.
    """
    from controlplane.profiling import services as profiling
    from controlplane.profiling.models import ProfileSweep
    from controlplane.profiling.selectors import sweep_progress

    sweep = profiling.sweep_start(
        device=device,
        budget_s=budget,
        architectures=list(architectures),
        batch_sizes=[16, 32, 64, 128, 256, 512],
        max_mix=max_mix,
        seed=0,
    )
    print(f"profiling {device.name} for {budget:g} s (sweep {sweep.id})", flush=True)
    while sweep.status not in (ProfileSweep.Status.SUCCEEDED, ProfileSweep.Status.FAILED):
        time.sleep(2)
        stack.children.check_alive()
        sweep.refresh_from_db()
        print(
            f"  {100 * sweep_progress(sweep):3.0f} % · {sweep.configs} configurations · {sweep.samples} samples",
            flush=True,
        )
    if sweep.status == ProfileSweep.Status.FAILED:
        raise RuntimeError(f"sweep failed: {sweep.error}")
    predictor = profiling.predictor_fit(backend=backend)
    if predictor.status != "ready":
        raise RuntimeError(f"predictor fit failed: {predictor.error}")
    print(
        f"predictor v{predictor.version} ({predictor.device_class}): kept {predictor.kept_family}, "
        f"held-out RMSLE {predictor.heldout_rmsle:.3f} on {predictor.training_samples} samples",
        flush=True,
    )
    return predictor


def follow(stack, runs: list, *, timeout_s: float) -> list:
    """Wait for ``runs`` to end, showing progress; returns them refreshed."""
    from controlplane.core.cli_support import follow_runs

    return follow_runs(
        lambda run: run,
        runs,
        timeout_s=timeout_s,
        check=stack.children.check_alive,
        label=lambda run: run.strategy,
    )


def per_round_fl(run) -> list[float | None]:
    """FL throughput (samples/s of round time) of each round of ``run``, in round order."""
    return [r.fl_throughput_sps for r in run.rounds.order_by("index")]


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    """``value`` formatted, or an em dash for ``None``."""
    return "—" if value is None else format(value, spec) + suffix


def best(values: dict[str, float | None], keep: Callable[[str], bool]) -> tuple[str | None, float | None]:
    """The name and value of the largest of ``values`` whose name ``keep`` accepts."""
    kept = {k: v for k, v in values.items() if keep(k) and v}
    if not kept:
        return None, None
    name = max(kept, key=lambda k: kept[k] or 0.0)
    return name, kept[name]
