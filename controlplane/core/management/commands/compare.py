"""``mtfl compare EXPERIMENT``: run every strategy on an experiment one after another (a
comparison), with a progress bar per run, then print the comparison tables."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from controlplane.common.errors import ApplicationError
from controlplane.core.cli_support import (
    comparison_tables,
    console,
    follow_runs,
    interrupt_on_signals,
    require_control_worker,
)
from controlplane.core.demo import comparison_rows
from controlplane.core.embedded import use_running_broker
from controlplane.core.options import int_option
from controlplane.experiments import services
from controlplane.experiments.models import Experiment, Run
from controlplane.experiments.services.planning import planner_options
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES
from controlplane.planning.strategies import compared_strategies, planned_strategies


class Command(BaseCommand):
    help = (
        f"Compare {', '.join(compared_strategies())} on an experiment: one run after another on the same "
        "devices (a control worker and the devices' agents must be running, e.g. `mtfl up`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("experiment", help="the experiment's id or name")
        parser.add_argument(
            "--objective",
            default="raw",
            help=f"the planners' ({', '.join(planned_strategies())}) objective: "
            f"{' or '.join(OBJECTIVES)} (default raw)",
        )
        parser.add_argument(
            "--slack",
            default="smaller_batches",
            help=f"what vres_sync gives devices that finish early: {' or '.join(SLACK_POLICIES)} "
            "(default smaller_batches)",
        )
        parser.add_argument(
            "--strategies",
            default="",
            help="comma-separated strategies to run, in order, including temporal (default: every compared one)",
        )
        parser.add_argument("--timeout", default="21600", help="seconds allowed per run (default 21600)")
        parser.add_argument("--no-wait", action="store_true", help="launch and exit; follow it on the dashboard")

    def handle(self, *args, **opts):
        timeout_s = int_option("timeout", opts["timeout"], 10, 7 * 24 * 3600)
        try:
            options = planner_options({"objective": opts["objective"], "slack": opts["slack"]})
        except ApplicationError as exc:
            raise CommandError(exc.message.replace("options.", "--")) from exc
        key = opts["experiment"]
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
        try:
            use_running_broker()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        require_control_worker("it runs the rounds")
        try:
            strategies = [n.strip() for n in opts["strategies"].split(",") if n.strip()] or None
            comparison = services.comparison_create(experiment=experiment, options=options, strategies=strategies)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        runs = list(comparison.runs.order_by("id"))
        console.print(
            f"comparison {comparison.id} on [bold]{experiment.name}[/bold]: "
            + " → ".join(f"{r.strategy} (run {r.id})" for r in runs)
        )
        if opts["no_wait"]:
            console.print(f"follow it on the experiment page: /experiments/{experiment.id}/")
            return
        interrupt_on_signals()
        try:
            ended = follow_runs(lambda run: run, runs, timeout_s=timeout_s, label=lambda run: run.strategy)
        except KeyboardInterrupt:
            console.print(
                f"stopped following: comparison {comparison.id} goes on (POST /api/comparisons/"
                f"{comparison.id}/cancel/ stops it)"
            )
            raise SystemExit(130) from None
        except TimeoutError as exc:
            raise CommandError(str(exc)) from exc
        shown = {r.id for r in ended}
        rows = [r for r in comparison_rows(experiment) if r["run"] in shown]
        for table in comparison_tables(rows, [t.name for t in experiment.tasks.order_by("id")]):
            console.print(table)
        for r in rows:
            if r["error"]:
                console.print(f"[red]run {r['run']} ({r['strategy']}): {r['error']}[/red]")
        if any(r.status != Run.Status.SUCCEEDED for r in ended):
            raise SystemExit(1)
