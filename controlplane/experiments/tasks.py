"""Control-queue Celery tasks of the round protocol: each loads ids and calls a service.

Late acknowledgement (``acks_late=True``) only for tasks that are safe to run twice: each claims
its work with one conditional update (``RUN_BEGIN``: pending → running; ``ROUND_ENQUEUE``: one
round row per index; ``ROUND_SETTLE``/``ROUND_WATCHDOG``: running → aggregating, retries by
attempt; ``STANDALONE_*``: under the run's row lock, only while no round exists;
``RUNS_RESUME``: every action conditional; ``CHECKPOINTS_EVALUATE``: only checkpoints still
pending, settled with one conditional update), so a message redelivered after a worker died
changes nothing twice. The lab's ``LAB_SCHEDULE`` and storage's ``RUN_RETENTION`` are in
:mod:`controlplane.lab.tasks` and :mod:`controlplane.storage.tasks`. ``ROUND_PROGRESS`` is
display only and acked on receipt.
"""

from __future__ import annotations

from controlplane.celery import app
from controlplane.experiments import services
from workers.protocol.queues import TaskName


@app.task(name=TaskName.RUN_BEGIN, ignore_result=True, acks_late=True, bind=True)
def run_begin(self, run_id: int) -> None:
    services.run_begin(run_id=run_id, claimant=self.request.hostname or "")


@app.task(name=TaskName.STANDALONE_RECORDED, ignore_result=True, acks_late=True)
def standalone_recorded(results: list, run_id: int, before_round: int = 0) -> None:
    services.standalone_record(run_id=run_id, results=results, before_round=before_round)


@app.task(name=TaskName.STANDALONE_WATCHDOG, ignore_result=True, acks_late=True)
def standalone_watchdog(run_id: int, before_round: int = 0) -> None:
    services.standalone_watchdog(run_id=run_id, before_round=before_round)


@app.task(name=TaskName.ROUND_ENQUEUE, ignore_result=True, acks_late=True)
def round_enqueue(run_id: int, index: int) -> None:
    services.round_enqueue(run_id=run_id, index=index)


@app.task(name=TaskName.ROUND_PROGRESS, ignore_result=True)
def round_progress(round_id: int, device: str, phase: str, at: float | None = None) -> None:
    services.round_progress(round_id=round_id, device=device, phase=phase, at=at)


@app.task(name=TaskName.ROUND_SETTLE, ignore_result=True, acks_late=True, bind=True)
def round_settle(self, results: list, round_id: int) -> None:
    # The chord's callback: every device's first attempt answered. A failed device may still be
    # retried, so settling does not record the round unconditionally.
    services.round_settle(round_id=round_id, results=results, claimant=self.request.hostname or "")


@app.task(name=TaskName.ROUND_WATCHDOG, ignore_result=True, acks_late=True, bind=True)
def round_watchdog(self, round_id: int) -> None:
    services.round_watchdog(round_id=round_id, claimant=self.request.hostname or "")


@app.task(name=TaskName.CHECKPOINTS_EVALUATE, ignore_result=True, acks_late=True)
def checkpoints_evaluate(checkpoint_ids: list[int]) -> None:
    # Beside the next round's training (the control worker runs two tasks at a time).
    services.checkpoints_evaluate(checkpoint_ids=checkpoint_ids)


@app.task(name=TaskName.RUNS_RESUME, ignore_result=True, acks_late=True)
def runs_resume(nodename: str = "", booted_at: float | None = None) -> None:
    services.runs_resume(nodename=nodename, booted_at=booted_at)


# The names ROUND_ENQUEUE and ROUND_SETTLE had before the round's steps were renamed: a message
# the previous release queued (a round waiting for its devices, a chord whose callback was signed
# with the old name) is still served after an upgrade instead of being dropped as unregistered.
# To be removed one release later.
PREVIOUS_TASK_NAMES: dict[str, str] = {
    TaskName.ROUND_ENQUEUE: "mtfl.round_start",
    TaskName.ROUND_SETTLE: "mtfl.round_finish",
}


@app.task(name=PREVIOUS_TASK_NAMES[TaskName.ROUND_ENQUEUE], ignore_result=True, acks_late=True)
def round_start_previous_name(run_id: int, index: int) -> None:
    services.round_enqueue(run_id=run_id, index=index)


@app.task(name=PREVIOUS_TASK_NAMES[TaskName.ROUND_SETTLE], ignore_result=True, acks_late=True, bind=True)
def round_finish_previous_name(self, results: list, round_id: int) -> None:
    services.round_settle(round_id=round_id, results=results, claimant=self.request.hostname or "")
