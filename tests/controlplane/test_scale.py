"""Scale (issue 7, item 6): what keeps a round of 1,000 simulated devices inside a second of
control-plane time, and the dashboard's figures of such a run under 2 MB each.

- FedAvg as a running sum, bit-identical to the all-at-once one; weights files with one digest
  read once; a round whose devices all return the global model unchanged (the simulated
  backend) keeps the previous file and its evaluation;
- the bulk writes (one prepared statement for many rows) write what the ORM would;
- the simulated backend passes the global weights through as a hard link, hashed once;
- every figure of a 1,000-device × 3-task × 20-round run (and of a five-strategy comparison of
  it) is ≤ 2 MB of JSON, and the run page reads only the devices and rounds it draws.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import pytest

from controlplane.common.bulk import bulk_insert, bulk_set
from controlplane.dashboard import data, figures
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Comparison, Round, Run
from controlplane.planning.strategies import baseline_strategy, compared_strategies, planned_strategies
from tests.controlplane.comparison_rows import comparison_from_rows, store_round_metrics
from workers.fl.artifacts import device_weights_key, get_store
from workers.fl.fedavg import FedAvgAccumulator, fedavg, load_state, save_state

MB2 = 2_000_000
T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
TASKS = ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"]
STRATEGIES = list(compared_strategies())


def _size(fig: dict) -> int:
    return len(json.dumps(fig))


# ------------------------------------------------------------------------------------ FedAvg


def test_fedavg_accumulator_is_bit_identical_to_fedavg():
    rng = np.random.default_rng(3)
    states = [
        {
            "w": rng.normal(size=(300, 7)).astype(np.float32),
            "b": rng.normal(size=(5,)),
            "n": np.array(rng.integers(0, 100), dtype=np.int64),
        }
        for _ in range(6)
    ]
    counts = [5, 0, 17, 250, 1, 9]

    accumulator = FedAvgAccumulator()
    for state, n in zip(states, counts, strict=True):
        accumulator.add(state, n)
    streamed = accumulator.result()

    expected = fedavg(states, counts)
    for key in expected:
        assert streamed[key].dtype == expected[key].dtype
        np.testing.assert_array_equal(streamed[key], expected[key])


def test_fedavg_accumulator_names_the_mismatched_key():
    accumulator = FedAvgAccumulator()
    accumulator.add({"w": np.zeros((2, 3), np.float32)}, 1)

    with pytest.raises(ValueError, match="'w'.*state dict 1"):
        accumulator.add({"w": np.zeros((3, 2), np.float32)}, 1)


# --------------------------------------------------------------------- a round of many devices


@pytest.fixture
def begun_round(started_round):
    """A sharing run of one task on three devices (30, 20, 10 samples), begun, round 0 planned."""
    return started_round(
        device_names=("dev-a", "dev-b", "dev-c"),
        counts_fn=lambda devices, tasks: [
            {"device": d.id, "task": tasks[0].id, "num_samples": n} for d, n in zip(devices, (30, 20, 10), strict=True)
        ],
    )


def _results(rnd: Round, weights_of) -> list[dict]:
    """Device results as agents send them; ``weights_of(device name, initial state)`` gives the
    state a device reports (written at its own key)."""
    store = get_store()
    out = []
    for a in rnd.assignments.select_related("device"):
        initial = Checkpoint.objects.get(run=rnd.run, task_id=a.task_id, round=None)
        key = device_weights_key(rnd.run_id, rnd.index, a.device.name, a.task_id)
        state = weights_of(a.device.name, load_state(store.path(initial.artifact_path)))
        store.path(key).parent.mkdir(parents=True, exist_ok=True)
        if state is None:  # the global model passed through unchanged, as the simulated backend does
            store.path(key).unlink(missing_ok=True)  # run ids repeat across tests; the store does not
            os.link(store.path(initial.artifact_path), store.path(key))
            sha = initial.sha256
        else:
            sha = save_state(state, store.path(key))
        out.append(
            {
                "run_id": rnd.run_id,
                "round_id": rnd.id,
                "device": a.device.name,
                "status": "succeeded",
                "idempotency_key": "",
                "assignments": [
                    {
                        "assignment_id": a.id,
                        "task_id": a.task_id,
                        "status": "succeeded",
                        "samples_trained": a.samples,
                        "seconds": 1.0,
                        "throughput_sps": 40.0,
                        "started_at": 1000.0,
                        "finished_at": 1001.0,
                        "weights": key,
                        "weights_sha256": sha,
                    }
                ],
            }
        )
    return out


def test_a_round_of_unchanged_models_keeps_the_previous_file_and_its_evaluation(begun_round, monkeypatch):
    run, rnd = begun_round
    results = _results(rnd, lambda device, state: None)
    import workers.training.evaluate
    from controlplane.experiments.services import checkpoints_evaluate

    # The initial model was evaluated beside round 0, as the control worker does.
    checkpoints_evaluate(checkpoint_ids=run.checkpoints.values_list("id", flat=True))

    def no_evaluation(*_args, **_kwargs):
        raise AssertionError("the same model was evaluated again")

    monkeypatch.setattr(workers.training.evaluate, "evaluate", no_evaluation)
    services.round_record(round_id=rnd.id, results=results)

    rnd.refresh_from_db()
    initial = Checkpoint.objects.get(run=run, round=None)
    after = Checkpoint.objects.get(run=run, round=rnd)
    assert rnd.status == Round.Status.SUCCEEDED
    assert (after.artifact_path, after.sha256) == (initial.artifact_path, initial.sha256)
    assert initial.test_accuracy is not None and after.evaluation_status == "done"
    assert (after.test_accuracy, after.test_loss, after.kept_previous) == (
        initial.test_accuracy,
        initial.test_loss,
        False,
    )


def test_recording_a_round_queues_the_retention_policy_after_the_next_round_and_the_task_applies_it(
    started_round, monkeypatch, django_capture_on_commit_callbacks
):
    """The retention policy is its own control task (RUN_RETENTION), sent after the next
    round's start: recording the round leaves its device weights on disk (at 1,000 devices,
    3,000 files and 1,000 folders that no longer hold the round up), and the task removes them
    and marks their rows."""
    from controlplane.experiments.services import dispatch
    from controlplane.storage import tasks

    run, rnd = started_round(
        rounds=2,
        device_names=("dev-a", "dev-b", "dev-c"),
        counts_fn=lambda devices, tasks: [
            {"device": d.id, "task": tasks[0].id, "num_samples": n} for d, n in zip(devices, (30, 20, 10), strict=True)
        ],
    )
    results = _results(rnd, lambda device, state: None)
    sent: list[tuple] = []
    monkeypatch.setattr(
        dispatch, "send_round_enqueue", lambda run_id, index: sent.append(("round_enqueue", run_id, index))
    )
    monkeypatch.setattr(dispatch, "send_run_retention", lambda run_id, index: sent.append(("retention", run_id, index)))
    monkeypatch.setattr(dispatch, "send_checkpoints_evaluate", lambda ids: sent.append(("evaluate",)))

    with django_capture_on_commit_callbacks(execute=True):
        services.round_record(round_id=rnd.id, results=results)

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.SUCCEEDED
    assert [m for m in sent if m[0] != "evaluate"] == [("round_enqueue", run.id, 1), ("retention", run.id, 0)]
    store = get_store()
    files = [store.path(a.weights_path) for a in rnd.assignments.all()]
    assert len(files) == 3 and all(f.is_file() for f in files)
    assert not rnd.assignments.filter(weights_deleted_at__isnull=False).exists()

    tasks.run_retention(run.id, 0)

    assert not any(f.exists() for f in files)
    assert not files[0].parent.parent.exists()  # the round's folder went with its device folders
    assert rnd.assignments.filter(weights_deleted_at__isnull=False).count() == 3
    tasks.run_retention(run.id, 0)  # a redelivered message changes nothing
    assert rnd.assignments.filter(weights_deleted_at__isnull=False).count() == 3


def test_identical_weights_files_are_read_once_and_weighted_by_their_devices(begun_round, monkeypatch):
    run, rnd = begun_round
    scale = {"dev-a": 2.0, "dev-b": 2.0, "dev-c": 5.0}  # dev-a and dev-b report the same model
    results = _results(
        rnd,
        lambda device, state: {
            k: (v * scale[device]).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in state.items()
        },
    )
    from controlplane.experiments.services.rounds import aggregate

    reads = []
    monkeypatch.setattr(aggregate, "load_state", lambda path: reads.append(path) or load_state(path))
    services.round_record(round_id=rnd.id, results=results)

    assert len(reads) == 2  # dev-a's and dev-b's files hold the same bytes: read once
    store = get_store()
    initial = load_state(store.path(Checkpoint.objects.get(run=run, round=None).artifact_path))
    averaged = load_state(store.path(Checkpoint.objects.get(run=run, round=rnd).artifact_path))
    key = next(k for k, v in initial.items() if v.dtype == np.float32 and v.size > 100)
    # (30 × 2W + 20 × 2W + 10 × 5W) / 60 = 2.5 W
    np.testing.assert_allclose(averaged[key], 2.5 * initial[key], rtol=1e-5)


def test_round_progress_marks_only_that_devices_pending_assignments(begun_round):
    run, rnd = begun_round
    Assignment.objects.filter(round=rnd, device__name="dev-c").update(status=Assignment.Status.SUCCEEDED)

    updated = services.round_progress(round_id=rnd.id, device="dev-a", phase="started", at=1_000_000.5)
    services.round_progress(round_id=rnd.id, device="dev-c", phase="started", at=1_000_000.5)

    rows = {a.device.name: a for a in rnd.assignments.select_related("device")}
    assert updated == 1
    assert rows["dev-a"].status == Assignment.Status.RUNNING
    assert rows["dev-a"].started_at == dt.datetime.fromtimestamp(1_000_000.5, tz=dt.UTC)
    assert (rows["dev-b"].status, rows["dev-b"].started_at) == (Assignment.Status.PENDING, None)
    assert rows["dev-c"].status == Assignment.Status.SUCCEEDED  # not pending: left alone


# ------------------------------------------------------------------------------- bulk writes


def test_bulk_insert_and_bulk_set_write_what_the_orm_would(begun_round):
    run, rnd = begun_round
    other = Round.objects.create(run=run, index=5)
    template = list(rnd.assignments.order_by("id").values("device_id", "task_id"))
    bulk_insert(
        Assignment,
        [dict(round_id=other.id, batch_size=8, active_thread_percentage=40, samples=16, **t) for t in template],
    )
    rows = list(other.assignments.order_by("id"))
    assert [(a.status, a.error, a.samples_trained, a.started_at, a.mps_verified) for a in rows] == [
        (Assignment.Status.PENDING, "", 0, None, None)
    ] * len(template)

    when = T0 + dt.timedelta(microseconds=123456)
    for k, a in enumerate(rows):
        a.status, a.throughput_sps, a.started_at, a.mps_verified = "succeeded", 1.5 * k, when, k % 2 == 0
        a.error = "" if k else "ü ' \" quoted"
    bulk_set(Assignment, rows, ["status", "throughput_sps", "started_at", "mps_verified", "error"])

    again = list(other.assignments.order_by("id"))
    assert [(a.status, a.throughput_sps, a.started_at, a.mps_verified, a.error) for a in again] == [
        (a.status, a.throughput_sps, a.started_at, a.mps_verified, a.error) for a in rows
    ]
    # and the same rows read back equal to what Django's bulk_update writes
    for a in rows:
        a.throughput_sps = 7.0
    Assignment.objects.bulk_update(rows, ["throughput_sps"])
    assert {a.started_at for a in other.assignments.all()} == {when}


# ------------------------------------------------------------------------ the simulated device


def test_simulated_device_links_the_global_weights_and_hashes_them_once(tmp_path, monkeypatch):
    from workers.backends import simulated
    from workers.fl import artifacts
    from workers.fl.artifacts import LocalArtifactStore

    store = LocalArtifactStore(tmp_path)
    source = store.path("runs/1/tasks/1/global/initial.safetensors")
    source.parent.mkdir(parents=True)
    source.write_bytes(b"weights" * 1000)
    hashed = []
    monkeypatch.setattr(simulated, "sha256_file", lambda p: hashed.append(p) or artifacts.sha256_file(p))
    backend = simulated.SimulatedBackend(time_scale=0.0)

    digests = [
        backend._pass_through(store, f"runs/1/rounds/00000/dev-{k}/task-1.safetensors", source) for k in range(5)
    ]

    assert set(digests) == {artifacts.sha256_file(source)}
    assert len(hashed) == 1
    assert os.stat(store.path("runs/1/rounds/00000/dev-4/task-1.safetensors")).st_ino == os.stat(source).st_ino


# ----------------------------------------------------------------------------------- figures


def _assignment_rows(devices: int, rounds: int, strategy: str = "sharing", planned: bool = False) -> list[dict]:
    rows = []
    for r in range(rounds):
        start = T0 + dt.timedelta(minutes=5 * r)
        for d in range(devices):
            for t, task in enumerate(TASKS):
                rows.append(
                    {
                        "strategy": strategy,
                        "round_index": r,
                        "device": f"sim-{d:04d}",
                        "task": task,
                        "batch_size": 50,
                        "active_thread_percentage": 100,
                        "samples": 50,
                        "throughput_sps": 100.0 + d + t,
                        "standalone_throughput_sps": 150.0 + t,
                        "predicted_throughput_sps": 90.0 + d if planned else None,
                        "started_at": start,
                        "finished_at": start + dt.timedelta(seconds=10 + d % 7 + t),
                        "status": "succeeded",
                    }
                )
    return rows


def test_every_figure_of_a_1000_device_run_and_its_comparison_stays_under_2_mb():
    rounds = list(range(20))
    run_rows = _assignment_rows(1000, 20)
    sizes = {
        "plan": _size(data.figure_json(figures.allocation_plan(run_rows, round_indices=rounds))),
        "throughput": _size(data.figure_json(figures.throughput_per_round(run_rows))),
        "timeline": _size(data.figure_json(figures.timeline(run_rows))),
    }
    compared = [row for s in STRATEGIES for row in _assignment_rows(1000, 20, s, planned=s in planned_strategies())]
    speedups, split = comparison_from_rows(compared, STRATEGIES, baseline=baseline_strategy().name)
    sizes.update(
        {
            "per_device": _size(data.figure_json(figures.speedup_per_device(speedups, STRATEGIES))),
            "per_round": _size(data.figure_json(figures.speedup_per_round(speedups, STRATEGIES))),
            "round_time": _size(data.figure_json(figures.round_time_split(split, STRATEGIES))),
            "predicted": _size(data.figure_json(figures.plan_predicted_vs_measured(compared))),
        }
    )
    telemetry = [
        {
            "device": f"gpu-{d:04d}",
            "round_index": r,
            "t": [1e9 + 60 * r + k for k in range(60)],
            "gpu_util_percent": [50.0] * 60,
            "memory_used_bytes": [2**30] * 60,
            "memory_total_bytes": 2**34,
        }
        for d in range(1000)
        for r in range(20)
    ]
    sizes["gpu"] = _size(data.figure_json(figures.gpu_telemetry(telemetry)))
    curves = [
        {"strategy": s, "run": k, "task": task, "points": [(float(i), 0.5) for i in range(10_000)]}
        for k, s in enumerate(STRATEGIES)
        for task in TASKS
    ]
    sizes["accuracy"] = _size(data.figure_json(figures.accuracy_over_time(curves)))

    too_big = {name: size for name, size in sizes.items() if size > MB2}
    assert not too_big, too_big


def test_a_large_runs_figures_say_what_they_left_out():
    rows = _assignment_rows(1000, 20)
    long_run = _assignment_rows(200, 100)

    plan = figures.allocation_plan(rows, round_indices=list(range(20)))
    timeline = figures.timeline(long_run)

    shown = {x for trace in plan.data for x in trace.x}
    assert len(shown) == figures.MAX_DEVICES and {"sim-0000", "sim-0999"} <= shown
    assert "50 of 1,000 devices shown" in plan.layout.title.text
    lanes = {y.split(" · ")[0] for trace in timeline.data for y in trace.y}
    assert len(lanes) == figures.MAX_DEVICES
    assert "the newest 60 of 100 rounds" in timeline.layout.title.text
    assert all(len(trace.x) <= figures.MAX_MARKS for trace in timeline.data)


def test_many_rounds_are_averaged_not_dropped():
    rows = [{"round_index": r, "task": "t", "throughput_sps": float(r)} for r in range(10_000)]

    fig = figures.throughput_per_round(rows)

    (trace,) = fig.data
    assert len(trace.x) <= figures.MAX_POINTS
    assert trace.y[0] == pytest.approx(np.mean(range(10)))  # the first ten rounds' mean
    assert "mean of 10 consecutive rounds" in fig.layout.title.text


# --------------------------------------------------------------------- the pages, from the db


@pytest.fixture
def large_run(db, user):
    """A finished sharing run of 120 devices × 3 tasks × 25 rounds, written in bulk."""
    from controlplane.experiments.models import Experiment, Task
    from controlplane.fleet.models import Device

    devices = Device.objects.bulk_create([Device(name=f"sim-{d:04d}", backend="simulated") for d in range(120)])
    devices = list(Device.objects.order_by("name"))
    tasks = [Task.objects.create(name=f"scale-{a}", architecture=a) for a in TASKS]
    experiment = Experiment.objects.create(name="large", rounds=25, owner=user)
    experiment.devices.set(devices)
    experiment.tasks.set(tasks)
    comparison = Comparison.objects.create(experiment=experiment, strategies=STRATEGIES[:2])
    runs = []
    for strategy in STRATEGIES[:2]:
        run = Run.objects.create(
            experiment=experiment, strategy=strategy, status=Run.Status.SUCCEEDED, started_at=T0, comparison=comparison
        )
        Round.objects.bulk_create(
            [
                Round(
                    run=run,
                    index=r,
                    status=Round.Status.SUCCEEDED,
                    started_at=T0,
                    flags=[f"flag {k}" for k in range(50)],
                )
                for r in range(25)
            ]
        )
        rounds = dict(Round.objects.filter(run=run).values_list("index", "id"))
        bulk_insert(
            Assignment,
            [
                dict(
                    round_id=rounds[r],
                    device_id=d.id,
                    task_id=t.id,
                    batch_size=50,
                    active_thread_percentage=100,
                    samples=50,
                    status="succeeded",
                    throughput_sps=100.0 + k,
                    standalone_throughput_sps=150.0,
                    started_at=T0 + dt.timedelta(minutes=r),
                    finished_at=T0 + dt.timedelta(minutes=r, seconds=10 + k % 5),
                )
                for r in range(25)
                for k, d in enumerate(devices)
                for t in tasks
            ],
        )
        store_round_metrics(Round.objects.filter(run=run))
        runs.append(run)
    return experiment, runs


def test_the_run_page_of_a_large_run_draws_a_sample_and_sums_everything(large_run):
    experiment, runs = large_run
    run = runs[1]

    live = data.run_live(run)

    assert len(json.dumps(live)) < MB2
    plan_devices = {x for trace in live["figures"]["plan"]["data"] for x in trace["x"]}
    assert len(plan_devices) == figures.MAX_DEVICES
    throughput = {t["name"]: t["y"] for t in live["figures"]["throughput"]["data"]}
    assert throughput["scale-resnet18"][0] == pytest.approx(sum(100.0 + k for k in range(120)))
    assert len(live["rounds"]) == 25 and len(live["rounds"][0]["flags"]) == data.LIVE_FLAGS + 1


def test_the_experiment_page_of_a_large_comparison_stays_small(large_run):
    experiment, runs = large_run
    rows = data.experiment_runs(experiment)

    built = {**data.experiment_figures(experiment, rows), **data.comparison_figures(experiment, rows)["figures"]}

    assert all(_size(fig) < MB2 for fig in built.values())
    per_device = [t for t in built["per_device"]["data"] if t["visible"]]
    assert {len(t["x"]) for t in per_device} == {figures.MAX_DEVICES}
    isolation = next(t for t in per_device if t["name"] == "isolation")
    assert isolation["y"] == [pytest.approx(1.0)] * figures.MAX_DEVICES  # the same throughputs as temporal


# ----------------------------------------------------------------------------- the benchmark


@pytest.mark.integration
def test_the_scale_benchmark_runs_a_small_federation_to_the_end():
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "MTFL_HOME"}}
    done = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "scale_sim.py"), "--devices", "12", "--rounds", "2"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "run 1: succeeded, 2 rounds (succeeded), 72 assignments" in done.stdout
    assert re.fullmatch(r"control_plane_s_per_round=\d+\.\d{3}", lines[-1])
    assert re.fullmatch(r"largest_figure_bytes=\d+", lines[-2])
