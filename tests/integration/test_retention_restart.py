"""The retention policy never deletes what a resume needs (issue 24 item 4): the control worker is
killed mid-run with retention at its tightest (one checkpoint kept besides the initial and the
best, device weights deleted after every round, a stateful aggregator whose server state the
next round reads), restarted, and the run finishes, having kept exactly what the policy says.

Real processes as in tests/integration/test_faults.py (its helpers and settings): a Celery
control worker and two ``simulated`` device agents against a broker of their own, rounds paced
in real time (about 3 s each).
"""

from __future__ import annotations

import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Round, Run
from tests.integration.test_faults import (  # noqa: F401 - fast_faults is a fixture
    _device_started,
    _experiment,
    _restart_control_worker,
    _wait_for,
    fast_faults,
)
from workers.fl.artifacts import get_store

pytestmark = pytest.mark.integration

SIM_SCALE_3S = "45"
"""About 3 s of real time per simulated round (test_faults.py: 150 makes about 10 s): long enough
for the initial models' evaluation (beside round 0, the control worker's first, which imports
torch) to settle round 0's unchanged models before the policy runs after round 1."""


def test_the_control_worker_killed_mid_run_with_retention_active_resumes_and_the_run_finishes(fast_faults):  # noqa: F811
    fast_faults.setenv("MTFL_SIM_TIME_SCALE", SIM_SCALE_3S)
    names = ["ret-a", "ret-b"]
    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        experiment = _experiment(names, rounds=3, keep_last_checkpoints=1, aggregation="fedavgm")
        run = services.run_create(experiment=experiment, strategy="sharing")
        _wait_for(lambda: _device_started(run, 2, "ret-a"), 240, "round 2 to start")
        # the policy ran after rounds 0 and 1 (round 1's beside round 2, which it does not hold up)
        _wait_for(
            lambda: (
                Checkpoint.objects.filter(run=run, round__index=0, deleted_at__isnull=False).exists()
                and not Assignment.objects.filter(round__run=run, round__index__lt=2, weights_deleted_at=None).exists()
            ),
            30,
            "the retention policy of rounds 0 and 1",
            poll_s=0.1,
        )
        assert Run.objects.get(id=run.id).status == Run.Status.RUNNING  # the kill is mid-run

        _restart_control_worker(stack, down_s=2)

        run = run_wait(run, timeout_s=300)
        store = get_store()
        # The last round's retention is its own control task, queued as the run finishes: on a loaded
        # machine it may still be running when the run reads SUCCEEDED.
        _wait_for(
            lambda: (
                not store.path(f"runs/{run.id}/rounds").exists()
                and not Assignment.objects.filter(round__run=run, weights_deleted_at=None).exists()
            ),
            60,
            "the last round's retention",
            poll_s=0.2,
        )
        stack.children.check_alive()

    assert run.status == Run.Status.SUCCEEDED, run.error
    rounds = list(run.rounds.order_by("index"))
    assert [(r.index, r.status) for r in rounds] == [(i, Round.Status.SUCCEEDED) for i in range(3)], [
        (r.status, r.error) for r in rounds
    ]
    kept = list(Checkpoint.objects.filter(run=run, deleted_at=None).select_related("round"))
    # the devices pass the model through unchanged: every round ties on test accuracy, so the
    # best is the newest, which is also the last round kept
    assert sorted(c.round.index if c.round else -1 for c in kept) == [-1, 2]
    for ckpt in Checkpoint.objects.filter(run=run).select_related("round"):
        on_disk = store.path(ckpt.artifact_path).is_file()
        assert on_disk == (ckpt.deleted_at is None), ckpt.artifact_path
        if ckpt.server_state_path:
            assert store.path(ckpt.server_state_path).is_file() == (ckpt.deleted_at is None)
    assert kept[0].test_accuracy is not None and all(c.test_accuracy is not None for c in run.checkpoints.all())
