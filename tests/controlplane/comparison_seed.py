"""A finished comparison with repeats written straight into the database, as recording its rounds
would have left it: runs in the interleaved order, rounds with their stored metrics
(:func:`controlplane.planning.metrics.round_metrics`), assignments with their spans, checkpoints
with test accuracies, ``P_alone`` measured by every run (its runs are ``simulated``, which the
cross-run cache never answers), and wall-clock times with the waiting between rounds that the FL
round time leaves out. The numbers are made up but deterministic (a seeded generator), so a test
can rely on them and the screenshots in ``docs/screenshots/`` come out the same each time.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Mapping, Sequence

from controlplane.experiments.models import (
    Assignment,
    Checkpoint,
    Comparison,
    Experiment,
    Round,
    Run,
    StandaloneThroughput,
)
from controlplane.planning import metrics

SPEED = {"temporal": 1.0, "isolation": 1.25, "sharing": 1.6, "vres_greedy": 1.8, "vres_sync": 2.1}
"""Each strategy's throughput over ``temporal``'s (before the per-repeat noise)."""
LEARNS = {"temporal": 1.0, "isolation": 1.0, "sharing": 1.0, "vres_greedy": 0.85, "vres_sync": 0.8}
"""Each strategy's accuracy gain per round over ``temporal``'s: the baselines train at batch 128
with the same seeds, so their curves coincide exactly (``sharing`` lies on ``temporal``); the
planners change batch sizes and learn a little less per round."""
BETWEEN_ROUNDS_S = 18.0
"""Wall-clock seconds a round takes besides its FL round time (dispatch, start-up, FedAvg,
planning), before noise: what the wall clock counts and the round-time clock leaves out."""
START = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC)


def _accuracy(task_index: int, strategy: str, rounds_done: int, repeat: int) -> float:
    """The test accuracy of a task's global model after ``rounds_done`` rounds (0: the initial
    model's) in repeat ``repeat``: the same for every strategy of equal ``LEARNS`` in one repeat
    (same batch sizes, same seeds), varying a little from repeat to repeat."""
    learns = LEARNS.get(strategy, 1.0)
    ceiling = (0.82, 0.74)[task_index % 2]
    noise = random.Random(f"{repeat}/{task_index}/{rounds_done}/{learns}").uniform(-0.025, 0.025)
    curve = 0.1 + (ceiling - 0.1) * (1 - math.exp(-0.55 * learns * rounds_done))
    return round(curve + (noise if rounds_done else 0.0), 4)


def seed_comparison(
    experiment: Experiment,
    strategies: Sequence[str],
    *,
    repeats: int = 3,
    rounds: int = 5,
    seed: int = 33,
    targets: Mapping[str, float] | None = None,
) -> Comparison:
    """A succeeded comparison of ``strategies`` on ``experiment`` with ``repeats`` repeats, every
    run succeeded with ``rounds`` rounds on every device of the experiment.

    Args:
        targets: ``{task id (a string): accuracy}`` (the comparison's ``targets``).
    """
    rng = random.Random(seed)
    comparison = Comparison.objects.create(
        experiment=experiment,
        strategies=list(strategies),
        repeats=repeats,
        targets=dict(targets or {}),
        status=Comparison.Status.SUCCEEDED,
    )
    clock = START
    for repeat, order in enumerate(metrics.interleaved_orders(strategies, repeats)):
        drift = 1.0 + 0.06 * repeat  # the shared machine slows a little, repeat after repeat
        for strategy in order:
            run = Run.objects.create(
                experiment=experiment, strategy=strategy, comparison=comparison, repeat=repeat, simulated=True
            )
            clock = _seed_run(run, rng, rounds=rounds, drift=drift, start=clock)
    return comparison


def _seed_run(run: Run, rng: random.Random, *, rounds: int, drift: float, start: dt.datetime) -> dt.datetime:
    """Rounds, assignments and checkpoints of one run from ``start``; returns when it ended."""
    experiment = run.experiment
    devices = list(experiment.devices.order_by("name"))
    tasks = list(experiment.tasks.order_by("id"))
    speed = SPEED.get(run.strategy, 1.0) * rng.uniform(0.9, 1.1) / drift
    elapsed = rng.uniform(4.0, 6.0)  # measuring P_alone before round 0
    StandaloneThroughput.objects.bulk_create(
        StandaloneThroughput(
            run=run,
            device=d,
            task=t,
            batch_size=128,
            throughput_sps=260.0 + 40 * k,
            simulated=True,
            source=StandaloneThroughput.Source.MEASURED,
        )  # fmt: skip
        for k, d in enumerate(devices)
        for t in tasks
    )
    summaries = []
    for index in range(rounds):
        rnd = Round.objects.create(run=run, index=index, status=Round.Status.SUCCEEDED)
        begun = start + dt.timedelta(seconds=elapsed)
        totals = {}
        for k, device in enumerate(devices):
            offset = rng.uniform(0.0, 0.4) * k  # the second device starts a little later
            measured = []
            for t, task in enumerate(tasks):
                samples = 600 + 200 * t + 150 * k
                throughput = (150.0 + 40 * k) * speed * rng.uniform(0.95, 1.05)
                seconds = samples / throughput
                a = Assignment.objects.create(
                    round=rnd, device=device, task=task, batch_size=128, active_thread_percentage=100,
                    samples=samples, samples_trained=samples, throughput_sps=throughput,
                    standalone_throughput_sps=260.0 + 40 * k, status=Assignment.Status.SUCCEEDED,
                    started_at=begun + dt.timedelta(seconds=offset),
                    finished_at=begun + dt.timedelta(seconds=offset + seconds), simulated=True,
                )  # fmt: skip
                measured.append(
                    metrics.TaskMeasurement(
                        succeeded=True,
                        samples_trained=samples,
                        throughput_sps=throughput,
                        standalone_sps=a.standalone_throughput_sps,
                        started_at=a.started_at.timestamp(),
                        finished_at=a.finished_at.timestamp(),
                    )  # fmt: skip
                )
            totals[device.name] = metrics.DeviceTotals.from_tasks(measured)
        m = metrics.round_metrics(totals)
        elapsed += m.round_time_s + BETWEEN_ROUNDS_S * rng.uniform(0.8, 1.25) * drift
        finished = start + dt.timedelta(seconds=elapsed)
        Round.objects.filter(id=rnd.id).update(
            started_at=begun, finished_at=finished, wall_time_s=(finished - begun).total_seconds(),
            round_time_s=m.round_time_s, samples_trained=m.samples_trained, fl_throughput_sps=m.fl_throughput_sps,
            raw_throughput_sps=m.raw_throughput_sps, fair_throughput=m.fair_throughput,
            device_metrics=m.devices_json(),
        )  # fmt: skip
        summaries.append(m)
        _checkpoints(run, rnd, index + 1, tasks, finished)
    _checkpoints(run, None, 0, tasks, start)
    totals_run = metrics.run_metrics(summaries)
    end = start + dt.timedelta(seconds=elapsed)
    Run.objects.filter(id=run.id).update(
        status=Run.Status.SUCCEEDED, started_at=start, finished_at=end,
        raw_throughput_sps=totals_run.raw_throughput_sps, fair_throughput=totals_run.fair_throughput,
        fl_throughput_sps=totals_run.fl_throughput_sps,
    )  # fmt: skip
    return end + dt.timedelta(seconds=2)


def _checkpoints(run: Run, rnd: Round | None, rounds_done: int, tasks: list, at: dt.datetime) -> None:
    """Each task's global model after ``rounds_done`` rounds, saved ``at``."""
    for t, task in enumerate(tasks):
        ckpt = Checkpoint.objects.create(
            run=run,
            task=task,
            round=rnd,
            artifact_path=f"seeded/{run.id}/{task.id}/{rounds_done}",
            sha256="0" * 64,
            test_accuracy=_accuracy(t, run.strategy, rounds_done, run.repeat),
        )
        Checkpoint.objects.filter(id=ckpt.id).update(created_at=at, evaluated_at=at)
