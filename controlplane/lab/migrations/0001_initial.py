"""The lab's models, taken over from the ``experiments`` app by state only: their tables
(``experiments_devicelease``, ``experiments_usershare``) were created by ``experiments`` 0015
and keep their names, so no row moves. A fresh database gets them from that migration too.
"""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("experiments", "0020_lab_and_storage_apps"),
        ("fleet", "0007_device_pools_pause"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="UserShare",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "weight",
                            models.FloatField(
                                default=1.0,
                                help_text="0.01 to 100; users without a row weigh 1",
                                validators=[
                                    django.core.validators.MinValueValidator(0.01),
                                    django.core.validators.MaxValueValidator(100.0),
                                ],
                            ),
                        ),
                        (
                            "user",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="lab_share",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={"db_table": "experiments_usershare"},
                ),
                migrations.CreateModel(
                    name="DeviceLease",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("granted_at", models.DateTimeField()),
                        ("released_at", models.DateTimeField(blank=True, null=True)),
                        ("release_reason", models.CharField(blank=True, default="", max_length=200)),
                        (
                            "device",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="leases", to="fleet.device"
                            ),
                        ),
                        (
                            "owner",
                            models.ForeignKey(
                                blank=True,
                                help_text="the run's experiment's owner when leased (whose device-time it counts as)",
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="device_leases",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "round",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="leases",
                                to="experiments.round",
                            ),
                        ),
                        (
                            "run",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="leases",
                                to="experiments.run",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "experiments_devicelease",
                        "ordering": ["-granted_at"],
                        "indexes": [
                            models.Index(fields=["released_at", "granted_at"], name="experiments_release_77be2b_idx"),
                            models.Index(fields=["owner", "granted_at"], name="experiments_owner_i_90677c_idx"),
                            models.Index(fields=["round"], name="experiments_round_i_4497c4_idx"),
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                condition=models.Q(("released_at__isnull", True)),
                                fields=("device",),
                                name="one_held_lease_per_device",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        )
    ]
