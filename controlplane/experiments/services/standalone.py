"""Beginning a run: its initial models, then round 0, whose devices first measure the
``P_alone`` it trains (each task alone on the whole device at its planned batch size, the
denominator of fair throughput).

:func:`run_begin` claims a pending run, writes and evaluates the seeded initial models and
enqueues round 0 (:func:`.rounds.enqueue.round_enqueue`). Once the lab scheduler has leased its
devices, :func:`.rounds.dispatch.round_dispatch` takes what the cross-run cache knows
(:mod:`.standalone_cache`) and asks them for the ``P_alone`` measured nowhere yet
(:mod:`.rounds.alone`: round 0's devices, then devices drawn for the first time or replanned
batch sizes); :func:`standalone_record` stores the answers (and keeps the successful ones in the
cache) and dispatches the round; :func:`standalone_watchdog` dispatches it anyway at the
deadline with the devices that did not answer recorded as failed.

A run cancelled while it starts stops at its next step and its initial models go
(:func:`.stop.run_start_undo`); a run begun again after its control worker was lost keeps its
first ``started_at`` (:func:`.reliability.runs_resume` counts the restart).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.common.bulk import bulk_insert, bulk_set
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Checkpoint, Round, Run, StandaloneThroughput
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.evaluation import checkpoints_evaluate_on_commit
from controlplane.experiments.services.participation import round_participants
from controlplane.experiments.services.planning import plan_from_json, run_plan
from controlplane.experiments.services.rounds.dispatch import round_dispatch
from controlplane.experiments.services.rounds.enqueue import round_enqueue
from controlplane.experiments.services.runs import run_fail
from controlplane.experiments.services.standalone_cache import Measured, standalone_cache_store
from controlplane.experiments.services.stop import run_start_undo
from controlplane.planning.types import Plan
from workers.fl.artifacts import get_store, global_weights_key, save_model_weights
from workers.protocol.messages import StandaloneResult

log = logging.getLogger(__name__)


def run_begin(*, run_id: int, claimant: str = "") -> None:
    """Claim a pending run, write the initial models, ask for ``P_alone``.

    Every strategy of an experiment starts from the same initial weights (seeded by the
    experiment's seed), so runs differ only in how devices are shared. The initial models are
    evaluated beside the run's start (``CHECKPOINTS_EVALUATE``, queued with round 0:
    :mod:`.evaluation`; a run's second strategy takes the first's results of the same model).

    Args:
        claimant: the control worker's name, kept so a restart of it can begin again a run it
            was preparing (:func:`controlplane.experiments.services.reliability.runs_resume`).
    """
    now = timezone.now()
    # A run begun again after a restart (runs_resume) keeps its first started_at: its wall time
    # includes the restart's delay. claimed_at is this claim's time, which runs_resume judges.
    claimed = Run.objects.filter(id=run_id, status=Run.Status.PENDING).update(
        status=Run.Status.RUNNING,
        started_at=Coalesce(F("started_at"), Value(now)),
        claimed_at=now,
        claimed_by=claimant[:200],
    )
    if not claimed:
        log.info("run %s is not pending; RUN_BEGIN ignored", run_id)
        return
    run = Run.objects.select_related("experiment").get(id=run_id)
    experiment = run.experiment
    store = get_store()
    initial: list[int] = []
    try:
        from workers.training.zoo import build_model  # deferred: torch, only where initial models are built

        for task in experiment.tasks.order_by("id"):
            if _start_cancelled(run.id):
                return
            key = global_weights_key(run.id, task.id, None)
            # Built at the task's own input shape: a plug-in model on other data than images
            # (its first layer's size follows from the shape) has no 3×32×32 form.
            model = build_model(task.architecture, task.num_classes, experiment.seed, tuple(task.input_shape))
            sha = save_model_weights(model, store.path(key))
            initial.append(
                Checkpoint.objects.create(
                    run=run,
                    task=task,
                    round=None,
                    artifact_path=key,
                    sha256=sha,
                    evaluation_status=Checkpoint.Evaluation.PENDING,
                ).id
            )
    except Exception as exc:  # noqa: BLE001 - any failure here ends the run, with its cause shown
        run_fail(run_id=run.id, error=f"could not prepare the initial models: {type(exc).__name__}: {exc}")
        return
    if _start_cancelled(run.id):
        return
    # Round 0 waits for its devices like any round; once leased, its P_alone missing from the
    # cache are measured first.
    round_enqueue(run_id=run.id, index=0)
    checkpoints_evaluate_on_commit(initial)


def _start_cancelled(run_id: int) -> bool:
    """Whether the run stopped running while it was being prepared (a user cancelled it, or it
    failed); if so, remove what its start wrote (:func:`.stop.run_start_undo`)."""
    if Run.objects.filter(id=run_id, status=Run.Status.RUNNING).exists():
        return False
    log.info("run %s ended while it was being prepared; its start stops and its initial models go", run_id)
    run_start_undo(run_id=run_id)
    return True


def standalone_record(*, run_id: int, results: Iterable[Any], before_round: int = 0) -> None:
    """Store every device's ``P_alone`` measurements, then start round ``before_round`` (0, or
    a replanned round waiting for batch sizes measured nowhere yet: :mod:`.rounds.alone`).

    A device whose measurement failed gets rows with the error and no throughput; its fair
    throughput is then unknown (shown as missing), but the run goes on.
    """
    with transaction.atomic():
        # The run's row lock serialises a late answer and the watchdog recording the same rows.
        run = Run.objects.select_for_update(of=("self",)).select_related("experiment").get(id=run_id)
        if run.status != Run.Status.RUNNING:
            return
        _standalone_rows_save(run, results, before_round=before_round)
    _round_continue(run_id, before_round)


def _round_continue(run_id: int, index: int) -> None:
    """Dispatch round ``index``, which was waiting for ``P_alone`` on its leased devices (a run
    begun before rounds were queued has no round row yet: it is enqueued)."""
    rnd = Round.objects.filter(run_id=run_id, index=index).only("id").first()
    if rnd is None:
        round_enqueue(run_id=run_id, index=index)
        return
    round_dispatch(round_id=rnd.id)


def _standalone_rows_save(run: Run, results: Iterable[Any] | None, *, before_round: int = 0) -> None:
    """Insert or update the ``P_alone`` rows of every valid result (four queries in all), reading
    only the answering devices' (not the whole federation's)."""
    results = list(results or [])
    named = {raw.get("device") for raw in results if isinstance(raw, dict)}
    answering = run.experiment.devices.only("id", "name")
    if len(named) <= selectors.DEVICE_FILTER_LIMIT:
        answering = answering.filter(name__in=named)
    devices = {d.name: d for d in answering if d.name in named}
    plan: Plan | None = None
    # One query to read what is stored, two to write: a redelivered result updates its rows.
    stored = {
        (s.device_id, s.task_id, s.batch_size): s
        for s in selectors.device_filtered(
            StandaloneThroughput.objects.filter(run=run), [d.id for d in devices.values()]
        )
    }
    created: dict[tuple[int, int, int], StandaloneThroughput] = {}
    changed: dict[tuple[int, int, int], StandaloneThroughput] = {}
    for raw in results or []:
        try:
            result = StandaloneResult.model_validate(raw)
        except PydanticValidationError as exc:
            log.error("run %s: malformed standalone result ignored: %s", run.id, exc)
            continue
        device = devices.get(result.device)
        if device is None:
            continue
        measurements = [
            (m.task_id, m.batch_size, m.throughput_sps, m.error or result.error, m.simulated)
            for m in result.measurements
        ]
        if not measurements:  # the whole device failed: record why against each of its tasks
            plan = plan or _awaited_plan(run, before_round)
            measurements = [(a.task_id, a.batch_size, None, result.error, False) for a in plan.on_device(device.id)]
        for task_id, batch_size, throughput, error, simulated in measurements:
            key = (device.id, task_id, batch_size)
            values = {"throughput_sps": throughput, "error": error, "simulated": simulated or result.simulated}
            row = created.get(key) or stored.get(key)
            if row is None:
                created[key] = StandaloneThroughput(
                    run=run, device=device, task_id=task_id, batch_size=batch_size, **values
                )
                continue
            for field, value in values.items():
                setattr(row, field, value)
            if key not in created:
                changed[key] = row
    # One prepared statement (controlplane.common.bulk): with partial participation every round
    # inserts the P_alone of the devices it draws for the first time.
    bulk_insert(
        StandaloneThroughput,
        [
            {
                "run_id": run.id,
                "device_id": row.device_id,
                "task_id": row.task_id,
                "batch_size": row.batch_size,
                "throughput_sps": row.throughput_sps,
                "error": row.error,
                "simulated": row.simulated,
            }
            for row in created.values()
        ],
    )
    bulk_set(StandaloneThroughput, list(changed.values()), ["throughput_sps", "error", "simulated"])
    # Kept for the next runs of these workloads on these devices (:mod:`.standalone_cache`).
    standalone_cache_store(
        run,
        [
            Measured(row.device_id, row.task_id, row.batch_size, row.throughput_sps, row.simulated)
            for row in (*created.values(), *changed.values())
            if row.throughput_sps is not None and not row.error
        ],
    )


def _round_zero_plan(run: Run) -> Plan:
    """What round 0 trains: the run's plan of round 0's participants
    (:func:`.participation.round_participants`; every device without partial participation)."""
    return run_plan(run, device_ids=round_participants(run.experiment, 0))


def _awaited_plan(run: Run, before_round: int) -> Plan:
    """The plan whose ``P_alone`` are being measured: round 0's, or the pending round's (a
    replanned round, or one that drew devices measured nowhere yet)."""
    pending = (run.planned or {}).get("pending_round")
    if pending and pending.get("index") == before_round:
        return plan_from_json(pending["plan"])
    return _round_zero_plan(run)


def standalone_watchdog(*, run_id: int, before_round: int = 0) -> None:
    """At the deadline of the ``P_alone`` measurements: if the run is still waiting for them,
    record the devices that did not answer and start round ``before_round`` anyway (its own
    deadline then fails a device that is really gone; a late answer still fills in ``P_alone``)."""
    run = Run.objects.filter(id=run_id, status=Run.Status.RUNNING).first()
    if run is None or run.rounds.filter(index=before_round, deadline_at__isnull=False).exists():
        return  # the round was dispatched: the measurements were recorded
    deadline_s = float(mtfl_setting("ROUND_DEADLINE_S"))
    # Devices that answered while the chord could not complete (another agent died) are in the
    # result backend under their task ids.
    states = dispatch.device_task_states((run.standalone_task_ids or {}).values())
    answered = [st.result for st in states.values() if st.status == "SUCCESS" and isinstance(st.result, dict)]
    # Devices with a row for every (task, batch size) awaited: before round 0 that is any row.
    awaited = _awaited_plan(run, before_round)
    awaited_ids = sorted({a.device_id for a in awaited.assignments})
    rows = set(selectors.standalone_table(run, device_ids=awaited_ids))
    names = {
        d.id: d.name for d in selectors.experiment_devices(run.experiment, device_ids=awaited_ids, fields=["name"])
    }
    missing_rows = {a.device_id for a in awaited.assignments if (a.device_id, a.task_id, a.batch_size) not in rows}
    measured = {names[d] for d in awaited_ids if d not in missing_rows}
    measured |= {r.get("device") for r in answered}
    missing = sorted(set(names.values()) - measured)
    results = answered + [
        {
            "run_id": run.id,
            "device": name,
            "status": "failed",
            "error": f"no standalone measurement within the round deadline ({deadline_s:g} s)",
        }
        for name in missing
    ]
    log.warning(
        "run %s: no P_alone from %s within %g s; starting round %s",
        run_id,
        ", ".join(missing),
        deadline_s,
        before_round,
    )
    standalone_record(run_id=run_id, results=results, before_round=before_round)
