"""The device's own compute speed while a configuration is measured (``cpu`` backend).

A virtual machine's cores do not run at one speed: a neighbour on the host's sibling
hyper-threads, the host's frequency and its caches change how much work a core does per second,
in regimes lasting seconds. On this project's 2-core CI machine one single-threaded
``mobilenet_v3_small`` trainer ran at 195–326 samples/s in consecutive 2-second windows of the
same process, and two measurements of one configuration differed by 25–50 % (median) across a
sweep. The guest sees none of it: no steal time, no change in CPU time accounting.

:class:`SpeedProbe` measures that speed beside the trainers, with almost no load of its own.
One thread per core, pinned to it, runs a fixed pure-Python loop of :data:`PROBE_LOOP`
iterations (about 0.3 ms) every ``period_s`` and records the loop's iterations per second of
**the thread's own CPU time** (``time.thread_time``). Time the thread spends waiting for the
core (the trainers run there too) is not CPU time, so the reading does not depend on how the
core is shared between the probe and the trainers, only on how fast the core executes while
the probe has it. Measured on the 2-core machine over 40 s of training (2-second windows,
trainer and probe aligned in time): the log of the trainer's throughput and the log of the
probe's speed on its cores correlate at 0.96 (one thread, ``mobilenet_v3_small``) and 0.93
(``resnet18`` on both cores); dividing the throughput by the probe's speed cut its spread
(standard deviation of the log) from 0.19 to 0.07 and from 0.11 to 0.05.

The probe's own load is ``~0.3 ms / period_s`` of each core (0.6 % at the default 50 ms).

Only the ``cpu`` backend uses it: on a GPU the trainers' speed is the GPU's, which a host-core
probe does not see.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Generic, NamedTuple, Self, TypeVar

PROBE_LOOP = 2500
"""Iterations of the probe's fixed loop per reading (about 0.3 ms on the CI machine's cores)."""


class ProbeReading(NamedTuple):
    """One reading: when (host monotonic seconds, the middle of the loop), on which core, and
    the loop's speed in millions of iterations per second of the probe thread's CPU time."""

    at: float
    core: int
    mips: float


def _probe_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


R = TypeVar("R")
"""A probe's reading type."""


class BackgroundProbe(Generic[R]):
    """What the device's probes share: the cores and period they were given (checked), readings
    collected in the background between the subclass's ``start()`` and ``stop()``, kept under a
    lock, and use as a context manager.

    Raises:
        ValueError: fewer than ``min_cores`` distinct cores (``purpose`` says what they are
            for) or a non-positive ``period_s``.
    """

    def __init__(self, cores: Iterable[int], period_s: float, *, min_cores: int = 1, purpose: str = "to probe") -> None:
        self.cores = sorted(set(int(c) for c in cores))
        if len(self.cores) < min_cores:
            ids = "one CPU id" if min_cores == 1 else f"{min_cores} CPU ids"
            raise ValueError(f"cores must list at least {ids} {purpose}, got {self.cores}")
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0 seconds, got {period_s!r}")
        self.period_s = float(period_s)
        self._readings: list[R] = []
        self._lock = threading.Lock()

    def _record(self, reading: R) -> None:
        with self._lock:
            self._readings.append(reading)

    def start(self) -> Self:
        """Start taking readings; returns ``self``."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop taking readings and wait for the probe to finish."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def readings(self) -> list[R]:
        """Every reading so far, in the order taken."""
        with self._lock:
            return list(self._readings)


class SpeedProbe(BackgroundProbe[ProbeReading]):
    """Background readings of each core's speed (see the module docstring).

    Use as a context manager, or :meth:`start` / :meth:`stop`; :meth:`speed_index` then
    summarises the readings of some cores over a time window.

    Args:
        cores: CPU ids to probe (one pinned thread each).
        period_s: seconds between the starts of two readings on a core, ``> 0``.
        loop: iterations of the probe loop per reading, ``>= 1``.

    Raises:
        ValueError: no cores, a non-positive ``period_s`` or ``loop < 1``.
    """

    def __init__(self, cores: Iterable[int], *, period_s: float = 0.05, loop: int = PROBE_LOOP) -> None:
        if loop < 1:
            raise ValueError(f"loop must be >= 1 iterations, got {loop!r}")
        super().__init__(cores, period_s)
        self.loop = int(loop)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _run(self, core: int) -> None:
        try:
            # pid 0 is the calling thread: only this thread moves to the core.
            os.sched_setaffinity(0, {core})
        except OSError:
            return  # the core is not ours (any more): no readings from it
        while not self._stop.is_set():
            began = time.monotonic()
            cpu0 = time.thread_time()
            _probe_loop(self.loop)
            cpu = time.thread_time() - cpu0
            ended = time.monotonic()
            if cpu > 0:
                self._record(ProbeReading((began + ended) / 2, core, self.loop / cpu / 1e6))
            self._stop.wait(max(0.0, self.period_s - (ended - began)))

    def start(self) -> Self:
        """Start one daemon thread per core; returns ``self``."""
        self._stop.clear()
        for core in self.cores:
            thread = threading.Thread(target=self._run, args=(core,), daemon=True, name=f"speed-probe-{core}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the threads and wait for them (at most one reading's time)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._threads = []

    def speed_index(self, cores: Sequence[int] | None, start: float, end: float) -> float | None:
        """The cores' speed over ``[start, end]`` (host monotonic seconds): the geometric mean
        of the readings taken on ``cores`` (``None``: every probed core) in that window, in
        millions of probe-loop iterations per CPU-second. The cores are probed at the same
        rate, so each weighs about equally.

        Returns:
            ``None`` if no reading falls in the window on those cores.
        """
        wanted = set(self.cores if cores is None else cores)
        logs = [math.log(r.mips) for r in self.readings() if r.core in wanted and start <= r.at <= end]
        return math.exp(sum(logs) / len(logs)) if logs else None
