"""Control-queue Celery task of the lab: a scheduling pass.

``LAB_SCHEDULE`` is acknowledged late: a pass is idempotent and safe to run twice or at once
(a device is claimed by one conditional insert, a round granted by one conditional update).
"""

from __future__ import annotations

from controlplane.celery import app
from controlplane.lab.services.scheduler import lab_schedule as _lab_schedule_pass
from workers.protocol.queues import TaskName


@app.task(name=TaskName.LAB_SCHEDULE, ignore_result=True, acks_late=True)
def lab_schedule() -> None:
    """Run one scheduling pass (:func:`controlplane.lab.services.scheduler.lab_schedule`)."""
    _lab_schedule_pass()
