"""Plain data the planner works on: the experiment as it sees it, and the plan it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

Partitioning = Literal["timeslice", "mps"]


@dataclass(frozen=True)
class PlanningInput:
    """What a strategy needs to know about an experiment.

    Attributes:
        device_ids: devices of the federation, in a fixed order.
        task_ids: tasks every device may hold, in a fixed order.
        samples: ``samples[(device_id, task_id)]`` = ``|D_ij|``, training samples of task ``i``
            on device ``j`` (missing means 0).
        local_epochs: ``E``, local epochs per round.
    """

    device_ids: tuple[int, ...]
    task_ids: tuple[int, ...]
    samples: dict[tuple[int, int], int]
    local_epochs: int = 1

    def samples_of(self, device_id: int, task_id: int) -> int:
        """``|D_ij|`` (0 when the device holds no data of the task)."""
        return int(self.samples.get((device_id, task_id), 0))

    def tasks_on(self, device_id: int) -> tuple[int, ...]:
        """Tasks with at least one sample on the device; only these run there."""
        return tuple(t for t in self.task_ids if self.samples_of(device_id, t) > 0)


@dataclass(frozen=True)
class PlannedAssignment:
    """One task on one device for one round: its batch size ``B_ij`` and share ``R_ij`` (%),
    and, for predictor-driven plans, the predicted throughput ``P_ij`` (samples/s) and seconds
    ``t_ij`` (a fixed part plus ``E·|D_ij| / P_ij``, :mod:`controlplane.planning.seconds`).

    ``partitioning`` overrides the plan's for this assignment's device (a ``vres_*`` plan that
    kept a ``timeslice`` baseline's plan on one device, :func:`controlplane.planning.planner.
    never_worse`); ``None``: the plan's. Every assignment of a device has the same one.
    """

    device_id: int
    task_id: int
    batch_size: int
    active_thread_percentage: int
    samples: int
    predicted_throughput_sps: float | None = None
    predicted_seconds: float | None = None
    partitioning: Partitioning | None = None


@dataclass(frozen=True)
class Plan:
    """An allocation plan: every assignment of a round, and how the device is partitioned.

    ``partitioning`` is ``timeslice`` for ``temporal`` (no partitioning: the device is
    time-sliced) and ``mps`` for every strategy that gives each task its share; an assignment
    may override it for its device (:meth:`partitioning_of`).
    ``predicted_round_time_s`` is ``max_j max_i t_ij`` for predictor-driven plans, ``t_ij``
    each assignment's predicted seconds. ``notes`` say why the plan differs from what its
    planner chose (a device given a baseline's plan predicted faster), one line each.
    """

    strategy: str
    partitioning: Partitioning
    assignments: tuple[PlannedAssignment, ...] = field(default_factory=tuple)
    predicted_round_time_s: float | None = None
    notes: tuple[str, ...] = ()

    def on_device(self, device_id: int) -> tuple[PlannedAssignment, ...]:
        """The assignments of one device, in task order."""
        return tuple(a for a in self.assignments if a.device_id == device_id)

    def partitioning_of(self, device_id: int) -> Partitioning:
        """How the device is shared: its assignments' override, else the plan's."""
        return self._overrides.get(device_id, self.partitioning)

    @cached_property
    def _overrides(self) -> dict[int, Partitioning]:
        # Read once per plan: a round of 1,000 devices asks for every device's.
        return {a.device_id: a.partitioning for a in self.assignments if a.partitioning is not None}


class PlanningError(ValueError):
    """A plan cannot be made or is invalid; ``field`` names the input at fault."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field
