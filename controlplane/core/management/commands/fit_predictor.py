"""``mtfl fit-predictor``: fit a throughput predictor on the profile samples, here and now."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from rich.table import Table

from controlplane.common.errors import ApplicationError
from controlplane.core.cli_support import console
from controlplane.core.options import list_option
from controlplane.planning.predictor import FAMILIES
from controlplane.profiling import services
from controlplane.profiling.models import Predictor
from workers.registry.backends import BACKEND_REGISTRY


class Command(BaseCommand):
    help = "Fit a new predictor version on every profile sample of a backend and device class, and report its accuracy."

    def add_arguments(self, parser):
        parser.add_argument("--backend", default="cpu", choices=BACKEND_REGISTRY.names())
        parser.add_argument("--device-class", default=None, help="e.g. cpu-2cores (needed when several have samples)")
        parser.add_argument(
            "--families",
            default=",".join(FAMILIES),
            help=f"comma-separated model families to compare (default: all of {', '.join(FAMILIES)}; fewer fit faster)",
        )

    def handle(self, *args, **opts):
        families = list_option("families", opts["families"], FAMILIES)
        with console.status("fitting") as status:

            def step(line: str) -> None:
                status.update(line)
                console.print(f"[dim]{line}[/dim]")

            try:
                predictor = services.predictor_fit(
                    backend=opts["backend"], device_class=opts["device_class"], families=families, progress=step
                )
            except ApplicationError as exc:
                raise CommandError(exc.message) from exc
        if predictor.status != Predictor.Status.READY:
            raise CommandError(f"predictor v{predictor.version} could not be fitted: {predictor.error}")
        table = Table(
            title=f"Predictor v{predictor.version} ({predictor.backend}, {predictor.device_class}): "
            f"{predictor.training_samples} samples, whole mixes held out"
        )
        for column in ("family", "held-out RMSLE", "MAPE", "CV seconds", ""):
            table.add_column(column, justify="left" if column in ("family", "") else "right")
        for family, m in sorted(predictor.metrics.items(), key=lambda kv: kv[1]["rmsle"]):
            table.add_row(
                family,
                f"{m['rmsle']:.4f}",
                f"{100 * m['mape']:.1f} %",
                f"{m['fit_seconds']:.1f}",
                "kept" if family == predictor.kept_family else "",
            )
        console.print(table)
        reference = (predictor.feature_spec or {}).get("reference_speed_index")
        if reference:
            console.print(
                f"throughputs predicted at the host's median speed (speed index {reference:.1f}): "
                "probed samples were scaled to it"
            )
        link = (predictor.feature_spec or {}).get("reference_cross_core_rtt_ns")
        if link:
            gamma = (predictor.feature_spec or {}).get("link_exponent", 0.0)
            console.print(
                f"tasks alone on several cores predicted at the near placement (cross-core round trip "
                f"{link:.0f} ns; measured further apart, they ran (rtt / {link:.0f} ns)^-{gamma:.2f} as fast)"
            )
        kappa = (predictor.feature_spec or {}).get("passive_ratio")
        if kappa and kappa >= 0.005:  # fitted to its floor (1e-4): no passive-wait cost was seen
            console.print(
                f"multi-threaded tasks on shared cores pay {kappa:.2f} of their per-iteration overhead "
                "more per iteration (their threads wait passively at barriers)"
            )
        console.print(f"predictor page: /predictors/{predictor.id}/")
