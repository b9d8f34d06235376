"""After a round: start the next one, or end the run."""

from __future__ import annotations

from django.db import transaction

from controlplane.experiments.models import Round, Run
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.runs import run_fail, run_finish


def round_advance(rnd: Round) -> None:
    """Move a run on after its round ``rnd`` ended: a round that failed on every device fails
    the run; otherwise the next round is queued once the transaction commits
    (``ROUND_START``, idempotent: one round row per index), or, after the experiment's last
    round, the run is finished (:func:`.runs.run_finish`). Nothing happens when the run is no
    longer running (cancelled, or already moved on)."""
    run = Run.objects.select_related("experiment").get(id=rnd.run_id)
    if run.status != Run.Status.RUNNING:
        return
    if rnd.status == Round.Status.FAILED:
        run_fail(run_id=run.id, error=f"round {rnd.index} failed on every device: {rnd.error}")
        return
    if rnd.index + 1 < run.experiment.rounds:
        transaction.on_commit(lambda: dispatch.send_round_start(run.id, rnd.index + 1))
    else:
        run_finish(run_id=run.id)
