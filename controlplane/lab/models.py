"""The lab's state: which round holds which device (:class:`DeviceLease`) and each user's
weight under the fair scheduling policy (:class:`UserShare`).

Both tables were created by the ``experiments`` app (migration 0015) and keep their names
(``db_table``): the models moved to this app by state only (``experiments`` 0020, ``lab`` 0001),
so no row moved.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.common.limits import SHARE_WEIGHT
from controlplane.experiments.models import Round, Run
from controlplane.fleet.models import Device


class DeviceLease(models.Model):
    """A device leased to one run's round by the lab scheduler, from ``granted_at`` until
    ``released_at`` (null while held).

    A device is held by at most one lease at a time: a partial unique constraint on the held rows,
    so a round's leases are claimed with one conditional INSERT of all its devices, refused whole
    when any of them is held (:func:`controlplane.lab.services.leases.leases_claim`).
    Released rows stay: they are each owner's device-time, which the fair policy reads.
    """

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="leases")
    # Kept (run and round emptied) when a run is deleted: a lease is also its owner's
    # device-time, which the fair policy must not forget because the run is gone.
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="leases")
    round = models.ForeignKey(Round, null=True, blank=True, on_delete=models.SET_NULL, related_name="leases")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="device_leases",
        help_text="the run's experiment's owner when leased (whose device-time it counts as)",
    )
    granted_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        db_table = "experiments_devicelease"  # created by the experiments app; no row moved
        ordering = ["-granted_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["device"], condition=models.Q(released_at__isnull=True), name="one_held_lease_per_device"
            )
        ]
        # Named as the experiments app's migration 0015 created them (the names Django derives
        # from the table, which is the same).
        indexes = [
            models.Index(fields=["released_at", "granted_at"], name="experiments_release_77be2b_idx"),
            models.Index(fields=["owner", "granted_at"], name="experiments_owner_i_90677c_idx"),
            models.Index(fields=["round"], name="experiments_round_i_4497c4_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.device_id} leased to round {self.round_id}"


class UserShare(models.Model):
    """An admin's weight for a user under the fair scheduling policy: a user's device-seconds
    in the window count divided by it (2.0: entitled to twice the device-time of a weight-1 user)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="lab_share")
    weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(SHARE_WEIGHT.low), MaxValueValidator(SHARE_WEIGHT.high)],
        help_text=f"{SHARE_WEIGHT.span}; users without a row weigh 1",
    )

    class Meta:
        db_table = "experiments_usershare"  # created by the experiments app; no row moved

    def __str__(self) -> str:
        return f"{self.user} x{self.weight:g}"
