"""Benchmark: FL algorithms' test accuracy per round in ``mtfl demo --algorithms``'s setting,
with in-process trainers (no stack), to choose the demo's algorithm parameters by measurement.

    python benchmarks/algorithms_sweep.py resnet18 fedavg fedprox:mu=0.01 \\
        fedadam:server_learning_rate=0.003 fedadam fedadam:server_learning_rate=0.03

The demo's setting: the digits task of ``ARCHITECTURE`` (local Adam, learning rate 1e-3, the
demo's tasks), its whole training split divided over 2 devices by ``dirichlet_labels`` with
α = 0.5 (the shards the demo's experiment holds: seed 0, the task's position ``k`` among the
demo's architectures), each device training one local epoch at batch min(128, shard) (the
``sharing`` baseline's batch size) with one thread, ``--rounds`` rounds; each aggregator given as
``NAME[:PARAM=VALUE,...]`` (left-out parameters at their registry defaults) aggregates the
devices' models (Reddi et al. 2021's server optimisers keep their state across rounds). Prints
one line per aggregator: the test accuracy of the initial model and after each round.
benchmarks/results/algorithms_demo.json keeps the figures.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()  # the demo's constants live beside its Django code

from controlplane.core.demo import ALGORITHM_PARTITION, DEMO_ARCHITECTURES  # noqa: E402
from workers.fl.artifacts import LocalArtifactStore, device_weights_key, global_weights_key  # noqa: E402
from workers.fl.fedavg import load_state, save_state  # noqa: E402
from workers.protocol.indices import encode_indices  # noqa: E402
from workers.protocol.messages import DatasetRef, OptimizerConfig, ShardRef, TaskRef  # noqa: E402
from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext  # noqa: E402
from workers.registry.dataset_sources import digits_labels  # noqa: E402
from workers.training.evaluate import evaluate  # noqa: E402
from workers.training.partition import partition_indices  # noqa: E402
from workers.training.trainer import TrainerSpec, train  # noqa: E402
from workers.training.zoo import write_initial_weights  # noqa: E402


def _aggregator(text: str) -> tuple[str, dict[str, float]]:
    name, _, given = text.partition(":")
    params = {k.strip(): float(v) for k, _, v in (p.partition("=") for p in given.split(",") if p.strip())}
    return name, params


def accuracy_per_round(
    architecture: str, aggregator: str, params: dict[str, float], *, rounds: int, devices: int, alpha: float
) -> list[float]:
    """Test accuracy of the initial model and after each round (see the module)."""
    record = AGGREGATOR_REGISTRY.get(aggregator, field="aggregation")
    options = record.check_params(params)
    extra = record.assignment_options(options)  # what the control plane sends every trainer
    task = TaskRef(
        task_id=1,
        name=f"digits-{architecture}",
        architecture=architecture,
        num_classes=10,
        dataset=DatasetRef(name="digits"),
        optimizer=OptimizerConfig(name="adam", learning_rate=1e-3, weight_decay=0.0),
    )
    k = DEMO_ARCHITECTURES.index(architecture) if architecture in DEMO_ARCHITECTURES else 0
    labels = digits_labels()[0]
    shards = partition_indices(labels, devices, ALGORITHM_PARTITION, {"alpha": alpha}, k)
    with tempfile.TemporaryDirectory() as root:
        store = LocalArtifactStore(root)
        key = global_weights_key(1, 1, None)
        write_initial_weights(architecture, 10, 0, store.path(key))
        state: dict = {}
        accuracy = [evaluate(task, store.path(key))[0]]
        for r in range(rounds):
            aggregation = record.start(
                AggregationContext(
                    previous=lambda key=key: load_state(store.path(key)), options=options, state=lambda s=state: s
                )
            )
            for d, positions in enumerate(shards):
                spec = TrainerSpec(
                    assignment_id=d,
                    task=task,
                    batch_size=min(128, len(positions)),
                    active_thread_percentage=100,
                    shard=ShardRef(
                        permutation_seed=0,
                        offset=0,
                        count=len(positions),
                        indices=encode_indices(np.asarray(positions)),
                    ),
                    local_epochs=1,
                    global_weights=key,
                    output_weights=device_weights_key(1, r, f"d{d}", 1),
                    seed=r,
                    artifact_root=root,
                    threads=1,
                    warmup_iterations=1,
                    **extra,
                )
                result = train(spec, io.StringIO(), io.StringIO("GO\n"))
                if result.status != "succeeded":
                    raise RuntimeError(f"device {d} round {r}: {result.error}")
                aggregation.add(load_state(store.path(spec.output_weights)), len(positions))
            new = aggregation.result()
            if record.stateful:
                state = aggregation.server_state()  # type: ignore[attr-defined]
            key = global_weights_key(1, 1, r)
            save_state(new, store.path(key))
            accuracy.append(evaluate(task, store.path(key))[0])
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("architecture")
    parser.add_argument("aggregators", nargs="+", metavar="NAME[:PARAM=VALUE,...]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.5)
    args = parser.parse_args()
    for text in args.aggregators:
        name, params = _aggregator(text)
        started = time.monotonic()
        accuracy = accuracy_per_round(
            args.architecture, name, params, rounds=args.rounds, devices=args.devices, alpha=args.alpha
        )
        print(
            f"{args.architecture} {text}: accuracy by round {[round(a, 3) for a in accuracy]} "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
