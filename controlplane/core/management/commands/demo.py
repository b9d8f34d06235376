"""``mtfl demo``: a whole multi-task FL comparison on real data, on the embedded stack."""

from __future__ import annotations

import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.common.errors import ApplicationError
from controlplane.core.cli_support import (
    comparison_tables,
    console,
    follow_runs,
    interrupt_on_signals,
    prepare_database,
    print_credentials,
    serve_until_interrupted,
)
from controlplane.core.demo import DEMO_ARCHITECTURES, comparison_rows, demo_experiment_create
from controlplane.core.options import addr_option, float_option, int_option, list_option
from controlplane.core.stack import LocalStack
from controlplane.experiments import services as exp_services
from controlplane.fleet.models import Device
from controlplane.planning.strategies import STRATEGY_REGISTRY
from workers.registry.models import MODEL_REGISTRY
from workers.training.datasets import dataset_info


def _plan_free_strategies() -> list[str]:
    """The strategies a demo can run: those needing neither a fitted predictor (the demo fits
    none) nor a plan from the user (``temporal``, ``isolation``, ``sharing`` among the built-ins)."""
    return [s.name for s in STRATEGY_REGISTRY if not s.needs_predictor and not s.takes_plan]


class Command(BaseCommand):
    help = (
        "Start the embedded stack (Redis, control worker, two local cpu device agents), run the "
        "baselines on the digits demo experiment, print the comparison, then serve the dashboard."
    )

    def add_arguments(self, parser):
        parser.add_argument("--no-serve", action="store_true", help="exit after the comparison table")
        parser.add_argument("--addr", default="127.0.0.1:8000", help="where to serve the dashboard")
        parser.add_argument("--devices", default="2", help="number of local devices (default 2)")
        parser.add_argument("--rounds", default="2", help="FL rounds per run (default 2)")
        parser.add_argument("--local-epochs", default="1", help="local epochs per round (default 1)")
        parser.add_argument("--alpha", default="0.5", help="Dirichlet alpha of the data volumes (default 0.5)")
        parser.add_argument(
            "--samples", default=None, help="training samples per task, split over the devices (default: all 1437)"
        )
        parser.add_argument(
            "--architectures", default=",".join(DEMO_ARCHITECTURES), help="comma-separated models of the zoo"
        )
        parser.add_argument(
            "--strategies",
            default=",".join(_plan_free_strategies()),
            help="comma-separated strategies that plan without a predictor or a given plan",
        )
        parser.add_argument("--timeout", default="1800", help="seconds allowed per run (default 1800)")

    def handle(self, *args, **opts):
        train_size = dataset_info("digits").train_size
        n_devices = int_option("devices", opts["devices"], 1, 16)
        rounds = int_option("rounds", opts["rounds"], 1, 1000)
        local_epochs = int_option("local-epochs", opts["local_epochs"], 1, 100)
        timeout_s = int_option("timeout", opts["timeout"], 10, 7 * 24 * 3600)
        samples = int_option("samples", opts["samples"], 2, train_size) if opts["samples"] else None
        alpha = float_option("alpha", opts["alpha"], 0, 1000)
        architectures = list_option("architectures", opts["architectures"], MODEL_REGISTRY.names())
        strategies = list_option("strategies", opts["strategies"], _plan_free_strategies())
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
                )
                console.print(
                    f"experiment [bold]{experiment.name}[/bold] (id {experiment.id}): {experiment.description}"
                )
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

    def _run_all(self, experiment, strategies, timeout_s, stack) -> None:
        follow_runs(
            lambda strategy: exp_services.run_create(experiment=experiment, strategy=strategy),
            strategies,
            timeout_s=timeout_s,
            check=stack.children.check_alive,
        )
