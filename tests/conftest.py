"""Shared fixtures: users and API clients, and factories for devices, tasks and experiments."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


def in_a_fresh_django_process(target: str, *args: object) -> dict:
    """Call ``target`` (``"module:function"``, importable from the project root) with ``args``
    (JSON values) in a new Python process with Django set up on this test's database, as a
    restarted control worker would start, and return its JSON answer.

    Raises:
        AssertionError: the process failed (its stderr's tail is the message).
    """
    import json
    import subprocess
    import sys

    from django.db import connection

    module, function = target.split(":")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict, connection.vendor),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    }
    code = (
        f"import json, sys, django; django.setup(); from {module} import {function} as w; "
        "print('RESULT ' + json.dumps(w(*json.loads(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(args))],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def database_url(settings_dict: dict, vendor: str) -> str:
    """A ``DATABASE_URL`` naming the database of ``settings_dict`` (Django's connection settings)."""
    if vendor == "sqlite":
        return f"sqlite:///{settings_dict['NAME']}"
    if vendor == "postgresql":
        user = settings_dict.get("USER") or ""
        password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
        auth = f"{user}{password}@" if user else ""
        host = settings_dict.get("HOST") or "127.0.0.1"
        return f"postgres://{auth}{host}:{settings_dict.get('PORT') or 5432}/{settings_dict['NAME']}"
    raise RuntimeError(f"unsupported database vendor {vendor}")


@pytest.fixture(scope="session", autouse=True)
def _child_processes_use_the_test_database(request):
    """With ``DATABASE_URL`` set (CI's PostgreSQL pass), every process a test starts would inherit
    it and open the database it names, not the ``test_`` one pytest-django created: point it at
    the test database for the whole session. Unset (the SQLite default), children already use
    the session's own ``MTFL_HOME`` (tests/env_plugin.py)."""
    original = os.environ.get("DATABASE_URL")
    if not original:
        yield
        return
    request.getfixturevalue("django_db_setup")
    from django.db import connection

    os.environ["DATABASE_URL"] = database_url(connection.settings_dict, connection.vendor)
    yield
    os.environ["DATABASE_URL"] = original


@pytest.fixture(autouse=True)
def _environment_is_restored():
    """Put ``os.environ`` back as it was before the test. Code under test may export variables
    for its own children (``workers.agent.app.main`` exports ``--control-url`` as
    ``MTFL_CONTROL_URL``), which monkeypatch does not undo; under pytest-xdist the files a worker
    runs after such a test differ from run to run, so a leak would fail unrelated tests."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("researcher", password="s3cret-pass")


@pytest.fixture
def api(user) -> APIClient:
    """An API client authenticated with the user's token."""
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def browser_client(client, user):
    """Django's test client logged in (session) as the user."""
    client.force_login(user)
    return client


def inventory(name: str, backend: str = "cpu") -> dict:
    """What an agent reports at start (:class:`workers.protocol.messages.DeviceInventory`)."""
    return {"name": name, "backend": backend, "host": "test-host", "cores": [0, 1]}


@pytest.fixture
def make_device(db):
    """A device whose agent has connected (``connected=False``: registered only)."""
    from controlplane.fleet.services import device_create, device_report

    def make(name: str = "dev-a", backend: str = "cpu", *, connected: bool = True):
        device = device_create(name=name, backend=backend)
        if connected:
            device = device_report(inventory=inventory(name, backend))
        return device

    return make


@pytest.fixture
def make_task(db, user):
    """A task owned by the ``user`` fixture unless ``owner=`` says otherwise."""
    from controlplane.experiments.services import task_create

    def make(name: str = "digits-mobilenet", architecture: str = "mobilenet_v3_small", **kw):
        kw.setdefault("owner", user)
        return task_create(name=name, architecture=architecture, **kw)

    return make


@pytest.fixture
def predictor(make_device):
    """A ready cpu predictor (class ``cpu-2cores``) fitted on 100 configurations of the contention
    law's synthetic samples (tests/controlplane/contention_law.py), stored as a sweep of the
    device ``profiled`` had measured them."""
    from controlplane.profiling.services import predictor_fit
    from tests.controlplane.contention_law import store_synthetic_samples

    store_synthetic_samples(make_device("profiled"), n=100)
    fitted = predictor_fit(backend="cpu", families=("baseline", "extra_trees"))
    assert fitted.status == "ready", fitted.error
    return fitted


@pytest.fixture
def make_experiment(db, user, make_device, make_task):
    """An experiment over given (or two new) devices and tasks, explicit small shards by default,
    owned by the ``user`` fixture unless ``owner=`` says otherwise."""
    from controlplane.experiments.services import experiment_create

    def make(*, devices=None, tasks=None, name="exp", rounds=1, counts=None, **kw):
        devices = devices or [make_device("dev-a"), make_device("dev-b")]
        tasks = tasks or [
            make_task("t-mobilenet", "mobilenet_v3_small"),
            make_task("t-shufflenet", "shufflenet_v2_x1_0"),
        ]
        if counts is None and "partition_rule" not in kw:
            kw["partition_rule"] = "explicit"
            counts = [
                {"device": d.id, "task": t.id, "num_samples": 40 + 8 * i}
                for i, (d, t) in enumerate((d, t) for d in devices for t in tasks)
            ]
        kw.setdefault("owner", user)
        return experiment_create(
            name=name,
            task_ids=[t.id for t in tasks],
            device_ids=[d.id for d in devices],
            rounds=rounds,
            sample_counts=counts,
            **kw,
        )

    return make


@pytest.fixture
def started_round(make_experiment, make_device, make_task, django_capture_on_commit_callbacks):
    """Factory: a sharing run of one task on dev-a and dev-b (30 and 10 samples) unless told
    otherwise, begun, P_alone recorded (100 samples/s), round 0 planned and dispatched (to the
    in-memory broker); returns ``(run, round 0)``."""
    from controlplane.experiments import services
    from controlplane.experiments.models import Round

    def start(*, tasks=None, counts_fn=None, rounds=1, device_names=("dev-a", "dev-b")):
        devices = [make_device(name) for name in device_names]
        tasks = tasks or [make_task("t-mobilenet", "mobilenet_v3_small")]
        counts = (
            counts_fn(devices, tasks)
            if counts_fn
            else [
                {"device": devices[0].id, "task": tasks[0].id, "num_samples": 30},
                {"device": devices[1].id, "task": tasks[0].id, "num_samples": 10},
            ]
        )
        experiment = make_experiment(
            devices=devices, tasks=tasks, counts=counts, partition_rule="explicit", rounds=rounds
        )
        with django_capture_on_commit_callbacks(execute=True):
            run = services.run_create(experiment=experiment, strategy="sharing")
        services.run_begin(run_id=run.id)
        standalone = [
            {
                "run_id": run.id,
                "device": d.name,
                "status": "succeeded",
                "measurements": [
                    {"task_id": s.task_id, "batch_size": min(128, s.num_samples), "throughput_sps": 100.0}
                    for s in experiment.shards.filter(device=d, num_samples__gt=0)
                ],
            }
            for d in devices
        ]
        with django_capture_on_commit_callbacks(execute=True):
            services.standalone_record(run_id=run.id, results=standalone)
        return run, Round.objects.get(run=run, index=0)

    return start


_DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback", "live_server"}
)


ENGINE_SENSITIVE = frozenset(
    {
        # one conditional insert per lease and a partial unique constraint (one held lease per device)
        "controlplane/test_lab_scheduler.py",
        "controlplane/test_queue_state.py",
        # conditional updates that claim a round, row locks, the resume sweeps
        "controlplane/test_round_protocol.py",
        "controlplane/test_reliability.py",
        "controlplane/test_aggregation_resume.py",
        # cascades and SET_NULL when runs and experiments are deleted; bulk inserts and updates
        "controlplane/test_storage.py",
        "controlplane/test_fast_lists.py",
        # query counts, owner-only querysets, filters and ordering through the API
        "controlplane/test_query_counts.py",
        "controlplane/test_permissions.py",
        "controlplane/test_api.py",
        "controlplane/test_health.py",
        "test_database_selection.py",
        # aggregates the database computes (each task's sample-weighted training loss, the tidy
        # metrics export) and the 0021 data migration recomputing stored device waits
        "controlplane/test_run_learning.py",
        "controlplane/test_export_tracker.py",
        "controlplane/test_comparison_followups.py",
    }
)
"""Modules (paths under tests/) whose tests the PostgreSQL pass runs besides the integration
tests: what they check depends on the database engine."""


def _module(item: pytest.Item) -> str:
    return Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent).as_posix()


def uses_the_database(item: pytest.Item) -> bool:
    """Whether a test opens the test database: marked ``django_db`` or asking, directly or
    through its fixtures, for one of pytest-django's database fixtures."""
    if item.get_closest_marker("django_db") is not None:
        return True
    return bool(_DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config, items):
    """Refuse two tests with one node id: pytest-xdist (``-n 2``, pyproject) schedules by node
    id and would silently run only one of them (tests/controlplane/test_fuzz_api.py says how
    schemathesis 4 came to do that). Files with an ``integration`` test go first.

    ``MTFL_TESTS_DATABASE_ONLY=1`` keeps, for CI's second, PostgreSQL pass (.ci/run), the tests
    that use the database *and* depend on what the engine does: the integration tests (real
    workers racing on the rows) and the modules of :data:`ENGINE_SENSITIVE`. The others open no
    connection, or do plain reads and writes the ORM makes the same on both engines, so they
    would repeat the first pass (the whole suite, on the embedded SQLite) at twice its cost in
    CI's time limit. Tests marked ``one_database`` are left out too (long end-to-end flows whose
    database work the other integration tests cover there)."""
    shared = sorted(nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1)
    if shared:
        raise pytest.UsageError(f"tests share a node id, so pytest-xdist would run only one of each: {shared[:3]}")
    # Files that start real processes (the longest) first: pytest-xdist hands out whole files
    # in this order, and one of them last would leave the other worker idle at the end.
    slow = {item.path for item in items if item.get_closest_marker("integration") is not None}
    items.sort(key=lambda item: item.path not in slow)
    if os.environ.get("MTFL_TESTS_DATABASE_ONLY") != "1":
        return
    kept, dropped = [], []
    for item in items:
        # A ``one_database`` test (a long end-to-end flow: a researcher's own task, a simulated
        # comparison, the browser) runs once, in the first pass; the faults, Celery-round and
        # remote-agent tests exercise the same services on PostgreSQL.
        once = item.get_closest_marker("one_database") is not None
        sensitive = item.get_closest_marker("integration") is not None or _module(item) in ENGINE_SENSITIVE
        (kept if uses_the_database(item) and sensitive and not once else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
