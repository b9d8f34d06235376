"""Evaluation beside training, through real processes (issue 30): a Celery control worker (two
tasks at a time, as ``mtfl up`` starts it) and a ``cpu`` device agent over the embedded Redis,
three rounds of real training on the digits data.

Each round's global model is evaluated by the control worker while the next round is already
under way: the next round was queued (and its devices leased) before the evaluation of the
models it starts from ended, and every round was recorded before its models' evaluation ended.
The accuracies land on their own rounds, equal to an evaluation from scratch (the control
worker's evaluator kept its model and test data across the rounds), and the run is reported
finished only with its last round's accuracy in.
"""

from __future__ import annotations

import uuid

import pytest

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.experiments import selectors, services
from controlplane.experiments.models import Checkpoint, Round, Run
from controlplane.fleet.models import Device
from workers.fl.artifacts import get_store
from workers.training.evaluate import evaluate

pytestmark = [pytest.mark.integration, pytest.mark.one_database]

ROUNDS = 3


@pytest.fixture
def finished_run(child_env, monkeypatch) -> Run:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    name = "ev-a"
    with LocalStack(agents=[name], log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        device = Device.objects.get(name=name)
        task = services.task_create(name=f"mobilenet-{uuid.uuid4().hex[:6]}", architecture="mobilenet_v3_small")
        experiment = services.experiment_create(
            name=f"ev-{uuid.uuid4().hex[:8]}",
            task_ids=[task.id],
            device_ids=[device.id],
            rounds=ROUNDS,
            partition_rule="explicit",
            sample_counts=[{"device": device.id, "task": task.id, "num_samples": 64}],
        )
        run = run_wait(services.run_create(experiment=experiment, strategy="sharing"), timeout_s=420)
        stack.children.check_alive()
    return run


def test_each_rounds_models_are_evaluated_beside_the_next_round_and_the_run_ends_with_every_accuracy(
    finished_run,
):
    run = finished_run
    assert run.status == Run.Status.SUCCEEDED, run.error
    rounds = list(run.rounds.order_by("index"))
    assert [(r.index, r.status) for r in rounds] == [(i, Round.Status.SUCCEEDED) for i in range(ROUNDS)]
    checkpoints = list(Checkpoint.objects.filter(run=run).select_related("task", "round").order_by("id"))
    assert len(checkpoints) == ROUNDS + 1
    store = get_store()
    for ckpt in checkpoints:
        assert ckpt.evaluation_status == "done", (ckpt.round_id, ckpt.evaluation_error)
        expected = evaluate(selectors.task_ref(ckpt.task), store.path(ckpt.artifact_path), cached=False)
        # The control worker evaluates with one thread (it shares the agents' cores), this
        # process with several: the sums differ by float rounding only.
        assert ckpt.test_accuracy == pytest.approx(expected[0], abs=1e-9)
        assert ckpt.test_loss == pytest.approx(expected[1], rel=1e-6)

    evaluated = {c.round.index if c.round else None: c.evaluated_at for c in checkpoints}
    timeline = {
        r.index: (r.queued_at, r.started_at, r.finished_at, evaluated[r.index]) for r in rounds
    }  # printed on failure
    for rnd in rounds:
        # recorded (its wall time fixed) before its models' evaluation ended
        assert rnd.finished_at < evaluated[rnd.index], timeline
    for before, after in zip(rounds, rounds[1:], strict=False):
        # the next round was queued and leased its device without waiting for the evaluation
        assert after.queued_at < evaluated[before.index], timeline
        assert after.started_at < evaluated[before.index], timeline
    # the last round's models: evaluated before the run was reported finished
    assert evaluated[ROUNDS - 1] <= run.finished_at
    assert all(a is not None for a in selectors.run_final_accuracy(run).values())
