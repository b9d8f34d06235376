"""``mtfl up``: serve the web app with a control worker and local device agents."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.core.cli_support import (
    console,
    interrupt_on_signals,
    prepare_database,
    serve_until_interrupted,
)
from controlplane.core.options import addr_option, device_names_option
from controlplane.core.stack import LocalStack
from workers.registry.backends import BACKEND_REGISTRY


class Command(BaseCommand):
    help = (
        "Serve the web app with a control worker and local device agents (cpu by default; --backend simulated "
        "for simulated GPUs) on the embedded defaults."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="where to serve (default 127.0.0.1:8000)")
        parser.add_argument(
            "--agents",
            default="local-a,local-b",
            help="comma-separated local device agents to start ('' for none; default local-a,local-b)",
        )
        parser.add_argument(
            "--backend",
            default="cpu",
            help=f"the local agents' backend: {', '.join(BACKEND_REGISTRY.names())} (default cpu; simulated needs "
            "no GPU and sleeps what a simulated GPU would take: MTFL_SIM_DEVICE, MTFL_SIM_TIME_SCALE)",
        )

    def handle(self, *args, **opts):
        agents = device_names_option("agents", opts["agents"])
        backend = opts["backend"]
        if backend not in BACKEND_REGISTRY.names():
            raise CommandError(f"--backend {backend!r} is unknown; allowed: {', '.join(BACKEND_REGISTRY.names())}")
        addr = addr_option(opts["addr"])
        interrupt_on_signals()
        creds = prepare_database()
        try:
            with LocalStack(
                agents=agents, backend=backend, log=lambda line: console.print(f"[dim]{line}[/dim]")
            ) as stack:
                stack.wait_ready()
                serve_until_interrupted(stack, addr, creds)
        except KeyboardInterrupt:
            console.print("interrupted: every child process was stopped")
            raise SystemExit(130) from None
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
