"""Control-queue Celery task of the storage app: the retention policy after a round.

``RUN_RETENTION`` is acknowledged late: it is safe twice (rows are marked only while unmarked, a
file already gone is skipped).
"""

from __future__ import annotations

from controlplane.celery import app
from controlplane.storage.services.retention import retention_after_round
from workers.protocol.queues import TaskName


@app.task(name=TaskName.RUN_RETENTION, ignore_result=True, acks_late=True)
def run_retention(run_id: int, round_index: int) -> None:
    """:func:`controlplane.storage.services.retention.retention_after_round` of round
    ``round_index`` of run ``run_id``."""
    # Beside the next round's training; a lost one is made up by the next round's or mtfl gc.
    retention_after_round(run_id, round_index)
