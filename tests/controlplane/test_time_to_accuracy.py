"""Issue 22 items 3 and 4: the learning rate following the batch size, time to accuracy, and
comparisons repeated in interleaved orders with 95 % intervals and verdicts (hand-worked numbers;
the Celery messages are read off the in-memory broker, not executed)."""

from __future__ import annotations

import datetime as dt
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


def _points(accuracies, round_times=(10.0, 20.0, 30.0, 40.0), between_s=25.0):
    """Rounds of ``round_times`` seconds of training, each also taking ``between_s`` seconds of
    dispatch, start-up, FedAvg and planning: the wall clock since the run's start is their sum."""
    elapsed = 0.0
    points = []
    for k, (a, t) in enumerate(zip(accuracies, round_times, strict=False)):
        elapsed += t + between_s
        points.append(metrics.AccuracyPoint(k, t, elapsed, 100, a))
    return points


def test_time_to_accuracy_is_given_on_both_clocks():
    reached = metrics.time_to_accuracy(_points([0.3, 0.6, 0.5, 0.8]), 0.55)
    # rounds 0 and 1: 10 + 20 s of FL rounds; on the wall clock the run had been going for
    # (10 + 25) + (20 + 25) = 80 s when round 1's model was aggregated; 200 samples.
    assert reached == metrics.TimeToAccuracy(rounds=2, time_s=30.0, wall_time_s=80.0, samples=200, accuracy=0.6)
    assert metrics.time_to_accuracy(_points([0.3, 0.6, 0.5, 0.8]), 0.8).time_s == 100.0
    assert metrics.time_to_accuracy(_points([0.3, 0.6, 0.5, 0.8]), 0.8).wall_time_s == 200.0
    assert metrics.time_to_accuracy(_points([0.3, 0.6]), 0.9) is None
    # A failed round (no round time, no checkpoint) adds 0 s of FL rounds but counts as a round,
    # and its wall time passes all the same.
    failed = [metrics.AccuracyPoint(0, None, 5.0, 0, None), metrics.AccuracyPoint(1, 7.0, 19.0, 50, 0.9)]
    assert metrics.time_to_accuracy(failed, 0.9) == metrics.TimeToAccuracy(2, 7.0, 19.0, 50, 0.9)
    unknown = [metrics.AccuracyPoint(0, 3.0, None, 10, 0.9)]  # a run with no recorded start
    assert metrics.time_to_accuracy(unknown, 0.9).wall_time_s is None
    with pytest.raises(ValueError, match="target"):
        metrics.time_to_accuracy(failed, 0.0)


def test_the_default_target_is_the_lowest_final_accuracy():
    finals = [{"a": 0.8, "b": 0.5}, {"a": 0.7, "b": None}, {"a": 0.9, "b": 0.0}]
    assert metrics.lowest_final_accuracy(finals) == {"a": 0.7}


# --- intervals and verdicts --------------------------------------------------------------------


def test_an_estimate_is_the_mean_with_its_student_t_interval():
    e = metrics.estimate([1.0, 2.0, 3.0, None])
    # s = 1, n = 3, t_{0.975, 2} = 4.302653: half-width 4.302653 / √3 = 2.484138
    assert e.mean == 2.0 and e.n == 3 and e.values == (1.0, 2.0, 3.0) and e.scale == "linear"
    assert e.low == pytest.approx(2 - 2.484138, abs=1e-6) and e.high == pytest.approx(2 + 2.484138, abs=1e-6)
    assert metrics.estimate([5.0]) == metrics.Estimate(5.0, None, None, 1, (5.0,))
    assert metrics.estimate([]) == metrics.Estimate(None, None, None, 0)
    assert e.as_dict() == {
        "mean": 2.0,
        "low": e.low,
        "high": e.high,
        "n": 3,
        "values": [1.0, 2.0, 3.0],
        "scale": "linear",
    }
    with pytest.raises(ValueError, match="scale"):
        metrics.estimate([1.0], scale="logit")


T_0975_1 = 12.706205  # t_{0.975, 1}: the quantile of two repeats


def test_a_speedups_interval_with_two_repeats_is_taken_on_the_log_scale_and_stays_positive():
    # Issue 33: ratios 1.1 and 1.3 (n = 2). Linear: 1.2 ± 12.706 · 0.1414 / √2 = 1.2 ± 1.27,
    # down to -0.07×, an impossible speedup. Log: logs 0.09531 and 0.26236, mean 0.17884,
    # s_log = 0.11812, half-width 12.706 · 0.11812 / √2 = 1.06130:
    # exp(0.17884) = 1.1958 (the geometric mean √(1.1 · 1.3)), [exp(-0.88246), exp(1.24014)].
    e = metrics.estimate([1.1, 1.3], scale="log")
    logs = [math.log(1.1), math.log(1.3)]
    half = T_0975_1 * abs(logs[1] - logs[0]) / math.sqrt(2) / math.sqrt(2)
    assert e.mean == pytest.approx(math.sqrt(1.1 * 1.3)) and e.scale == "log" and e.n == 2
    assert e.low == pytest.approx(math.exp(sum(logs) / 2 - half), rel=1e-5)
    assert e.high == pytest.approx(math.exp(sum(logs) / 2 + half), rel=1e-5)
    assert (e.low, e.high) == pytest.approx((0.41379, 3.4555), abs=1e-3)
    assert e.low > 0
    assert metrics.estimate([1.1, 1.3]).low < 0  # what the linear scale said
    assert metrics.repeated_speedups(
        [{"per_device": {"raw": {"sharing": {"gpu-a": 1.1}}}}, {"per_device": {"raw": {"sharing": {"gpu-a": 1.3}}}}]
    ).intervals["per_device"]["raw"]["sharing"]["gpu-a"] == (e.low, e.high)


def test_times_are_geometric_means_with_multiplicative_intervals():
    # 10 s and 40 s: geometric mean 20 s; logs differ by ln 4, s_log = ln 4 / √2, half-width
    # 12.706 · ln 4 / 2 = 8.8074: [20 / e^8.8074, 20 · e^8.8074], both positive (linear: 25 ± 190.6).
    e = metrics.estimate([10.0, 40.0], scale="log")
    half = T_0975_1 * math.log(4) / 2
    assert e.mean == pytest.approx(20.0)
    assert e.low == pytest.approx(20.0 / math.exp(half), rel=1e-5) and e.low > 0
    assert e.high == pytest.approx(20.0 * math.exp(half), rel=1e-5)
    # a value that is not positive cannot be taken on the log scale: linear, and it says so
    assert metrics.estimate([0.0, 4.0], scale="log").scale == "linear"
    # accuracies: linear, clipped to where an accuracy lives
    acc = metrics.estimate([0.6, 0.9], bounds=(0.0, 1.0))
    assert acc.mean == pytest.approx(0.75) and (acc.low, acc.high) == (0.0, 1.0)


def test_a_verdict_pairs_repeat_k_with_repeat_k_on_the_log_scale():
    # Each repeat's run of the candidate is 10 % slower than the reference's run of the same
    # repeat, while the repeats drift by 2× and 4× (a shared machine getting busier). Paired,
    # the log ratios are all ln(1/1.1): no spread, ratio 0.909 → worse. Unpaired (Welch on the
    # logs) the drift drowns it: not distinguishable.
    candidate, reference = [10.0, 20.0, 40.0], [11.0, 22.0, 44.0]
    paired = metrics.contrast(candidate, reference, scale="log", paired=True)
    assert paired.kind == "ratio" and paired.method == "paired t" and paired.n == 3
    assert paired.mean == pytest.approx(1 / 1.1) and paired.high == pytest.approx(1 / 1.1)
    assert metrics.verdict(candidate, reference, scale="log", paired=True) == "worse"
    assert metrics.verdict(candidate, reference, scale="log", paired=True, higher_is_better=False) == "better"
    assert metrics.verdict(candidate, reference, scale="log") == "not distinguishable"
    assert metrics.contrast(candidate, reference, scale="log").method == "Welch"
    # paired times with spread: ratios 0.5, 0.6, 0.55 → logs mean -0.6012, s 0.0911, n 3,
    # t_{0.975, 2} = 4.302653: exp(-0.6012 ± 0.2263) = [0.4373, 0.6873] < 1: lower time, better
    found = metrics.contrast([5.0, 6.0, 5.5], [10.0, 10.0, 10.0], scale="log", paired=True)
    logs = [math.log(0.5), math.log(0.6), math.log(0.55)]
    mean = sum(logs) / 3
    s = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert found.low == pytest.approx(math.exp(mean - 4.302653 * s / math.sqrt(3)), rel=1e-5)
    assert found.high == pytest.approx(math.exp(mean + 4.302653 * s / math.sqrt(3)), rel=1e-5)
    assert found.high < 1
    assert metrics.verdict([5.0, 6.0, 5.5], [10.0, 10.0, 10.0], scale="log", paired=True, higher_is_better=False) == (
        "better"
    )
    # a repeat missing on one side leaves its pair out; below two pairs: Welch, below two values: none
    assert metrics.contrast([5.0, None, 5.5], [10.0, 9.0, 11.0], scale="log", paired=True).n == 2
    assert metrics.contrast([5.0, None, None], [10.0, 9.0, None], scale="log", paired=True) is None
    with pytest.raises(ValueError, match="paired"):
        metrics.contrast([1.0, 2.0], [1.0], paired=True)


def test_below_three_repeats_every_figure_carries_a_note():
    assert metrics.small_n_note(2) == "n = 2: interval wide"
    assert metrics.small_n_note(1) == "n = 1: no interval"
    assert metrics.small_n_note(3) == metrics.small_n_note(0) == ""
    log = metrics.estimate([1.1, 1.3], scale="log").as_dict()
    assert (
        metrics.format_estimate(log, 2, "×") == f"1.20× [{log['low']:.2f}, {log['high']:.2f}]" == "1.20× [0.41, 3.46]"
    )
    assert metrics.format_estimate(metrics.estimate([1.0, 2.0, 3.0]).as_dict()) == "2.0 ± 2.5"


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


BETWEEN_ROUNDS_S = 5.0
"""Wall-clock seconds each round of :func:`_finish` takes besides its FL round time (dispatch,
start-up, FedAvg, planning the next)."""


def _finish(run: Run, *, fl: float, round_times: list[float], accuracies: dict, device, tasks) -> None:
    """Give a run rounds, assignments and checkpoints as if it had trained: round ``k`` is
    aggregated ``Σ_{j ≤ k} (round_times[j] + BETWEEN_ROUNDS_S)`` seconds after the run started."""
    started = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=run.id)
    Run.objects.filter(id=run.id).update(
        status=Run.Status.SUCCEEDED,
        raw_throughput_sps=fl * 2,
        fair_throughput=fl / 100,
        fl_throughput_sps=fl,
        started_at=started,
    )
    elapsed = 0.0
    for k, t in enumerate(round_times):
        elapsed += t + BETWEEN_ROUNDS_S
        rnd = Round.objects.create(
            run=run,
            index=k,
            status=Round.Status.SUCCEEDED,
            round_time_s=t,
            wall_time_s=t + 1,
            samples_trained=80,
            finished_at=started + dt.timedelta(seconds=elapsed),
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
    # on the wall clock round 2 was aggregated (4 + 5) + (4 + 5) + (5 + 5) = 28 s after the start
    assert first["wall_time_to_accuracy_s"] == pytest.approx(28.0)
    assert (second["time_to_accuracy_s"], second["rounds_to_accuracy"]) == (8.0, 2)
    assert rows[("temporal", 1)]["tasks"][0]["time_to_accuracy_s"] == 30.0
    assert rows[("temporal", 1)]["tasks"][0]["wall_time_to_accuracy_s"] == pytest.approx(45.0)
    assert report["clocks"] == {
        "time_to_accuracy_s": "FL round time",
        "wall_time_to_accuracy_s": "wall-clock from the run's start",
    }
    assert report["small_n_note"] == "n = 2: interval wide"
    strategies = {s["strategy"]: s for s in report["strategies"]}
    sync = strategies["vres_sync"]
    fl_estimate = sync["fl_throughput_sps"]
    # log scale: the geometric mean √(30 · 31), exp(mean log ± 12.706 · s_log / √2)
    half = 12.706205 * abs(math.log(31) - math.log(30)) / 2
    assert fl_estimate["mean"] == pytest.approx(math.sqrt(30 * 31)) and fl_estimate["n"] == 2
    assert fl_estimate["scale"] == "log" and fl_estimate["values"] == [30.0, 31.0]
    assert fl_estimate["high"] == pytest.approx(math.sqrt(30 * 31) * math.exp(half), rel=1e-5)
    assert fl_estimate["low"] == pytest.approx(math.sqrt(30 * 31) / math.exp(half), rel=1e-5)
    assert sync["tasks"][1]["time_to_accuracy_s"]["mean"] == pytest.approx(8.0) and sync["tasks"][1]["reached"] == 2
    assert sync["tasks"][1]["wall_time_to_accuracy_s"]["mean"] == pytest.approx(18.0)
    assert sync["tasks"][0]["final_accuracy"]["scale"] == "linear"
    verdicts = {(v["strategy"], v["figure"], v["task_name"]): v for v in report["verdicts"]}
    fl_verdict = verdicts[("vres_sync", "fl_throughput_sps", None)]
    # paired: 30/20 and 31/22, logs 0.4055 and 0.3429 → exp(0.3742 ± 0.3977) reaches below 1 at n = 2
    assert fl_verdict["against"] == "sharing" and fl_verdict["verdict"] == "not distinguishable"
    assert fl_verdict["difference"]["kind"] == "ratio" and fl_verdict["difference"]["method"] == "paired t"
    assert fl_verdict["difference"]["mean"] == pytest.approx(math.sqrt(30 / 20 * 31 / 22))
    # sharing's t2 takes 12 s of FL rounds (22 s wall) in both repeats, vres_sync's 8 s (18 s):
    # no spread in the paired ratios, lower is better, on both clocks.
    for clock, ratio in (("time_to_accuracy_s", 8 / 12), ("wall_time_to_accuracy_s", 18 / 22)):
        tta = verdicts[("vres_sync", clock, t2.name)]
        assert tta["against"] == "sharing" and tta["verdict"] == "better"
        assert tta["difference"]["mean"] == pytest.approx(ratio)

    detail = api.get(f"/api/comparisons/{comparison.id}/")
    assert detail.status_code == 200
    assert detail.json()["report"]["runs"][0]["tasks"][1]["time_to_accuracy_s"] is not None
    assert "report" not in api.get("/api/comparisons/").json()["results"][0]

    page = browser_client.get(f"/experiments/{experiment.id}/").content.decode()
    shown = metrics.format_estimate(fl_estimate)
    assert 'id="comparison-table"' in page and shown in page and shown == "30.5 [24.8, 37.6]"
    assert "vres_sync</strong> against sharing, FL throughput" in page
    assert "FL round time" in page and "wall-clock from the run&#x27;s start" in page
    assert "n = 2: interval wide" in page
    fig = figures.time_to_accuracy(report)
    assert not figures.is_empty(fig)
    # both clocks, one panel each with its own axis; per strategy and clock a bar with its
    # interval, a point per repeat, and the value written above the whisker
    assert [a.text for a in fig.layout.annotations] == ["FL round time (s)", "wall-clock from the run's start (s)"]
    bars = {(t.name, t.xaxis): t for t in fig.data if t.type == "bar"}
    assert set(bars) == {(s, axis) for s in ("temporal", "sharing", "vres_sync") for axis in ("x", "x2")}
    assert list(bars[("vres_sync", "x2")].y) == pytest.approx([28.0, 18.0])  # both repeats alike: no spread
    assert list(bars[("vres_sync", "x")].y) == pytest.approx([13.0, 8.0])
    points = next(t for t in fig.data if t.name == "vres_sync: each repeat" and t.xaxis == "x2")
    assert list(points.y) == pytest.approx([28.0, 28.0, 18.0, 18.0])
    assert "n = 2: interval wide" in fig.layout.title.text

    throughput = figures.comparison_throughput(report)
    sync_bar = next(t for t in throughput.data if t.type == "bar" and t.name == "vres_sync")
    assert sync_bar.error_y.arrayminus[2] == pytest.approx(sync["fl_speedup"]["mean"] - sync["fl_speedup"]["low"])
    assert sync["fl_speedup"]["low"] > 0
    label = next(t for t in throughput.data if t.name == "vres_sync: value")
    assert label.mode == "text" and label.y[2] >= sync["fl_speedup"]["high"]  # above the whisker
    assert label.text[2] == f"{sync['fl_speedup']['mean']:.2f}×"
