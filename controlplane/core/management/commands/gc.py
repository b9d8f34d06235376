"""``mtfl gc``: free what the retention policy allows in the artifact store (``--dry-run``: only
say what it would free). The policy and what it keeps:
:mod:`controlplane.storage.services.retention`."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from controlplane.common.artifact_root import format_bytes
from controlplane.storage.services import retention


class Command(BaseCommand):
    help = (
        "Apply the retention policy to every finished run (device weights of aggregated rounds; global checkpoints "
        "other than the initial, the last N, the best and the latest) and remove the artifacts of runs that no "
        "longer exist; print what it frees per experiment and in total."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="only report what would be freed; nothing is deleted or marked"
        )

    def handle(self, *args, **opts):
        dry_run = bool(opts["dry_run"])
        report = retention.gc(dry_run=dry_run)
        verb = "would free" if dry_run else "freed"
        for e in report.entries:
            name = (
                e.experiment_name if e.experiment_id is None else f"{e.experiment_name} (experiment {e.experiment_id})"
            )
            self.stdout.write(f"{name}: {verb} {format_bytes(e.bytes)} in {e.files} file(s) of {e.runs} run(s)")
        if report.entries:
            self.stdout.write(f"total: {verb} {format_bytes(report.bytes)} in {report.files} file(s)")
        else:
            self.stdout.write("nothing to free: every finished run already follows the retention policy")
        totals = retention.storage_totals()
        self.stdout.write(
            f"ARTIFACT_ROOT {totals.root}: {format_bytes(totals.bytes)} in {totals.files} file(s), "
            f"{format_bytes(totals.free_bytes)} free"
        )
