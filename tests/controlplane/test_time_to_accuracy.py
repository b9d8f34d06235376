"""Issue 22 items 3 and 4: the learning rate following the batch size, time to accuracy, and
comparisons repeated in interleaved orders with 95 % intervals and verdicts (hand-worked numbers;
the Celery messages are read off the in-memory broker, not executed)."""

from __future__ import annotations

import math

import pytest

from controlplane.dashboard import figures
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Comparison, Round, Run
from controlplane.experiments.selectors import comparison_report
from controlplane.experiments.services.rounds.requests import assignment_learning_rate
from controlplane.planning import metrics
from controlplane.planning.lr_scaling import REFERENCE_BATCH_SIZE, lr_factor, scaled_learning_rate
from workers.protocol.messages import AssignmentSpec, DatasetRef, OptimizerConfig, ShardRef, TaskRef
from workers.training.trainer import assignment_optimizer

# --- the learning rate -------------------------------------------------------------------------


def test_the_learning_rate_follows_the_batch_size_by_the_rule():
    assert REFERENCE_BATCH_SIZE == 128
    assert scaled_learning_rate(0.1, 128, "linear") == pytest.approx(0.1)
    assert scaled_learning_rate(0.1, 256, "linear") == pytest.approx(0.2)
    assert scaled_learning_rate(0.1, 32, "linear") == pytest.approx(0.025)
    assert scaled_learning_rate(0.1, 512, "sqrt") == pytest.approx(0.2)  # √4 = 2
    assert scaled_learning_rate(0.1, 32, "sqrt") == pytest.approx(0.05)  # √(1/4)
    assert scaled_learning_rate(0.1, 4096, "none") == 0.1
    with pytest.raises(ValueError, match="lr_scaling: 'cubic' is not allowed; allowed: none, linear, sqrt"):
        lr_factor(128, "cubic")


def _task_ref(lr: float = 0.05) -> TaskRef:
    return TaskRef(
        task_id=1,
        name="t",
        architecture="mobilenet_v3_small",
        num_classes=10,
        dataset=DatasetRef(name="digits"),
        optimizer=OptimizerConfig(learning_rate=lr),
    )


def test_an_assignment_carries_its_scaled_learning_rate_and_the_trainer_uses_it():
    task = _task_ref(0.05)
    # none, and a batch of 128 under any rule, send no learning rate: the wire stays as it was.
    assert assignment_learning_rate(task, 256, "none") is None
    assert assignment_learning_rate(task, 128, "linear") is None
    assert assignment_learning_rate(task, 64, "linear") == pytest.approx(0.025)
    spec = AssignmentSpec(
        assignment_id=1,
        task=task,
        batch_size=64,
        active_thread_percentage=50,
        shard=ShardRef(permutation_seed=0, offset=0, count=10),
        local_epochs=1,
        global_weights="g",
        output_weights="o",
        learning_rate=0.025,
    )
    assert assignment_optimizer(spec).learning_rate == 0.025
    assert assignment_optimizer(spec).momentum == task.optimizer.momentum
    old = AssignmentSpec.model_validate({k: v for k, v in spec.model_dump().items() if k != "learning_rate"})
    assert assignment_optimizer(old).learning_rate == 0.05


def test_an_experiments_lr_scaling_is_checked_and_shown(api, make_device, make_task):
    devices, task = [make_device("dev-a")], make_task()
    body = {"name": "e", "tasks": [task.id], "devices": [d.id for d in devices], "rounds": 1}
    bad = api.post("/api/experiments/", {**body, "lr_scaling": "cubic"}, format="json")
    assert bad.status_code == 400
    assert "allowed: none, linear, sqrt" in bad.json()["errors"]["lr_scaling"][0]
    good = api.post("/api/experiments/", {**body, "lr_scaling": "sqrt"}, format="json")
    assert good.status_code == 201, good.json()
    assert good.json()["lr_scaling"] == "sqrt"
    fixed = api.patch(f"/api/experiments/{good.json()['id']}/", {"lr_scaling": "none"}, format="json")
    assert fixed.status_code == 400 and "lr_scaling" in fixed.json()["errors"]
    default = api.post("/api/experiments/", {**body, "name": "e2"}, format="json")
    assert default.json()["lr_scaling"] == "none"


# --- time to accuracy --------------------------------------------------------------------------


def _points(accuracies, round_times=(10.0, 20.0, 30.0, 40.0)):
    return [
        metrics.AccuracyPoint(k, t, t + 1.0, 100, a)
        for k, (a, t) in enumerate(zip(accuracies, round_times, strict=False))
    ]


def test_time_to_accuracy_sums_round_times_until_the_target_is_first_reached():
    reached = metrics.time_to_accuracy(_points([0.3, 0.6, 0.5, 0.8]), 0.55)
    # rounds 0 and 1: 10 + 20 s of FL rounds, 11 + 21 s wall, 200 samples.
    assert reached == metrics.TimeToAccuracy(rounds=2, time_s=30.0, wall_time_s=32.0, samples=200, accuracy=0.6)
    assert metrics.time_to_accuracy(_points([0.3, 0.6, 0.5, 0.8]), 0.8).time_s == 100.0
    assert metrics.time_to_accuracy(_points([0.3, 0.6]), 0.9) is None
    # A failed round (no round time, no checkpoint) adds 0 s but counts as a round.
    failed = [metrics.AccuracyPoint(0, None, 5.0, 0, None), metrics.AccuracyPoint(1, 7.0, 8.0, 50, 0.9)]
    assert metrics.time_to_accuracy(failed, 0.9) == metrics.TimeToAccuracy(2, 7.0, 13.0, 50, 0.9)
    with pytest.raises(ValueError, match="target"):
        metrics.time_to_accuracy(failed, 0.0)


def test_the_default_target_is_the_lowest_final_accuracy():
    finals = [{"a": 0.8, "b": 0.5}, {"a": 0.7, "b": None}, {"a": 0.9, "b": 0.0}]
    assert metrics.lowest_final_accuracy(finals) == {"a": 0.7}


# --- intervals and verdicts --------------------------------------------------------------------


def test_an_estimate_is_the_mean_with_its_student_t_interval():
    e = metrics.estimate([1.0, 2.0, 3.0, None])
    # s = 1, n = 3, t_{0.975, 2} = 4.302653: half-width 4.302653 / √3 = 2.484138
    assert e.mean == 2.0 and e.n == 3
    assert e.low == pytest.approx(2 - 2.484138, abs=1e-6) and e.high == pytest.approx(2 + 2.484138, abs=1e-6)
    assert metrics.estimate([5.0]) == metrics.Estimate(5.0, None, None, 1)
    assert metrics.estimate([]) == metrics.Estimate(None, None, None, 0)


def test_a_verdict_is_welchs_interval_of_the_difference():
    better, reference = [10.0, 11.0, 12.0], [5.0, 6.0, 7.0]
    # Δ = 5, se = √(1/3 + 1/3) = 0.8165, ν = 4, t_{0.975, 4} = 2.776445: [2.733, 7.267]
    diff, low, high = metrics.difference_interval(better, reference)
    assert diff == 5.0 and low == pytest.approx(5 - 2.776445 * math.sqrt(2 / 3), abs=1e-6)
    assert high == pytest.approx(5 + 2.776445 * math.sqrt(2 / 3), abs=1e-6)
    assert metrics.verdict(better, reference) == "better"
    assert metrics.verdict(reference, better) == "worse"
    assert metrics.verdict(better, reference, higher_is_better=False) == "worse"  # times: lower is better
    assert metrics.verdict([1.0, 5.0, 9.0], [4.0, 5.0, 6.0]) == "not distinguishable"
    assert metrics.verdict([10.0], [5.0, 6.0]) == "not distinguishable"  # one repeat: no verdict
    assert metrics.verdict([3.0, 3.0], [2.0, 2.0]) == "better"  # no spread at all


def test_repeats_run_in_interleaved_orders():
    assert metrics.interleaved_orders(["A", "B", "C"], 3) == [["A", "B", "C"], ["C", "B", "A"], ["A", "B", "C"]]


# --- comparisons -------------------------------------------------------------------------------


def test_a_comparison_with_repeats_creates_its_runs_interleaved(
    api,
    make_experiment,
    predictor,
    django_capture_on_commit_callbacks,
):
    experiment = make_experiment()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            f"/api/experiments/{experiment.id}/compare/",
            {"strategies": ["temporal", "sharing", "vres_sync"], "repeats": 2},
            format="json",
        )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["repeats"] == 2
    assert [(r["strategy"], r["repeat"]) for r in body["runs"]] == [
        ("temporal", 0),
        ("sharing", 0),
        ("vres_sync", 0),
        ("vres_sync", 1),
        ("sharing", 1),
        ("temporal", 1),
    ]


@pytest.mark.parametrize(
    "body, field, says",
    [
        ({"repeats": 0}, "repeats", "allowed 1 to 10"),
        ({"repeats": 11}, "repeats", "allowed 1 to 10"),
        ({"targets": {"nope": 0.5}}, "targets.nope", "not a task of this experiment"),
        ({"targets": {"TASK": 1.5}}, "targets.TASK", "greater than 0 and at most 1"),
        ({"targets": {"TASK": 0}}, "targets.TASK", "greater than 0 and at most 1"),
        ({"targets": {"TASK": "high"}}, "targets.TASK", "finite number"),
    ],
)
def test_a_comparisons_repeats_and_targets_are_checked(api, make_experiment, body, field, says):
    experiment = make_experiment()
    task = experiment.tasks.order_by("id").first()
    if "targets" in body:
        body = {"targets": {(str(task.id) if k == "TASK" else k): v for k, v in body["targets"].items()}}
        field = field.replace("TASK", str(task.id))
    response = api.post(
        f"/api/experiments/{experiment.id}/compare/", {"strategies": ["temporal"], **body}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert says in " ".join(response.json()["errors"][field]), response.json()
    assert not Comparison.objects.exists()


def _finish(run: Run, *, fl: float, round_times: list[float], accuracies: dict, device, tasks) -> None:
    """Give a run rounds, assignments and checkpoints as if it had trained."""
    Run.objects.filter(id=run.id).update(
        status=Run.Status.SUCCEEDED, raw_throughput_sps=fl * 2, fair_throughput=fl / 100, fl_throughput_sps=fl
    )
    for k, t in enumerate(round_times):
        rnd = Round.objects.create(
            run=run, index=k, status=Round.Status.SUCCEEDED, round_time_s=t, wall_time_s=t + 1, samples_trained=80
        )
        for task in tasks:
            Assignment.objects.create(
                round=rnd,
                device=device,
                task=task,
                batch_size=128,
                active_thread_percentage=100,
                samples=40,
                samples_trained=40,
                status=Assignment.Status.SUCCEEDED,
            )
            Checkpoint.objects.create(
                run=run, task=task, round=rnd, artifact_path="x", sha256="0", test_accuracy=accuracies[task.name][k]
            )


def test_a_comparisons_report_has_time_to_accuracy_intervals_and_verdicts(
    api,
    browser_client,
    make_experiment,
    predictor,
    django_capture_on_commit_callbacks,
):
    experiment = make_experiment()
    t1, t2 = experiment.tasks.order_by("id")
    device = experiment.devices.order_by("id").first()
    with django_capture_on_commit_callbacks(execute=True):
        comparison = services.comparison_create(
            experiment=experiment, strategies=["temporal", "sharing", "vres_sync"], repeats=2, targets={t2.name: 0.5}
        )
    assert comparison.targets == {str(t2.id): 0.5}
    fl = {("temporal", 0): 10.0, ("temporal", 1): 12.0, ("sharing", 0): 20.0, ("sharing", 1): 22.0}
    fl |= {("vres_sync", 0): 30.0, ("vres_sync", 1): 31.0}
    times = {"temporal": [10.0, 10.0, 10.0], "sharing": [6.0, 6.0, 6.0], "vres_sync": [4.0, 4.0, 5.0]}
    acc = {t1.name: [0.2, 0.6, 0.7], t2.name: [0.4, 0.5, 0.9]}
    for run in comparison.runs.all():
        own = {t1.name: list(acc[t1.name]), t2.name: list(acc[t2.name])}
        if run.strategy == "temporal" and run.repeat == 1:
            own[t1.name][2] = 0.65  # the lowest final accuracy of t1: its default target
        _finish(
            run,
            fl=fl[(run.strategy, run.repeat)],
            round_times=times[run.strategy],
            accuracies=own,
            device=device,
            tasks=[t1, t2],
        )

    report = comparison_report(comparison)
    assert report["targets"] == [
        {"task": t1.id, "task_name": t1.name, "target": 0.65, "source": "lowest final accuracy"},
        {"task": t2.id, "task_name": t2.name, "target": 0.5, "source": "given"},
    ]
    rows = {(r["strategy"], r["repeat"]): r for r in report["runs"]}
    sync0 = rows[("vres_sync", 0)]
    assert sync0["fl_speedup"] == pytest.approx(3.0)  # over repeat 0's temporal run
    assert rows[("vres_sync", 1)]["fl_speedup"] == pytest.approx(31 / 12)
    first, second = sync0["tasks"]
    # t1 first reaches 0.65 in round 2 (0.7): 4 + 4 + 5 s; t2 reaches 0.5 in round 1: 8 s.
    assert (first["time_to_accuracy_s"], first["rounds_to_accuracy"], first["samples_to_accuracy"]) == (13.0, 3, 120)
    assert first["wall_time_to_accuracy_s"] == 16.0
    assert (second["time_to_accuracy_s"], second["rounds_to_accuracy"]) == (8.0, 2)
    assert rows[("temporal", 1)]["tasks"][0]["time_to_accuracy_s"] == 30.0
    strategies = {s["strategy"]: s for s in report["strategies"]}
    sync = strategies["vres_sync"]
    assert sync["fl_throughput_sps"]["mean"] == 30.5 and sync["fl_throughput_sps"]["n"] == 2
    # s = 0.7071, n = 2, t_{0.975, 1} = 12.7062: half-width 6.3531
    assert sync["fl_throughput_sps"]["high"] == pytest.approx(30.5 + 6.3531, abs=1e-3)
    assert sync["tasks"][1]["time_to_accuracy_s"]["mean"] == 8.0 and sync["tasks"][1]["reached"] == 2
    verdicts = {(v["strategy"], v["figure"], v["task_name"]): v for v in report["verdicts"]}
    fl_verdict = verdicts[("vres_sync", "fl_throughput_sps", None)]
    assert fl_verdict["against"] == "sharing" and fl_verdict["verdict"] == "better"
    # sharing's t2 time is 12 s in both repeats, vres_sync's 8 s: no spread, lower is better.
    tta = verdicts[("vres_sync", "time_to_accuracy_s", t2.name)]
    assert tta["against"] == "sharing" and tta["verdict"] == "better"

    detail = api.get(f"/api/comparisons/{comparison.id}/")
    assert detail.status_code == 200
    assert detail.json()["report"]["runs"][0]["tasks"][1]["time_to_accuracy_s"] is not None
    assert "report" not in api.get("/api/comparisons/").json()["results"][0]

    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    assert 'id="comparison-table"' in page and "30.5 ± 6.4" in page
    assert "vres_sync</strong> against sharing, FL throughput" in page
    fig = figures.time_to_accuracy(report)
    assert fig.data[0].error_y.array is not None and not figures.is_empty(fig)
    assert figures.comparison_throughput(report).data[2].error_y.arrayminus[2] == pytest.approx(
        sync["fl_speedup"]["mean"] - sync["fl_speedup"]["low"]
    )
