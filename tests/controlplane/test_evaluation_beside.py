"""Evaluation off the round's critical path (issue 30): a round's global models are saved with
their test results pending, the next round is sent first and their evaluation
(``CHECKPOINTS_EVALUATE``) beside it; the results land on the round that made the models; time
to accuracy counts to when a model existed, not to when it was evaluated; a failed evaluation is
recorded where a researcher sees it; a lost evaluation is redone by a restarted control worker
(a fresh process); a finished run has every round's accuracy.

Rounds are driven through the control plane's services with device updates of the run's real
models (mobilenet_v3_small, shufflenet_v2_x1_0), as in test_aggregation_resume.py; the messages
the control plane sends are captured at the dispatch boundary, and the evaluations run on the
real digits test split.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from controlplane.experiments import selectors, services
from controlplane.experiments.models import Checkpoint, Round, Run
from controlplane.experiments.services import dispatch, evaluation
from controlplane.planning import metrics
from tests.conftest import in_a_fresh_django_process
from tests.controlplane.test_aggregation_resume import _round_updates, begin, capture_dispatch, device_results
from workers.fl.artifacts import get_store
from workers.training.evaluate import evaluate

PENDING, DONE, FAILED = "pending", "done", "failed"


def _experiment(make_experiment, two_tasks, **kw):
    devices, tasks, counts = two_tasks
    return make_experiment(devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", **kw)


def _sent_in_order(monkeypatch) -> list[tuple]:
    """Every message the control plane sends (:func:`capture_dispatch`), and, in the order they
    were sent, its ROUND_ENQUEUE and CHECKPOINTS_EVALUATE messages."""
    capture_dispatch(monkeypatch)
    order: list[tuple] = []
    monkeypatch.setattr(dispatch, "send_round_enqueue", lambda run_id, index: order.append(("round_enqueue", index)))
    monkeypatch.setattr(dispatch, "send_checkpoints_evaluate", lambda ids: order.append(("evaluate", sorted(ids))))
    return order


def _ids(queryset) -> list[int]:
    return sorted(queryset.values_list("id", flat=True))


def _uncached(ckpt: Checkpoint) -> tuple[float, float]:
    """The checkpoint's model evaluated from scratch (a new model, the test split read again)."""
    return evaluate(selectors.task_ref(ckpt.task), get_store().path(ckpt.artifact_path), cached=False)


@pytest.mark.django_db(transaction=True)  # messages are sent once each transaction commits
def test_the_next_round_is_sent_before_the_models_of_the_round_are_evaluated_and_they_land_on_their_round(
    make_experiment, two_tasks, monkeypatch
):
    order = _sent_in_order(monkeypatch)
    run = begin(_experiment(make_experiment, two_tasks, rounds=2))
    initial = _ids(Checkpoint.objects.filter(run=run, round=None))
    # the initial models are written, not evaluated, on the run's start path
    assert order == [("evaluate", initial)]
    assert set(Checkpoint.objects.filter(id__in=initial).values_list("evaluation_status", flat=True)) == {PENDING}

    rnd0 = Round.objects.get(run=run, index=0)
    services.round_record(round_id=rnd0.id, results=device_results(rnd0, _round_updates(run, 0)))

    rnd0.refresh_from_db()
    made = _ids(Checkpoint.objects.filter(round=rnd0))
    assert rnd0.status == Round.Status.SUCCEEDED and len(made) == 2
    # the next round first, then the evaluation of the models the round made, beside it
    assert order[1:] == [("round_enqueue", 1), ("evaluate", made)]
    assert all(
        (c.evaluation_status, c.test_accuracy, c.test_loss) == (PENDING, None, None)
        for c in Checkpoint.objects.filter(id__in=made)
    )

    # round 1 is leased and trains while the control worker evaluates what round 0 made
    services.round_enqueue(run_id=run.id, index=1)
    rnd1 = Round.objects.get(run=run, index=1)
    assert rnd1.status == Round.Status.RUNNING
    assert services.checkpoints_evaluate(checkpoint_ids=initial + made) == 4

    for ckpt in Checkpoint.objects.filter(id__in=made).select_related("task", "round"):
        assert ckpt.round_id == rnd0.id and ckpt.evaluation_status == DONE and ckpt.evaluation_error == ""
        assert (ckpt.test_accuracy, ckpt.test_loss) == _uncached(ckpt)
        assert rnd0.finished_at < ckpt.evaluated_at and ckpt.created_at < ckpt.evaluated_at
    # a redelivered message (acks_late) settles nothing twice
    assert services.checkpoints_evaluate(checkpoint_ids=initial + made) == 0

    services.round_record(round_id=rnd1.id, results=device_results(rnd1, _round_updates(run, 1)))
    run.refresh_from_db()
    # the last round's models were evaluated inline before the run was reported finished:
    # no message for them, and every checkpoint of the run has its accuracy
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert order[-1] == ("evaluate", made)
    last = list(Checkpoint.objects.filter(round=rnd1).select_related("task"))
    assert len(last) == 2 and all(c.evaluated_at <= run.finished_at for c in last)
    assert all((c.test_accuracy, c.test_loss) == _uncached(c) for c in last)
    assert not Checkpoint.objects.filter(run=run).exclude(evaluation_status=DONE).exists()
    assert set(selectors.run_final_accuracy(run)) == {"t-mobilenet", "t-shufflenet"}
    assert all(a is not None for a in selectors.run_final_accuracy(run).values())


@pytest.mark.django_db
def test_time_to_accuracy_counts_to_when_the_model_existed_not_to_when_it_was_evaluated(
    make_experiment, two_tasks, monkeypatch
):
    _sent_in_order(monkeypatch)
    evaluation_s = 1.0

    def slow_evaluation(task, path):
        time.sleep(evaluation_s)
        return (0.9, 0.3) if Path(path).name.startswith("round-") else (0.1, 2.3)

    monkeypatch.setattr(evaluation, "model_evaluate", slow_evaluation)
    run = begin(_experiment(make_experiment, two_tasks, rounds=2))
    rnd0 = Round.objects.get(run=run, index=0)
    services.round_record(round_id=rnd0.id, results=device_results(rnd0, _round_updates(run, 0)))
    services.round_enqueue(run_id=run.id, index=1)
    services.checkpoints_evaluate(checkpoint_ids=_ids(Checkpoint.objects.filter(run=run)))
    rnd1 = Round.objects.get(run=run, index=1)
    services.round_record(round_id=rnd1.id, results=device_results(rnd1, _round_updates(run, 1)))

    rnd0.refresh_from_db()
    task = run.experiment.tasks.get(name="t-mobilenet")
    ckpt0 = Checkpoint.objects.get(round=rnd0, task=task)
    assert ckpt0.test_accuracy == 0.9
    # the round's wall time ended when its model was saved; its evaluation ended a second later
    assert rnd0.wall_time_s == pytest.approx((rnd0.finished_at - rnd0.started_at).total_seconds())
    assert (ckpt0.evaluated_at - ckpt0.created_at).total_seconds() >= evaluation_s
    points = selectors.runs_accuracy_points([run.id])[run.id][task.id]
    reached = metrics.time_to_accuracy(points, 0.9)
    assert reached is not None and reached.rounds == 1
    run.refresh_from_db()
    # the wall clock runs from the run's start to the round's aggregation, not to its evaluation
    assert reached.wall_time_s == pytest.approx((rnd0.finished_at - run.started_at).total_seconds())
    assert reached.wall_time_s >= rnd0.wall_time_s
    assert reached.wall_time_s < (ckpt0.evaluated_at - run.started_at).total_seconds() - 0.9 * evaluation_s


@pytest.mark.django_db
def test_a_failed_evaluation_is_flagged_on_its_round_and_logged_and_leaves_no_accuracy(
    make_experiment, two_tasks, monkeypatch, caplog
):
    _sent_in_order(monkeypatch)
    run = begin(_experiment(make_experiment, two_tasks, rounds=2))
    rnd0 = Round.objects.get(run=run, index=0)
    services.round_record(round_id=rnd0.id, results=device_results(rnd0, _round_updates(run, 0)))
    made = list(Checkpoint.objects.filter(round=rnd0).select_related("task"))

    def broken(task, path):
        raise RuntimeError(f"size mismatch for features.0.weight in {Path(path).name}")

    monkeypatch.setattr(evaluation, "model_evaluate", broken)
    with caplog.at_level(logging.ERROR, logger="controlplane.experiments.services.evaluation"):
        assert services.checkpoints_evaluate(checkpoint_ids=[c.id for c in made]) == 2

    rnd0.refresh_from_db()
    for ckpt in made:
        ckpt.refresh_from_db()
        assert (ckpt.evaluation_status, ckpt.test_accuracy, ckpt.test_loss) == (FAILED, None, None)
        assert "RuntimeError: size mismatch" in ckpt.evaluation_error
        assert any(f"task {ckpt.task.name}: its global model could not be evaluated" in f for f in rnd0.flags)
    assert "evaluation failed" in caplog.text and "size mismatch" in caplog.text
    # failed is settled: a redelivery does not try again, and the round's flags are not repeated
    assert services.checkpoints_evaluate(checkpoint_ids=[c.id for c in made]) == 0
    assert len(Round.objects.get(id=rnd0.id).flags) == len(rnd0.flags)


def restarted_control_worker() -> dict:
    """What a restarted control worker does, in a fresh process: the resume sweep, then the
    evaluations it sends itself, run here. Returns what it did (printed as JSON by the caller)."""

    class _Patch:
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    capture_dispatch(_Patch())
    sent: list[list[int]] = []
    dispatch.send_checkpoints_evaluate = lambda ids: sent.append(sorted(ids))
    resume = services.runs_resume(nodename="control@host", booted_at=time.time())
    settled = sum(services.checkpoints_evaluate(checkpoint_ids=ids) for ids in sent)
    return {"resume": resume, "sent": sent, "settled": settled}


@pytest.mark.django_db(transaction=True)
def test_evaluations_lost_with_the_control_worker_are_done_by_the_restarted_one(
    make_experiment, two_tasks, monkeypatch
):
    # the control worker "dies" after round 0: its ROUND_ENQUEUE and its evaluations (the initial
    # models' and round 0's) are lost
    _sent_in_order(monkeypatch)
    run = begin(_experiment(make_experiment, two_tasks, rounds=2))
    rnd0 = Round.objects.get(run=run, index=0)
    services.round_record(round_id=rnd0.id, results=device_results(rnd0, _round_updates(run, 0)))
    pending = _ids(Checkpoint.objects.filter(run=run))
    assert len(pending) == 4
    assert set(Checkpoint.objects.filter(run=run).values_list("evaluation_status", flat=True)) == {PENDING}

    done = in_a_fresh_django_process("tests.controlplane.test_evaluation_beside:restarted_control_worker")

    assert done["resume"]["evaluations"] == 4 and done["resume"]["advanced"] == 1
    assert sorted({i for ids in done["sent"] for i in ids}) == pending
    assert done["settled"] == 4
    for ckpt in Checkpoint.objects.filter(run=run).select_related("task"):
        assert ckpt.evaluation_status == DONE
        assert (ckpt.test_accuracy, ckpt.test_loss) == _uncached(ckpt)


@pytest.mark.django_db
def test_a_model_is_evaluated_once_for_every_checkpoint_of_it_across_rounds_and_runs(
    make_experiment, two_tasks, monkeypatch
):
    _sent_in_order(monkeypatch)
    calls: list[str] = []
    real = evaluation.model_evaluate

    def counted(task, path):
        calls.append(Path(path).name)
        return real(task, path)

    monkeypatch.setattr(evaluation, "model_evaluate", counted)
    experiment = _experiment(make_experiment, two_tasks, rounds=2)
    first, second = begin(experiment), begin(experiment)  # two strategies: the same initial models
    rnd0 = Round.objects.get(run=first, index=0)
    store = get_store()
    # the devices pass the models through unchanged (as the simulated backend does)
    unchanged = {
        (d, t): store.path(Checkpoint.objects.get(run=first, round=None, task__name=t).artifact_path).read_bytes()
        for d, t in [("dev-a", "t-mobilenet"), ("dev-b", "t-mobilenet"), ("dev-b", "t-shufflenet")]
    }
    services.round_record(round_id=rnd0.id, results=device_results(rnd0, unchanged))
    kept = _ids(Checkpoint.objects.filter(round=rnd0))
    assert set(Checkpoint.objects.filter(id__in=kept).values_list("evaluation_status", flat=True)) == {PENDING}

    # round 0's message and the second run's leave the models to the first run's initial
    # checkpoints, evaluated with their own message: once per model, for all six checkpoints
    assert services.checkpoints_evaluate(checkpoint_ids=kept) == 0
    assert services.checkpoints_evaluate(checkpoint_ids=_ids(second.checkpoints.all())) == 0
    assert calls == []
    assert services.checkpoints_evaluate(checkpoint_ids=_ids(first.checkpoints.filter(round=None))) == 6
    assert sorted(calls) == ["initial.safetensors", "initial.safetensors"]
    by_task = {}
    for ckpt in Checkpoint.objects.filter(run__in=[first, second]).select_related("task"):
        assert ckpt.evaluation_status == DONE
        by_task.setdefault(ckpt.task.name, set()).add((ckpt.test_accuracy, ckpt.test_loss))
    assert all(len(results) == 1 for results in by_task.values())
