"""Partial participation: the devices that train in a round of an experiment.

The draw itself is pure (:mod:`controlplane.planning.participation`); this module reads what it
needs from the database: the experiment's devices and, for ``weighted`` sampling, each device's
data volume (the sum of its shards' ``num_samples`` over the experiment's tasks).
"""

from __future__ import annotations

from django.db.models import Sum

from controlplane.common.errors import ApplicationError
from controlplane.experiments.models import Experiment, Shard
from controlplane.planning.participation import draw_participants, participant_count


def participation_set(experiment: Experiment) -> bool:
    """Whether the experiment trains a sample of its devices per round (``clients_per_round`` or
    ``client_fraction`` set); it may still draw every device when the count reaches them all."""
    return experiment.clients_per_round is not None or experiment.client_fraction is not None


def round_participants(experiment: Experiment, index: int) -> list[int] | None:
    """The ids of the devices that train round ``index`` of any run of ``experiment``, in
    increasing order, or ``None`` when every device takes part (no participation set, or a
    count that reaches every device).

    Without partial participation, a device holding no sample of any task is not a participant
    (:func:`_data_holders`): it would train nothing, and the lab would hold it for the round
    (and make the round wait for it) all the same. Drawn samples are left as they are drawn: a
    drawn device without data trains nothing (the experiment and its runs say so in their
    ``warnings``, :mod:`controlplane.planning.data_gaps`).

    Drawn by :func:`controlplane.planning.participation.draw_participants` with the experiment's
    ``client_sampling`` (``uniform``, or ``weighted`` by data volume), seeded by the experiment's
    ``seed`` and ``index``: the same devices every time it is asked, whichever run asks, and
    independent of the other rounds' draws. Two queries at most (the device ids; for
    ``weighted``, the volumes summed by the database), whatever the number of shards.

    Raises:
        ApplicationError: a stored setting out of range (400, the field named): both
            ``clients_per_round`` and ``client_fraction``, a fraction outside its range
            (:data:`~controlplane.common.limits.CLIENT_FRACTION`), a count
            below 1, or an unknown ``client_sampling``.
    """
    if not participation_set(experiment):
        return _data_holders(experiment)
    # The membership table alone (no join onto the devices): 10,000 ids in a few milliseconds.
    device_ids = list(
        Experiment.devices.through.objects.filter(experiment_id=experiment.id).values_list("device_id", flat=True)
    )
    try:
        count = participant_count(
            len(device_ids),
            clients_per_round=experiment.clients_per_round,
            client_fraction=experiment.client_fraction,
        )
    except ValueError as exc:
        field = "client_fraction" if "client_fraction=" in str(exc) else "clients_per_round"
        raise ApplicationError(str(exc), field=field) from exc
    if count >= len(device_ids):
        return None
    volumes = None
    if experiment.client_sampling == "weighted":
        volumes = _sample_totals(experiment)
    try:
        return draw_participants(
            device_ids,
            count=count,
            rule=experiment.client_sampling,
            seed=experiment.seed,
            round_index=index,
            volumes=volumes,
        )
    except ValueError as exc:
        raise ApplicationError(str(exc), field="client_sampling") from exc


def _sample_totals(experiment: Experiment) -> dict[int, int]:
    """``{device id: samples it holds over all tasks}`` (one grouped query; a device without
    shards is absent)."""
    return dict(
        Shard.objects.filter(experiment=experiment)
        .values("device_id")
        .annotate(n=Sum("num_samples"))
        .order_by()
        .values_list("device_id", "n")
    )


def _data_holders(experiment: Experiment) -> list[int] | None:
    """The ids of the experiment's devices holding a sample of some task, in increasing order,
    or ``None`` when every device does (one query: the devices' sample totals)."""
    totals = _sample_totals(experiment)
    members = list(
        Experiment.devices.through.objects.filter(experiment_id=experiment.id).values_list("device_id", flat=True)
    )
    holders = sorted(d for d in members if totals.get(d, 0) > 0)
    return None if len(holders) == len(members) else holders
