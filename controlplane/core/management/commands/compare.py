"""``mtfl compare EXPERIMENT``: run every strategy on an experiment one after another (a
comparison), with a progress bar per run, then print the comparison tables."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from controlplane.common.errors import ApplicationError
from controlplane.common.limits import PRIORITY, REPEATS, TARGET_ACCURACY
from controlplane.core.cli_support import (
    comparison_report_tables,
    comparison_tables,
    console,
    experiment_by_id_or_name,
    follow_runs,
    interrupt_on_signals,
    require_control_worker,
)
from controlplane.core.demo import comparison_rows
from controlplane.core.embedded import use_running_broker
from controlplane.core.options import int_option, params_option
from controlplane.experiments import services
from controlplane.experiments.models import Run
from controlplane.experiments.selectors import comparison_report
from controlplane.experiments.services.planning import planner_options
from controlplane.planning.planner import OBJECTIVES, SLACK_POLICIES
from controlplane.planning.strategies import compared_strategies, planned_strategies
from workers.registry.aggregators import AGGREGATOR_REGISTRY


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
            "--replan",
            default="every_round",
            help="the planners' replanning: every_round (closed loop, from what the run measured) or never "
            "(open loop: the first plan in every round) (default every_round)",
        )
        parser.add_argument(
            "--aggregation",
            default="",
            help="every run's aggregator instead of the experiment's: "
            f"{', '.join(AGGREGATOR_REGISTRY.names())} (default: the experiment's)",
        )
        parser.add_argument(
            "--aggregation-param",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a hyper-parameter of that aggregator (repeat for several; `mtfl plugins` lists each "
            "aggregator's parameters and ranges); left-out ones take their defaults",
        )
        parser.add_argument(
            "--pool",
            default=None,
            help="a device pool (name or id, `mtfl pool list`) every run is placed in (default: the experiment's devices)",
        )
        parser.add_argument(
            "--priority",
            type=int,
            default=0,
            help=f"{PRIORITY.span}: every run's priority in the lab's queue, higher first (default 0)",
        )
        parser.add_argument(
            "--strategies",
            default="",
            help="comma-separated strategies to run, in order, including temporal (default: every compared one)",
        )
        parser.add_argument(
            "--repeats",
            default="1",
            help=f"how many times every strategy runs, {REPEATS.span}, in interleaved orders (as given, "
            "reversed, ...); figures are then means with 95 %% intervals (default 1)",
        )
        parser.add_argument(
            "--target",
            action="append",
            default=[],
            metavar="TASK=ACCURACY",
            help=f"test accuracy a task (id or name) must reach for its time to accuracy, in {TARGET_ACCURACY.interval}; "
            "repeatable "
            "(default: the lowest final accuracy any run reached)",
        )
        parser.add_argument("--timeout", default="21600", help="seconds allowed per run (default 21600)")
        parser.add_argument("--no-wait", action="store_true", help="launch and exit; follow it on the dashboard")

    def handle(self, *args, **opts):
        timeout_s = int_option("timeout", opts["timeout"], 10, 7 * 24 * 3600)
        repeats = int_option("repeats", opts["repeats"], int(REPEATS.low), int(REPEATS.high))
        targets = _targets(opts["target"])
        try:
            options: dict[str, Any] = planner_options(
                {"objective": opts["objective"], "slack": opts["slack"], "replan": opts["replan"]}
            )
        except ApplicationError as exc:
            raise CommandError(exc.message.replace("options.", "--")) from exc
        aggregation_params = params_option("aggregation-param", opts["aggregation_param"])
        if opts["aggregation"]:
            options["aggregation"] = opts["aggregation"]
        if aggregation_params:
            options["aggregation_params"] = aggregation_params
        if opts["pool"] is not None and not opts["pool"].strip():
            raise CommandError("--pool is empty: give a pool's name or id (`mtfl pool list`)")
        experiment = experiment_by_id_or_name(opts["experiment"])
        try:
            use_running_broker()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        require_control_worker("it runs the rounds")
        try:
            strategies = [n.strip() for n in opts["strategies"].split(",") if n.strip()] or None
            comparison = services.comparison_create(
                experiment=experiment,
                options=options,
                strategies=strategies,
                repeats=repeats,
                targets=targets,
                pool=opts["pool"],
                priority=opts["priority"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        runs = list(comparison.runs.order_by("id"))
        console.print(
            f"comparison {comparison.id} on [bold]{experiment.name}[/bold]: "
            + " → ".join(f"{r.strategy} (run {r.id}{f', repeat {r.repeat}' if repeats > 1 else ''})" for r in runs)
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
        comparison.refresh_from_db()
        for table in comparison_report_tables(comparison_report(comparison)):
            console.print(table)
        for r in rows:
            if r["error"]:
                console.print(f"[red]run {r['run']} ({r['strategy']}): {r['error']}[/red]")
        if any(r.status != Run.Status.SUCCEEDED for r in ended):
            raise SystemExit(1)


def _targets(given: list[str]) -> dict[str, float] | None:
    """``--target TASK=ACCURACY`` options as the service's ``targets`` (it checks the task and the
    range).

    Raises:
        CommandError: an option without ``=`` or whose accuracy is not a number.
    """
    if not given:
        return None
    out: dict[str, float] = {}
    for item in given:
        task, sep, value = item.partition("=")
        try:
            if not sep or not task.strip():
                raise ValueError
            out[task.strip()] = float(value)
        except ValueError:
            raise CommandError(
                f"--target: {item!r} is not TASK=ACCURACY (a task id or name, an accuracy in {TARGET_ACCURACY.interval})"
            ) from None
    return out
