"""The demo comparison: tasks and an experiment on the digits data, the baselines run one after
another, and the comparison table (used by ``mtfl demo``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from controlplane.experiments import selectors
from controlplane.experiments import services as exp_services
from controlplane.experiments.models import Experiment, Run, Task
from controlplane.fleet.models import Device

DEMO_ARCHITECTURES = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0")
DEMO_USER = "demo"


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
) -> Experiment:
    """Create the demo experiment: one digits task per architecture (Adam, learning rate 1e-3:
    it learns within the demo's few local iterations where SGD barely moves), Dirichlet(alpha)
    data volumes over the devices (the ``quantity`` partition rule).

    Args:
        samples: use only this many training samples per task, for quick runs: their counts
            per device drawn by the same rule over the first ``samples`` labels, given as an
            ``explicit`` experiment; default: the whole training split.
        owner: the experiment's owner (the demo user).
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
        )
        tasks.append(task)
    name = f"demo {timezone.now():%Y-%m-%d %H:%M:%S}"
    device_ids = sorted(d.id for d in devices)
    common = dict(
        name=name,
        description=f"{' + '.join(architectures)} on scikit-learn's digits, {len(devices)} devices, "
        f"Dirichlet alpha {alpha}, {rounds} round(s) × {local_epochs} local epoch(s)",
        task_ids=[t.id for t in tasks],
        device_ids=device_ids,
        rounds=rounds,
        local_epochs=local_epochs,
        seed=seed,
        owner=owner,
    )
    if samples is None:
        return exp_services.experiment_create(partition_rule="quantity", partition_params={"alpha": alpha}, **common)
    from controlplane.experiments.services.catalog import task_train_labels
    from workers.training.partition import partition_indices

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
