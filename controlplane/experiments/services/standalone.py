"""Beginning a run: its initial models, then every device's ``P_alone`` (each task alone on the
whole device at its planned batch size, the denominator of fair throughput), then round 0.

:func:`run_begin` claims a pending run, writes and evaluates the seeded initial models and asks
every device for ``P_alone``; :func:`standalone_record` stores the answers and starts round 0
(:func:`.rounds.start.round_start`); :func:`standalone_watchdog` starts it anyway at the
deadline with the devices that did not answer recorded as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from controlplane.common.bulk import bulk_set
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Checkpoint, Run, StandaloneThroughput
from controlplane.experiments.services import dispatch
from controlplane.experiments.services.evaluation import model_evaluate
from controlplane.experiments.services.planning import run_plan
from controlplane.experiments.services.rounds.requests import shard_ref
from controlplane.experiments.services.rounds.start import round_start
from controlplane.experiments.services.runs import run_fail
from controlplane.planning.types import Plan
from workers.fl.artifacts import get_store, global_weights_key
from workers.protocol.messages import StandaloneItem, StandaloneRequest, StandaloneResult

log = logging.getLogger(__name__)


def run_begin(*, run_id: int, claimant: str = "") -> None:
    """Claim a pending run, write and evaluate the initial models, ask for ``P_alone``.

    Every strategy of an experiment starts from the same initial weights (seeded by the
    experiment's seed), so runs differ only in how devices are shared.

    Args:
        claimant: the control worker's name, kept so a restart of it can begin again a run it
            was preparing (:func:`controlplane.experiments.services.reliability.runs_resume`).
    """
    claimed = Run.objects.filter(id=run_id, status=Run.Status.PENDING).update(
        status=Run.Status.RUNNING, started_at=timezone.now(), claimed_by=claimant[:200]
    )
    if not claimed:
        log.info("run %s is not pending; RUN_BEGIN ignored", run_id)
        return
    run = Run.objects.select_related("experiment").get(id=run_id)
    experiment = run.experiment
    store = get_store()
    try:
        from workers.fl.artifacts import save_model_weights
        from workers.training.zoo import build_model

        for task in experiment.tasks.order_by("id"):
            key = global_weights_key(run.id, task.id, None)
            # Built at the task's own input shape: a plug-in model on other data than images
            # (its first layer's size follows from the shape) has no 3×32×32 form.
            model = build_model(task.architecture, task.num_classes, experiment.seed, tuple(task.input_shape))
            sha = save_model_weights(model, store.path(key))
            accuracy, loss = model_evaluate(selectors.task_ref(task), store.path(key))
            Checkpoint.objects.create(
                run=run, task=task, round=None, artifact_path=key, sha256=sha, test_accuracy=accuracy, test_loss=loss
            )
        plan = run_plan(run)
    except Exception as exc:  # noqa: BLE001 - any failure here ends the run, with its cause shown
        run_fail(run_id=run.id, error=f"could not prepare the initial models: {type(exc).__name__}: {exc}")
        return
    shards = selectors.experiment_shards(experiment, with_indices=True)
    tasks = {t.id: t for t in experiment.tasks.all()}
    devices = {d.id: d for d in experiment.devices.all()}
    requests = []
    for device_id in sorted({a.device_id for a in plan.assignments}):
        items = [
            StandaloneItem(
                task=selectors.task_ref(tasks[a.task_id]),
                batch_size=a.batch_size,
                shard=shard_ref(experiment, shards[(a.device_id, a.task_id)]),
            )
            for a in plan.on_device(device_id)
        ]
        requests.append(
            StandaloneRequest(
                run_id=run.id,
                device=devices[device_id].name,
                backend=devices[device_id].backend,
                warmup_iterations=mtfl_setting("WARMUP_ITERATIONS"),
                timed_iterations=mtfl_setting("STANDALONE_TIMED_ITERATIONS"),
                items=items,
            )
        )
    task_ids = {r.device: dispatch.new_task_id() for r in requests}
    Run.objects.filter(id=run.id).update(standalone_task_ids=task_ids)
    dispatch.send_standalone(run.id, requests, deadline_s=float(mtfl_setting("ROUND_DEADLINE_S")), task_ids=task_ids)


def standalone_record(*, run_id: int, results: Iterable[Any]) -> None:
    """Store every device's ``P_alone`` measurements, then start round 0.

    A device whose measurement failed gets rows with the error and no throughput; its fair
    throughput is then unknown (shown as missing), but the run goes on.
    """
    with transaction.atomic():
        # The run's row lock serialises a late answer and the watchdog recording the same rows.
        run = Run.objects.select_for_update(of=("self",)).select_related("experiment").get(id=run_id)
        if run.status != Run.Status.RUNNING:
            return
        _standalone_rows_save(run, results)
    round_start(run_id=run_id, index=0)


def _standalone_rows_save(run: Run, results: Iterable[Any] | None) -> None:
    """Insert or update the ``P_alone`` rows of every valid result (three queries in all)."""
    devices = {d.name: d for d in run.experiment.devices.all()}
    plan: Plan | None = None
    # One query to read what is stored, two to write: a redelivered result updates its rows.
    stored = {(s.device_id, s.task_id, s.batch_size): s for s in StandaloneThroughput.objects.filter(run=run)}
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
            plan = plan or run_plan(run)
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
    StandaloneThroughput.objects.bulk_create(created.values())
    bulk_set(StandaloneThroughput, list(changed.values()), ["throughput_sps", "error", "simulated"])


def standalone_watchdog(*, run_id: int) -> None:
    """At the deadline of the ``P_alone`` measurements: if the run is still waiting for them,
    record the devices that did not answer and start round 0 anyway (its own deadline then
    fails a device that is really gone; a late answer still fills in ``P_alone``)."""
    run = Run.objects.filter(id=run_id, status=Run.Status.RUNNING).first()
    if run is None or run.rounds.exists():
        return
    deadline_s = float(mtfl_setting("ROUND_DEADLINE_S"))
    # Devices that answered while the chord could not complete (another agent died) are in the
    # result backend under their task ids.
    states = dispatch.device_task_states((run.standalone_task_ids or {}).values())
    answered = [st.result for st in states.values() if st.status == "SUCCESS" and isinstance(st.result, dict)]
    measured = set(StandaloneThroughput.objects.filter(run=run).values_list("device__name", flat=True))
    measured |= {r.get("device") for r in answered}
    missing = [d.name for d in run.experiment.devices.order_by("name") if d.name not in measured]
    results = answered + [
        {
            "run_id": run.id,
            "device": name,
            "status": "failed",
            "error": f"no standalone measurement within the round deadline ({deadline_s:g} s)",
        }
        for name in missing
    ]
    log.warning("run %s: no P_alone from %s within %g s; starting round 0", run_id, ", ".join(missing), deadline_s)
    standalone_record(run_id=run_id, results=results)
