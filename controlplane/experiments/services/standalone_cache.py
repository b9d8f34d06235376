"""``P_alone`` kept across runs (:class:`~controlplane.experiments.models.StandaloneCacheEntry`),
so a run of tasks already measured on its devices asks them nothing before round 0.

A task's ``P_alone`` on a device depends on what is trained and on what trains it, not on which
run asks. The cache key is therefore:

- the **device** itself (an entry is never used for another device, even one of the same class
  or pool: two hosts with one GPU model still differ in clocks, cooling and neighbours);
- its **backend** and its **environment** as its agent last reported it
  (:class:`workers.protocol.messages.DeviceInventory`): ``code_version`` — mtfl-lab's and
  torch's versions and the providers of the task's model and data set plug-ins — and
  ``hardware`` — accelerator, GPU UUID, number of cores. An agent upgrade, a torch upgrade, a GPU
  swap or a new core set makes every entry of the device miss;
- the task's **workload** (:func:`workload_identity`): architecture, classes, input shape, data set
  and the optimizer's kind, momentum and weight decay (momentum and weight decay change the
  optimizer step's work), and its **execution options** (``execution_mode``, ``precision``,
  ``channels_last``: a step replayed as a CUDA graph, or in bfloat16, is not an eager fp32 one).
  The options are keyed as the task asks for them, not as a trainer resolved ``auto``: a task
  whose options change is measured again. The task's row id, name, learning rate and data
  folder are left out: two tasks that train the same thing the same way share entries;
- the **batch size** the measurement really trains at, ``min(batch size, shard size)`` (a shard
  smaller than the batch is trained whole as every batch: :func:`workers.training.trainer.measure_item`),
  and the **share** (``P_alone`` is measured on the whole device: 100).

The ``simulated`` backend is never cached: its measurement noise is drawn from the run's seed,
so a cached answer would make one run's figures depend on which runs came before it.

Only successful measurements are kept (a failure is retried by the next run), each with when it
was measured; one older than ``MTFL_STANDALONE_CACHE_MAX_AGE_S`` (default 7 days; 0 turns the
cache off) is ignored and measured again. Profile samples are not a source: they name a task by
its architecture only (not its classes, input shape or optimizer), so using them would mix
different workloads.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from django.utils import timezone

from controlplane.common.bulk import bulk_insert
from controlplane.conf import mtfl_setting
from controlplane.experiments import selectors
from controlplane.experiments.models import Run, StandaloneCacheEntry, StandaloneThroughput, Task
from controlplane.experiments.services.execution import EXECUTION_FIELDS, task_execution
from controlplane.fleet.models import Device
from controlplane.planning.types import PlannedAssignment
from workers.protocol.messages import DEFAULT_INPUT_SHAPE

ALONE_SHARE = 100
"""The share ``P_alone`` is measured at: the whole device."""


class Measured(NamedTuple):
    """One successful ``P_alone`` measurement to keep: ``throughput_sps`` in samples/s."""

    device_id: int
    task_id: int
    batch_size: int
    throughput_sps: float
    simulated: bool


WORKLOAD_FIELDS = (
    "id",
    "architecture",
    "num_classes",
    "input_shape",
    "dataset",
    "optimizer",
    "momentum",
    "weight_decay",
    *EXECUTION_FIELDS,
)
"""The task fields :func:`workload_identity` reads."""


def workload_identity(task: Task) -> dict[str, Any]:
    """What determines a task's training speed, as plain JSON (see the module): its
    architecture, classes, input shape, data set, optimizer kind, momentum and weight decay, and
    its execution options (``{"mode", "precision", "channels_last"}``)."""
    return {
        "architecture": task.architecture,
        "num_classes": int(task.num_classes),
        "input_shape": [int(d) for d in (task.input_shape or DEFAULT_INPUT_SHAPE)],
        "dataset": task.dataset,
        "optimizer": task.optimizer,
        "momentum": float(task.momentum),
        "weight_decay": float(task.weight_decay),
        "execution": task_execution(task).model_dump(mode="json"),
    }


def workload_key(identity: dict[str, Any]) -> str:
    """The sha256 hex digest of a :func:`workload_identity` (keys sorted, so it is stable)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def device_environment(device: Device, identity: dict[str, Any]) -> tuple[str, str]:
    """``(code_version, hardware)`` of ``device`` for a task of ``identity``, from what its agent
    last reported (empty parts when it reported nothing, e.g. an agent that never registered)."""
    inventory = device.inventory or {}
    plugins = device.plugins or {}
    model = (plugins.get("models") or {}).get(identity["architecture"], "")
    data = (plugins.get("datasets") or {}).get(identity["dataset"], "")
    code_version = (
        f"mtfl-lab {inventory.get('agent_version', '')}; torch {inventory.get('torch_version', '')}; "
        f"model {model}; data {data}"
    )
    cores = inventory.get("cores") or []
    hardware = (
        f"{inventory.get('accelerator', '')}; gpu {inventory.get('gpu_uuid', '')}; "
        f"{len(cores)} cores; driver {inventory.get('driver_version', '')}"
    )
    return code_version[:200], hardware[:400]


def max_age_s() -> float:
    """``MTFL_STANDALONE_CACHE_MAX_AGE_S`` as a number; 0 or less: the cache is off.

    Raises:
        ValueError: the setting is not a number.
    """
    raw = mtfl_setting("STANDALONE_CACHE_MAX_AGE_S")
    try:
        return float(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"MTFL_STANDALONE_CACHE_MAX_AGE_S must be a number of seconds, got {raw!r}") from exc


class _Keys:
    """The cache key of every (device, task) a run asks about, computed once per call."""

    def __init__(self, run: Run, device_ids: Collection[int], task_ids: Collection[int]) -> None:
        self.devices = {
            d.id: d
            for d in selectors.experiment_devices(
                run.experiment, device_ids=device_ids, fields=["id", "backend", "inventory", "plugins"]
            )
        }
        # Not the whole row: a task carries its training labels (megabytes for a large data set).
        tasks = Task.objects.filter(id__in=list(task_ids)).only(*WORKLOAD_FIELDS)
        self.identity = {t.id: workload_identity(t) for t in tasks}
        self.workload = {task_id: workload_key(identity) for task_id, identity in self.identity.items()}
        self.shard_sizes = {
            key: span.num_samples
            for key, span in selectors.experiment_shards(run.experiment, device_ids=device_ids).items()
        }

    def key(self, device_id: int, task_id: int, batch_size: int) -> tuple[Any, ...] | None:
        """The cache key of a (device, task, batch size) of the run, or ``None`` where nothing
        may be cached (an unknown device or task, the ``simulated`` backend, an empty shard)."""
        device = self.devices.get(device_id)
        if device is None or task_id not in self.identity or device.backend == "simulated":
            return None
        shard_size = self.shard_sizes.get((device_id, task_id), 0)
        if shard_size < 1:
            return None
        code_version, hardware = device_environment(device, self.identity[task_id])
        trained = min(batch_size, shard_size)
        return (device_id, device.backend, code_version, hardware, self.workload[task_id], trained, ALONE_SHARE)


def _entry_key(e: StandaloneCacheEntry) -> tuple[Any, ...]:
    return (e.device_id, e.backend, e.code_version, e.hardware, e.workload_key, e.batch_size, e.share)


def standalone_cache_fill(
    run: Run, assignments: Iterable[PlannedAssignment], *, now: dt.datetime | None = None
) -> list[PlannedAssignment]:
    """Record, as the run's ``P_alone`` (``source="cache"``), every assignment's entry young
    enough in the cache, and return the assignments it had none for (to be measured).

    One read of the entries of the assignments' devices and workloads, one insert.
    """
    assignments = list(assignments)
    limit = max_age_s()
    if limit <= 0 or not assignments:
        return assignments
    now = now or timezone.now()
    device_ids = sorted({a.device_id for a in assignments})
    keys = _Keys(run, device_ids, {a.task_id for a in assignments})
    entries = selectors.device_filtered(
        StandaloneCacheEntry.objects.filter(
            workload_key__in=sorted(set(keys.workload.values())),
            share=ALONE_SHARE,
            measured_at__gte=now - dt.timedelta(seconds=limit),
        ),
        device_ids,
    )
    found = {_entry_key(e): e for e in entries.order_by("measured_at")}  # the newest wins
    missing: list[PlannedAssignment] = []
    rows: list[dict[str, Any]] = []
    for a in assignments:
        key = keys.key(a.device_id, a.task_id, a.batch_size)
        entry = found.get(key) if key is not None else None
        if entry is None:
            missing.append(a)
            continue
        rows.append(
            {
                "run_id": run.id,
                "device_id": a.device_id,
                "task_id": a.task_id,
                "batch_size": a.batch_size,
                "throughput_sps": entry.throughput_sps,
                "error": "",
                "simulated": entry.simulated,
                "source": StandaloneThroughput.Source.CACHE,
                "measured_at": entry.measured_at,
            }
        )
    # A row the run already has (a redelivered dispatch) is kept as it is.
    bulk_insert(StandaloneThroughput, rows, ignore_conflicts=True)
    return missing


def standalone_cache_store(run: Run, measured: Iterable[Measured], *, now: dt.datetime | None = None) -> int:
    """Keep the successful measurements of ``run`` in the cache (an existing entry of the same
    key is replaced: the newest measurement wins). One read of the devices and tasks, one
    statement.

    Returns:
        How many entries were written.
    """
    measured = [m for m in measured if m.throughput_sps is not None and m.throughput_sps > 0]
    if not measured or max_age_s() <= 0:
        return 0
    now = now or timezone.now()
    keys = _Keys(run, sorted({m.device_id for m in measured}), {m.task_id for m in measured})
    entries: dict[tuple[Any, ...], StandaloneCacheEntry] = {}
    for m in measured:
        key = keys.key(m.device_id, m.task_id, m.batch_size)
        if key is None:
            continue
        device_id, backend, code_version, hardware, wkey, batch_size, share = key
        entries[key] = StandaloneCacheEntry(
            device_id=device_id,
            backend=backend,
            code_version=code_version,
            hardware=hardware,
            workload_key=wkey,
            workload=keys.identity[m.task_id],
            batch_size=batch_size,
            share=share,
            throughput_sps=m.throughput_sps,
            simulated=m.simulated,
            measured_at=now,
            run_id=run.id,
        )
    StandaloneCacheEntry.objects.bulk_create(
        list(entries.values()),
        update_conflicts=True,
        unique_fields=["device", "backend", "code_version", "hardware", "workload_key", "batch_size", "share"],
        update_fields=["throughput_sps", "simulated", "measured_at", "run", "workload"],
    )
    return len(entries)
