"""The round record (issue 32, item 3): each device's metrics in a round are stored on the round
(``Round.device_metrics``), computed once when the round is recorded, so the dashboard reads them
instead of rebuilding them from the assignments.

Rounds recorded before this migration get theirs from their assignments, by the rule the
dashboard applied to them until now (:func:`controlplane.planning.metrics.round_metrics` over
:meth:`~controlplane.planning.metrics.DeviceTotals.from_tasks`: a device counts when every one
of its assignments succeeded), so pages for old runs show the same numbers.
"""

from collections import defaultdict

from django.db import migrations, models

from controlplane.planning import metrics

_BATCH = 200
"""Rounds filled per query (their assignments are read together)."""


def _seconds(value) -> float | None:
    return value.timestamp() if value is not None else None


def fill_device_metrics(apps, schema_editor) -> None:
    """Store each round's device metrics, computed from its assignments (rounds with none keep
    the empty default: they drew nothing on the dashboard either)."""
    Round = apps.get_model("experiments", "Round")
    Assignment = apps.get_model("experiments", "Assignment")
    alias = schema_editor.connection.alias
    round_ids = list(Assignment.objects.using(alias).order_by("round_id").values_list("round_id", flat=True).distinct())
    for start in range(0, len(round_ids), _BATCH):
        batch = round_ids[start : start + _BATCH]
        tasks: dict[int, dict[str, list[metrics.TaskMeasurement]]] = defaultdict(lambda: defaultdict(list))
        rows = (
            Assignment.objects.using(alias)
            .filter(round_id__in=batch)
            .values_list(
                "round_id",
                "device__name",
                "status",
                "samples_trained",
                "throughput_sps",
                "standalone_throughput_sps",
                "started_at",
                "finished_at",
            )
        )
        for round_id, device, status, samples, throughput, standalone, started_at, finished_at in rows:
            tasks[round_id][device].append(
                metrics.TaskMeasurement(
                    succeeded=status == "succeeded",
                    samples_trained=samples or 0,
                    throughput_sps=throughput,
                    standalone_sps=standalone,
                    started_at=_seconds(started_at),
                    finished_at=_seconds(finished_at),
                )
            )
        rounds = []
        for rnd in Round.objects.using(alias).filter(id__in=batch).only("id"):
            measured = metrics.round_metrics(
                {device: metrics.DeviceTotals.from_tasks(t) for device, t in tasks[rnd.id].items()}
            )
            rnd.device_metrics = measured.devices_json()
            rounds.append(rnd)
        Round.objects.using(alias).bulk_update(rounds, ["device_metrics"])


class Migration(migrations.Migration):
    dependencies = [("experiments", "0018_execution_options")]

    operations = [
        migrations.AddField(
            model_name="round",
            name="device_metrics",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="each device's metrics in the round, by device name, computed once when the round was "
                "recorded (controlplane.planning.metrics.DeviceMetrics.as_json: counts, raw_throughput_sps, "
                "fair_throughput, samples_trained, compute_s, idle_s); empty until the round is recorded",
            ),
        ),
        migrations.RunPython(fill_device_metrics, migrations.RunPython.noop),
    ]
