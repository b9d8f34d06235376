"""One record of a round: the result-to-row field map is declared once and used by the
recorder's copy and the API's assignment fields, and each device's metrics are stored on the
round, for rounds recorded before the store existed too (migration 0019's backfill)."""

from __future__ import annotations

import datetime as dt
import importlib
import types

import pytest
from django.apps import apps
from django.db import connection

from controlplane.api.serializers import AssignmentSerializer
from controlplane.experiments.models import ASSIGNMENT_RESULT_COLUMNS, Assignment, Round, Run
from controlplane.experiments.services.rounds.record import result_columns
from controlplane.planning import metrics
from workers.protocol.messages import AssignmentResult

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_every_result_column_is_an_assignment_column_the_api_lists():
    columns = {f.name for f in Assignment._meta.get_fields()}
    assert set(ASSIGNMENT_RESULT_COLUMNS.values()) <= columns
    assert set(ASSIGNMENT_RESULT_COLUMNS) <= set(AssignmentResult.model_fields)
    assert set(ASSIGNMENT_RESULT_COLUMNS.values()) <= set(AssignmentSerializer.Meta.fields)


def test_a_result_becomes_column_values_by_the_columns_types():
    result = AssignmentResult(
        assignment_id=1,
        task_id=2,
        status="succeeded",
        samples_trained=64,
        throughput_sps=12.5,
        started_at=T0.timestamp(),
        finished_at=T0.timestamp() + 4,
        weights=None,
        mps_detail="x" * 20_000,
    )

    values = result_columns(result)

    assert set(values) == set(ASSIGNMENT_RESULT_COLUMNS.values())
    assert values["started_at"] == T0 and values["finished_at"] == T0 + dt.timedelta(seconds=4)
    assert values["weights_path"] == "" and values["torch_device"] == "" and values["execution_mode"] == ""
    assert len(values["mps_detail"]) == 10_000
    assert values["samples_trained"] == 64 and values["throughput_sps"] == 12.5 and values["mps_verified"] is None


@pytest.mark.django_db
def test_the_backfill_stores_each_devices_metrics_of_rounds_recorded_before_it(make_experiment):
    experiment = make_experiment(name="old")
    run = Run.objects.create(experiment=experiment, strategy="temporal", status=Run.Status.SUCCEEDED)
    rnd = Round.objects.create(run=run, index=0, status=Round.Status.PARTIAL, started_at=T0)
    shards = list(experiment.shards.select_related("device", "task").order_by("device__name", "task__name"))
    failing = shards[-1].device
    expected: dict[str, list[metrics.TaskMeasurement]] = {}
    for k, shard in enumerate(shards):
        ok = shard.device != failing or k % 2 == 0
        Assignment.objects.create(
            round=rnd,
            device=shard.device,
            task=shard.task,
            batch_size=8,
            active_thread_percentage=100,
            samples=8,
            samples_trained=8,
            throughput_sps=10.0 + k,
            standalone_throughput_sps=20.0,
            status=Assignment.Status.SUCCEEDED if ok else Assignment.Status.FAILED,
            started_at=T0 + dt.timedelta(seconds=k),
            finished_at=T0 + dt.timedelta(seconds=5 + k),
        )
        expected.setdefault(shard.device.name, []).append(
            metrics.TaskMeasurement(
                succeeded=ok,
                samples_trained=8,
                throughput_sps=10.0 + k,
                standalone_sps=20.0,
                started_at=(T0 + dt.timedelta(seconds=k)).timestamp(),
                finished_at=(T0 + dt.timedelta(seconds=5 + k)).timestamp(),
            )
        )
    empty = Round.objects.create(run=run, index=1, status=Round.Status.QUEUED)

    migration = importlib.import_module("controlplane.experiments.migrations.0019_round_record")
    # The data migration uses only its schema editor's connection.
    migration.fill_device_metrics(apps, types.SimpleNamespace(connection=connection))

    rnd.refresh_from_db()
    empty.refresh_from_db()
    want = metrics.round_metrics({d: metrics.DeviceTotals.from_tasks(t) for d, t in expected.items()})
    assert rnd.device_metrics == want.devices_json()
    assert rnd.device_metrics[failing.name]["counts"] is False
    assert any(m["counts"] for m in rnd.device_metrics.values())
    assert empty.device_metrics == {}
    stored = metrics.RoundMetrics.from_stored(want, rnd.device_metrics)
    assert stored.devices == want.devices
