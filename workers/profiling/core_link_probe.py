"""How fast the device's cores talk to each other while a configuration is measured (``cpu``
backend): the round-trip time of a cache line between two of its cores.

A virtual machine's vCPUs are host threads, and the host moves them. On this project's 2-core
CI machine (a Firecracker VM) the pair switched, every few seconds to a few minutes, between two
placements: one where a cache line made a round trip between the two vCPUs in 80 ns (a C
ping-pong; 330 ns with this module's Python loop) and one where it took 430 ns (610 ns here),
the latency of cores that share no cache. Measured over 2 minutes beside a ``mobilenet_v3_small``
trainer (batch 32) on both cores: 780 samples/s in every 2-second window of the near placement,
470–500 in every window of the far one, with nothing else changing — user time 96–98 % on both
cores, no steal time, and :mod:`workers.profiling.speed_probe`'s per-core speed within a few percent. A
multi-threaded trainer synchronises its threads at every parallel operator (OpenMP barriers,
oneDNN's shared GEMM buffers, a mutex-protected primitive cache: ``perf`` showed
``pthread_mutex_lock`` at 11 % of the far placement's samples against 3.5 % of the near one's),
so each of those costs a few cross-core round trips; a single-threaded trainer does not notice.

:class:`CoreLinkProbe` measures that latency beside the trainers. A separate process
(``python -m workers.profiling.core_link_probe``, one forked helper per further core, each pinned to its
core) wakes every ``period_s`` at the same absolute time on all cores; for one pair of cores
per wake-up (the pairs of neighbouring cores in turn, ``(c_0, c_1), (c_1, c_2), …``) the first
writes a byte to a shared page and the second echoes it, ``round_trips`` times, and the median
round trip is one reading. Both sides then sleep: the load is about ``0.2 ms / period_s`` of
two cores (0.2 % at the default 100 ms). The figures are the Python loop's, so they include
the interpreter's own time per step (about 250 ns here): compare readings with each other, on
one host, not with latencies quoted for native code.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Self

from workers.profiling.speed_probe import BackgroundProbe

READING_PREFIX = "LINK"
"""Start of each reading line the probe process writes: ``LINK <t> <core_a> <core_b> <ns>``."""

_LINE = 64  # bytes of a cache line: ping and pong live on lines of their own
_EXCHANGE_S = 0.005  # the most a reading may take from its wake-up (200 round trips take ~0.1 ms)


class LinkReading(NamedTuple):
    """One reading: when (host monotonic seconds, end of the round trips), between which two
    cores, and the median round trip in nanoseconds."""

    at: float
    core_a: int
    core_b: int
    rtt_ns: float


def ring_pairs(cores: Sequence[int]) -> list[tuple[int, int]]:
    """The pairs a probe measures in turn: neighbouring cores of the sorted list, closing the
    ring when there are more than two.

    Example:
        >>> ring_pairs([0, 1])
        [(0, 1)]
        >>> ring_pairs([3, 1, 2])
        [(1, 2), (2, 3), (3, 1)]
    """
    cores = sorted(set(cores))
    if len(cores) < 2:
        return []
    pairs = list(zip(cores, cores[1:], strict=False))
    if len(cores) > 2:
        pairs.append((cores[-1], cores[0]))
    return pairs


class CoreLinkProbe(BackgroundProbe[LinkReading]):
    """Background readings of the cross-core round trip (see the module docstring).

    Use as a context manager, or :meth:`start` / :meth:`stop`; :meth:`rtt_ns` then summarises
    the readings between some cores over a time window.

    Args:
        cores: CPU ids of the device, at least 2.
        period_s: seconds between two wake-ups, ``> 0``.
        round_trips: round trips per reading, ``>= 5``.

    Raises:
        ValueError: fewer than 2 distinct cores, a non-positive ``period_s`` or
            ``round_trips < 5``.
    """

    def __init__(self, cores: Iterable[int], *, period_s: float = 0.1, round_trips: int = 200) -> None:
        if round_trips < 5:
            raise ValueError(f"round_trips must be >= 5, got {round_trips!r}")
        super().__init__(cores, period_s, min_cores=2, purpose="to probe the link between them")
        self.round_trips = int(round_trips)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def command(self) -> list[str]:
        """The probe process's command line."""
        return [
            sys.executable,
            "-m",
            "workers.profiling.core_link_probe",
            "--cores",
            ",".join(map(str, self.cores)),
            "--period",
            repr(self.period_s),
            "--round-trips",
            str(self.round_trips),
        ]

    def start(self) -> Self:
        """Start the probe process (readings begin at its first wake-up, within ~0.2 s)."""
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True
        )
        self._reader = threading.Thread(
            target=self._read, args=(self._proc,), daemon=True, name=f"core-link-probe-{self._proc.pid}"
        )
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None  # started with stdout=PIPE
        for raw in proc.stdout:
            parts = raw.decode("ascii", errors="replace").split()
            if len(parts) == 5 and parts[0] == READING_PREFIX:
                try:
                    reading = LinkReading(float(parts[1]), int(parts[2]), int(parts[3]), float(parts[4]))
                except ValueError:
                    continue
                self._record(reading)

    def stop(self) -> None:
        """Stop the probe process (its helpers exit with it) and wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5.0)

    def rtt_ns(self, cores: Sequence[int], start: float, end: float) -> float | None:
        """The median round trip (ns) between pairs of ``cores`` over ``[start, end]`` (host
        monotonic seconds): the median of the readings on pairs with both cores in ``cores``.

        Returns:
            ``None`` for fewer than 2 cores (a task on one core has no link to wait on) or
            when no reading of such a pair falls in the window.
        """
        wanted = set(cores)
        if len(wanted) < 2:
            return None
        values = [
            r.rtt_ns for r in self.readings() if r.core_a in wanted and r.core_b in wanted and start <= r.at <= end
        ]
        return float(statistics.median(values)) if values else None


# ------------------------------------------------------------------------- the probe process


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _respond(mv: memoryview, base: int, tick: int, deadline: float) -> None:
    """The second core of a pair: say ready, echo every byte written to the ping line until
    the initiator writes 0 (done) or the monotonic ``deadline`` passes."""
    ping, pong, ready = base, base + _LINE, base + 2 * _LINE
    last = mv[ping]
    mv[ready] = tick % 255 + 1
    while True:
        v = mv[ping]
        if v != last:
            mv[pong] = v
            last = v
            if v == 0:
                return
        elif time.monotonic() > deadline:
            return


def _initiate(mv: memoryview, base: int, tick: int, round_trips: int, deadline: float) -> float | None:
    """The first core of a pair: wait for the responder, time ``round_trips`` round trips,
    return their median (ns), or ``None`` if the responder did not come or the monotonic
    ``deadline`` passed first."""
    ping, pong, ready = base, base + _LINE, base + 2 * _LINE
    clock = time.perf_counter_ns
    end_ns = clock() + int((deadline - time.monotonic()) * 1e9)
    while mv[ready] != tick % 255 + 1:
        if clock() > end_ns:
            return None
    trips = []
    try:
        for i in range(round_trips):
            x = i % 255 + 1
            began = clock()
            mv[ping] = x
            while mv[pong] != x:
                if clock() > end_ns:
                    return None
            trips.append(clock() - began)
    finally:
        mv[ping] = 0  # done: the responder goes back to sleep
    return float(statistics.median(trips))


def _serve(
    core: int,
    pairs: list[tuple[int, int]],
    mv: memoryview,
    period_s: float,
    round_trips: int,
    t_first: float,
    parent: int,
) -> None:
    """One pinned process's loop: at wake-up ``k`` pair ``k mod len(pairs)`` is measured. It
    returns when its parent (``parent``: the probe process for a helper, the agent for the
    probe process) is gone, so no probe outlives an agent that was killed."""
    os.sched_setaffinity(0, {core})
    tick = 0
    while True:
        _sleep_until(t_first + tick * period_s)
        if os.getppid() != parent:
            return
        k = tick % len(pairs)
        a, b = pairs[k]
        base = k * 3 * _LINE
        # Both sides give up at the same absolute time, so a late wake-up costs one reading,
        # never a core spinning into the next wake-up (which would desynchronise the pair).
        deadline = t_first + tick * period_s + min(_EXCHANGE_S, period_s / 4)
        if time.monotonic() > deadline:
            pass  # woke too late for this reading
        elif core == b:
            _respond(mv, base, tick, deadline)
        elif core == a:
            rtt = _initiate(mv, base, tick, round_trips, deadline)
            if rtt is not None:
                sys.stdout.write(f"{READING_PREFIX} {time.monotonic():.6f} {a} {b} {rtt:.1f}\n")
                sys.stdout.flush()
        tick += 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workers.profiling.core_link_probe --cores 0,1 [--period 0.1] [--round-trips 200]``:
    print a ``LINK`` reading line per wake-up until terminated."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", required=True, help="CPU ids, comma-separated, at least 2")
    parser.add_argument("--period", type=float, default=0.1, help="seconds between wake-ups (> 0)")
    parser.add_argument("--round-trips", type=int, default=200, help="round trips per reading (>= 5)")
    args = parser.parse_args(argv)
    try:
        cores = sorted({int(c) for c in args.cores.split(",") if c.strip()})
        CoreLinkProbe(cores, period_s=args.period, round_trips=args.round_trips)  # validates
        os.sched_setaffinity(0, {cores[0]})
    except (ValueError, OSError) as exc:
        print(f"core_link_probe: {exc}", file=sys.stderr)
        return 2
    pairs = ring_pairs(cores)
    page = mmap.mmap(-1, max(mmap.PAGESIZE, len(pairs) * 3 * _LINE))  # shared with the forked helpers
    mv = memoryview(page)
    t_first = time.monotonic() + 0.1
    agent, me = os.getppid(), os.getpid()
    helpers = []
    for core in cores[1:]:
        pid = os.fork()  # this process has no threads: forking it is safe
        if pid == 0:
            try:
                _serve(core, pairs, mv, args.period, args.round_trips, t_first, me)
            finally:
                os._exit(0)
        helpers.append(pid)
    try:
        _serve(cores[0], pairs, mv, args.period, args.round_trips, t_first, agent)
    except (KeyboardInterrupt, BrokenPipeError):
        pass  # terminated, or nobody reads the readings any more
    finally:
        for pid in helpers:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # terminate() runs the finally: helpers killed
    sys.exit(main())
