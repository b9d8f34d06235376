"""Shared pieces of the ``mtfl`` commands (``demo``, ``up``, ``compare``, ``profile``, ...) and of
the benchmarks that drive a local stack: the console, progress bars, comparison tables, the
database and demo user, following runs to their end.

Kept outside ``management/commands/``, where Django would take every public module for a command."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controlplane.celery import app
from controlplane.core.demo import Credentials, demo_user_ensure, run_wait
from controlplane.experiments.models import Experiment
from controlplane.planning import metrics
from controlplane.planning.metrics import format_estimate

REDIRECTED_WIDTH = 200
"""Columns the tables are laid out in when the output is not a terminal (a file, a pipe, CI's
log) and ``COLUMNS`` is not set: rich's default there is 80, which squeezed the comparison
tables' intervals into ``…``."""

console = Console(
    highlight=False,
    width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else REDIRECTED_WIDTH,
)


def experiment_by_id_or_name(key: str) -> Experiment:
    """The experiment whose id (digits) or name is ``key``.

    Raises:
        CommandError: no such experiment, or the database cannot be read (one line each).
    """
    try:
        experiment = Experiment.objects.filter(id=int(key)).first() if key.isdigit() else None
        experiment = experiment or Experiment.objects.filter(name=key).first()
    except DatabaseError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CommandError(
            f"cannot read experiments from the database ({first}): if it is new, start `mtfl up` "
            "or run `mtfl migrate`, then create one"
        ) from exc
    if experiment is None:
        raise CommandError(
            f"experiment {key!r} does not exist (give its id or name; `GET /api/experiments/` lists them)"
        )
    return experiment


def interrupt_on_signals() -> None:
    """Make SIGINT (Ctrl-C), SIGTERM and SIGHUP raise ``KeyboardInterrupt`` in the command, so the
    stack's ``with`` block stops every child. SIGINT is installed explicitly because a shell
    starts background jobs with SIGINT ignored, and Python keeps it ignored then."""

    def interrupt(*_args) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)  # the terminal closed or the SSH session dropped


def prepare_database() -> Credentials:
    """Apply migrations and make sure the local researcher account exists."""
    call_command("migrate", interactive=False, verbosity=0)
    return demo_user_ensure()


def _num(value, fmt: str, suffix: str = "") -> str:
    return format(value, fmt) + suffix if value is not None else "—"


def comparison_tables(rows: list[dict], task_names: list[str]) -> list[Table]:
    """Two tables narrow enough for an 80-column terminal: throughput and speedups per run,
    then the final test accuracy of each task (rows) per run (columns)."""
    throughput = Table(title="Throughput (means over rounds and devices; speedups over temporal)")
    for column, justify in (
        ("run", "right"),
        ("strategy", "left"),
        ("status", "left"),
        ("raw samples/s", "right"),
        ("fair", "right"),
        ("raw ×", "right"),
        ("fair ×", "right"),
    ):
        throughput.add_column(column, justify=justify, no_wrap=True)
    for r in rows:
        throughput.add_row(
            str(r["run"]),
            r["strategy"],
            r["status"],
            _num(r["raw_throughput_sps"], ".1f"),
            _num(r["fair_throughput"], ".3f"),
            _num(r["raw_speedup"], ".2f", "×"),
            _num(r["fair_speedup"], ".2f", "×"),
        )
    accuracy = Table(title="Final test accuracy")
    accuracy.add_column("task", no_wrap=True)
    for r in rows:
        accuracy.add_column(f"{r['strategy']} (run {r['run']})", justify="right")
    for name in task_names:
        accuracy.add_row(name, *[_num(r["accuracy"].get(name), ".3f") for r in rows])
    return [throughput, accuracy]


def comparison_report_tables(report: dict) -> list[Table]:
    """The tables of a comparison report
    (:func:`controlplane.experiments.selectors.comparison_report`): throughput and speedups per
    strategy; time to each task's target accuracy on both clocks (FL round time, wall-clock from
    the run's start) and rounds to it, per strategy; the planners' verdicts against the best
    baseline on every figure and both clocks. Throughputs, speedups, times and rounds are
    geometric means over repeats with their 95 % interval [low, high] (log scale); fewer than
    three repeats carry the note ``n = 2: interval wide``. "P_alone measured" says how many of a
    strategy's runs measured ``P_alone`` themselves (their wall clock includes it; the others
    took it from the cache)."""
    repeats = report["repeats"]
    # every figure these tables show is positive: a geometric mean with its log-scale interval
    how = f"geometric mean of {repeats} repeats, 95 % interval" if repeats > 1 else "one repeat"
    note = report.get("small_n_note") or ""
    how += f"; {note}" if note else ""
    throughput = Table(title=f"Throughput per strategy ({how}; speedups over {report['baseline']})")
    for column in (
        "strategy",
        "runs",
        "P_alone measured",
        "raw samples/s",
        "fair",
        "FL samples/s",
        "raw ×",
        "fair ×",
        "FL ×",
    ):
        throughput.add_column(column, justify="left" if column == "strategy" else "right", no_wrap=True)
    for row in report["strategies"]:
        small = metrics.small_n_note(row["succeeded"])
        throughput.add_row(
            row["strategy"],
            f"{row['succeeded']}/{len(row['runs'])}" + (f" ({small})" if small else ""),
            f"{len(row.get('alone_measured_runs') or [])}/{len(row['runs'])} runs",
            format_estimate(row["raw_throughput_sps"], 1),
            format_estimate(row["fair_throughput"], 3),
            format_estimate(row["fl_throughput_sps"], 1),
            format_estimate(row["raw_speedup"], 2, "×"),
            format_estimate(row["fair_speedup"], 2, "×"),
            format_estimate(row["fl_speedup"], 2, "×"),
        )
    targets = ", ".join(f"{t['task_name']} ≥ {_num(t['target'], '.3f')} ({t['source']})" for t in report["targets"])
    clocks = report.get("clocks") or metrics.CLOCKS
    tta = Table(title=f"Time to accuracy on two clocks, seconds, and rounds ({how}); targets: {targets}")
    tta.add_column("task", no_wrap=True)
    tta.add_column("clock", no_wrap=True)
    for row in report["strategies"]:
        tta.add_column(row["strategy"], justify="right")
    for k, target in enumerate(report["targets"]):
        for figure, label, unit in (*((f, c, " s") for f, c in clocks.items()), ("rounds_to_accuracy", "rounds", "")):
            tta.add_row(
                target["task_name"],
                label,
                *[format_estimate(row["tasks"][k][figure], 1, unit) for row in report["strategies"]],
            )
    tables = [throughput, tta]
    if report["verdicts"]:
        verdicts = Table(
            title="Planners against the best baseline (95 %; ×: ratio of geometric means, paired by repeat)"
        )
        for column in ("strategy", "figure", "against", "verdict", "contrast [interval]"):
            verdicts.add_column(column, no_wrap=column != "contrast [interval]")
        for v in report["verdicts"]:
            figure = f"time to accuracy, {clocks[v['figure']]}" if v["figure"] in clocks else v["figure"]
            verdicts.add_row(
                v["strategy"],
                figure + (f" ({v['task_name']})" if v["task_name"] else ""),
                v["against"],
                v["verdict"],
                metrics.format_contrast(v["difference"]),
            )
        tables.append(verdicts)
    return tables


def print_credentials(creds: Credentials, how: str) -> None:
    """Where to look next, and how to log in (printed unwrapped, so it can be copied)."""
    console.print(f"See the runs in the dashboard: start [bold]{how}[/bold] and open the address it prints.")
    console.print(f"Log in as {creds.username} / {creds.password}", soft_wrap=True)
    console.print(f"API token: {creds.token}", soft_wrap=True)


def serve_until_interrupted(stack, addr: str, creds: Credentials) -> None:
    """Serve the web app until Ctrl-C or SIGTERM, with the stack's workers running.

    The children are supervised (:meth:`~controlplane.core.processes.Children.supervise`): one
    that exits is restarted with back-off, and a ``RuntimeError`` ends the serving only when one
    keeps crashing."""
    stack.start_web(addr)
    console.print(f"\nDashboard: http://{addr}/", soft_wrap=True)
    console.print(f"API docs:  http://{addr}/api/docs/", soft_wrap=True)
    console.print(f"Log in as {creds.username} / {creds.password}", soft_wrap=True)
    console.print(f"API token: {creds.token}", soft_wrap=True)
    console.print("Press Ctrl-C to stop.")
    try:
        while True:
            stack.children.supervise()
            time.sleep(1.0)
    except KeyboardInterrupt:
        console.print("stopping…")


def progress_detail(p: dict) -> str:
    """One line saying where a run is (``selectors.run_progress``'s dictionary)."""
    detail = f"{p['rounds_done']}/{p['rounds_total']} rounds"
    if p["current_round"] and p["current_round"]["status"] == "aggregating":
        detail += f" · round {p['current_round']['index']}: FedAvg and evaluation"
    elif p["current_round"]:
        c = p["current_round"]
        detail += f" · round {c['index']}: {c['assignments_finished']}/{c['assignments_total']} done"
        if c["assignments_running"]:
            detail += f", {c['assignments_running']} training"
    elif p["status"] == "running":
        detail += f" · {p['phase']}"
    elif p["status"] != "pending":
        detail += f" · {p['status']}"
    return detail


PLAIN_PROGRESS_EVERY_S = 30.0
"""Off a terminal, the longest a followed run stays silent while its progress changes inside a
round (a line is printed at once whenever its round or state changes)."""


class ProgressLines:
    """Progress as plain lines, for output that is not a terminal (a file, a pipe, CI's log),
    where rich's bars draw nothing until the end: one line when the followed thing's stage
    (round, state) changes, and otherwise at most one every ``every_s`` seconds while its detail
    changes. Each line is ``"<label>: <percent> % · <detail>"``, flushed at once.

    Args:
        label: what the lines are about (``"sharing"``, ``"profiling"``).
        stream: where to write them.
        every_s: the least seconds between two lines of the same stage.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        label: str,
        stream: TextIO,
        *,
        every_s: float = PLAIN_PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.stream, self.every_s, self.clock = label, stream, every_s, clock
        self._stage: object = None
        self._detail: str | None = None
        self._at = -math.inf

    def update(self, stage: object, fraction: float, detail: str) -> None:
        """Print a line if ``stage`` changed, or ``detail`` did and ``every_s`` has passed;
        ``fraction``: done, from 0 to 1."""
        now = self.clock()
        if stage == self._stage and (detail == self._detail or now - self._at < self.every_s):
            return
        self._stage, self._detail, self._at = stage, detail, now
        print(f"{self.label}: {100 * fraction:.0f} % · {detail}", file=self.stream, flush=True)


def run_stage(p: dict) -> tuple:
    """What a run's progress line changes with (``selectors.run_progress``'s dictionary): its
    state, phase, rounds done and current round's index and state."""
    current = p["current_round"] or {}
    return (p["status"], p["phase"], p["rounds_done"], current.get("index"), current.get("status"))


def follow_runs(
    start: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    timeout_s: float,
    check: Callable[[], None] | None = None,
    label: Callable[[Any], str] = str,
    stream: TextIO | None = None,
) -> list:
    """Follow the runs one after another until each ends: one progress bar per run on a
    terminal, plain lines otherwise (:class:`ProgressLines`).

    Args:
        start: gives the run of an item (creating it, or returning one already queued).
        items: what ``start`` takes, in order (strategy names, runs).
        timeout_s: seconds allowed per run (``TimeoutError`` past it).
        check: called at every poll (e.g. to stop when a child process died).
        label: the bar's name for an item.
        stream: where plain lines go, and whether bars are drawn (when it is a terminal);
            ``None``: the console's output.

    Returns:
        The ended runs.
    """
    terminal = console.is_terminal if stream is None else stream.isatty()
    if not terminal:
        return _follow_plain(start, items, timeout_s=timeout_s, check=check, label=label, stream=stream or console.file)
    ended = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        for item in items:
            run = start(item)
            bar = progress.add_task(f"{label(item):<12}", total=1.0, detail="queued")

            def update(p, bar=bar):
                if check is not None:
                    check()
                progress.update(bar, completed=p["fraction"], detail=progress_detail(p))

            ended.append(run_wait(run, timeout_s=timeout_s, on_progress=update))
    return ended


def _follow_plain(
    start: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    timeout_s: float,
    check: Callable[[], None] | None,
    label: Callable[[Any], str],
    stream: TextIO,
) -> list:
    """:func:`follow_runs` off a terminal: a :class:`ProgressLines` per run, with its id."""
    ended = []
    for item in items:
        run = start(item)
        lines = ProgressLines(f"{label(item)} (run {run.id})", stream)

        def update(p, lines=lines):
            if check is not None:
                check()
            lines.update(run_stage(p), p["fraction"], progress_detail(p))

        ended.append(run_wait(run, timeout_s=timeout_s, on_progress=update))
    return ended


def require_control_worker(why: str) -> None:
    """Stop the command unless a control worker answers on the broker.

    Raises:
        CommandError: naming what the worker is needed for and how to start one.
    """

    replies = app.control.ping(timeout=2.0) or []
    if not any(name.startswith("control@") for reply in replies for name in reply):
        raise CommandError(f"no control worker answers on the broker ({why}); start `mtfl up`")
