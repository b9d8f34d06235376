"""``mtfl profile``: profile co-located mixes on a device, with a progress bar."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from controlplane.common.errors import ApplicationError
from controlplane.common.limits import BATCH_SIZE, SEED, SWEEP_BUDGET, SWEEP_BUDGET_SELF_SERVE
from controlplane.core.cli_support import ProgressLines, console, interrupt_on_signals, require_control_worker
from controlplane.core.embedded import use_running_broker
from controlplane.core.options import float_option, int_option, list_option
from controlplane.experiments.models import EXECUTION_MODES, Task
from controlplane.experiments.services import sweeps
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class
from controlplane.profiling import services
from controlplane.profiling.models import ProfileSweep
from controlplane.profiling.selectors import sweep_progress
from controlplane.profiling.services.sweeps import DEFAULT_ARCHITECTURES
from workers.protocol.messages import ExecutionOptions
from workers.registry.models import MODEL_REGISTRY


class Command(BaseCommand):
    help = (
        "Profile co-located mixes on a device for a time budget (the device's agent and a control worker must be "
        "running, e.g. under `mtfl up`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--device", required=True, help="the device to profile")
        parser.add_argument(
            "--budget",
            required=True,
            help=f"seconds to spend measuring, {SWEEP_BUDGET.span}: the CLI runs as the lab's operator, so it may "
            f"give the whole range as lab staff may (a researcher on the dashboard or the API: "
            f"{SWEEP_BUDGET_SELF_SERVE.span}); no round gets the device meanwhile",
        )
        parser.add_argument(
            "--architectures",
            default=None,
            help=f"comma-separated models, profiled at 10 classes and 3×32×32 (default without --tasks: "
            f"{','.join(DEFAULT_ARCHITECTURES)})",
        )
        parser.add_argument(
            "--tasks",
            default=None,
            help="comma-separated task ids or names whose models are profiled at each task's own classes and "
            "input shape (a plug-in model on tabular data, say)",
        )
        parser.add_argument("--batch-sizes", default="16,32,64,128,256", help="comma-separated batch sizes")
        parser.add_argument("--max-mix", default="4", help="most co-located tasks per configuration (1-8)")
        parser.add_argument("--seed", default="0", help="seed of the space-filling design")
        parser.add_argument(
            "--execution-mode",
            default=ExecutionOptions().mode,
            help=f"how the profiled trainers run a step: {'|'.join(EXECUTION_MODES)} (default auto: graphs on a GPU "
            "backend, eager on cpu; graphs needs a GPU backend). Profile with the mode the rounds will use",
        )

    def handle(self, *args, **opts):
        budget = float_option("budget", opts["budget"], SWEEP_BUDGET.low - 1e-9, SWEEP_BUDGET.high)
        task_ids = self._task_ids(opts["tasks"]) if opts["tasks"] else None
        if opts["architectures"] is not None or task_ids is None:
            given = opts["architectures"] if opts["architectures"] is not None else ",".join(DEFAULT_ARCHITECTURES)
            architectures: list[str] | None = list_option("architectures", given, MODEL_REGISTRY.names())
        else:
            architectures = None
        batch_sizes = [
            int_option("batch-sizes", b, int(BATCH_SIZE.low), int(BATCH_SIZE.high))
            for b in list_option("batch-sizes", opts["batch_sizes"])
        ]
        max_mix = int_option("max-mix", opts["max_mix"], 1, 8)
        seed = int_option("seed", opts["seed"], int(SEED.low), int(SEED.high))
        device = Device.objects.filter(name=opts["device"]).first()
        if device is None:
            known = ", ".join(Device.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"--device {opts['device']!r} is not registered; known devices: {known}")
        execution = self._execution(opts["execution_mode"], device)
        try:
            use_running_broker()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        self._require_control_worker()
        try:
            sweep = sweeps.sweep_start(
                device=device,
                budget_s=budget,
                architectures=architectures,
                tasks=task_ids,
                batch_sizes=batch_sizes,
                max_mix=max_mix,
                seed=seed,
                execution=execution,
                actor=None,  # the operator's command line: lab staff's budget range
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        console.print(
            f"sweep {sweep.id} on {device.name}: {budget:g} s of co-located mixes of {', '.join(sweep.request['architectures'])}"
        )
        interrupt_on_signals()
        try:
            sweep = self._follow(sweep)
        except KeyboardInterrupt:
            console.print(
                f"stopped following: sweep {sweep.id} goes on on the agent (GET /api/profile-sweeps/{sweep.id}/; "
                f"cancel it with POST /api/profile-sweeps/{sweep.id}/cancel/ or on its dashboard page)"
            )
            raise SystemExit(130) from None
        spread = sweep.max_repeat_spread
        console.print(
            f"sweep {sweep.id} {sweep.status}: {sweep.configs} configurations, {sweep.samples} samples"
            + (f", largest repeat spread {100 * spread:.1f} %" if spread is not None else "")
        )
        if sweep.error:
            console.print(f"[red]{sweep.error}[/red]")
        if sweep.status in (ProfileSweep.Status.FAILED, ProfileSweep.Status.CANCELLED):
            raise SystemExit(1)
        console.print(
            f"next: `mtfl fit-predictor --backend {device.backend} --device-class {device_class(device)}` fits a "
            "predictor on every sample of this device class"
        )

    def _execution(self, mode: str, device: Device) -> ExecutionOptions:
        """``--execution-mode`` as the sweep's options, checked against the device's backend
        before anything is sent; a bad mode, or graphs on a cpu device, is a one-line error."""
        if mode not in EXECUTION_MODES:
            raise CommandError(f"--execution-mode must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}")
        try:
            return services.sweep_execution({"mode": mode}, device, fields={"mode": "--execution-mode"})
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc

    def _task_ids(self, given: str) -> list[int]:
        """The ids of ``--tasks``' comma-separated ids or names; an unknown one is a one-line error."""

        ids = []
        for key in list_option("tasks", given):
            task = Task.objects.filter(id=int(key)).first() if key.isdigit() else None
            task = task or Task.objects.filter(name=key).first()
            if task is None:
                raise CommandError(f"--tasks: no task with id or name {key!r} (GET /api/tasks/ lists them)")
            ids.append(task.id)
        return ids

    def _require_control_worker(self) -> None:
        require_control_worker("it records the measurements")

    def _follow(self, sweep: ProfileSweep) -> ProfileSweep:
        """Poll the sweep until it ends: a bar on a terminal, plain lines otherwise (a bar
        draws nothing when the output goes to a file or a pipe)."""
        if not console.is_terminal:
            lines = ProgressLines("profiling", console.file)
            while True:
                sweep.refresh_from_db()
                lines.update(sweep.status, sweep_progress(sweep), self._detail(sweep))
                if sweep.ended:
                    return sweep
                time.sleep(1.0)
        with Progress(
            TextColumn("profiling"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            bar = progress.add_task("sweep", total=1.0, detail="waiting for the agent")
            while True:
                sweep.refresh_from_db()
                progress.update(bar, completed=sweep_progress(sweep), detail=self._detail(sweep))
                if sweep.ended:
                    return sweep
                time.sleep(1.0)

    @staticmethod
    def _detail(sweep: ProfileSweep) -> str:
        return f"{sweep.configs} configurations · {sweep.samples} samples · {sweep.status}"
