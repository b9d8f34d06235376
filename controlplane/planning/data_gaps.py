"""Devices without data: a partition may leave a device 0 samples of a task, or of every task.

Nothing is refused for it (an ``explicit`` count of 0 is allowed, and a skewed partition of a
small split can empty a shard), but the researcher is told, at creation (the experiment's
``warnings`` in the API, a message on the dashboard's form, a block on its page) and on each run
(``Run.warnings``), what the rounds do about it: the planner gives a device only the tasks it
holds data of (:meth:`controlplane.planning.types.PlanningInput.tasks_on`), so a device with no
data of some tasks trains the others, and a device with no data of any task has no assignment
and is dispatched nothing in every round (it stays out of the round's metrics and FedAvg).

Pure: shard sizes in, warnings out (:func:`controlplane.experiments.selectors.experiments_data_warnings`
reads the shards).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

MAX_WARNED_DEVICES = 20
"""Devices named per kind of warning; the rest are counted (a federation of thousands of devices
would otherwise carry thousands of lines on every run)."""


@dataclass(frozen=True)
class DataGaps:
    """Which devices lack data: ``idle`` (device names holding no sample of any task) and
    ``partial`` (device name → the task names it holds no sample of, for devices that hold data
    of some other task); ``tasks``: every task name of the experiment, in order."""

    idle: tuple[str, ...]
    partial: dict[str, tuple[str, ...]]
    tasks: tuple[str, ...]


def data_gaps(shards: Iterable[tuple[str, str, int]]) -> DataGaps:
    """The gaps of an experiment's shards ``(device name, task name, num_samples)`` (every
    device × task pair; a missing pair counts as 0 samples). Devices and tasks sorted by name."""
    held: dict[str, dict[str, int]] = defaultdict(dict)
    tasks: set[str] = set()
    for device, task, n in shards:
        held[device][task] = held[device].get(task, 0) + int(n)
        tasks.add(task)
    idle, partial = [], {}
    for device in sorted(held):
        empty = tuple(t for t in sorted(tasks) if held[device].get(t, 0) <= 0)
        if len(empty) == len(tasks):
            idle.append(device)
        elif empty:
            partial[device] = empty
    return DataGaps(idle=tuple(idle), partial=partial, tasks=tuple(sorted(tasks)))


def _named(names: list[str], limit: int) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown


def data_gap_warnings(gaps: DataGaps, *, limit: int = MAX_WARNED_DEVICES) -> list[str]:
    """The gaps as warnings, one line per device with no data of some task (at most ``limit``,
    then one line counting the rest) and one line naming the devices with no data at all.

    Example: ``["dev-a holds 0 samples of t-shufflenet: it trains t-mobilenet only", "dev-c holds
    no data of any task: it is left out of training in every round"]``.
    """
    lines = []
    for device in list(gaps.partial)[:limit]:
        trains = [t for t in gaps.tasks if t not in gaps.partial[device]]
        lines.append(
            f"{device} holds 0 samples of {', '.join(gaps.partial[device])}: it trains {', '.join(trains)} only"
        )
    if len(gaps.partial) > limit:
        lines.append(
            f"{len(gaps.partial) - limit} more devices hold 0 samples of some task: each trains only the tasks it holds"
        )
    if gaps.idle:
        names = list(gaps.idle)
        verb = "holds" if len(names) == 1 else "hold"
        lines.append(
            f"{_named(names, limit)} {verb} no data of any task: "
            f"{'it is' if len(names) == 1 else 'they are'} left out of training in every round"
        )
    return lines
