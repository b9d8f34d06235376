"""Every API operation fuzzed with schemathesis from the project's own OpenAPI schema.

The schema is the one ``/api/schema/`` serves to a logged-in user (drf-spectacular); schemathesis generates valid
and invalid requests for each operation (its examples, coverage and fuzzing phases, positive
and negative data) and sends them to the Django app in process (WSGI), authenticated as a user
who owns an experiment with a run, rounds, assignments, checkpoints and a comparison, so detail
endpoints are reached with real ids (:func:`_aim_at_real_objects`). The agent endpoints are
called with the agent token of one of the experiment's devices.

Checks on every response:

- no 5xx (``not_a_server_error``);
- the status code, content type, headers and body are those the schema documents;
- every 4xx body is the API's error format and a 400's message names the field at fault
  (:func:`error_body_names_the_field`);
- a request the schema says is invalid is refused (``negative_data_rejection``). The converse
  (``positive_data_acceptance``) is not checked: by design the serializers check shapes and
  types and the services check values (ranges, ids that exist, what a state allows), so a
  schema-valid request may well be a 400.

Bounded and deterministic: a fixed seed, derandomized Hypothesis, no shrinking, no example
database. Per operation: schemathesis's coverage phase (deterministic boundary and wrong-type
cases for every field, unbounded by the settings but a fixed set: about 60 requests on
average, DELETE and PATCH as the unexpected methods) and ``MTFL_FUZZ_EXAMPLES`` (default 12)
generated requests. About 3,000 requests in all; 80-90 s of CPU on one core (SQLite or
PostgreSQL). One test per operation, each with its own database transaction and fixtures;
launches dispatch to the in-memory broker the tests use (tests/env_plugin.py), after-commit
callbacks run, so nothing waits on a real Celery worker.
"""

from __future__ import annotations

import datetime as dt
import os
import re

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.django_db

FUZZ_SEED = 7_2026
MAX_EXAMPLES = int(os.environ.get("MTFL_FUZZ_EXAMPLES", "12"))
T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
MAX_ID = 2**63 - 1
"""The largest id the schema allows (controlplane.api.serializers.MAX_ID)."""


@schemathesis.check
def error_body_names_the_field(ctx, response, case):
    """Every 4xx is ``{"message": str, "errors": {field: [str]}}``; a 400 names a field in
    ``errors`` and its message starts with that field (or is the field-less message)."""
    if not 400 <= response.status_code < 500:
        return None
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"{response.status_code} body is not JSON: {response.content[:200]!r}") from None
    if not isinstance(body, dict) or set(body) != {"message", "errors"}:
        raise AssertionError(f"{response.status_code} body is not the API's error format: {body!r}")
    message, errors = body["message"], body["errors"]
    if not isinstance(message, str) or not message.strip():
        raise AssertionError(f"{response.status_code} body has no message: {body!r}")
    if not isinstance(errors, dict) or not all(
        isinstance(v, list) and v and all(isinstance(m, str) and m for m in v) for v in errors.values()
    ):
        raise AssertionError(f"{response.status_code} errors are not {{field: [messages]}}: {body!r}")
    if response.status_code == 400:
        if not errors:
            raise AssertionError(f"400 names no field: {body!r}")
        field = next(iter(errors))
        if field != "non_field_errors" and not message.startswith(field):
            raise AssertionError(f"400 message does not name the field {field!r}: {body!r}")
    return None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    error_body_names_the_field,
    negative_data_rejection,
]


def _load_schema():
    """The app's own OpenAPI schema as ``/api/schema/`` serves it to a logged-in user, bound to
    the WSGI handler the fuzzed requests go through.

    The schema needs a login, and no database exists while pytest collects: the request is
    authenticated as an unsaved user (DRF's forced authentication), which reads no table.
    """
    from django.contrib.auth import get_user_model
    from django.core.wsgi import get_wsgi_application
    from rest_framework.test import APIClient

    config = schemathesis.Config.from_dict(
        {
            "seed": FUZZ_SEED,
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                "no-shrink": True,
                "database": "none",
            },
            "phases": {
                # One 405 per path shows the error format of every method DRF refuses.
                "coverage": {"unexpected-methods": ["DELETE", "PATCH"]},
                "stateful": {"enabled": False},
            },
        }
    )
    client = APIClient()
    client.force_authenticate(user=get_user_model()(username="schema-reader"))
    # localhost: Django's test environment (which allows "testserver") is not set up yet.
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json", HTTP_HOST="localhost")
    assert response.status_code == 200, response.content[:300]
    loaded = schemathesis.openapi.from_dict(response.json(), config=config)
    loaded.app = get_wsgi_application()
    loaded.location = "/api/schema/"
    return loaded


schema = _load_schema()


@pytest.fixture
def keep_the_test_connection():
    """Requests go through Django's real WSGI handler, whose ``request_finished`` signal closes
    the database connection, and with it the test's transaction; Django's own test client
    disconnects that handler the same way."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def fuzz_world(user, make_experiment, make_device):
    """What the fuzzed requests find: the ``user`` fixture's experiment (two devices, two
    tasks) with a finished run (a round, its assignments, checkpoints, GPU telemetry), a
    pending run of a comparison, a profile sweep with a sample, a ready predictor, a model
    workload, an agent token for ``dev-a``, a device outside the experiment, a device pool of
    the experiment's devices, and a lab admin (staff) who pauses devices and changes pools."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from controlplane.experiments.models import Assignment, Checkpoint, Comparison, DeviceTelemetry, Round, Run
    from controlplane.fleet.models import Device, DevicePool
    from controlplane.fleet.services import device_token_issue
    from controlplane.profiling.models import ModelWorkload, Predictor, ProfileSample, ProfileSweep

    experiment = make_experiment(name="fuzzed", rounds=2)
    devices = list(experiment.devices.order_by("id"))
    tasks = list(experiment.tasks.order_by("id"))
    spare = make_device("dev-spare")
    run = Run.objects.create(
        experiment=experiment,
        strategy="sharing",
        status=Run.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=30),
        raw_throughput_sps=120.0,
        fair_throughput=1.5,
        fl_throughput_sps=40.0,
    )
    rnd = Round.objects.create(
        run=run,
        index=0,
        status=Round.Status.SUCCEEDED,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=20),
        round_time_s=12.5,
        wall_time_s=20.0,
        samples_trained=200,
        fl_throughput_sps=16.0,
        raw_throughput_sps=120.0,
        fair_throughput=1.5,
    )
    assignments = [
        Assignment.objects.create(
            round=rnd,
            device=shard.device,
            task=shard.task,
            batch_size=16,
            active_thread_percentage=100,
            samples=shard.num_samples,
            samples_trained=shard.num_samples,
            throughput_sps=30.0,
            seconds=2.0,
            train_loss=1.2,
            started_at=T0,
            finished_at=T0 + dt.timedelta(seconds=2),
            status=Assignment.Status.SUCCEEDED,
        )
        for shard in experiment.shards.select_related("device", "task").order_by("id")
    ]
    for task in tasks:
        Checkpoint.objects.create(run=run, task=task, round=None, artifact_path=f"init-{task.id}", sha256="0" * 64)
    checkpoint = Checkpoint.objects.create(
        run=run, task=tasks[0], round=rnd, artifact_path="x", sha256="0" * 64, test_accuracy=0.5, test_loss=1.1
    )
    DeviceTelemetry.objects.create(
        round=rnd,
        device=devices[0],
        t=[0.0, 1.0],
        gpu_util_percent=[50, 60],
        memory_used_bytes=[10, 20],
        memory_total_bytes=100,
    )
    comparison = Comparison.objects.create(experiment=experiment, strategies=["temporal", "isolation"])
    pending = Run.objects.create(experiment=experiment, strategy="temporal", comparison=comparison)
    sweep = ProfileSweep.objects.create(
        device=devices[0], backend="cpu", budget_s=30.0, request={}, status=ProfileSweep.Status.SUCCEEDED
    )
    sample = ProfileSample.objects.create(
        source=ProfileSample.Source.SWEEP,
        sweep=sweep,
        device=devices[0],
        backend="cpu",
        device_class="cpu-2cores",
        config_key="k",
        configuration={},
        mix_size=1,
        task_index=0,
        architecture="resnet18",
        batch_size=16,
        active_thread_percentage=100,
        throughput_sps=50.0,
    )
    predictor = Predictor.objects.create(
        version=1, backend="cpu", device_class="cpu-2cores", status=Predictor.Status.READY, heldout_rmsle=0.2
    )
    workload = ModelWorkload.objects.create(
        architecture="resnet18",
        num_classes=10,
        input_shape=[3, 32, 32],
        forward_flops_per_sample=1e6,
        train_flops_per_sample=3e6,
        params=1000,
        param_bytes=4000,
        activation_bytes_per_sample=1e4,
    )
    _, agent_key = device_token_issue(device=devices[0])
    token, _ = Token.objects.get_or_create(user=user)
    pool = DevicePool.objects.create(name="fuzz-pool")
    Device.objects.filter(id__in=[d.id for d in devices]).update(pool=pool)
    lab_admin = get_user_model().objects.create_user("lab-admin", is_staff=True)
    admin_token, _ = Token.objects.get_or_create(user=lab_admin)
    ids = {
        "devices": [d.id for d in devices] + [spare.id],
        "tasks": [t.id for t in tasks],
        "experiments": [experiment.id],
        "runs": [run.id, pending.id],
        "rounds": [rnd.id],
        "assignments": [a.id for a in assignments],
        "checkpoints": [checkpoint.id],
        "comparisons": [comparison.id],
        "profile-sweeps": [sweep.id],
        "profile-samples": [sample.id],
        "predictors": [predictor.id],
        "workloads": [workload.id],
        "pools": [pool.id],
    }
    return {
        "ids": ids,
        "user_auth": f"Token {token.key}",
        "agent_auth": f"Agent {agent_key}",
        "admin_auth": f"Token {admin_token.key}",
    }


# Body and query fields that hold ids of a resource, and which.
ID_FIELDS = {
    "device": "devices",
    "devices": "devices",
    "task": "tasks",
    "tasks": "tasks",
    "experiment": "experiments",
    "run": "runs",
    "round": "rounds",
    "sweep": "profile-sweeps",
    "pool": "pools",
}


def _real(value, ids: list[int]):
    """A positive integer up to the schema's maximum id becomes one of ``ids`` (which one depends
    on the integer, so runs repeat); anything else (0, negatives, ids past 2**63 - 1, strings:
    the negative cases) is left alone."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID:
        return ids[value % len(ids)]
    return value


def _aim_at_real_objects(case, world) -> None:
    """Point the generated request at the fixture's objects: the ``{id}`` of a detail path,
    and id-valued fields (``devices``, ``tasks``, ``plan[].device``, ``?run=``) of bodies and
    queries, so requests get past "not found" to the code behind it."""
    ids = world["ids"]
    resource = case.operation.path.split("/")[2]
    if case.path_parameters and "id" in case.path_parameters and resource in ids:
        case.path_parameters["id"] = _real(case.path_parameters["id"], ids[resource])
    if isinstance(case.query, dict):
        for name, kind in ID_FIELDS.items():
            if name in case.query:
                case.query[name] = _real(case.query[name], ids[kind])
    body = case.body if isinstance(case.body, dict) else {}
    entries = [body] + [
        e
        for key in ("plan", "sample_counts")
        if isinstance(body.get(key), list)
        for e in body[key]
        if isinstance(e, dict)
    ]
    for entry in entries:
        for name, kind in ID_FIELDS.items():
            if isinstance(entry.get(name), list):
                entry[name] = [_real(v, ids[kind]) for v in entry[name]]
            elif name in entry:
                entry[name] = _real(entry[name], ids[kind])


LAB_ADMIN_PATHS = ("/api/pools/", "/api/pools/{id}/", "/api/devices/{id}/pause/", "/api/devices/{id}/resume/")
"""Operations whose writes are a lab admin's: fuzzed as one (a researcher's 403 is tested in
tests/controlplane/test_queue_api.py), so their bodies reach the services."""


def _auth(case, world) -> str:
    path = case.operation.path
    if path.startswith("/api/agent/"):
        return world["agent_auth"]
    if path in LAB_ADMIN_PATHS and case.method.upper() != "GET":
        return world["admin_auth"]
    return world["user_auth"]


def _operation_test(label: str):
    """The fuzz test of one API operation (``label``: ``"GET /api/runs/{id}/"``).

    One test function per operation, not one ``@schema.parametrize()`` over all of them:
    schemathesis 4 gives all the items of one function the same node id under pytest 9, and
    pytest-xdist (``-n 2``, pyproject) schedules by node id, so it would run only one of them.
    """

    @schema.include(name=label).parametrize()
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def test(case, fuzz_world, keep_the_test_connection, django_capture_on_commit_callbacks):
        _aim_at_real_objects(case, fuzz_world)
        auth = _auth(case, fuzz_world)
        with django_capture_on_commit_callbacks(execute=True):
            case.call_and_validate(headers={"Authorization": auth}, checks=CHECKS)

    return test


def _test_name(label: str) -> str:
    """``"GET /api/runs/{id}/"`` → ``"test_api_operation_survives_fuzzing__get_api_runs_id"``."""
    return "test_api_operation_survives_fuzzing__" + re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


OPERATION_LABELS = [result.ok().label for result in schema.get_all_operations()]
for _label in OPERATION_LABELS:
    globals()[_test_name(_label)] = _operation_test(_label)
