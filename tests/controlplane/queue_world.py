"""A shared lab's queue built directly in the database, for the queue tests (selector, API,
CLI, dashboard): runs whose rounds hold devices (held :class:`DeviceLease` rows) and runs whose
rounds wait (``queued``), without a scheduler pass or a broker."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.contrib.auth import get_user_model

from controlplane.experiments.models import Experiment, Round, Run
from controlplane.lab.models import DeviceLease


def running_round(
    run: Run,
    *,
    index: int = 0,
    devices,
    started_at: dt.datetime,
    predicted_round_time_s: float | None = None,
) -> Round:
    """A running round of ``run`` holding ``devices`` since ``started_at``."""
    rnd = Round.objects.create(
        run=run,
        index=index,
        status=Round.Status.RUNNING,
        queued_at=started_at,
        queue_s=0.0,
        started_at=started_at,
        predicted_round_time_s=predicted_round_time_s,
    )
    for device in devices:
        DeviceLease.objects.create(device=device, run=run, round=rnd, owner=run.experiment.owner, granted_at=started_at)
    return rnd


def queued_round(run: Run, *, index: int = 0, queued_at: dt.datetime, participants=None) -> Round:
    """A round of ``run`` waiting for its devices since ``queued_at``."""
    return Round.objects.create(
        run=run, index=index, status=Round.Status.QUEUED, queued_at=queued_at, participants=participants
    )


def running_run(experiment: Experiment, *, strategy: str = "sharing", priority: int = 0, pool=None) -> Run:
    return Run.objects.create(
        experiment=experiment, strategy=strategy, status=Run.Status.RUNNING, priority=priority, pool=pool
    )


@dataclass
class TwoResearchers:
    """The issue's first paragraph: ``holder`` (the ``user`` fixture's run) trains round 0 on
    dev-a and dev-b; ``waiter`` (the colleague's run, same devices) has its round 0 queued."""

    now: dt.datetime
    owner: object
    colleague: object
    devices: list
    holder: Run
    holder_round: Round
    waiter: Run
    waiter_round: Round


def two_researchers(make_experiment, make_device, user, *, now: dt.datetime) -> TwoResearchers:
    """Build :class:`TwoResearchers`: the holder's round started 5 s before ``now`` with a
    predicted round time of 20 s, the waiter's round queued 3 s before ``now``."""
    colleague = get_user_model().objects.create_user("colleague", password="s3cret-pass")
    devices = [make_device("dev-a"), make_device("dev-b")]
    mine = make_experiment(name="mine", devices=devices)
    theirs = make_experiment(name="theirs", devices=devices, tasks=list(mine.tasks.all()), owner=colleague)
    holder = running_run(mine)
    holder_round = running_round(
        holder, devices=devices, started_at=now - dt.timedelta(seconds=5), predicted_round_time_s=20.0
    )
    waiter = running_run(theirs)
    waiter_round = queued_round(waiter, queued_at=now - dt.timedelta(seconds=3))
    return TwoResearchers(now, user, colleague, devices, holder, holder_round, waiter, waiter_round)
