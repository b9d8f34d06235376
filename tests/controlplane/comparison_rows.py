"""Speedups and the compute/idle split of per-assignment rows, with no database at hand: each
round's metrics by :func:`controlplane.planning.metrics.round_metrics`, as recording a round
computes them, then taken together as the dashboard takes the stored ones."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controlplane.experiments.models import Assignment, Round
from controlplane.planning.metrics import (
    DeviceTotals,
    Speedups,
    TaskMeasurement,
    comparison_speedups,
    round_metrics,
    time_split,
)


def _seconds(value: object) -> float | None:
    """Unix seconds from a number or a datetime."""
    if value is None or isinstance(value, int | float):
        return value
    return value.timestamp()  # type: ignore[attr-defined]


def comparison_from_rows(
    rows: Iterable[Mapping[str, Any]], strategies: Sequence[str], *, baseline: str
) -> tuple[Speedups, dict[tuple[str, str], tuple[float, float]]]:
    """``(comparison_speedups(...), time_split(...))`` of rows ``{"strategy", "device",
    "round_index", "status", "samples_trained", "throughput_sps", "standalone_throughput_sps",
    "started_at", "finished_at"}`` (one per assignment; a status other than ``"succeeded"``
    fails the device's round; missing keys read as unknown)."""
    grouped: dict[tuple[str, int], dict[str, list[TaskMeasurement]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        grouped[(row["strategy"], row["round_index"])][row["device"]].append(
            TaskMeasurement(
                succeeded=row.get("status", "succeeded") == "succeeded",
                samples_trained=row.get("samples_trained") or 0,
                throughput_sps=row.get("throughput_sps"),
                standalone_sps=row.get("standalone_throughput_sps"),
                started_at=_seconds(row.get("started_at")),
                finished_at=_seconds(row.get("finished_at")),
            )
        )
    per_round = {
        key: round_metrics({d: DeviceTotals.from_tasks(t) for d, t in by_device.items()})
        for key, by_device in grouped.items()
    }
    device_rounds = {(s, d, r): m for (s, r), rm in per_round.items() for d, m in rm.devices.items()}
    return comparison_speedups(device_rounds, strategies, baseline=baseline), time_split(per_round)


def store_round_metrics(rounds: Iterable[Any]) -> None:
    """Store on rounds written directly (a fixture's, not recorded by the round protocol) the
    device metrics recording them would have stored (``Round.device_metrics``): each device
    counts when all its assignments succeeded."""
    rounds = list(rounds)
    rows = Assignment.objects.filter(round__in=rounds).values(
        "round_id",
        "device__name",
        "status",
        "samples_trained",
        "throughput_sps",
        "standalone_throughput_sps",
        "started_at",
        "finished_at",
    )
    tasks: dict[int, dict[str, list[TaskMeasurement]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        tasks[row["round_id"]][row["device__name"]].append(
            TaskMeasurement(
                succeeded=row["status"] == "succeeded",
                samples_trained=row["samples_trained"] or 0,
                throughput_sps=row["throughput_sps"],
                standalone_sps=row["standalone_throughput_sps"],
                started_at=_seconds(row["started_at"]),
                finished_at=_seconds(row["finished_at"]),
            )
        )
    for rnd in rounds:
        measured = round_metrics({d: DeviceTotals.from_tasks(t) for d, t in tasks[rnd.id].items()})
        rnd.device_metrics = measured.devices_json()
    Round.objects.bulk_update(rounds, ["device_metrics"])
