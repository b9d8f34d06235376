"""Evaluating global models on their task's test split, in the control worker, beside the
next round's training.

A round's checkpoints are saved with their test results pending
(``Checkpoint.evaluation_status``), and :func:`checkpoints_evaluate_on_commit` queues
``CHECKPOINTS_EVALUATE`` beside the next round's dispatch: the control worker runs two tasks at
a time (:mod:`controlplane.core.stack`), so the evaluation runs while the devices train, and
the next round never waits for it. The results are recorded against the checkpoint, so against
the round that made the model; the model existed when the checkpoint was created
(``created_at``, when its round ended), which is what time to accuracy counts
(:func:`controlplane.planning.metrics.time_to_accuracy` sums the rounds' times up to the round,
not the time its evaluation took).

Nothing is lost or counted twice:

- :func:`checkpoints_evaluate` settles only checkpoints still pending, with one conditional
  update, so a redelivered message (the task is ``acks_late``) or two messages naming the same
  checkpoint change nothing twice;
- a model (same task, same SHA-256) is evaluated once: a checkpoint of a model evaluated before
  takes those results, and one evaluation settles every checkpoint of its model still pending
  (a round that kept the previous model, the simulated backend's unchanged models, every
  strategy's identical initial models), so a message whose model is pending in an earlier
  checkpoint leaves it to that checkpoint's evaluation and frees its worker slot at once;
- a failed evaluation leaves the accuracy ``None``, records why on the checkpoint
  (``evaluation_error``) and on its round's flags, and logs it;
- a control worker that restarts sends every pending evaluation again
  (:func:`checkpoints_evaluate_resend`, from
  :func:`controlplane.experiments.services.reliability.runs_resume`);
- a run is finished only once every checkpoint of it is evaluated: the step that finishes it
  evaluates what is still pending inline (:func:`run_checkpoints_evaluate`), since nothing waits
  on the run then.

Nothing in the round protocol reads an accuracy before the next round (closed-loop replanning
reads measured throughputs; there is no early stop at a target accuracy), so no run needs its
evaluations inline.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from controlplane.common.gc_tuning import control_worker_gc
from controlplane.experiments import selectors
from controlplane.experiments.models import Checkpoint, Round
from controlplane.experiments.services import dispatch
from workers.fl.artifacts import get_store
from workers.protocol.messages import TaskRef

log = logging.getLogger(__name__)

PENDING = Checkpoint.Evaluation.PENDING


def model_evaluate(task: TaskRef, weights_path: Path | str) -> tuple[float, float]:
    """Test accuracy (0–1) and mean test loss of the weights at ``weights_path``.

    Calls :func:`workers.training.evaluate.evaluate` (torch is imported on first use, so a web process
    that never evaluates never loads it; the worker process keeps the model and the test tensors
    for the next call), then, once per process, keeps the garbage collector off the objects that
    import left behind (:func:`_freeze_long_lived`).

    Raises:
        FileNotFoundError, ValueError: as :func:`workers.training.evaluate.evaluate` (missing or
            mismatched weights, a bad batch size).
    """
    from workers.training.evaluate import evaluate  # deferred: torch, only in the control worker that evaluates

    result = evaluate(task, weights_path)
    _freeze_long_lived()
    return result


def checkpoints_evaluate(*, checkpoint_ids: Iterable[int], force: bool = False) -> int:
    """Evaluate the checkpoints of ``checkpoint_ids`` whose test results are still pending.

    Checkpoints of the same task and model (SHA-256) are evaluated once, or not at all when a
    checkpoint of that model was evaluated before (its results are copied). A model is left
    alone when an earlier checkpoint of it (a lower id, of any run) is pending too and not among
    ``checkpoint_ids``, unless ``force``: that checkpoint's own evaluation settles this one (a
    lost message of it is sent again by :func:`checkpoints_evaluate_resend`). Each model's
    results are written to every checkpoint of it still pending with one conditional update
    (pending → done or failed), so a checkpoint settled meanwhile by another call keeps that
    call's results (the same numbers: evaluation is deterministic). A failure is recorded, never
    raised: the checkpoints of ``checkpoint_ids`` are ``failed`` with ``evaluation_error``, their
    rounds get a flag line, and the error is logged.

    Args:
        checkpoint_ids: checkpoint ids; those not pending (or gone) are skipped.
        force: evaluate every model of ``checkpoint_ids`` still pending now, whatever else is
            pending (a run about to be reported finished).

    Returns:
        How many checkpoints this call settled (other runs' checkpoints of the same models included).
    """
    pending = list(
        Checkpoint.objects.filter(id__in=list(checkpoint_ids), evaluation_status=PENDING)
        .select_related("task")
        .order_by("id")
    )
    groups: dict[tuple[int, str], list[Checkpoint]] = defaultdict(list)
    for ckpt in pending:
        groups[(ckpt.task_id, ckpt.sha256)].append(ckpt)
    store = get_store()
    settled = 0
    for (task_id, sha256), members in groups.items():
        known = (
            Checkpoint.objects.filter(task_id=task_id, sha256=sha256, evaluation_status=Checkpoint.Evaluation.DONE)
            .values_list("test_accuracy", "test_loss")
            .first()
        )
        if known is None and not force:
            earliest = (
                Checkpoint.objects.filter(task_id=task_id, sha256=sha256, evaluation_status=PENDING)
                .order_by("id")
                .values_list("id", flat=True)
                .first()
            )
            if earliest is not None and earliest < members[0].id:
                log.info("checkpoint %s: its model is evaluated with checkpoint %s", members[0].id, earliest)
                continue
        error = ""
        accuracy = loss = None
        if known is not None:
            accuracy, loss = known
        else:
            first = members[0]
            try:
                accuracy, loss = model_evaluate(selectors.task_ref(first.task), store.path(first.artifact_path))
            except Exception as exc:  # noqa: BLE001 - recorded on the checkpoint and its round, and logged
                log.exception("checkpoint %s (run %s, task %s): evaluation failed", first.id, first.run_id, task_id)
                error = f"{type(exc).__name__}: {exc}"
        settled += _settle(members, accuracy, loss, error)
    return settled


def _settle(members: list[Checkpoint], accuracy: float | None, loss: float | None, error: str) -> int:
    """Record one model's results on every checkpoint of it (the task and SHA-256 of
    ``members``) still pending, or its ``error`` on ``members`` only (it may be theirs alone: a
    file gone) with a flag on their rounds. Returns the rows changed."""
    first = members[0]
    with transaction.atomic():
        same = Checkpoint.objects.filter(evaluation_status=PENDING)
        if error:
            same = same.filter(id__in=[c.id for c in members])
        else:
            same = same.filter(task_id=first.task_id, sha256=first.sha256)
        rows = list(same.values_list("id", "round_id"))
        changed = Checkpoint.objects.filter(id__in=[i for i, _ in rows], evaluation_status=PENDING).update(
            test_accuracy=None if error else accuracy,
            test_loss=None if error else loss,
            evaluation_status=Checkpoint.Evaluation.FAILED if error else Checkpoint.Evaluation.DONE,
            evaluation_error=error[:10_000],
            evaluated_at=timezone.now(),
        )
        if error and changed:
            line = f"task {first.task.name}: its global model could not be evaluated ({error[:500]}); no test accuracy"
            for rnd in Round.objects.select_for_update().filter(id__in={r for _, r in rows if r}):
                Round.objects.filter(id=rnd.id).update(flags=[*rnd.flags, line])
    return changed


def checkpoints_evaluate_on_commit(checkpoint_ids: Iterable[int]) -> None:
    """Queue the evaluation of ``checkpoint_ids`` (``CHECKPOINTS_EVALUATE`` on ``control``) once
    the current transaction commits; nothing when there are none."""
    ids = sorted(set(checkpoint_ids))
    if ids:
        transaction.on_commit(lambda: dispatch.send_checkpoints_evaluate(ids))


def round_checkpoints_pending(round_id: int) -> list[int]:
    """The ids of a round's checkpoints whose evaluation is pending."""
    return list(Checkpoint.objects.filter(round_id=round_id, evaluation_status=PENDING).values_list("id", flat=True))


def run_checkpoints_evaluate(run_id: int) -> int:
    """Evaluate, now, every checkpoint of the run still pending (the initial models' and every
    round's), before the run is reported finished: its final figures then hold every round's
    accuracy. Evaluations already queued find them settled and do nothing.

    Returns:
        How many checkpoints this call settled.
    """
    ids = Checkpoint.objects.filter(run_id=run_id, evaluation_status=PENDING).values_list("id", flat=True)
    return checkpoints_evaluate(checkpoint_ids=list(ids), force=True)


def checkpoints_evaluate_resend() -> int:
    """After a control worker (re)connected: queue again, one message per run, the evaluation
    of every checkpoint still pending (a message the worker was running when it died waits
    for the broker's visibility timeout otherwise). Settling is conditional, so a duplicate
    only costs an evaluation.

    Returns:
        The number of pending checkpoints sent.
    """
    by_run: dict[int, list[int]] = defaultdict(list)
    for ckpt_id, run_id in Checkpoint.objects.filter(evaluation_status=PENDING).values_list("id", "run_id"):
        by_run[run_id].append(ckpt_id)
    for ids in by_run.values():
        checkpoints_evaluate_on_commit(ids)
    return sum(len(ids) for ids in by_run.values())


_FROZEN = False


def _freeze_long_lived() -> None:
    """Once per process, after its first evaluation: freeze what importing torch and
    torchvision left (some 400,000 objects that live as long as the process, which every full
    collection walked again) out of the garbage collector's generations, with the control
    worker's settings (:func:`controlplane.common.gc_tuning.control_worker_gc`)."""
    global _FROZEN
    if _FROZEN:
        return
    _FROZEN = True
    control_worker_gc()
