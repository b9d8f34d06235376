"""The closed loop's measurements: every measured assignment of an FL round becomes a profile
sample (:class:`controlplane.profiling.models.ProfileSample`, source ``run``) that the next
predictor fit learns from.

It reads the round's rows, so it lives with them: profiling, below the experiments app, stores
and fits samples and never reads a run.
"""

from __future__ import annotations

from collections.abc import Collection

from django.db.models import F

from controlplane.common.bulk import bulk_insert
from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Assignment, Round, Task
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class
from controlplane.planning.strategies import STRATEGY_REGISTRY
from controlplane.profiling.models import ProfileSample

# A round of 1,000 devices has 3,000 assignments: plain values, and each device and task
# once, rather than a model instance per assignment with its device and task joined on.
_COLUMNS = (
    "id",
    "device_id",
    "task_id",
    "status",
    "throughput_sps",
    "batch_size",
    "active_thread_percentage",
    "standalone_throughput_sps",
    "started_at",
    "finished_at",
    "simulated",
    "samples",
    "execution_mode",
)
"""The assignment columns a sample is made of."""


def _none_timed(rnd: Round, *, epochs: int, untimed: int, needed: int) -> bool:
    """Whether the round's shards are too short to time any of its succeeded assignments (one
    EXISTS query)."""
    # A round whose shards are too short to time any assignment stores nothing: one EXISTS
    # instead of reading its 3,000 assignments, devices and tasks. The test below keeps an
    # assignment exactly when ceil(samples / batch) >= least, i.e. samples > (least - 1) * batch.
    least = -(-(needed + untimed) // epochs)
    return not rnd.assignments.filter(
        status=Assignment.Status.SUCCEEDED, samples__gt=(least - 1) * F("batch_size")
    ).exists()


def _assignments_by_device(rnd: Round) -> dict[int, list[dict]]:
    """The round's assignments as :data:`_COLUMNS` dicts, per device, by device then task id."""
    by_device: dict[int, list[dict]] = {}
    for values in rnd.assignments.order_by("device_id", "task_id").values_list(*_COLUMNS):
        a = dict(zip(_COLUMNS, values, strict=True))
        by_device.setdefault(a["device_id"], []).append(a)
    return by_device


def _device_samples(
    rnd: Round,
    device: Device,
    assignments: list[dict],
    architecture: dict[int, str],
    *,
    epochs: int,
    untimed: int,
    needed: int,
) -> list[dict]:
    """The sample rows of one device's assignments in the round (the co-located configuration),
    leaving out those with fewer than ``needed`` timed iterations."""
    klass = device_class(device)
    configuration = [
        {
            "architecture": architecture[a["task_id"]],
            "batch_size": a["batch_size"],
            "active_thread_percentage": a["active_thread_percentage"],
        }
        for a in assignments
    ]
    rows = []
    for index, a in enumerate(assignments):
        if epochs * -(-a["samples"] // a["batch_size"]) - untimed < needed:
            continue
        rows.append(
            dict(
                source=ProfileSample.Source.RUN,
                assignment_id=a["id"],
                device_id=device.id,
                backend=device.backend,
                device_class=klass,
                config_key=f"round-{rnd.id}-{device.id}",
                configuration=configuration,
                mix_size=len(assignments),
                task_index=index,
                architecture=architecture[a["task_id"]],
                batch_size=a["batch_size"],
                active_thread_percentage=a["active_thread_percentage"],
                throughput_sps=a["throughput_sps"],
                standalone_sps=a["standalone_throughput_sps"],
                started_at=a["started_at"],
                finished_at=a["finished_at"],
                simulated=a["simulated"],
                execution_mode=a["execution_mode"],
            )
        )
    return rows


def samples_from_round(*, round_id: int, timesliced_devices: Collection[int] = ()) -> int:
    """The closed loop: every measured assignment of an FL round becomes a profile sample, its
    device's assignments of that round being the co-located configuration.

    Rounds of strategies with ``timeslice`` partitioning (``temporal``) are left out: their
    tasks do not run at their shares; so are ``timesliced_devices``, the devices a
    predictor-driven round time-sliced (a baseline's plan kept there: the caller knows the
    round's plan, :func:`.planning.round_timesliced_devices`), and rounds of a strategy no longer
    registered (what its shares meant is unknown). So is an assignment too short to time: fewer than
    ``MTFL_MIN_TIMED_ITERATIONS`` iterations after the warm-up (``E·ceil(|D_ij| / B_ij)`` in
    all; a 6-sample shard trains one batch a round, and the trainer then times iterations that
    still carry one-off costs). Returns the number of samples stored.
    """
    rnd = Round.objects.select_related("run__experiment").get(id=round_id)
    epochs = rnd.run.experiment.local_epochs
    untimed = int(mtfl_setting("WARMUP_ITERATIONS"))
    needed = int(mtfl_setting("MIN_TIMED_ITERATIONS"))
    if rnd.run.strategy not in STRATEGY_REGISTRY or STRATEGY_REGISTRY.get(rnd.run.strategy).partitioning != "mps":
        return 0
    if epochs > 0 and _none_timed(rnd, epochs=epochs, untimed=untimed, needed=needed):
        return 0
    by_device = _assignments_by_device(rnd)
    used = rnd.assignments.values("device_id")
    devices = {d.id: d for d in Device.objects.filter(id__in=used).only("id", "backend", "inventory")}
    architecture = dict(Task.objects.filter(id__in=rnd.assignments.values("task_id")).values_list("id", "architecture"))
    # A device a predictor-driven plan kept on a timeslice baseline's plan did not run at its shares.
    sliced = set(timesliced_devices)
    rows = []
    for device_id, assignments in by_device.items():
        if device_id in sliced:
            continue
        if not all(a["status"] == Assignment.Status.SUCCEEDED and a["throughput_sps"] for a in assignments):
            continue
        rows += _device_samples(
            rnd, devices[device_id], assignments, architecture, epochs=epochs, untimed=untimed, needed=needed
        )
    bulk_insert(ProfileSample, rows, ignore_conflicts=True)
    return len(rows)
