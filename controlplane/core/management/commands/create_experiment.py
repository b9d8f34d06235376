"""``mtfl create-experiment``: create an experiment from a built-in template and print its
``|D_ij|`` table.

New tasks ask the control worker for their workload features over the broker of a running stack
(``CELERY_BROKER_URL``, or the embedded one of an ``mtfl up`` on this machine); with no broker
running, the command computes them itself.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rich.table import Table

from controlplane.common.errors import ApplicationError
from controlplane.core.cli_support import console
from controlplane.core.embedded import use_running_broker
from controlplane.core.options import list_option
from controlplane.experiments import selectors
from controlplane.experiments.models import Experiment
from controlplane.experiments.services import experiment_create_from_template
from controlplane.experiments.services.templates import (
    DEFAULT_DIRICHLET_ALPHA,
    DEFAULT_LOCAL_EPOCHS,
    DEFAULT_ROUNDS,
    TEMPLATES,
    template_get,
)
from controlplane.fleet.models import Device
from controlplane.profiling.services import workload_ensure

USAGE_ERROR = 2
"""Exit status of bad input (as argparse's)."""


def _error(message: str) -> CommandError:
    return CommandError(message, returncode=USAGE_ERROR)


def _typed(name: str, value: str | None, kind: type, what: str):
    """``value`` as ``kind`` (ranges are the service's to check), or ``None`` if not given."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        raise _error(f"--{name} must be {what}, got {value!r}") from None


class Command(BaseCommand):
    help = (
        "Create an experiment from a built-in template (the task mixes of Yu et al. 2022, §5: "
        + "; ".join(t.name + ": " + "+".join(t.architectures) for t in TEMPLATES.values())
        + ") on registered devices, with Dirichlet-skewed data volumes per task and device, on CIFAR-10 when "
        "MTFL_CIFAR10_ROOT holds it and on the digits otherwise."
    )

    def add_arguments(self, parser):
        # Checked in handle(), not by argparse, so that bad input is one line with exit status 2.
        parser.add_argument("--template", help=f"one of {', '.join(TEMPLATES)}")
        parser.add_argument("--devices", help="comma-separated names of registered devices")
        parser.add_argument("--name", help="default: '<template> mix', numbered if taken")
        parser.add_argument("--rounds", help=f"FL rounds, 1 to 10000 (default {DEFAULT_ROUNDS})")
        parser.add_argument(
            "--local-epochs", help=f"local epochs per round, 1 to 1000 (default {DEFAULT_LOCAL_EPOCHS})"
        )
        parser.add_argument(
            "--alpha",
            "--dirichlet-alpha",
            dest="alpha",
            help="Dirichlet concentration of the data volumes, (0, 1000]; smaller skews more "
            f"(default {DEFAULT_DIRICHLET_ALPHA})",
        )
        parser.add_argument("--seed", help="seed of the partition, 0 to 2147483647 (default 0)")
        parser.add_argument("--dataset", help="digits or cifar10 (default: cifar10 when MTFL_CIFAR10_ROOT holds it)")
        parser.add_argument(
            "--owner",
            help="user name of the researcher who owns it (sees and shares it on the "
            "dashboard and the API); default: none, so only superusers see it",
        )

    def handle(self, *args, **opts):
        if not opts["template"]:
            raise _error(f"--template is required: one of {', '.join(TEMPLATES)}")
        if not opts["devices"]:
            raise _error("--devices is required: comma-separated names of registered devices")
        try:
            template_get(opts["template"])
            names = list_option("devices", opts["devices"])
        except ApplicationError as exc:
            raise _error(exc.message) from exc
        except CommandError as exc:
            raise _error(str(exc)) from exc
        numbers = {
            "rounds": _typed("rounds", opts["rounds"], int, "an integer"),
            "local_epochs": _typed("local-epochs", opts["local_epochs"], int, "an integer"),
            "dirichlet_alpha": _typed("alpha", opts["alpha"], float, "a number"),
            "seed": _typed("seed", opts["seed"], int, "an integer"),
        }
        devices = {d.name: d.id for d in Device.objects.filter(name__in=names)}
        unknown = [n for n in names if n not in devices]
        if unknown:
            known = ", ".join(Device.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise _error(f"--devices: {unknown[0]!r} is not a registered device; known devices: {known}")
        owner = None
        if opts["owner"]:
            owner = get_user_model().objects.filter(username=opts["owner"], is_active=True).first()
            if owner is None:
                raise _error(f"--owner: no active user named {opts['owner']!r}; create one with mtfl createsuperuser")
        broker = self._connect_broker()
        try:
            experiment = experiment_create_from_template(
                template=opts["template"],
                device_ids=[devices[n] for n in names],
                name=opts["name"],
                dataset=opts["dataset"],
                owner=owner,
                **{k: v for k, v in numbers.items() if v is not None},
            )
        except ApplicationError as exc:
            raise _error(exc.message) from exc
        if not broker:
            with console.status("computing the tasks' workload features (no control worker is running)"):
                for task in experiment.tasks.all():
                    workload_ensure(
                        architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape
                    )
        self._report(experiment)

    def _connect_broker(self) -> bool:
        """Point the control app at the running stack's broker; with none, at an in-process one
        (messages to the control worker then go nowhere). Returns whether a stack's was found."""
        try:
            use_running_broker()
        except RuntimeError:
            from controlplane.celery import use_broker

            use_broker("memory://localhost/", "cache+memory://")
            return False
        return True

    def _report(self, experiment: Experiment) -> None:
        tasks = list(experiment.tasks.order_by("id"))
        devices = list(experiment.devices.order_by("id"))
        shards = selectors.experiment_shards(experiment)
        console.print(f"experiment {experiment.id} {experiment.name!r}", soft_wrap=True)
        console.print(f"dataset: {tasks[0].dataset if tasks else '—'}", soft_wrap=True)
        console.print(experiment.description, soft_wrap=True)
        table = Table(title="|D_ij|: training samples of each task (column) on each device (row)")
        table.add_column("device", no_wrap=True)
        for task in tasks:
            table.add_column(task.architecture, justify="right", no_wrap=True)
        table.add_column("total", justify="right", no_wrap=True)
        for k, device in enumerate(devices):
            counts = [shards[(device.id, t.id)].num_samples for t in tasks]
            table.add_row(device.name, *map(str, counts), str(sum(counts)), end_section=k == len(devices) - 1)
        totals = [sum(shards[(d.id, t.id)].num_samples for d in devices) for t in tasks]
        table.add_row("total", *map(str, totals), str(sum(totals)))
        console.print(table)
        console.print(
            f"experiment page: /experiments/{experiment.id}/ · launch a run: "
            f"POST /api/experiments/{experiment.id}/runs/",
            soft_wrap=True,
        )
