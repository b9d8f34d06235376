"""Load (issue 7, item 5): with 10,000 rounds and 100,000 assignments in the database, every
list endpoint and dashboard page answers with a bounded number of queries (no query per row).

The data is written once for the module, in bulk, and deleted afterwards: two experiments of
the owner (10 runs × 1,000 rounds × 5 devices × 2 tasks in the first; one small run in the
second, so pages hold runs of more than one experiment) and one of another researcher (which the
owner's lists must not show).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.common.bulk import bulk_insert
from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Comparison,
    Experiment,
    Round,
    Run,
    Shard,
    StandaloneThroughput,
    Task,
)
from controlplane.fleet.models import Device
from controlplane.profiling.models import ProfileSample

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
RUNS, ROUNDS_PER_RUN, DEVICES, TASKS = 10, 1000, 5, 2
STRATEGIES = ["temporal", "isolation", "sharing", "vres_greedy", "vres_sync"]
MAX_API_QUERIES = 12
MAX_PAGE_QUERIES = 33  # the experiment page's 31st: the partition's data warnings (one query over the shards);
# 32nd and 33rd: the run form's manual plan table (the shards holding data, the devices' names)


def _experiment(name: str, owner, devices, tasks) -> Experiment:
    experiment = Experiment.objects.create(name=name, rounds=ROUNDS_PER_RUN, owner=owner, partition_rule="explicit")
    experiment.devices.set(devices)
    experiment.tasks.set(tasks)
    Shard.objects.bulk_create(
        Shard(experiment=experiment, device=d, task=t, num_samples=50, offset=50 * k)
        for k, (d, t) in enumerate((d, t) for d in devices for t in tasks)
    )
    return experiment


def _runs(experiment: Experiment, runs: int, rounds: int, devices, tasks) -> list[Run]:
    comparison = Comparison.objects.create(experiment=experiment, strategies=STRATEGIES, status="succeeded")
    made = Run.objects.bulk_create(
        Run(
            experiment=experiment,
            strategy=STRATEGIES[k % len(STRATEGIES)],
            status=Run.Status.SUCCEEDED,
            started_at=T0,
            finished_at=T0,
            raw_throughput_sps=100.0 + k,
            fair_throughput=1.0 + k,
            fl_throughput_sps=10.0,
            comparison=comparison if k < len(STRATEGIES) else None,
            simulated=True,
        )
        for k in range(runs)
    )
    made = list(experiment.runs.order_by("id"))
    bulk_insert(
        Round,
        [
            dict(
                run_id=run.id,
                index=r,
                status="succeeded",
                started_at=T0,
                finished_at=T0,
                round_time_s=1.0,
                raw_throughput_sps=100.0,
                fair_throughput=1.0,
                flags=["a flag"],
            )
            for run in made
            for r in range(rounds)
        ],
    )
    round_ids = list(
        Round.objects.filter(run__in=made).order_by("run_id", "index").values_list("id", "run_id", "index")
    )
    bulk_insert(
        Assignment,
        [
            dict(
                round_id=rid,
                device_id=d.id,
                task_id=t.id,
                batch_size=50,
                active_thread_percentage=50,
                samples=50,
                samples_trained=50,
                status="succeeded",
                throughput_sps=40.0 + k,
                standalone_throughput_sps=80.0,
                predicted_throughput_sps=45.0,
                started_at=T0 + dt.timedelta(seconds=index),
                finished_at=T0 + dt.timedelta(seconds=index + 1 + k % 3),
                simulated=True,
            )
            for rid, _run, index in round_ids
            for k, (d, t) in enumerate((d, t) for d in devices for t in tasks)
        ],
    )
    bulk_insert(
        Checkpoint,
        [
            dict(
                run_id=run_id,
                task_id=t.id,
                round_id=rid,
                artifact_path=f"runs/{run_id}/x",
                sha256="0" * 64,
                test_accuracy=0.5,
                test_loss=1.0,
            )
            for rid, run_id, _index in round_ids
            for t in tasks
        ],
    )
    bulk_insert(
        StandaloneThroughput,
        [
            dict(run_id=run.id, device_id=d.id, task_id=t.id, batch_size=50, throughput_sps=80.0)
            for run in made
            for d in devices
            for t in tasks
        ],
    )
    return made


@pytest.fixture(scope="module")
def dataset(django_db_setup, django_db_blocker):
    """10,000 rounds and 100,000 assignments (and their checkpoints and profile samples)."""
    with django_db_blocker.unblock():
        users = get_user_model().objects
        owner = users.create_user("load-owner", password="unused-pass")
        other = users.create_user("load-other", password="unused-pass")
        devices = list(
            Device.objects.bulk_create(
                Device(
                    name=f"load-{k}", backend="simulated", last_heartbeat_at=T0, inventory={"accelerator": "titan-v"}
                )
                for k in range(DEVICES)
            )
        )
        devices = list(Device.objects.filter(name__startswith="load-").order_by("name"))
        tasks = [Task.objects.create(name=f"load-task-{k}", architecture="resnet18", owner=owner) for k in range(TASKS)]
        big = _experiment("load big", owner, devices, tasks)
        runs = _runs(big, RUNS, ROUNDS_PER_RUN, devices, tasks)
        small = _experiment("load small", owner, devices[:2], tasks[:1])
        _runs(small, 2, 3, devices[:2], tasks[:1])
        theirs = _experiment("load theirs", other, devices[:2], tasks[:1])
        _runs(theirs, 1, 3, devices[:2], tasks[:1])
        samples = list(
            Assignment.objects.filter(round__run=runs[2])
            .order_by("id")
            .values_list("id", "device_id", "round_id", "task_id")[:5000]
        )
        bulk_insert(
            ProfileSample,
            [
                dict(
                    source="run",
                    assignment_id=aid,
                    device_id=did,
                    backend="simulated",
                    device_class="simulated-titan-v",
                    config_key=f"round-{rid}-{did}",
                    configuration=[{"architecture": "resnet18"}],
                    mix_size=2,
                    task_index=tid % 2,
                    architecture="resnet18",
                    batch_size=50,
                    active_thread_percentage=50,
                    throughput_sps=40.0,
                    simulated=True,
                )
                for aid, did, rid, tid in samples
            ],
            ignore_conflicts=True,
        )
        token, _ = Token.objects.get_or_create(user=owner)
        assert Round.objects.count() >= 10_000 and Assignment.objects.count() >= 100_000
    yield {
        "owner": owner,
        "token": token.key,
        "big": big,
        "small": small,
        "theirs": theirs,
        "runs": runs,
        "devices": devices,
        "tasks": tasks,
    }
    with django_db_blocker.unblock():
        for experiment in (big, small, theirs):
            experiment.delete()
        ProfileSample.objects.filter(device__in=devices).delete()
        Device.objects.filter(id__in=[d.id for d in devices]).delete()
        Task.objects.filter(id__in=[t.id for t in tasks]).delete()
        Token.objects.filter(user__in=[owner, other]).delete()
        users.filter(id__in=[owner.id, other.id]).delete()


@pytest.fixture
def owner_api(db, dataset) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {dataset['token']}")
    return client


@pytest.fixture
def owner_browser(db, client, dataset):
    client.force_login(dataset["owner"])
    return client


def _paths(dataset) -> list[str]:
    run, big = dataset["runs"][3], dataset["big"]
    first_round = Round.objects.filter(run=run).order_by("index").values_list("id", flat=True).first()
    return [
        "/api/runs/",
        f"/api/runs/?experiment={big.id}",
        "/api/runs/?limit=1000",
        "/api/rounds/",
        f"/api/rounds/?run={run.id}",
        "/api/rounds/?limit=1000&offset=5000",
        "/api/assignments/",
        f"/api/assignments/?run={run.id}",
        f"/api/assignments/?experiment={big.id}&limit=1000",
        f"/api/assignments/?round={first_round}",
        "/api/assignments/?limit=1000&offset=90000",
        "/api/checkpoints/",
        f"/api/checkpoints/?run={run.id}&limit=1000",
        "/api/experiments/",
        "/api/devices/",
        "/api/comparisons/",
        "/api/profile-samples/?limit=1000",
        "/api/tasks/",
        "/api/profile-sweeps/",
        "/api/predictors/",
    ]


def test_every_list_endpoint_answers_in_a_bounded_number_of_queries(owner_api, dataset, django_assert_max_num_queries):
    for path in _paths(dataset):
        with django_assert_max_num_queries(MAX_API_QUERIES, info=path):
            response = owner_api.get(path)
        assert response.status_code == 200, (path, response.content[:300])


def test_list_pages_are_bounded_and_hold_only_the_owners_rows(owner_api, dataset):
    too_many = owner_api.get("/api/assignments/?limit=100000")
    page = owner_api.get("/api/rounds/?limit=1000").json()
    runs = owner_api.get("/api/runs/?limit=1000").json()

    assert too_many.status_code == 400 and "limit" in too_many.json()["errors"]
    assert len(page["results"]) == 1000 and page["count"] == RUNS * ROUNDS_PER_RUN + 2 * 3
    assert {r["experiment"] for r in runs["results"]} == {dataset["big"].id, dataset["small"].id}


@pytest.mark.parametrize("page", ["index", "experiment", "run", "run-live"])
def test_dashboard_pages_answer_in_a_bounded_number_of_queries(
    owner_browser, dataset, page, django_assert_max_num_queries
):
    run = dataset["runs"][4]
    path = {
        "index": "/",
        "experiment": f"/experiments/{dataset['big'].id}/",
        "run": f"/runs/{run.id}/",
        "run-live": f"/runs/{run.id}/live/",
    }[page]

    with django_assert_max_num_queries(MAX_PAGE_QUERIES, info=path):
        response = owner_browser.get(path)

    assert response.status_code == 200


def test_a_page_costs_the_same_queries_for_a_small_and_a_large_experiment(owner_browser, dataset):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = {}
    for name in ("small", "big"):
        with CaptureQueriesContext(connection) as queries:
            assert owner_browser.get(f"/experiments/{dataset[name].id}/").status_code == 200
        counts[name] = len(queries)

    assert counts["big"] == counts["small"], counts


# ------------------------------------------------------------- partial participation at scale

SAMPLED_DEVICES = {"small": 4, "large": 400}
SAMPLED_PER_ROUND, SAMPLED_ROUNDS = 3, 6


def _sampled_experiment(size: str, owner, task) -> tuple[Experiment, Run]:
    """An experiment of ``SAMPLED_DEVICES[size]`` devices training 3 of them per round, with one
    finished sharing run of 6 rounds: each round's participants and only their assignments."""
    import numpy as np

    n = SAMPLED_DEVICES[size]
    Device.objects.bulk_create(
        Device(name=f"samp-{size}-{k:04d}", backend="simulated", last_heartbeat_at=T0, inventory={"cores": [0]})
        for k in range(n)
    )
    devices = list(Device.objects.filter(name__startswith=f"samp-{size}-").order_by("id"))
    experiment = Experiment.objects.create(
        name=f"sampled {size}",
        rounds=SAMPLED_ROUNDS,
        owner=owner,
        partition_rule="explicit",
        clients_per_round=SAMPLED_PER_ROUND,
    )
    experiment.devices.set(devices)
    experiment.tasks.set([task])
    bulk_insert(
        Shard,
        [dict(experiment_id=experiment.id, device_id=d.id, task_id=task.id, num_samples=3, offset=0) for d in devices],
    )
    run = Run.objects.create(experiment=experiment, strategy="sharing", status=Run.Status.SUCCEEDED, simulated=True)
    rng = np.random.default_rng(0)
    drawn = [
        sorted(int(i) for i in rng.choice([d.id for d in devices], SAMPLED_PER_ROUND, replace=False))
        for _ in range(SAMPLED_ROUNDS)
    ]
    bulk_insert(
        Round,
        [
            dict(
                run_id=run.id,
                index=r,
                status="succeeded",
                started_at=T0,
                finished_at=T0,
                round_time_s=1.0,
                participants=drawn[r],
            )
            for r in range(SAMPLED_ROUNDS)
        ],
    )
    rounds = dict(Round.objects.filter(run=run).values_list("index", "id"))
    bulk_insert(
        Assignment,
        [
            dict(
                round_id=rounds[r],
                device_id=d,
                task_id=task.id,
                batch_size=3,
                active_thread_percentage=100,
                samples=3,
                samples_trained=3,
                status="succeeded",
                throughput_sps=10.0,
                started_at=T0,
                finished_at=T0 + dt.timedelta(seconds=1),
                simulated=True,
            )
            for r in range(SAMPLED_ROUNDS)
            for d in drawn[r]
        ],
    )
    return experiment, run


@pytest.fixture(scope="module")
def sampled(django_db_setup, django_db_blocker):
    """A small (4 devices) and a large (400 devices) experiment sampling 3 devices per round."""
    with django_db_blocker.unblock():
        owner = get_user_model().objects.create_user("sampled-owner", password="unused-pass")
        task = Task.objects.create(name="sampled-task", architecture="resnet18", owner=owner)
        made = {size: _sampled_experiment(size, owner, task) for size in SAMPLED_DEVICES}
    yield {"owner": owner, **made}
    with django_db_blocker.unblock():
        for experiment, _run in made.values():
            experiment.delete()
        Device.objects.filter(name__startswith="samp-").delete()
        task.delete()
        owner.delete()


@pytest.mark.parametrize("page", ["run", "run-live", "experiment", "rounds-api"])
def test_pages_of_a_sampled_run_cost_the_same_queries_for_4_and_400_devices(db, client, sampled, page):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(sampled["owner"])
    counts, bodies = {}, {}
    for size in SAMPLED_DEVICES:
        experiment, run = sampled[size]
        path = {
            "run": f"/runs/{run.id}/",
            "run-live": f"/runs/{run.id}/live/",
            "experiment": f"/experiments/{experiment.id}/",
            "rounds-api": f"/api/rounds/?run={run.id}",
        }[page]
        with CaptureQueriesContext(connection) as queries:
            response = client.get(path)
        assert response.status_code == 200, (path, response.content[:300])
        counts[size], bodies[size] = len(queries), response

    assert counts["large"] == counts["small"] <= MAX_PAGE_QUERIES, counts
    if page == "run-live":
        rows = bodies["large"].json()["rounds"]
        assert [r["participants"]["count"] for r in rows] == [SAMPLED_PER_ROUND] * SAMPLED_ROUNDS
        assert all(r["participants"]["of"] == 400 and len(r["participants"]["names"]) == 3 for r in rows)
    if page == "rounds-api":
        rounds = bodies["large"].json()["results"]
        assert all(len(r["participants"]) == SAMPLED_PER_ROUND for r in rounds)


def test_the_index_pages_its_devices_in_a_bounded_number_of_queries(db, client, sampled, django_assert_max_num_queries):
    client.force_login(sampled["owner"])

    with django_assert_max_num_queries(MAX_PAGE_QUERIES):
        first = client.get("/")
    last = client.get("/?devices_page=9")
    wrong = client.get("/?devices_page=10000")

    assert first.status_code == 200 and last.status_code == 200
    # one page of 50 devices in the devices table, and a cell of a few names per experiment
    assert first.content.count(b"<td>samp-") <= 50 + 1
    assert b"page 9 of" in last.content
    assert wrong.status_code == 400 and b"devices_page" in wrong.content
