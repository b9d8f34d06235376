"""``mtfl demo``: a whole multi-task FL comparison on real data, on the embedded stack."""

from __future__ import annotations

import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rich.table import Table

from controlplane.common.errors import ApplicationError
from controlplane.common.limits import DIRICHLET_ALPHA
from controlplane.core.cli_support import (
    comparison_tables,
    console,
    follow_runs,
    interrupt_on_signals,
    prepare_database,
    print_credentials,
    serve_until_interrupted,
)
from controlplane.core.demo import (
    ALGORITHM_PARTITION,
    ALGORITHM_ROUNDS,
    DEMO_ALGORITHMS,
    DEMO_ARCHITECTURES,
    algorithm_options,
    algorithm_rows,
    comparison_rows,
    demo_experiment_create,
)
from controlplane.core.options import addr_option, float_option, int_option, list_option
from controlplane.core.stack import LocalStack
from controlplane.experiments import services as exp_services
from controlplane.fleet.models import Device
from controlplane.planning.strategies import STRATEGY_REGISTRY
from workers.registry.aggregators import AGGREGATOR_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.training.datasets import dataset_info

ALGORITHM_STRATEGY = "sharing"
"""The strategy ``--algorithms`` runs unless ``--strategies`` says otherwise: one plan-free
strategy keeps the demo short (algorithms × strategies runs)."""


def _plan_free_strategies() -> list[str]:
    """The strategies a demo can run: those needing neither a fitted predictor (the demo fits
    none) nor a plan from the user (``temporal``, ``isolation``, ``sharing`` among the built-ins)."""
    return [s.name for s in STRATEGY_REGISTRY if not s.needs_predictor and not s.takes_plan]


class Command(BaseCommand):
    help = (
        "Start the embedded stack (Redis, control worker, two local cpu device agents), run the "
        "baselines on the digits demo experiment, print the comparison, then serve the dashboard. "
        "With --algorithms, compare FL algorithms (each with every strategy) on a label-skewed split."
    )

    def add_arguments(self, parser):
        parser.add_argument("--no-serve", action="store_true", help="exit after the comparison table")
        parser.add_argument("--addr", default="127.0.0.1:8000", help="where to serve the dashboard")
        parser.add_argument("--devices", default="2", help="number of local devices (default 2)")
        parser.add_argument(
            "--algorithms",
            nargs="?",
            const=",".join(DEMO_ALGORITHMS),
            default=None,
            metavar="A,B,...",
            help="compare these aggregators instead (default when given bare: "
            f"{','.join(DEMO_ALGORITHMS)}): every algorithm × strategy runs on one experiment with "
            f"{ALGORITHM_PARTITION} shards, {ALGORITHM_ROUNDS} rounds and --strategies sharing unless given",
        )
        parser.add_argument(
            "--rounds", default=None, help=f"FL rounds per run (default 2; {ALGORITHM_ROUNDS} with --algorithms)"
        )
        parser.add_argument("--local-epochs", default="1", help="local epochs per round (default 1)")
        parser.add_argument(
            "--alpha",
            default="0.5",
            help="Dirichlet alpha of the data volumes, of the label shares with --algorithms (default 0.5)",
        )
        parser.add_argument(
            "--samples", default=None, help="training samples per task, split over the devices (default: all 1437)"
        )
        parser.add_argument(
            "--architectures", default=",".join(DEMO_ARCHITECTURES), help="comma-separated models of the zoo"
        )
        parser.add_argument(
            "--strategies",
            default=None,
            help="comma-separated strategies that plan without a predictor or a given plan (default: "
            f"{','.join(_plan_free_strategies())}; {ALGORITHM_STRATEGY} with --algorithms)",
        )
        parser.add_argument("--timeout", default="1800", help="seconds allowed per run (default 1800)")

    def handle(self, *args, **opts):
        train_size = dataset_info("digits").train_size
        algorithms = (
            list_option("algorithms", opts["algorithms"], AGGREGATOR_REGISTRY.names())
            if opts["algorithms"] is not None
            else None
        )
        n_devices = int_option("devices", opts["devices"], 1, 16)
        rounds = int_option(
            "rounds",
            opts["rounds"] if opts["rounds"] is not None else str(ALGORITHM_ROUNDS if algorithms else 2),
            1,
            1000,
        )
        local_epochs = int_option("local-epochs", opts["local_epochs"], 1, 100)
        timeout_s = int_option("timeout", opts["timeout"], 10, 7 * 24 * 3600)
        samples = int_option("samples", opts["samples"], 2, train_size) if opts["samples"] else None
        alpha = float_option("alpha", opts["alpha"], DIRICHLET_ALPHA.low, DIRICHLET_ALPHA.high)
        architectures = list_option("architectures", opts["architectures"], MODEL_REGISTRY.names())
        default_strategies = ALGORITHM_STRATEGY if algorithms else ",".join(_plan_free_strategies())
        given = opts["strategies"] if opts["strategies"] is not None else default_strategies
        strategies = list_option("strategies", given, _plan_free_strategies())
        addr = None if opts["no_serve"] else addr_option(opts["addr"])

        started = time.monotonic()
        interrupt_on_signals()
        creds = prepare_database()
        agent_names = [f"local-{chr(ord('a') + i)}" for i in range(n_devices)]
        try:
            with LocalStack(agents=agent_names, log=lambda line: console.print(f"[dim]{line}[/dim]")) as stack:
                console.print("waiting for the control worker and the device agents…")
                stack.wait_ready()
                devices = list(Device.objects.filter(name__in=agent_names))
                experiment = demo_experiment_create(
                    devices=devices,
                    architectures=architectures,
                    rounds=rounds,
                    local_epochs=local_epochs,
                    alpha=alpha,
                    samples=samples,
                    owner=get_user_model().objects.filter(username=creds.username).first(),
                    partition_rule=ALGORITHM_PARTITION if algorithms else "quantity",
                )
                console.print(
                    f"experiment [bold]{experiment.name}[/bold] (id {experiment.id}): {experiment.description}"
                )
                if algorithms:
                    self._run_algorithms(experiment, algorithms, strategies, timeout_s, stack)
                    results = algorithm_rows(experiment)
                    for table in algorithm_tables(results, [t.name for t in experiment.tasks.order_by("id")]):
                        console.print(table)
                    rows = results["rows"]
                else:
                    self._run_all(experiment, strategies, timeout_s, stack)
                    rows = comparison_rows(experiment)
                    for table in comparison_tables(rows, [t.name for t in experiment.tasks.order_by("id")]):
                        console.print(table)
                for r in rows:
                    if r["error"]:
                        console.print(f"[red]run {r['run']} ({r['strategy']}): {r['error']}[/red]")
                console.print(f"demo took {time.monotonic() - started:.0f} s")
                if addr is None:
                    print_credentials(creds, "mtfl up")
                else:
                    serve_until_interrupted(stack, addr, creds)
        except KeyboardInterrupt:
            console.print("interrupted: every child process was stopped")
            raise SystemExit(130) from None
        except (RuntimeError, TimeoutError) as exc:
            raise CommandError(str(exc)) from exc
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc

    def _run_algorithms(self, experiment, algorithms, strategies, timeout_s, stack) -> None:
        """Every algorithm × strategy, one run after another, each run with its own aggregator."""
        follow_runs(
            lambda item: exp_services.run_create(
                experiment=experiment, strategy=item[1], options=algorithm_options(item[0])
            ),
            [(a, s) for a in algorithms for s in strategies],
            timeout_s=timeout_s,
            # Runs last minutes to hours: a crashed child is restarted as under `mtfl up`, and
            # the protocol fails or retries its device for the round it was in.
            check=stack.children.supervise,
            label=lambda item: f"{item[0]} · {item[1]}",
        )

    def _run_all(self, experiment, strategies, timeout_s, stack) -> None:
        follow_runs(
            lambda strategy: exp_services.run_create(experiment=experiment, strategy=strategy),
            strategies,
            timeout_s=timeout_s,
            check=stack.children.supervise,  # as in _run_algorithms
        )


def algorithm_tables(results: dict, task_names: list[str]) -> list[Table]:
    """The algorithm demo's tables (:func:`controlplane.core.demo.algorithm_rows`): each run's
    final test accuracy per task and its wall time, then the rounds and seconds of FL rounds each
    run took to each task's target (the lowest final accuracy any run reached)."""
    rows = results["rows"]
    final = Table(title="Final test accuracy per algorithm and strategy")
    for column in ("run", "algorithm · strategy", "status", "wall s"):
        final.add_column(column, justify="right" if column in ("run", "wall s") else "left", no_wrap=True)
    for name in task_names:
        final.add_column(name, justify="right")
    for r in rows:
        final.add_row(
            str(r["run"]),
            f"{r['algorithm']} · {r['strategy']}",
            r["status"],
            "—" if r["wall_s"] is None else f"{r['wall_s']:.0f}",
            *["—" if r["accuracy"].get(t) is None else f"{r['accuracy'][t]:.3f}" for t in task_names],
        )
    targets = ", ".join(f"{t} ≥ {a:.3f}" for t, a in results["targets"].items())
    reached = Table(
        title="Rounds / seconds of FL rounds to each task's target",
        caption=f"target: the lowest final accuracy; {targets}",
    )
    reached.add_column("task", no_wrap=True)
    for r in rows:
        reached.add_column(f"{r['algorithm']} · {r['strategy']}", justify="right")
    for name in results["targets"]:
        reached.add_row(
            name,
            *[
                "—"
                if r["to_target"].get(name) is None
                else f"{r['to_target'][name].rounds} / {r['to_target'][name].time_s:.1f} s"
                for r in rows
            ],
        )
    return [final, reached]
