"""``mtfl queue``: the shared lab's queue — per device who holds it and since when, the rounds
waiting in the order the policy serves them with what they wait for and their estimated start
(``--json``: the body of ``GET /api/queue/``)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from controlplane.api.serializers import QueueSerializer
from controlplane.core.lab_cli import read_lab
from controlplane.lab.selectors import queue_state


def _clock(value: dt.datetime | None) -> str:
    return f"{timezone.localtime(value):%H:%M:%S}" if value is not None else "-"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return ["  " + "  ".join([*(r[i].ljust(widths[i]) for i in range(len(widths))), r[-1]]) for r in [header, *rows]]


def policy_line(state: dict[str, Any]) -> str:
    """One line naming the policy in force and what it means."""
    if state["policy"] == "fair":
        rule = f"least weighted device-seconds in the last {state['fair_window_s']:g} s first"
    else:
        rule = "first come, first served"
    return (
        f"Policy: {state['policy']} ({rule}; higher priority first; a round that fits a free device is never held back)"
    )


def _device_row(d: dict[str, Any]) -> tuple[str, ...]:
    """One device of ``state["devices"]`` as a row of the devices table."""
    h, sweep = d["holder"], d.get("profiling")
    state_text = "paused" if d["paused"] else "held" if h else "profiling" if sweep else "free"
    if d["paused"] and d["paused_reason"]:
        state_text += f" ({d['paused_reason']})"
    if h:
        holder = f"run {h['run']} {h['run_strategy']} ({h['owner'] or 'nobody'}) round {h['round_index']}"
        since, free_at = h["since"], h["expected_free_at"]
    elif sweep:
        holder, since, free_at = f"profiling sweep {sweep['sweep']}", sweep["since"], sweep["expected_end"]
    else:
        holder, since, free_at = "-", None, None
    return (
        d["name"],
        d["pool"] or "-",
        state_text,
        holder,
        _clock(since) if since else "-",
        _clock(free_at) if free_at else "-",
        str(d["waiting_count"]),
        _clock(d["next_start"]),
    )


def _waiting_row(w: dict[str, Any]) -> tuple[str, ...]:
    """One round of ``state["waiting"]`` as a row of the waiting rounds' table."""
    needs = f"{w['slots']} of pool {w['pool']}" if w["pool"] else ",".join(w["devices"])
    if not w["pool"] and w["devices_count"] > len(w["devices"]):
        needs += f",... ({w['devices_count']})"
    blockers = [
        f"{b['device']} paused"
        if b["paused"]
        else f"{b['device']} (run {b['holder_run']}, {b['holder_owner'] or 'nobody'})"
        if b["holder_run"]
        else f"{b['device']} (profiling sweep {b.get('profiling_sweep')})"
        for b in w["blockers"]
    ]
    if w["blockers_count"] > len(w["blockers"]):
        blockers.append(f"... ({w['blockers_count']})")
    waited = f" ({w['waited_s']:.0f} s)" if w["waited_s"] is not None else ""
    return (
        str(w["position"]),
        f"run {w['run']} {w['run_strategy']}",
        w["owner"] or "nobody",
        str(w["priority"]),
        str(w["round_index"]),
        _clock(w["queued_at"]) + waited,
        needs,
        _clock(w["estimated_start"]) if w["estimated_start"] else "none while paused",
        "; ".join(blockers) or "its turn at the next pass",
    )


def queue_lines(state: dict[str, Any]) -> list[str]:
    """The queue as text (:func:`controlplane.lab.selectors.queue_state`)."""
    lines = [
        policy_line(state),
        f"{state['waiting_total']} round(s) waiting · {state['devices_held']} of {state['devices_total']} device(s) "
        f"held · {state['devices_paused']} paused",
        "",
    ]
    shown = "" if state["devices_listed"] == state["devices_involved"] else f", {state['devices_listed']} shown"
    lines.append(f"Devices held, paused or waited for ({state['devices_involved']}{shown}):")
    rows = [_device_row(d) for d in state["devices"]]
    if rows:
        lines += _table(("device", "pool", "state", "held by", "since", "free at", "waiting", "est. start"), rows)
    else:
        lines.append("  none: every device is free")
    lines += ["", f"Waiting rounds, in the order they are served ({state['waiting_total']}):"]
    rows = [_waiting_row(w) for w in state["waiting"]]
    if rows:
        lines += _table(("#", "run", "owner", "prio", "round", "queued", "needs", "est. start", "waiting for"), rows)
    else:
        lines.append("  none")
    if state["pools"]:
        lines += ["", "Pools:"]
        lines += _table(
            ("pool", "devices", "held", "paused", "free", "waiting"),
            [
                (p["name"], str(p["devices"]), str(p["held"]), str(p["paused"]), str(p["free"]), str(p["waiting"]))
                for p in state["pools"]
            ],
        )
    return lines


class Command(BaseCommand):
    help = (
        "Show the shared lab's queue: per device who holds it and since when, and the rounds waiting for "
        "devices in the order the scheduling policy serves them, with their estimated start."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the body of GET /api/queue/ instead")

    def handle(self, *args, **opts):
        state = read_lab("the queue", queue_state)
        if opts["json"]:
            self.stdout.write(json.dumps(QueueSerializer(state).data, indent=2))
            return
        for line in queue_lines(state):
            self.stdout.write(line)
