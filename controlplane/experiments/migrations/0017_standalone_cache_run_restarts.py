# Written for issue 30 (helper "baselines"): the cross-run P_alone cache, where a run's P_alone
# came from, and a run's restarts (its first started_at kept).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0016_checkpoint_evaluation"),
        ("fleet", "0007_device_pools_pause"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="started_at",
            field=models.DateTimeField(
                blank=True,
                help_text="when it first began; kept when a restart begins it again (its wall time)",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="claimed_at",
            field=models.DateTimeField(
                blank=True,
                help_text="when claimed_by last began it (a claim older than a worker is abandoned)",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="restarts",
            field=models.PositiveIntegerField(
                default=0, help_text="times it was begun again after the control worker preparing it was lost"
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="last_restart_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="standalonethroughput",
            name="source",
            field=models.CharField(
                choices=[("measured", "Measured"), ("cache", "Cache")], default="measured", max_length=16
            ),
        ),
        migrations.CreateModel(
            name="StandaloneCacheEntry",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("backend", models.CharField(max_length=32)),
                ("code_version", models.CharField(blank=True, default="", max_length=200)),
                ("hardware", models.CharField(blank=True, default="", max_length=400)),
                (
                    "workload_key",
                    models.CharField(help_text="sha256 of the task's workload identity", max_length=64),
                ),
                (
                    "workload",
                    models.JSONField(default=dict, help_text="the workload identity the key digests (for reading)"),
                ),
                ("batch_size", models.PositiveIntegerField()),
                (
                    "share",
                    models.PositiveSmallIntegerField(default=100, help_text="active-thread percentage (P_alone: 100)"),
                ),
                ("throughput_sps", models.FloatField()),
                ("simulated", models.BooleanField(default=False)),
                ("measured_at", models.DateTimeField()),
                (
                    "device",
                    models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="fleet.device"),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True,
                        help_text="the run that measured it",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="experiments.run",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("device", "backend", "code_version", "hardware", "workload_key", "batch_size", "share"),
                        name="uniq_standalone_cache",
                    )
                ],
            },
        ),
    ]
