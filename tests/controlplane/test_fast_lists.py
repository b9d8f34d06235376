"""controlplane.api.fast_lists: the fast ``many=True`` representation of the long lists gives
exactly DRF's own, field for field (nulls, datetimes in and out of UTC, foreign keys, JSON,
choices, non-finite floats), for every serializer that uses it."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from django.utils import timezone
from rest_framework import serializers

from controlplane.api import serializers as s
from controlplane.api.fast_lists import FastReadListSerializer
from controlplane.experiments import selectors
from controlplane.experiments.models import Assignment, Checkpoint, Round
from controlplane.profiling.models import ProfileSample

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
FAST = [s.RoundSerializer, s.AssignmentSerializer, s.CheckpointSerializer, s.ProfileSampleSerializer]


def _drf(serializer_class, rows) -> list[dict]:
    """DRF's own representation: the serializer with the default ListSerializer."""
    return serializers.ListSerializer(rows, child=serializer_class()).data


def _same(fast: list[dict], drf: list[dict]) -> None:
    assert len(fast) == len(drf)
    for a, b in zip(fast, drf, strict=True):
        assert list(a) == list(b)  # the same fields, in the same order
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, float) and math.isnan(x):
                assert isinstance(y, float) and math.isnan(y), key
            else:
                assert (x, type(x)) == (y, type(y)), key


@pytest.fixture
def rows(make_experiment, user):
    experiment = make_experiment()
    from controlplane.experiments.models import Run

    run = Run.objects.create(experiment=experiment, strategy="sharing", status="succeeded", started_at=T0)
    devices = list(experiment.devices.order_by("id"))
    tasks = list(experiment.tasks.order_by("id"))
    r0 = Round.objects.create(
        run=run,
        index=0,
        status="succeeded",
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=3),
        round_time_s=2.5,
        raw_throughput_sps=float("nan"),
        flags=["straggler dev-b"],
    )
    r1 = Round.objects.create(run=run, index=1, status="running", started_at=None)
    Assignment.objects.create(
        round=r0,
        device=devices[0],
        task=tasks[0],
        batch_size=32,
        active_thread_percentage=50,
        samples=40,
        samples_trained=40,
        throughput_sps=12.5,
        status="succeeded",
        started_at=T0,
        finished_at=T0 + dt.timedelta(microseconds=1),
        train_loss=float("inf"),
    )
    Assignment.objects.create(
        round=r1,
        device=devices[1],
        task=tasks[1],
        batch_size=16,
        active_thread_percentage=150,
        samples=10,
        status="failed",
        error="CUDA error: out of memory",
    )
    Checkpoint.objects.create(run=run, task=tasks[0], round=None, artifact_path="runs/1/initial", sha256="0" * 64)
    Checkpoint.objects.create(
        run=run,
        task=tasks[0],
        round=r0,
        artifact_path="runs/1/r0",
        sha256="1" * 64,
        test_accuracy=0.75,
        test_loss=0.5,
        kept_previous=True,
    )
    ProfileSample.objects.create(
        source="run",
        device=devices[0],
        backend="cpu",
        device_class="cpu-2cores",
        config_key="k",
        configuration=[{"architecture": "resnet18", "batch_size": 32}],
        mix_size=1,
        task_index=0,
        architecture="resnet18",
        batch_size=32,
        active_thread_percentage=100,
        throughput_sps=3.0,
        started_at=T0,
    )
    return {
        s.RoundSerializer: selectors.round_list(user=user),
        s.AssignmentSerializer: selectors.assignment_list(user=user),
        s.CheckpointSerializer: selectors.checkpoint_list(user=user),
        s.ProfileSampleSerializer: ProfileSample.objects.order_by("id"),
    }


@pytest.mark.parametrize("serializer_class", FAST, ids=lambda c: c.__name__)
def test_the_fast_list_is_drfs_own(serializer_class, rows):
    assert serializer_class.Meta.list_serializer_class is FastReadListSerializer
    queryset = rows[serializer_class]
    assert queryset.count() >= 1
    _same(serializer_class(list(queryset), many=True).data, _drf(serializer_class, list(queryset)))


@pytest.mark.parametrize("serializer_class", FAST, ids=lambda c: c.__name__)
def test_the_fast_list_is_drfs_own_in_another_time_zone(serializer_class, rows):
    with timezone.override("Asia/Kolkata"):
        queryset = rows[serializer_class]
        fast = serializer_class(list(queryset), many=True).data
        _same(fast, _drf(serializer_class, list(queryset)))
    assert any(isinstance(v, str) and v.endswith("+05:30") for row in fast for v in row.values())


def test_the_api_pages_come_from_the_fast_lists(api, rows):
    page = api.get("/api/assignments/").json()
    assert page["count"] == 2
    first = page["results"][0]
    assert first["started_at"] == "2026-11-01T12:00:00.123456Z" and first["train_loss"] is None  # inf → null
    assert (first["device_name"], first["task_name"], first["round_index"]) == ("dev-a", "t-mobilenet", 0)
