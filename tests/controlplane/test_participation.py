"""Partial participation (issue 23, item 2): the sampler, and the round services that train,
measure, aggregate and count only a round's participants.

The sampler's tests are pure (controlplane.planning.participation); the round tests drive the
real services (run_begin → standalone_record → round_enqueue → round_record) with the messages an
agent sends, capturing what the control plane dispatches at the Celery boundary
(controlplane.experiments.services.dispatch).
"""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.planning.participation import draw_participants, participant_count, plan_of_devices
from controlplane.planning.types import Plan, PlannedAssignment

# ------------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize(
    ("devices", "count", "fraction", "expected"),
    [
        (10, 3, None, 3),
        (10, 30, None, 10),  # never more than there are
        (30, None, 0.1, 3),  # 0.1 × 30 is 3.0000000000000004 in binary: still 3
        (10, None, 0.25, 3),  # 2.5 rounds up
        (10, None, 0.001, 1),  # at least one
        (7, None, 1.0, 7),
        (10_000, None, 0.01, 100),
        (12, None, None, 12),  # neither set: every device
    ],
)
def test_participant_count_takes_the_count_or_rounds_the_fraction_up(devices, count, fraction, expected):
    assert participant_count(devices, clients_per_round=count, client_fraction=fraction) == expected


@pytest.mark.parametrize(
    ("count", "fraction", "field"),
    [(0, None, "clients_per_round"), (None, 0.0, "client_fraction"), (None, 1.5, "client_fraction"), (2, 0.5, "")],
)
def test_participant_count_refuses_values_out_of_range(count, fraction, field):
    with pytest.raises(ValueError, match=field or "exclusive"):
        participant_count(10, clients_per_round=count, client_fraction=fraction)


def test_a_draw_is_reproducible_and_independent_of_the_other_rounds():
    ids = list(range(100, 600))
    first = [draw_participants(ids, count=20, rule="uniform", seed=7, round_index=r) for r in range(10)]
    # asked again in another order, and with the devices listed in another order
    again = {
        r: draw_participants(ids[::-1], count=20, rule="uniform", seed=7, round_index=r) for r in reversed(range(10))
    }

    assert all(first[r] == again[r] for r in range(10))
    assert len({tuple(d) for d in first}) == 10  # rounds draw differently
    assert draw_participants(ids, count=20, rule="uniform", seed=8, round_index=0) != first[0]  # and seeds


@pytest.mark.parametrize("rule", ["uniform", "weighted"])
def test_a_draw_has_the_count_asked_of_distinct_devices_in_id_order(rule):
    ids = [5, 3, 9, 1, 7, 11, 2]
    volumes = {d: 10 * d for d in ids}

    drawn = draw_participants(ids, count=4, rule=rule, seed=0, round_index=3, volumes=volumes)

    assert len(drawn) == 4 == len(set(drawn))
    assert set(drawn) <= set(ids)
    assert drawn == sorted(drawn)


def test_weighted_sampling_favours_devices_with_more_data():
    # 10 devices hold 1,000 samples each, 90 hold 10: by volume the large ones are 92 % of the
    # data. Over 400 rounds of 10 draws, a large device must be drawn far more often than a small
    # one, and uniform sampling must not tell them apart.
    large, small = list(range(10)), list(range(10, 100))
    volumes = {**{d: 1000 for d in large}, **{d: 10 for d in small}}
    counts = {"weighted": np.zeros(100), "uniform": np.zeros(100)}
    for rule in counts:
        for r in range(400):
            for d in draw_participants(range(100), count=10, rule=rule, seed=1, round_index=r, volumes=volumes):
                counts[rule][d] += 1
    rate = {rule: (c[large].mean() / 400, c[small].mean() / 400) for rule, c in counts.items()}

    assert rate["weighted"][0] > 0.6 and rate["weighted"][1] < 0.06  # inclusion rates per round
    assert rate["weighted"][0] > 10 * rate["weighted"][1]
    assert rate["uniform"][0] == pytest.approx(0.1, abs=0.03) and rate["uniform"][1] == pytest.approx(0.1, abs=0.01)


def test_weighted_sampling_draws_devices_without_data_only_to_fill_the_count():
    volumes = {1: 50, 2: 0, 3: 20, 4: 0, 5: 0}

    enough = [
        draw_participants(range(1, 6), count=2, rule="weighted", seed=0, round_index=r, volumes=volumes)
        for r in range(50)
    ]
    short = draw_participants(range(1, 6), count=4, rule="weighted", seed=0, round_index=0, volumes=volumes)

    assert all(d == [1, 3] for d in enough)
    assert {1, 3} <= set(short) and len(short) == 4


def test_the_sampler_refuses_an_unknown_rule_and_an_impossible_count():
    with pytest.raises(ValueError, match="client_sampling='roulette'.*uniform, weighted"):
        draw_participants([1, 2], count=1, rule="roulette", seed=0, round_index=0)
    with pytest.raises(ValueError, match="cannot draw 3 participants from 2 devices"):
        draw_participants([1, 2], count=3, rule="uniform", seed=0, round_index=0)


def test_a_stored_plan_cut_to_the_participants_predicts_their_round_time():
    plan = Plan(
        strategy="vres_sync",
        partitioning="mps",
        predicted_round_time_s=10.0,
        assignments=(
            PlannedAssignment(1, 1, 32, 50, samples=100, predicted_throughput_sps=10.0),  # 10 s
            PlannedAssignment(2, 1, 32, 50, samples=100, predicted_throughput_sps=50.0),  # 2 s
            PlannedAssignment(3, 1, 32, 50, samples=120, predicted_throughput_sps=40.0),  # 3 s
        ),
    )

    cut = plan_of_devices(plan, [2, 3], local_epochs=2)

    assert [a.device_id for a in cut.assignments] == [2, 3]
    assert cut.predicted_round_time_s == pytest.approx(6.0)  # E · |D| / P of device 3


# ------------------------------------------------------------------------ the round services


@pytest.fixture
def sampled_experiment(make_experiment, make_device, make_task):
    """Factory: an experiment of ``n`` devices ``dev-00``… holding 5, 10, … 40, 5, 10… samples
    of one task (the digits' 1,437 training samples hold 60 devices' shards), training ``clients_per_round`` (or ``client_fraction``) of them per round, the fields
    set on the model as the API stores them."""
    from controlplane.experiments.models import Experiment

    def make(n=6, *, clients_per_round=2, client_fraction=None, sampling="uniform", rounds=3, prefix="dev"):
        devices = [make_device(f"{prefix}-{k:02d}") for k in range(n)]
        task = make_task(f"{prefix}-mobilenet", "mobilenet_v3_small")
        counts = [{"device": d.id, "task": task.id, "num_samples": 5 + 5 * (k % 8)} for k, d in enumerate(devices)]
        experiment = make_experiment(
            name=f"{prefix}-exp", devices=devices, tasks=[task], counts=counts, partition_rule="explicit", rounds=rounds
        )
        Experiment.objects.filter(id=experiment.id).update(
            clients_per_round=clients_per_round, client_fraction=client_fraction, client_sampling=sampling
        )
        experiment.refresh_from_db()
        return experiment

    return make


@pytest.fixture
def dispatched(monkeypatch):
    """What the control plane sends to devices: ``{"standalone": [(requests, kwargs)], "rounds":
    [(round id, requests)]}`` (requests as the message models)."""
    from controlplane.experiments.services import dispatch

    sent: dict[str, list] = {"standalone": [], "rounds": []}
    monkeypatch.setattr(dispatch, "send_run_begin", lambda run_id: None)
    monkeypatch.setattr(
        dispatch, "send_standalone", lambda run_id, requests, **kw: sent["standalone"].append((requests, kw))
    )
    monkeypatch.setattr(
        dispatch, "send_round", lambda round_id, requests, **kw: sent["rounds"].append((round_id, requests))
    )
    return sent


def _standalone_answers(run_id: int, requests) -> list[dict]:
    """Every asked device's P_alone, 100 samples/s, as agents answer."""
    return [
        {
            "run_id": run_id,
            "device": r.device,
            "status": "succeeded",
            "measurements": [
                {"task_id": item.task.task_id, "batch_size": item.batch_size, "throughput_sps": 100.0}
                for item in r.items
            ],
        }
        for r in requests
    ]


def _begun(experiment, dispatched, capture):
    """A sharing run begun and its round 0 started (P_alone answered)."""
    from controlplane.experiments import services

    with capture(execute=True):
        run = services.run_create(experiment=experiment, strategy="sharing")
    with capture(execute=True):  # round 0 is leased, then asks its devices for P_alone
        services.run_begin(run_id=run.id)
    requests, _ = dispatched["standalone"][-1]
    with capture(execute=True):
        services.standalone_record(run_id=run.id, results=_standalone_answers(run.id, requests), before_round=0)
    return run


def _names(ids) -> list[str]:
    from controlplane.fleet.models import Device

    return sorted(Device.objects.filter(id__in=ids).values_list("name", flat=True))


@pytest.mark.django_db
def test_a_round_measures_plans_and_dispatches_only_its_participants(
    sampled_experiment, dispatched, django_capture_on_commit_callbacks
):
    from controlplane.experiments.models import Round, StandaloneThroughput
    from controlplane.experiments.services.participation import round_participants

    experiment = sampled_experiment(6, clients_per_round=2)
    drawn = round_participants(experiment, 0)

    run = _begun(experiment, dispatched, django_capture_on_commit_callbacks)

    rnd = Round.objects.get(run=run, index=0)
    [(standalone, _)] = dispatched["standalone"]
    [(round_id, requests)] = dispatched["rounds"]
    assert len(drawn) == 2 and rnd.participants == drawn
    assert sorted(r.device for r in standalone) == _names(drawn)  # P_alone of round 0's participants only
    assert sorted(StandaloneThroughput.objects.filter(run=run).values_list("device_id", flat=True)) == drawn
    assert sorted(rnd.assignments.values_list("device_id", flat=True)) == drawn
    assert round_id == rnd.id and sorted(r.device for r in requests) == _names(drawn)
    assert not rnd.flags  # every participant's P_alone is known


@pytest.mark.django_db
def test_aggregation_and_metrics_count_only_the_participants_and_the_watchdog_waits_for_no_one_else(
    sampled_experiment, dispatched, django_capture_on_commit_callbacks
):
    from controlplane.experiments import services
    from controlplane.experiments.models import Checkpoint, Round
    from tests.controlplane.test_round_protocol import _device_results
    from workers.fl.artifacts import get_store
    from workers.fl.fedavg import load_state

    experiment = sampled_experiment(6, clients_per_round=2)
    run = _begun(experiment, dispatched, django_capture_on_commit_callbacks)
    rnd = Round.objects.get(run=run, index=0)
    a, b = rnd.assignments.select_related("device").order_by("device_id")

    # Every participant reported: the round's check records it at once, whoever else is offline.
    finished = services.round_settle(
        round_id=rnd.id, results=_device_results(rnd, scale={a.device.name: 1.0, b.device.name: 3.0})
    )

    rnd.refresh_from_db()
    assert finished is not None and rnd.status == Round.Status.SUCCEEDED
    assert rnd.samples_trained == a.samples + b.samples
    assert rnd.fl_throughput_sps == pytest.approx(rnd.samples_trained / rnd.round_time_s)
    store = get_store()
    initial = load_state(store.path(Checkpoint.objects.get(run=run, round=None).artifact_path))
    averaged = load_state(store.path(Checkpoint.objects.get(run=run, round=rnd).artifact_path))
    key = next(k for k, v in initial.items() if v.dtype == np.float32 and v.size > 100)
    expected = (a.samples * 1.0 + b.samples * 3.0) / (a.samples + b.samples)
    np.testing.assert_allclose(averaged[key], expected * initial[key], rtol=1e-5)


@pytest.mark.django_db
def test_a_later_round_measures_its_newly_drawn_participants_before_it_starts(
    sampled_experiment, dispatched, django_capture_on_commit_callbacks
):
    from controlplane.experiments import services
    from controlplane.experiments.models import Round, Run, StandaloneThroughput
    from controlplane.experiments.services.participation import round_participants
    from tests.controlplane.test_round_protocol import _device_results

    experiment = sampled_experiment(6, clients_per_round=3, rounds=3)
    run = _begun(experiment, dispatched, django_capture_on_commit_callbacks)
    services.round_record(round_id=Round.objects.get(run=run, index=0).id, results=_device_results(run.rounds.get()))
    first, second = round_participants(experiment, 0), round_participants(experiment, 1)
    new = sorted(set(second) - set(first))
    assert new, "the seed draws the same devices twice: pick another experiment seed"

    with django_capture_on_commit_callbacks(execute=True):
        waiting = services.round_enqueue(run_id=run.id, index=1)
    assert not waiting.assignments.exists()  # leased; measures the new devices' P_alone first
    run.refresh_from_db()
    requests, kw = dispatched["standalone"][-1]
    assert kw["before_round"] == 1 and sorted(r.device for r in requests) == _names(new)
    assert run.planned["pending_round"]["participants"] == second

    with django_capture_on_commit_callbacks(execute=True):
        services.standalone_record(run_id=run.id, results=_standalone_answers(run.id, requests), before_round=1)

    rnd = Round.objects.get(run=run, index=1)
    assert rnd.participants == second
    assert sorted(rnd.assignments.values_list("device_id", flat=True)) == second
    assert all(a.standalone_throughput_sps == 100.0 for a in rnd.assignments.all())
    assert sorted(set(StandaloneThroughput.objects.filter(run=run).values_list("device_id", flat=True))) == sorted(
        set(first) | set(second)
    )
    assert Run.objects.get(id=run.id).status == Run.Status.RUNNING


@pytest.mark.django_db
def test_a_fraction_is_rounded_up_and_a_count_of_every_device_is_no_sample(sampled_experiment):
    from controlplane.experiments.services.participation import round_participants

    half = sampled_experiment(5, clients_per_round=None, client_fraction=0.5, prefix="half")
    every = sampled_experiment(3, clients_per_round=3, prefix="every")

    assert len(round_participants(half, 0)) == 3  # ⌈0.5 × 5⌉
    assert round_participants(every, 0) is None
    assert round_participants(half, 4) == round_participants(half, 4)  # reproducible


@pytest.mark.django_db
def test_weighted_sampling_reads_each_devices_data_volume(sampled_experiment):
    from controlplane.experiments.services.participation import round_participants

    # dev-00 … dev-07 hold 5, 10, … 40 samples: drawn 2 per round over 200 rounds, the largest
    # device must take part several times as often as the smallest.
    experiment = sampled_experiment(8, clients_per_round=2, sampling="weighted")
    ids = list(experiment.devices.order_by("id").values_list("id", flat=True))
    drawn = [d for r in range(200) for d in round_participants(experiment, r)]

    assert drawn.count(ids[-1]) > 4 * drawn.count(ids[0])


@pytest.mark.django_db
def test_planning_a_sampled_round_reads_only_the_participants(sampled_experiment):
    from controlplane.experiments import selectors

    experiment = sampled_experiment(6, clients_per_round=2)
    ids = list(experiment.devices.order_by("id").values_list("id", flat=True))

    spec = selectors.planning_input(experiment, device_ids=[ids[4], ids[1]])
    shards = selectors.experiment_shards(experiment, device_ids=ids[:3])

    assert spec.device_ids == (ids[1], ids[4])
    assert sorted(d for d, _t in spec.samples) == [ids[1], ids[4]]
    assert sorted(d for d, _t in shards) == ids[:3]


@pytest.mark.django_db
def test_starting_a_sampled_round_costs_the_same_queries_in_a_small_and_a_large_federation(
    sampled_experiment, dispatched, django_capture_on_commit_callbacks
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.experiments import services

    counts = {}
    for n, prefix in ((4, "small"), (60, "large")):
        experiment = sampled_experiment(n, clients_per_round=2, prefix=prefix)
        with django_capture_on_commit_callbacks(execute=True):
            run = services.run_create(experiment=experiment, strategy="sharing")
        with django_capture_on_commit_callbacks(execute=True):
            services.run_begin(run_id=run.id)
        requests, _ = dispatched["standalone"][-1]
        answers = _standalone_answers(run.id, requests)
        with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
            services.standalone_record(run_id=run.id, results=answers, before_round=0)  # starts round 0
        counts[prefix] = len(queries)
        assert run.rounds.get().assignments.count() == 2

    assert counts["large"] == counts["small"], counts


@pytest.mark.django_db
def test_an_aggregators_state_carries_over_the_rounds_a_tasks_devices_skipped(
    make_experiment, make_device, make_task, dispatched, django_capture_on_commit_callbacks
):
    """Task ``rare`` lives on one device only. In a round that does not draw it, ``rare`` keeps
    its model and the stateful aggregator's server state; the next round that draws it hands
    that state back (the state counts the aggregations it made: 1, kept, then 2)."""
    from controlplane.experiments import services
    from controlplane.experiments.models import Checkpoint, Experiment, Round
    from controlplane.experiments.services.participation import round_participants
    from tests.controlplane import stateful_aggregator
    from tests.controlplane.test_round_protocol import _device_results
    from workers.fl.artifacts import get_store
    from workers.fl.fedavg import load_state

    devices = [make_device(f"dev-{k}") for k in range(4)]
    common, rare = make_task("common", "mobilenet_v3_small"), make_task("rare", "mobilenet_v3_small")
    counts = [{"device": d.id, "task": common.id, "num_samples": 20} for d in devices]
    counts.append({"device": devices[0].id, "task": rare.id, "num_samples": 30})
    experiment = make_experiment(
        devices=devices, tasks=[common, rare], counts=counts, partition_rule="explicit", rounds=3
    )
    # A seed whose draws of 2 of the 4 devices take dev-0 in rounds 0 and 2 but not in round 1.
    Experiment.objects.filter(id=experiment.id).update(clients_per_round=2, aggregation=stateful_aggregator.NAME)
    experiment.refresh_from_db()
    for seed in range(200):
        experiment.seed = seed
        takes = [devices[0].id in round_participants(experiment, r) for r in range(3)]
        if takes == [True, False, True]:
            break
    else:
        pytest.fail("no seed below 200 draws dev-0 in rounds 0 and 2 only")
    experiment.save(update_fields=["seed"])

    def start(run, index: int) -> Round:
        with django_capture_on_commit_callbacks(execute=True):
            rnd = services.round_enqueue(run_id=run.id, index=index)
        if not rnd.assignments.exists():  # newly drawn devices: their P_alone first
            requests, kw = dispatched["standalone"][-1]
            assert kw["before_round"] == index
            with django_capture_on_commit_callbacks(execute=True):
                services.standalone_record(
                    run_id=run.id, results=_standalone_answers(run.id, requests), before_round=index
                )
        return Round.objects.get(run=run, index=index)

    with stateful_aggregator.registered():
        run = _begun(experiment, dispatched, django_capture_on_commit_callbacks)
        for index in range(3):
            rnd = Round.objects.get(run=run, index=0) if index == 0 else start(run, index)
            services.round_record(round_id=rnd.id, results=_device_results(rnd))

    store = get_store()
    kept = {c.round.index: c for c in Checkpoint.objects.filter(run=run, task=rare, round__isnull=False)}
    assert [kept[r].kept_previous for r in range(3)] == [False, True, False]
    assert kept[1].server_state_path == kept[0].server_state_path
    rounds_counted = [int(load_state(store.path(kept[r].server_state_path))["rounds"]) for r in range(3)]
    assert rounds_counted == [1, 1, 2]


def test_the_scale_benchmark_samples_its_devices_per_round():
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "MTFL_HOME"}}
    done = subprocess.run(
        [
            sys.executable,
            str(repo / "benchmarks" / "scale_sim.py"),
            "--devices",
            "12",
            "--sample",
            "4",
            "--rounds",
            "3",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "run 1: succeeded, 3 rounds (succeeded), 36 assignments" in done.stdout  # 4 devices × 3 tasks × 3
    assert "participants per round: 4 to 4 of 12 devices" in done.stdout
    assert re.fullmatch(r"rows_written_per_round=\d+", lines[-4])
    assert re.fullmatch(r"control_plane_s_per_round=\d+\.\d{3}", lines[-1])


def test_a_sampled_vres_sync_run_trains_and_replans_only_its_participants(api, make_experiment, make_device, predictor):
    from controlplane.experiments.models import Experiment
    from controlplane.experiments.services.participation import round_participants
    from tests.controlplane.test_replan_services import _launch, _measured, _start

    experiment = make_experiment(devices=[make_device(f"dev-{k}") for k in range(5)], rounds=3)
    Experiment.objects.filter(id=experiment.id).update(clients_per_round=2)
    experiment.refresh_from_db()
    run = _launch(api, experiment)

    first = _start(run, 0)
    _measured(first)
    second = _start(run, 1)

    assert len({a["device_id"] for a in run.planned["assignments"]}) == 5  # planned once, for every device
    for rnd in (first, second):
        drawn = round_participants(experiment, rnd.index)
        assert rnd.participants == drawn
        assert sorted(set(rnd.assignments.values_list("device_id", flat=True))) == drawn
    assert sorted(d["device_id"] for d in second.replan["decisions"]) == second.participants
    # round 0's predicted round time is its participants' slowest task: max t_ij, the planned
    # seconds (a fixed part and E·|D_ij| / P_ij)
    planned = {(a["device_id"], a["task_id"]): a["predicted_seconds"] for a in run.planned["assignments"]}
    slowest = max(planned[(a.device_id, a.task_id)] for a in first.assignments.all())
    assert first.predicted_round_time_s == pytest.approx(slowest)
