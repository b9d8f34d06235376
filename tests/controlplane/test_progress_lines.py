"""Progress off a terminal (issue 33, item 5): ``mtfl demo``, ``mtfl compare`` and ``mtfl profile``
print plain progress lines when their output is a file or a pipe, where rich's bars draw nothing."""

from __future__ import annotations

import datetime as dt
import io

import pytest

from controlplane.core.cli_support import ProgressLines, follow_runs
from controlplane.experiments.models import Round, Run

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_change_of_stage_and_at_most_one_every_few_seconds_inside_one():
    out, clock = io.StringIO(), Clock()
    lines = ProgressLines("sharing", out, every_s=5.0, clock=clock)

    lines.update("round 0", 0.0, "0/2 rounds · round 0: 0/4 done")
    clock.now = 1.0
    lines.update("round 0", 0.1, "0/2 rounds · round 0: 1/4 done")  # same stage, too soon: not printed
    clock.now = 6.5
    lines.update("round 0", 0.2, "0/2 rounds · round 0: 2/4 done")  # 5 s passed: printed
    clock.now = 20.0
    lines.update("round 0", 0.2, "0/2 rounds · round 0: 2/4 done")  # nothing changed: not printed
    clock.now = 20.5
    lines.update("round 1", 0.5, "1/2 rounds · round 1: 0/4 done")  # a new round: printed at once

    assert out.getvalue().splitlines() == [
        "sharing: 0 % · 0/2 rounds · round 0: 0/4 done",
        "sharing: 20 % · 0/2 rounds · round 0: 2/4 done",
        "sharing: 50 % · 1/2 rounds · round 1: 0/4 done",
    ]


@pytest.mark.django_db
def test_following_runs_into_a_file_prints_each_runs_progress_as_lines(make_experiment):
    experiment = make_experiment(name="follow", rounds=2)
    runs = {
        s: Run.objects.create(experiment=experiment, strategy=s, status=Run.Status.RUNNING, started_at=T0)
        for s in ("temporal", "sharing")
    }
    steps = {s: 0 for s in runs}

    def advance(strategy: str) -> None:
        """Each poll moves the run on: round 0 running, then round 0 done, then the run done."""
        run, step = runs[strategy], steps[strategy]
        if step == 0:
            Round.objects.create(run=run, index=0, status=Round.Status.RUNNING, started_at=T0)
        elif step == 1:
            Round.objects.filter(run=run, index=0).update(status=Round.Status.SUCCEEDED, finished_at=T0)
            Round.objects.create(run=run, index=1, status=Round.Status.SUCCEEDED, started_at=T0, finished_at=T0)
            Run.objects.filter(id=run.id).update(status=Run.Status.SUCCEEDED, finished_at=T0)
        steps[strategy] += 1

    out = io.StringIO()  # not a terminal
    current: list[str] = []

    def start(strategy: str) -> Run:
        current[:] = [strategy]
        return runs[strategy]

    ended = follow_runs(start, list(runs), timeout_s=30, check=lambda: advance(current[0]), stream=out, label=str)

    assert [r.status for r in ended] == ["succeeded", "succeeded"]
    lines = out.getvalue().splitlines()
    t, s = runs["temporal"].id, runs["sharing"].id
    assert lines[0].startswith(f"temporal (run {t}): 0 % · 0/2 rounds")
    assert lines[-1] == f"sharing (run {s}): 100 % · 2/2 rounds · succeeded"
    assert f"temporal (run {t}): 100 % · 2/2 rounds · succeeded" in lines
    assert all(line.startswith(("temporal (run", "sharing (run")) for line in lines)
    assert len(lines) == len(set(lines))  # no line repeated while nothing changed
