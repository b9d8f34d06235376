"""``mtfl agent``: run one device agent (a Celery worker on ``device.<name>``)."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from controlplane.core.embedded import use_running_broker


class Command(BaseCommand):
    help = "Run one device agent against CELERY_BROKER_URL (registering the device if new)."

    def add_arguments(self, parser):
        parser.add_argument("--device", required=True, help="device name (its queue is device.<name>)")
        parser.add_argument(
            "--backend",
            default="cpu",
            help="execution backend: cpu, simulated, cuda-mps or cuda-timeslice (default: cpu)",
        )
        parser.add_argument(
            "--gpu",
            default=None,
            help="cuda-* backends: the GPU, an NVML index or a UUID (default: MTFL_AGENT_GPU, else 0)",
        )
        parser.add_argument("--cores", default=None, help="CPU cores the device may use, e.g. 0-3,6 (default: all)")
        parser.add_argument(
            "--state-dir", default=None, help="agent state folder (default: $MTFL_HOME/agents/<device>)"
        )
        parser.add_argument("--heartbeat-s", default=None, help="seconds between heartbeats (default: 15)")
        parser.add_argument("--loglevel", default="INFO")
        parser.add_argument(
            "--control-url",
            default=None,
            help="a host with no shared disk: the control plane's URL weights go through "
            "(default: MTFL_CONTROL_URL; unset: shared ARTIFACT_ROOT)",
        )
        parser.add_argument(
            "--agent-token",
            default=None,
            help="the key `mtfl device-token DEVICE` printed (default: MTFL_AGENT_TOKEN or "
            "MTFL_AGENT_TOKEN_FILE, better: options show in the process list)",
        )

    def handle(self, *args, **options):
        try:
            use_running_broker()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        from workers.agent.app import main  # deferred: the agent's Celery app and backends, on first use

        argv = ["--device", options["device"], "--backend", options["backend"], "--loglevel", options["loglevel"]]
        for flag, key in (
            ("--cores", "cores"),
            ("--state-dir", "state_dir"),
            ("--heartbeat-s", "heartbeat_s"),
            ("--gpu", "gpu"),
            ("--control-url", "control_url"),
            ("--agent-token", "agent_token"),
        ):
            if options[key] is not None:
                argv += [flag, str(options[key])]
        sys.exit(main(argv, prog="mtfl agent"))
