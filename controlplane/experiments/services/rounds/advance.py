"""After a round: start the next round, or end the run; evaluate the round's global models
beside that; then free what the retention policy allows."""

from __future__ import annotations

from django.db import transaction

from controlplane.experiments.models import ROUND_ENDED, Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.evaluation import (
    checkpoints_evaluate_on_commit,
    round_checkpoints_pending,
    run_checkpoints_evaluate,
)
from controlplane.experiments.services.runs import run_fail, run_finish


def round_advance(rnd: Round) -> None:
    """Move a run on after its round ``rnd`` ended: a round that failed on every device fails
    the run; otherwise the next round is queued once the transaction commits
    (``ROUND_ENQUEUE``, idempotent: one round row per index), or, after the experiment's last
    round, the run is finished (:func:`.runs.run_finish`). Nothing of that happens when the run
    is no longer running (cancelled, or already moved on).

    The round's global models are evaluated off the critical path: their evaluation
    (``CHECKPOINTS_EVALUATE``) is queued right after the next round, so it runs while the devices
    train. After the last round nothing waits on the run, so whatever of it is still pending is
    evaluated inline before it is finished (:func:`.evaluation.run_checkpoints_evaluate`): a run
    reported finished has every round's accuracy (or, where an evaluation failed, the reason on
    the checkpoint and its round's flags). A run that fails or was cancelled is not waited for:
    its queued evaluations still run.

    Then, once the round's checkpoints are committed and the next round is sent, the retention
    policy is queued as its own control task (``RUN_RETENTION``:
    :func:`controlplane.storage.services.retention.retention_after_round`: device weights of ended rounds, checkpoints no
    longer kept), so neither this task nor the next round waits for it (at 1,000 devices it
    removes 3,000 files and 1,000 folders: a third of what recording the round took). Running beside that round is safe: the policy plans
    from what is committed when it runs, so it keeps the checkpoint the round reads (the latest)
    and those still to be evaluated, and never touches the weights of a round that has not
    ended. It only logs its failures.
    """
    run = Run.objects.select_related("experiment").get(id=rnd.run_id)
    finishing = (
        run.status == Run.Status.RUNNING
        and rnd.status != Round.Status.FAILED
        and rnd.index + 1 >= run.experiment.rounds
    )
    if run.status == Run.Status.RUNNING:
        if rnd.status == Round.Status.FAILED:
            run_fail(run_id=run.id, error=f"round {rnd.index} failed on every device: {rnd.error}")
        elif not finishing:
            transaction.on_commit(lambda: dispatch.send_round_enqueue(run.id, rnd.index + 1))
    if finishing:
        run_checkpoints_evaluate(run.id)
        run_finish(run_id=run.id)
    else:
        checkpoints_evaluate_on_commit(round_checkpoints_pending(rnd.id))
    if rnd.status in ROUND_ENDED:
        run_id, index = rnd.run_id, rnd.index
        transaction.on_commit(lambda: dispatch.send_run_retention(run_id, index))
