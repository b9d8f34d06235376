"""``mtfl create-experiment``: create an experiment from a built-in template and print its
``|D_ij|`` table.

New tasks ask the control worker for their workload features over the broker of a running stack
(``CELERY_BROKER_URL``, or the embedded one of an ``mtfl up`` on this machine); with no broker
running, the command computes them itself.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rich.table import Table

from controlplane.celery import use_broker
from controlplane.common.errors import ApplicationError
from controlplane.common.limits import (
    CLIENT_FRACTION,
    DIRICHLET_ALPHA,
    KEEP_LAST_CHECKPOINTS,
    LOCAL_EPOCHS,
    ROUNDS,
    SEED,
)
from controlplane.core.cli_support import console
from controlplane.core.embedded import use_running_broker
from controlplane.core.options import USAGE_ERROR, list_option, params_option
from controlplane.experiments import selectors
from controlplane.experiments.models import CLIENT_SAMPLING_RULES, EXECUTION_MODES, PRECISIONS, Experiment
from controlplane.experiments.services import experiment_create_from_template
from controlplane.experiments.services.templates import (
    DEFAULT_DIRICHLET_ALPHA,
    DEFAULT_LOCAL_EPOCHS,
    DEFAULT_ROUNDS,
    TEMPLATES,
    template_get,
)
from controlplane.fleet.models import Device
from controlplane.planning.guard import UNTRUSTED_PREDICTOR_CHOICES
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING, LR_SCALING_RULES
from controlplane.profiling.services import workload_ensure
from controlplane.storage.exports import aggregation_settings
from controlplane.storage.services.retention import keep_last_checkpoints
from workers.protocol.messages import ExecutionOptions
from workers.registry.aggregators import AGGREGATOR_REGISTRY


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


def _task_aggregation_option(values: list[str]) -> dict[str, dict]:
    """``--task-aggregation TASK=NAME[:k=v,...]`` (repeated) as the service's
    ``task_aggregation``: ``{TASK: {"aggregation": NAME, "aggregation_params": {k: v}}}``.

    Raises:
        CommandError: a value not of that form, or a task given twice.
    """
    out: dict[str, dict] = {}
    for value in values:
        task, sep, rest = value.partition("=")
        name, _, params = rest.partition(":")
        task, name = task.strip(), name.strip()
        if not sep or not task or not name:
            raise _error(
                "--task-aggregation must be TASK=AGGREGATOR[:NAME=VALUE,...] (TASK: an architecture of the template, "
                f"a task name or id; e.g. resnet18=fedprox:mu=0.01), got {value!r}"
            )
        if task in out:
            raise _error(f"--task-aggregation gives task {task!r} more than once")
        items = [p for p in params.split(",") if p.strip()]
        out[task] = {"aggregation": name, "aggregation_params": params_option("task-aggregation", items)}
    return out


def _param_text(value: object) -> str:
    """A parameter's value as typed on the command line: ``0.01``, ``true``, ``zero``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _fl_line(experiment: Experiment) -> str:
    """``aggregation: fedadam (beta1=0.9, ...); per task: ...; participation: ...`` in one line."""
    settings = aggregation_settings(experiment)

    def named(name: str, params: dict) -> str:
        return name + (f" ({', '.join(f'{k}={_param_text(v)}' for k, v in sorted(params.items()))})" if params else "")

    line = "aggregation: " + named(settings["aggregation"], settings["aggregation_params"] or {})
    if settings["task_aggregation"]:
        line += "; per task: " + ", ".join(
            f"{task} {named(o['aggregation'], o.get('aggregation_params') or {})}"
            for task, o in settings["task_aggregation"].items()
        )
    if settings["clients_per_round"] is not None:
        line += f"; {settings['clients_per_round']} device(s) per round, drawn {settings['client_sampling']}"
    elif settings["client_fraction"] is not None:
        line += f"; {settings['client_fraction']:g} of the devices per round, drawn {settings['client_sampling']}"
    return line


def _retention_line(experiment: Experiment) -> str:
    """``retention: device weights deleted after aggregation; checkpoints: the last 3 (lab default), ...``."""
    weights = "kept" if experiment.keep_device_weights else "deleted once their round is aggregated"
    source = "" if experiment.keep_last_checkpoints else " (lab default)"
    return (
        f"retention: device weights {weights}; global checkpoints kept per run and task: the last "
        f"{keep_last_checkpoints(experiment)}{source}, the best, the initial and the latest"
    )


def _add_experiment_arguments(parser) -> None:
    """The template, its devices and name, and the experiment's numbers and data set."""
    parser.add_argument("--template", help=f"one of {', '.join(TEMPLATES)}")
    parser.add_argument("--devices", help="comma-separated names of registered devices")
    parser.add_argument("--name", help="default: '<template> mix', numbered if taken")
    parser.add_argument("--rounds", help=f"{ROUNDS.help}, {ROUNDS.span} (default {DEFAULT_ROUNDS})")
    parser.add_argument(
        "--local-epochs", help=f"{LOCAL_EPOCHS.help}, {LOCAL_EPOCHS.span} (default {DEFAULT_LOCAL_EPOCHS})"
    )
    parser.add_argument(
        "--alpha",
        "--dirichlet-alpha",
        dest="alpha",
        help=f"{DIRICHLET_ALPHA.help}, {DIRICHLET_ALPHA.interval}; smaller skews more "
        f"(default {DEFAULT_DIRICHLET_ALPHA})",
    )
    parser.add_argument("--seed", help=f"{SEED.help}, {SEED.span} (default 0)")
    parser.add_argument("--dataset", help="digits or cifar10 (default: cifar10 when MTFL_CIFAR10_ROOT holds it)")


def _add_fl_arguments(parser) -> None:
    """How the experiment learns: learning-rate scaling, the untrusted predictor rule, the
    aggregator and participation."""
    parser.add_argument(
        "--lr-scaling",
        default=DEFAULT_LR_SCALING,
        help="how the learning rate follows the batch size B: none, linear (× B/128, Goyal et al. 2017) "
        "or sqrt (× √(B/128)); default none",
    )
    parser.add_argument(
        "--untrusted-predictor",
        default="plan",
        help="what a vres_* run does when the planner's guard distrusts a device's predictor: plan (anyway, "
        "with the warnings on the run), baseline (train the best baseline's plan instead) or measure (train it "
        "in round 0, then replan from what it measured); default plan",
    )
    parser.add_argument(
        "--aggregation",
        default="fedavg",
        help="how each task's device models become its next global model: "
        f"{', '.join(AGGREGATOR_REGISTRY.names())} (default fedavg)",
    )
    parser.add_argument(
        "--aggregation-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a hyper-parameter of the aggregator (repeat for several; `mtfl plugins` lists each "
        "aggregator's parameters and ranges); left-out ones take their defaults",
    )
    parser.add_argument(
        "--task-aggregation",
        action="append",
        default=[],
        metavar="TASK=NAME[:K=V,...]",
        help="a task's own aggregator and parameters (repeat for several tasks); TASK: one of the template's "
        "architectures, a task name or id; e.g. resnet18=fedprox:mu=0.01",
    )
    parser.add_argument(
        "--clients-per-round",
        help="partial participation: devices trained per round, 1 to the number of devices (default: every "
        "device); exclusive with --client-fraction",
    )
    parser.add_argument(
        "--client-fraction", help=f"partial participation: {CLIENT_FRACTION.help}, {CLIENT_FRACTION.interval}"
    )
    parser.add_argument(
        "--client-sampling",
        default="uniform",
        help="how each round's participants are drawn: uniform, or weighted by data volume (default uniform)",
    )


def _add_keeping_and_execution_arguments(parser) -> None:
    """Retention, the tasks' execution options and the owner."""
    parser.add_argument(
        "--keep-device-weights",
        action="store_true",
        help="keep every device's weights after its round is aggregated (for debugging); by default the "
        "retention policy deletes them",
    )
    parser.add_argument(
        "--keep-last-checkpoints",
        help=f"{KEEP_LAST_CHECKPOINTS.help} besides the initial, the best and the latest, "
        f"{KEEP_LAST_CHECKPOINTS.span} (default: MTFL_KEEP_LAST_CHECKPOINTS)",
    )
    parser.add_argument(
        "--execution-mode",
        default=ExecutionOptions().mode,
        help="how the tasks' trainers run a step: auto (graphs on a GPU backend, eager on cpu), eager (op by op) "
        "or graphs (a CUDA graph per batch size; every device must be a GPU backend); the tasks', so every "
        "strategy runs them alike (default auto)",
    )
    parser.add_argument(
        "--precision",
        default=ExecutionOptions().precision,
        help="fp32, or bf16 (autocast in bfloat16; every device must be a GPU backend) (default fp32)",
    )
    parser.add_argument(
        "--channels-last", action="store_true", help="4-D inputs and weights in torch.channels_last memory format"
    )
    parser.add_argument(
        "--owner",
        help="user name of the researcher who owns it (sees and shares it on the "
        "dashboard and the API); default: none, so only superusers see it",
    )


def _choices_check(opts: dict[str, Any]) -> None:
    """The required options given and each choice option one of its values.

    Raises:
        CommandError: (one line, exit status 2) naming the option and what is allowed.
    """
    if not opts["template"]:
        raise _error(f"--template is required: one of {', '.join(TEMPLATES)}")
    if not opts["devices"]:
        raise _error("--devices is required: comma-separated names of registered devices")
    if opts["lr_scaling"] not in LR_SCALING_RULES:
        raise _error(f"--lr-scaling: {opts['lr_scaling']!r} is not allowed; allowed: {', '.join(LR_SCALING_RULES)}")
    if opts["untrusted_predictor"] not in UNTRUSTED_PREDICTOR_CHOICES:
        raise _error(
            f"--untrusted-predictor: {opts['untrusted_predictor']!r} is not allowed; allowed: "
            f"{', '.join(UNTRUSTED_PREDICTOR_CHOICES)}"
        )
    if opts["client_sampling"] not in CLIENT_SAMPLING_RULES:
        raise _error(
            f"--client-sampling: {opts['client_sampling']!r} is not allowed; allowed: "
            f"{', '.join(CLIENT_SAMPLING_RULES)}"
        )
    for option, allowed in (("execution_mode", EXECUTION_MODES), ("precision", PRECISIONS)):
        if opts[option] not in allowed:
            flag = "--" + option.replace("_", "-")
            raise _error(f"{flag}: {opts[option]!r} is not allowed; allowed: {', '.join(allowed)}")
    if opts["clients_per_round"] is not None and opts["client_fraction"] is not None:
        raise _error("--clients-per-round and --client-fraction are exclusive: give one of them")


def _settings_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The FL settings (aggregator, per-task overrides, participation) and the retention policy
    as :func:`experiment_create_from_template` takes them, typed.

    Raises:
        CommandError: (one line, exit status 2) an option that does not parse, named.
    """
    return {
        "aggregation": opts["aggregation"],
        "aggregation_params": params_option("aggregation-param", opts["aggregation_param"]),
        "task_aggregation": _task_aggregation_option(opts["task_aggregation"]),
        "clients_per_round": _typed("clients-per-round", opts["clients_per_round"], int, "an integer"),
        "client_fraction": _typed("client-fraction", opts["client_fraction"], float, "a number"),
        "client_sampling": opts["client_sampling"],
        "keep_device_weights": bool(opts["keep_device_weights"]),
        "keep_last_checkpoints": _typed("keep-last-checkpoints", opts["keep_last_checkpoints"], int, "an integer"),
    }


def _device_ids(names: list[str]) -> list[int]:
    """The ids of the devices named, in that order.

    Raises:
        CommandError: (one line, exit status 2) the first name of no registered device, listing them.
    """
    devices = {d.name: d.id for d in Device.objects.filter(name__in=names)}
    unknown = [n for n in names if n not in devices]
    if unknown:
        known = ", ".join(Device.objects.order_by("name").values_list("name", flat=True)) or "none"
        raise _error(f"--devices: {unknown[0]!r} is not a registered device; known devices: {known}")
    return [devices[n] for n in names]


def _owner_option(username: str | None):
    """The active user named by ``--owner``, or ``None`` when none is given.

    Raises:
        CommandError: (one line, exit status 2) no active user of that name.
    """
    if not username:
        return None
    owner = get_user_model().objects.filter(username=username, is_active=True).first()
    if owner is None:
        raise _error(f"--owner: no active user named {username!r}; create one with mtfl createsuperuser")
    return owner


class Command(BaseCommand):
    help = (
        "Create an experiment from a built-in template (the task mixes of Yu et al. 2022, §5: "
        + "; ".join(t.name + ": " + "+".join(t.architectures) for t in TEMPLATES.values())
        + ") on registered devices, with Dirichlet-skewed data volumes per task and device, on CIFAR-10 when "
        "MTFL_CIFAR10_ROOT holds it and on the digits otherwise."
    )

    def add_arguments(self, parser):
        # Checked in handle(), not by argparse, so that bad input is one line with exit status 2.
        _add_experiment_arguments(parser)
        _add_fl_arguments(parser)
        _add_keeping_and_execution_arguments(parser)

    def handle(self, *args, **opts):
        _choices_check(opts)
        settings = _settings_options(opts)
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
        device_ids = _device_ids(names)
        owner = _owner_option(opts["owner"])
        broker = self._connect_broker()
        try:
            experiment = experiment_create_from_template(
                template=opts["template"],
                device_ids=device_ids,
                name=opts["name"],
                dataset=opts["dataset"],
                owner=owner,
                lr_scaling=opts["lr_scaling"],
                untrusted_predictor=opts["untrusted_predictor"],
                execution_mode=opts["execution_mode"],
                precision=opts["precision"],
                channels_last=bool(opts["channels_last"]),
                **settings,
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
        console.print(_fl_line(experiment), soft_wrap=True)
        console.print(_retention_line(experiment), soft_wrap=True)
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
        for warning in selectors.experiment_data_warnings(experiment):
            console.print(f"[yellow]warning: {warning}[/yellow]", soft_wrap=True)
        console.print(
            f"experiment page: /experiments/{experiment.id}/ · launch a run: "
            f"POST /api/experiments/{experiment.id}/runs/",
            soft_wrap=True,
        )
