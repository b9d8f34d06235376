"""Each device's wait for the slowest device, recomputed for rounds recorded before issue 33.

``Round.device_metrics[device]["idle_s"]`` is stored when a round is recorded. Until issue 33 it
was the round time less the device's own compute time, so a device that started late but ended
last showed as waiting; since then it is the round's end less the device's own end
(:func:`controlplane.planning.metrics.waits`: only devices that finished early wait). Stored
rounds keep everything else; their waits are recomputed here from their assignments' spans, for
the devices that counted (their stored ``counts``), by the same function the recorder uses. A
round recorded since then gets the value it already has; a round whose timed devices cannot all
be matched to assignment spans (a device renamed since) keeps what it has.
"""

from collections import defaultdict

from django.db import migrations

from controlplane.planning import metrics

_BATCH = 200
"""Rounds rewritten per query (their assignments are read together)."""


def recompute_waits(apps, schema_editor) -> None:
    """Rewrite ``idle_s`` of every counted device with known spans in every recorded round."""
    Round = apps.get_model("experiments", "Round")
    Assignment = apps.get_model("experiments", "Assignment")
    alias = schema_editor.connection.alias
    round_ids = list(Round.objects.using(alias).exclude(device_metrics={}).order_by("id").values_list("id", flat=True))
    for start in range(0, len(round_ids), _BATCH):
        batch = round_ids[start : start + _BATCH]
        ends: dict[int, dict[str, float]] = defaultdict(dict)
        for round_id, device, finished_at in (
            Assignment.objects.using(alias)
            .filter(round_id__in=batch, started_at__isnull=False, finished_at__isnull=False)
            .values_list("round_id", "device__name", "finished_at")
        ):
            end = finished_at.timestamp()
            ends[round_id][device] = max(end, ends[round_id].get(device, end))
        changed = []
        for rnd in Round.objects.using(alias).filter(id__in=batch).only("id", "device_metrics"):
            stored = rnd.device_metrics
            counted = {d: e for d, e in ends[rnd.id].items() if (stored.get(d) or {}).get("counts")}
            timed = {d for d, m in stored.items() if m.get("counts") and m.get("compute_s") is not None}
            if timed != set(counted):
                continue  # a device renamed since, or spans lost: the round's end is not known here
            idle = metrics.waits(counted)
            new = {d: {**m, "idle_s": idle[d]} if d in idle else m for d, m in stored.items()}
            if new != stored:
                rnd.device_metrics = new
                changed.append(rnd)
        Round.objects.using(alias).bulk_update(changed, ["device_metrics"])


class Migration(migrations.Migration):
    dependencies = [("experiments", "0020_lab_and_storage_apps")]

    operations = [migrations.RunPython(recompute_waits, migrations.RunPython.noop)]
