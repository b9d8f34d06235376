"""Shared pieces of the ``mtfl demo`` and ``mtfl up`` commands."""

from __future__ import annotations

import signal
import time

from django.core.management import call_command
from rich.console import Console
from rich.table import Table

from controlplane.core.demo import Credentials, demo_user_ensure

console = Console(highlight=False)


def interrupt_on_signals() -> None:
    """Make SIGINT (Ctrl-C) and SIGTERM raise ``KeyboardInterrupt`` in the command, so the
    stack's ``with`` block stops every child. SIGINT is installed explicitly because a shell
    starts background jobs with SIGINT ignored, and Python keeps it ignored then."""

    def interrupt(*_args) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)


def prepare_database() -> Credentials:
    """Apply migrations and make sure the local researcher account exists."""
    call_command("migrate", interactive=False, verbosity=0)
    return demo_user_ensure()


def comparison_table(rows: list[dict], task_names: list[str]) -> Table:
    table = Table(title="Comparison (throughputs are means over rounds and devices)")
    for column in ("run", "strategy", "status", "raw (samples/s)", "fair", "raw speedup", "fair speedup"):
        table.add_column(column, justify="right" if column not in {"strategy", "status"} else "left")
    for name in task_names:
        table.add_column(f"acc {name}", justify="right")

    def num(v, fmt):
        return format(v, fmt) if v is not None else "—"

    for r in rows:
        table.add_row(
            str(r["run"]), r["strategy"], r["status"], num(r["raw_throughput_sps"], ".1f"), num(r["fair_throughput"], ".3f"),
            num(r["raw_speedup"], ".2f") + ("×" if r["raw_speedup"] is not None else ""),
            num(r["fair_speedup"], ".2f") + ("×" if r["fair_speedup"] is not None else ""),
            *[num(r["accuracy"].get(n), ".3f") for n in task_names],
        )
    return table


def serve_until_interrupted(stack, addr: str, creds: Credentials) -> None:
    """Serve the web app until Ctrl-C or SIGTERM, with the stack's workers running."""
    stack.start_web(addr)
    console.print(f"\nDashboard: [bold]http://{addr}/[/bold]   API docs: http://{addr}/api/docs/")
    console.print(f"Log in as [bold]{creds.username}[/bold] / [bold]{creds.password}[/bold]; API token: {creds.token}")
    console.print("Press Ctrl-C to stop.")
    try:
        while True:
            stack.children.check_alive()
            time.sleep(1.0)
    except KeyboardInterrupt:
        console.print("stopping…")
