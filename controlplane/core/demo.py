"""The demo comparison: tasks and an experiment on the digits data, the baselines run one after
another, and the comparison table (used by ``mtfl demo``); with ``--algorithms``, FL algorithms
compared on one label-skewed experiment, each run with its own aggregator (``Run.options``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from controlplane.experiments import selectors
from controlplane.experiments import services as exp_services
from controlplane.experiments.models import Experiment, Run, Task
from controlplane.experiments.services.catalog import task_train_labels
from controlplane.fleet.models import Device
from controlplane.planning import metrics
from workers.training.partition import partition_indices

DEMO_ARCHITECTURES = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0")
DEMO_USER = "demo"

DEMO_ALGORITHMS = ("fedavg", "fedprox", "fedadam")
"""What ``mtfl demo --algorithms`` compares by default: FedAvg (McMahan et al. 2017), FedProx
(Li et al. 2020) and FedAdam (Reddi et al. 2021)."""
ALGORITHM_ROUNDS = 5
"""Rounds of the algorithm demo: enough for FedAvg to pass 80 % on the label-skewed digits."""
ALGORITHM_PARTITION = "dirichlet_labels"
"""The algorithm demo's partition: label skew, per class device shares from Dir(alpha) (Hsu et
al. 2019), the heterogeneity FedProx (Li et al. 2020) and the server optimisers (Reddi et al.
2021) were proposed for."""
ALGORITHM_PARAMS: dict[str, dict[str, float]] = {
    "fedprox": {"mu": 0.01},
    "fedadam": {"server_learning_rate": 0.01},
}
"""Each algorithm's parameters in the demo (the others take their registry defaults).

FedProx: μ = 0.01, the middle of Li et al. 2020's grid {0.001, 0.01, 0.1, 1}. FedAdam: the
server learning rate η measured on this demo's setting (local Adam at 1e-3, dirichlet_labels
α = 0.5 over 2 devices, 5 rounds; benchmarks/results/algorithms_demo.json has the sweep): of
0.003, 0.01 and 0.03, η = 0.01 ends highest on each of the three models (0.003 is still
climbing after 5 rounds; 0.03 overshoots and falls back). With v₋₁ = τ² the first server step
moves each weight by about η (Reddi et al. 2021, Algorithm 2), so η sets the step size directly."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str
    token: str


def demo_user_ensure() -> Credentials:
    """The local researcher account of the embedded stack; its password is generated once and
    kept in ``$MTFL_HOME/demo_password`` (mode 600)."""
    path = settings.MTFL_HOME / "demo_password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    password = path.read_text().strip()
    user, _ = get_user_model().objects.get_or_create(
        username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
    )
    if not user.check_password(password):
        user.set_password(password)
        user.save()
    token, _ = Token.objects.get_or_create(user=user)
    return Credentials(DEMO_USER, password, token.key)


def demo_experiment_create(
    *,
    devices: Sequence[Device],
    architectures: Sequence[str] = DEMO_ARCHITECTURES,
    rounds: int = 2,
    local_epochs: int = 1,
    alpha: float = 0.5,
    samples: int | None = None,
    seed: int = 0,
    owner=None,
    partition_rule: str = "quantity",
) -> Experiment:
    """Create the demo experiment: one digits task per architecture (Adam, learning rate 1e-3:
    it learns within the demo's few local iterations where SGD barely moves), Dirichlet(alpha)
    data volumes over the devices (the ``quantity`` partition rule), or with
    ``partition_rule="dirichlet_labels"`` Dirichlet(alpha) label shares (the algorithm demo).

    Args:
        samples: use only this many training samples per task, for quick runs; default: the
            whole training split. Under ``quantity`` their counts per device are drawn by the
            same rule over the first ``samples`` labels, given as an ``explicit`` experiment;
            under another rule, the rule divides the first ``samples`` samples
            (``experiment_create``'s ``train_samples``), so their labels stay skewed.
        owner: the experiment's owner (the demo user).
        partition_rule: ``quantity`` or another rule that takes ``alpha``.
    """
    tasks = []
    for arch in architectures:
        task = Task.objects.filter(name=f"digits-{arch}").first() or exp_services.task_create(
            name=f"digits-{arch}",
            architecture=arch,
            dataset="digits",
            num_classes=10,
            optimizer="adam",
            learning_rate=1e-3,
            weight_decay=0.0,
            # Computed here, before any run starts: not in the control worker beside run 1's start.
            features="now",
        )
        tasks.append(task)
    name = f"demo {timezone.now():%Y-%m-%d %H:%M:%S}"
    device_ids = sorted(d.id for d in devices)
    skew = "label shares" if partition_rule == ALGORITHM_PARTITION else "volumes"
    common = dict(
        name=name,
        description=f"{' + '.join(architectures)} on scikit-learn's digits"
        f"{f' (first {samples} training samples)' if samples else ''}, {len(devices)} devices, "
        f"Dirichlet alpha {alpha} {skew}, {rounds} round(s) × {local_epochs} local epoch(s)",
        task_ids=[t.id for t in tasks],
        device_ids=device_ids,
        rounds=rounds,
        local_epochs=local_epochs,
        seed=seed,
        owner=owner,
    )
    if samples is None or partition_rule != "quantity":
        return exp_services.experiment_create(
            partition_rule=partition_rule, partition_params={"alpha": alpha}, train_samples=samples, **common
        )

    counts = []
    for k, task in enumerate(tasks):
        labels = task_train_labels(task)[:samples]
        parts = partition_indices(labels, len(device_ids), "quantity", {"alpha": alpha}, seed * 10007 + k)
        counts += [
            {"device": device_id, "task": task.id, "num_samples": len(part)}
            for device_id, part in zip(device_ids, parts, strict=True)
        ]
    return exp_services.experiment_create(partition_rule="explicit", sample_counts=counts, **common)


def run_wait(
    run: Run, *, timeout_s: float, on_progress: Callable[[dict], None] | None = None, poll_s: float = 0.5
) -> Run:
    """Poll a run until it ends, reporting its progress.

    Raises:
        TimeoutError: it did not end within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.refresh_from_db()
        progress = selectors.run_progress(run)
        if on_progress:
            on_progress(progress)
        if run.is_finished:
            return run
        time.sleep(poll_s)
    raise TimeoutError(f"run {run.id} ({run.strategy}) did not finish within {timeout_s:.0f} s")


def comparison_rows(experiment: Experiment) -> list[dict]:
    """One row per run: strategy, status, raw and fair throughput, speedups over ``temporal``,
    final test accuracy per task."""
    runs = list(experiment.runs.order_by("id"))
    baselines = selectors.run_baselines(experiment, runs)
    rows = []
    for run in runs:
        baseline = baselines[run.id]
        rows.append(
            {
                "run": run.id,
                "strategy": run.strategy,
                "status": run.status,
                "error": run.error,
                "raw_throughput_sps": run.raw_throughput_sps,
                "fair_throughput": run.fair_throughput,
                "fl_throughput_sps": run.fl_throughput_sps,
                **selectors.run_speedups(run, baseline),
                "accuracy": selectors.run_final_accuracy(run),
            }
        )
    return rows


def algorithm_options(algorithm: str) -> dict[str, Any]:
    """The run options of one algorithm of the algorithm demo: ``{"aggregation": algorithm,
    "aggregation_params": ...}`` with :data:`ALGORITHM_PARAMS` (registry defaults otherwise)."""
    return {"aggregation": algorithm, "aggregation_params": dict(ALGORITHM_PARAMS.get(algorithm, {}))}


def run_algorithm(run: Run) -> str:
    """The aggregator a run uses: its own (``options["aggregation"]``), else its experiment's."""
    return str((run.options or {}).get("aggregation") or run.experiment.aggregation)


def algorithm_rows(experiment: Experiment) -> dict[str, Any]:
    """The algorithm demo's results: one row per run, and each task's target accuracy.

    The target of a task is the lowest final test accuracy any run reached
    (:func:`controlplane.planning.metrics.lowest_final_accuracy`, as comparisons take it), so
    every run that ended reached it and the rounds and seconds to it compare the algorithms'
    speed (:func:`controlplane.planning.metrics.time_to_accuracy`).

    Returns:
        ``{"targets": {task name: accuracy}, "rows": [{"run", "algorithm", "strategy",
        "status", "error", "wall_s" (the run's first start to its end), "accuracy": {task:
        final accuracy}, "to_target": {task: TimeToAccuracy or None}}]}``, rows in run order.
    """
    runs = list(experiment.runs.select_related("experiment").order_by("id"))
    ids = [r.id for r in runs]
    finals = selectors.runs_final_accuracy(ids)
    points = selectors.runs_accuracy_points(ids)
    names = dict(experiment.tasks.values_list("id", "name"))
    targets = metrics.lowest_final_accuracy(finals.get(r.id, {}) for r in runs if r.status == Run.Status.SUCCEEDED)
    rows = []
    for run in runs:
        by_task = {names[task_id]: p for task_id, p in points.get(run.id, {}).items()}
        rows.append(
            {
                "run": run.id,
                "algorithm": run_algorithm(run),
                "strategy": run.strategy,
                "status": run.status,
                "error": run.error,
                "wall_s": (run.finished_at - run.started_at).total_seconds()
                if run.started_at and run.finished_at
                else None,
                "accuracy": finals.get(run.id, {}),
                "to_target": {
                    task: metrics.time_to_accuracy(by_task[task], target) if by_task.get(task) else None
                    for task, target in targets.items()
                },
            }
        )
    return {"targets": targets, "rows": rows}
