"""Throughput metrics of multi-task FL: the only place they are computed.

Recording a round (``round_record``) computes its metrics and each device's here, once, and stores
them; the dashboard, the API, the exports and ``mtfl compare`` read what was stored, and the
benchmarks call this module too, so a number means the same wherever it is shown. Pure Python:
no Django, no NumPy needed.

Formulas (Yu et al. 2022, "Powering Multi-Task Federated Learning with Competitive GPU Resource
Sharing", §5 and footnote 1; ``docs/DESIGN.md`` §1). For device ``j`` in one round, with ``P_ij``
the measured steady-state throughput of task ``i`` and ``P_ij^alone`` the same task alone on the
whole device at the same batch size:

* raw throughput ``T_j = Σ_i P_ij`` (samples/s);
* fair throughput ``T_f,j = Σ_i P_ij / P_ij^alone`` (dimensionless: ``1`` means the tasks together
  got as much done as one of them alone, ``I`` means no slowdown at all);
* round time: from the first trainer's start to the last trainer's end over the devices that
  count (seconds);
* FL throughput: samples trained in the round by the devices that count / round time;
* a device's compute time: its first trainer's start to its last one's end; its idle time: from
  its last trainer's end to the round's end (the last trainer's end over the devices that count):
  the wait for the slowest device. The slowest device waits 0 s; a device that started late but
  finished last does not wait either (its late start is not a wait for another device), so compute
  plus idle is at most the round time;
* a task's throughput in a round: ``Σ_j P_ij`` over the devices that count;
* a round's raw and fair throughput: the mean over the devices that count; a run's: the mean
  over its rounds (a round with no device that counts has none and adds nothing);
* speedup: a strategy's metric over the baseline strategy's (``baseline`` in the strategy
  registry, :func:`controlplane.planning.strategies.baseline_strategy`) on the same experiment:
  inside a device, the mean over rounds of the device's metric over the baseline's mean on that
  device; per round, the mean over devices of the ratio in that round.

**The one rule for failed and partial devices.** A device *counts* in a round when its round
succeeded: the device reported no failure and every one of its assignments succeeded (the same
devices whose weights enter FedAvg). A device that does not count contributes nothing: not to raw
or fair throughput (even tasks that finished before the failure), not to the round time, not to
the samples trained, and it has no compute or idle time. A partial round (some devices count)
reports its metrics over the devices that count, and a run's means include it; a failed round
(no device counts) reports no metrics (``None``) and 0 samples. Among the devices that count:
raw throughput sums the tasks with a measured throughput (``None`` when none was measured); fair
throughput needs every task measured with a positive standalone throughput, else that device's
fair throughput is ``None`` and the round's is the mean over the devices that have one.

**Time to accuracy, on two clocks** (:func:`time_to_accuracy`). A run's rounds are read in
index order; for a task, round ``r`` has the round time ``round_time_s`` (first trainer start to
last trainer end over the devices that count: the FL round time the planners minimise; a failed
round has none and adds 0 s), the elapsed time ``elapsed_s`` (wall-clock seconds from the run's
start, ``Run.started_at``, to the round's aggregation done, ``Round.finished_at``), the samples of
that task trained by its succeeded assignments, and the test accuracy of the task's global model
after the round (its checkpoint). For a target accuracy ``a*``, with ``r`` the first round whose
test accuracy is ``≥ a*``:

* the **FL round-time clock** ``time_to_accuracy_s = Σ round_time_s`` over rounds ``0..r``: what
  the planners optimise, the training the devices did;
* the **wall clock** ``wall_time_to_accuracy_s = elapsed_s`` of round ``r``: what the researcher
  waits, from the run's start until the round whose global model reached the target was
  aggregated — the standalone measurement before round 0, each round's dispatch, queueing for
  devices, process start-up, FedAvg and the planning between rounds all count. So it depends on
  the order runs ran in: ``P_alone`` is measured before round 0 and before a round with new
  batch sizes only where no earlier run measured it on that device at that batch size (the
  cross-run cache, ``controlplane.experiments.services.standalone_cache``; never on the
  ``simulated`` backend, which measures every time), so the first run of a workload pays for it
  and the later ones do not. The comparison report says which runs measured it
  (``alone_measured``); the FL round-time clock does not depend on it;
* the rounds to accuracy ``r + 1`` and the samples to accuracy (the sum of those rounds' samples).

A round's times end when its global model was saved: the model is evaluated beside the next
round, and the evaluation's own duration counts on neither clock, so the time to accuracy is the
time until the model that reached the target existed, not until its evaluation said so. A run
that never reaches ``a*`` has none. A comparison's default target for a task
(:func:`lowest_final_accuracy`) is the lowest final test accuracy any of its runs reached, so
every run with a final accuracy reaches it. (Before issue 33 ``wall_time_to_accuracy_s`` summed
each round's dispatch-to-aggregation time, leaving out everything between rounds; the name is
kept with the definition above, which is what a researcher waits.)

**Repeats and confidence** (:func:`estimate`, :func:`contrast`, :func:`verdict`). A comparison
with ``n`` repeats reports every figure over its repeats with a confidence interval at
``c = 0.95``; with one value there is no interval, and below three values the interval is wide
(``t_{0.975, 1} = 12.7``): every view shows :func:`small_n_note` ("n = 2: interval wide") then.

* Positive figures — speedups (ratios), times (both clocks), rounds and samples to accuracy,
  throughputs — are summarised on the **log scale**: the geometric mean ``exp(mean log x)`` with
  the interval ``exp(mean log x ± t_{(1+c)/2, n-1} · s_log / √n)``, ``s_log`` the sample standard
  deviation of ``log x``. The interval is multiplicative (asymmetric around the mean) and can
  never reach 0 or below. A speedup of repeat ``k`` is already paired: the strategy's run of
  repeat ``k`` over the baseline's run of repeat ``k`` (interleaved blocks are pairs), so this is
  the paired t-interval on log ratios. Source: Fleming & Wallace 1986, "How not to lie with
  statistics: the correct way to summarize benchmark results" (CACM 29(3)): ratios are summarised
  by their geometric mean; the interval is Student's t on the logs (e.g. Limpert, Stahel & Abbt
  2001, "Log-normal distributions across the sciences", BioScience 51(5)). Should a value not be
  positive (a time of 0 s), that figure falls back to the linear scale and says so in its
  ``scale``, its interval clipped to ``[0, ∞)`` where a positive figure lives (with values 0 and
  2 at n = 2: mean 1, interval ``[max(0, 1 − 12.71), 1 + 12.71] = [0, 13.71]``).
* Final accuracies are on the **linear scale**: ``mean ± t_{(1+c)/2, n-1} · s / √n``, the
  interval clipped to ``[0, 1]``, where an accuracy lives.

A strategy is *better* or *worse* than a reference when the interval of their contrast
(:func:`contrast`) lies entirely on one side of "no difference", else *not distinguishable*;
lower is better for times to accuracy. On the log scale the contrast is the ratio
``candidate / reference``: with at least two **pairs** (repeat ``k`` of each, both with a value)
the paired t-interval of ``mean(log c_k − log r_k)``, exponentiated (no difference: 1); without
pairs, Welch's interval of the difference of the mean logs (Welch 1947, ``ν`` by the
Welch–Satterthwaite equation), exponentiated. On the linear scale the contrast is the difference
of means (paired, else Welch; no difference: 0). With fewer than two values (pairs) on either
side there is no verdict but *not distinguishable*.

Throughputs are in samples per second (``sps``), times in seconds, timestamps in Unix seconds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from controlplane.common.limits import TARGET_ACCURACY

METRICS = ("raw", "fair")
"""The throughput metrics speedups are taken of: raw ``Σ P`` and fair ``Σ P / P^alone``."""


def raw_throughput(throughputs_sps: Iterable[float]) -> float:
    """Raw throughput of one device, ``T = Σ_i P_i`` (samples/s summed over its tasks;
    Yu et al. 2022, §5)."""
    return float(sum(throughputs_sps))


def fair_throughput(throughputs_sps: Sequence[float], standalone_sps: Sequence[float]) -> float:
    """Fair throughput of one device, ``T_f = Σ_i P_i / P_i^alone`` (Yu et al. 2022, footnote 1).

    ``P_i^alone`` is task ``i`` alone on the whole device at the same batch size. 1.0 means the
    tasks together got as much done as one of them alone would; ``I`` means no slowdown at all.

    Raises:
        ValueError: lengths differ, or a standalone throughput is not positive and finite.
    """
    if len(throughputs_sps) != len(standalone_sps):
        raise ValueError("throughputs_sps and standalone_sps must have the same length")
    total = 0.0
    for p, alone in zip(throughputs_sps, standalone_sps, strict=True):
        if not (alone > 0 and math.isfinite(alone)):
            raise ValueError(f"standalone throughput must be positive and finite, got {alone}")
        total += p / alone
    return total


def speedup(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline`` (a strategy's metric over the baseline strategy's); ``None`` when
    either is missing or the baseline is not positive."""
    if value is None or baseline is None or not baseline > 0:
        return None
    return value / baseline


def round_time(spans: Iterable[tuple[float, float]]) -> float | None:
    """Round (synchronisation cycle) time: from the first trainer's start to the last one's end.

    Args:
        spans: ``(started_at, finished_at)`` of every assignment that counts, Unix seconds.

    Returns:
        ``max(finished_at) - min(started_at)`` in seconds, or ``None`` with no spans.
    """
    spans = list(spans)
    if not spans:
        return None
    return max(end for _, end in spans) - min(start for start, _ in spans)


def fl_throughput(samples_trained: int, round_time_s: float | None) -> float | None:
    """FL throughput of a round: samples trained in the round / round time (samples/s);
    ``None`` without a positive round time."""
    if round_time_s is None or not round_time_s > 0:
        return None
    return samples_trained / round_time_s


def mean_or_none(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are not ``None``; ``None`` if there are none."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


# ------------------------------------------------------------------------------ one round


@dataclass(frozen=True)
class TaskMeasurement:
    """One assignment's outcome: one task on one device in one round.

    Attributes:
        succeeded: the assignment's status is ``succeeded``.
        samples_trained: samples the trainer went through.
        throughput_sps: measured steady-state throughput, or ``None``.
        standalone_sps: the task alone on the whole device at the same batch size, or ``None``.
        started_at, finished_at: the trainer's span, Unix seconds (``None`` when unknown).
    """

    succeeded: bool
    samples_trained: int = 0
    throughput_sps: float | None = None
    standalone_sps: float | None = None
    started_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True)
class DeviceTotals:
    """What the metrics need of one device in one round: counts, sums and extremes of its
    assignments. A database can compute these (``COUNT``, ``SUM``, ``MIN``, ``MAX``) so the
    rows never leave it; :meth:`from_tasks` computes them from per-task measurements.

    Attributes:
        tasks: assignments of the device in the round.
        failed_tasks: of them, those that did not succeed.
        device_failed: the device reported its round failed.
        measured: assignments with a measured throughput.
        with_standalone: of those, the ones with a positive standalone throughput.
        raw_sps: ``Σ P`` over the measured assignments (``None`` when none).
        fair: ``Σ P / P^alone`` over the assignments with both (``None`` when none).
        samples_trained: samples trained by all its assignments.
        started_at, finished_at: first start and last end over its assignments with both
            timestamps, Unix seconds (``None`` when none).
    """

    tasks: int
    failed_tasks: int = 0
    device_failed: bool = False
    measured: int = 0
    with_standalone: int = 0
    raw_sps: float | None = None
    fair: float | None = None
    samples_trained: int = 0
    started_at: float | None = None
    finished_at: float | None = None

    @classmethod
    def from_tasks(cls, tasks: Iterable[TaskMeasurement], *, device_failed: bool = False) -> DeviceTotals:
        """The totals of one device's assignments in a round.

        Raises:
            ValueError: a standalone throughput that is positive but not finite.
        """
        tasks = list(tasks)
        measured = [t.throughput_sps for t in tasks if t.throughput_sps is not None]
        pairs = [
            (t.throughput_sps, t.standalone_sps)
            for t in tasks
            if t.throughput_sps is not None and t.standalone_sps is not None and t.standalone_sps > 0
        ]
        spans = [(t.started_at, t.finished_at) for t in tasks if t.started_at is not None and t.finished_at is not None]
        return cls(
            tasks=len(tasks),
            failed_tasks=sum(not t.succeeded for t in tasks),
            device_failed=device_failed,
            measured=len(measured),
            with_standalone=len(pairs),
            raw_sps=raw_throughput(measured) if measured else None,
            fair=fair_throughput([p for p, _ in pairs], [a for _, a in pairs]) if pairs else None,
            samples_trained=sum(t.samples_trained for t in tasks),
            started_at=min(s for s, _ in spans) if spans else None,
            finished_at=max(e for _, e in spans) if spans else None,
        )

    @property
    def counts(self) -> bool:
        """Whether the device counts in the round (module docstring: the one rule)."""
        return self.tasks > 0 and self.failed_tasks == 0 and not self.device_failed


@dataclass(frozen=True)
class DeviceMetrics:
    """One device's metrics in one round (all ``None`` when it does not count).

    Attributes:
        counts: the device's round succeeded (module docstring).
        raw_throughput_sps: ``Σ_i P_ij``, samples/s.
        fair_throughput: ``Σ_i P_ij / P_ij^alone``.
        samples_trained: samples its tasks trained (0 when it does not count).
        compute_s: its first trainer's start to its last one's end, seconds.
        idle_s: its last trainer's end to the round's end: the wait for the slowest device,
            seconds (0 for the device that ends last).
    """

    counts: bool
    raw_throughput_sps: float | None = None
    fair_throughput: float | None = None
    samples_trained: int = 0
    compute_s: float | None = None
    idle_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The stored form (``Round.device_metrics[device]``): every attribute by name, JSON
        numbers and booleans (``None`` as ``null``)."""
        return {
            "counts": self.counts,
            "raw_throughput_sps": self.raw_throughput_sps,
            "fair_throughput": self.fair_throughput,
            "samples_trained": self.samples_trained,
            "compute_s": self.compute_s,
            "idle_s": self.idle_s,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> DeviceMetrics:
        """The metrics :meth:`as_json` stored (a key missing reads as its default)."""
        return cls(
            counts=bool(stored.get("counts", False)),
            raw_throughput_sps=stored.get("raw_throughput_sps"),
            fair_throughput=stored.get("fair_throughput"),
            samples_trained=int(stored.get("samples_trained") or 0),
            compute_s=stored.get("compute_s"),
            idle_s=stored.get("idle_s"),
        )

    def get(self, metric: str) -> float | None:
        """The ``raw`` or ``fair`` throughput (:data:`METRICS`).

        Raises:
            ValueError: another metric name.
        """
        if metric == "raw":
            return self.raw_throughput_sps
        if metric == "fair":
            return self.fair_throughput
        raise ValueError(f"metric: {metric!r} is not allowed; allowed: {', '.join(METRICS)}")


@dataclass(frozen=True)
class RoundMetrics:
    """One round's metrics (module docstring). Field names match the stored ``Round`` columns.

    Attributes:
        round_time_s: first start to last end over the devices that count, seconds.
        samples_trained: samples trained by the devices that count.
        fl_throughput_sps: ``samples_trained / round_time_s``.
        raw_throughput_sps: mean over the devices that count of ``Σ_i P_ij``.
        fair_throughput: mean over the devices that count and have one of ``Σ_i P_ij / P_ij^alone``.
        devices: every device's :class:`DeviceMetrics`, by name.
    """

    round_time_s: float | None
    samples_trained: int
    fl_throughput_sps: float | None
    raw_throughput_sps: float | None
    fair_throughput: float | None
    devices: Mapping[str, DeviceMetrics] = field(default_factory=dict)

    @property
    def counted(self) -> tuple[str, ...]:
        """Names of the devices that count, in name order."""
        return tuple(sorted(d for d, m in self.devices.items() if m.counts))

    def devices_json(self) -> dict[str, dict[str, Any]]:
        """Every device's metrics in their stored form (``Round.device_metrics``), by name."""
        return {name: m.as_json() for name, m in self.devices.items()}

    @classmethod
    def from_stored(cls, stored: RoundSummary, device_metrics: Mapping[str, Mapping[str, Any]]) -> RoundMetrics:
        """A recorded round's metrics as they were stored: its round-level figures (a ``Round``
        row's columns) and each device's (``Round.device_metrics``); nothing is recomputed."""
        return cls(
            round_time_s=stored.round_time_s,
            samples_trained=stored.samples_trained,
            fl_throughput_sps=stored.fl_throughput_sps,
            raw_throughput_sps=stored.raw_throughput_sps,
            fair_throughput=stored.fair_throughput,
            devices={name: DeviceMetrics.from_json(m) for name, m in device_metrics.items()},
        )


def waits(ends: Mapping[str, float]) -> dict[str, float]:
    """Each device's wait for the slowest device in one round (module docstring): the round's
    end (the latest of ``ends``) less the device's own end, seconds; the device that ends last
    waits 0 s, whenever it started.

    Args:
        ends: ``{device name: its last trainer's end}`` (Unix seconds) of the devices that count
            and have their spans.
    """
    last = max(ends.values(), default=0.0)
    return {name: last - end for name, end in ends.items()}


def round_metrics(devices: Mapping[str, DeviceTotals]) -> RoundMetrics:
    """The metrics of one round from each device's totals (module docstring: formulas and the
    one rule for failed and partial devices).

    Args:
        devices: ``{device name: DeviceTotals}`` for every device planned in the round.

    Returns:
        The round's :class:`RoundMetrics`, with each device's metrics.
    """
    counted = {name: t for name, t in devices.items() if t.counts}
    spans = [
        (t.started_at, t.finished_at)
        for t in counted.values()
        if t.started_at is not None and t.finished_at is not None
    ]
    time_s = round_time(spans)
    idle_of = waits(
        {name: t.finished_at for name, t in counted.items() if t.started_at is not None and t.finished_at is not None}
    )
    per_device: dict[str, DeviceMetrics] = {}
    for name, t in devices.items():
        if not t.counts:
            per_device[name] = DeviceMetrics(counts=False)
            continue
        compute = (t.finished_at - t.started_at) if t.started_at is not None and t.finished_at is not None else None
        idle = idle_of.get(name)
        per_device[name] = DeviceMetrics(
            counts=True,
            raw_throughput_sps=t.raw_sps if t.measured else None,
            fair_throughput=t.fair if t.tasks == t.measured == t.with_standalone else None,
            samples_trained=t.samples_trained,
            compute_s=compute,
            idle_s=idle,
        )
    samples = sum(t.samples_trained for t in counted.values())
    return RoundMetrics(
        round_time_s=time_s,
        samples_trained=samples,
        fl_throughput_sps=fl_throughput(samples, time_s),
        raw_throughput_sps=mean_or_none(m.raw_throughput_sps for m in per_device.values()),
        fair_throughput=mean_or_none(m.fair_throughput for m in per_device.values()),
        devices=per_device,
    )


# ------------------------------------------------------------------------------ one run


class RoundSummary(Protocol):
    """Anything with a round's stored metrics: a :class:`RoundMetrics` or a ``Round`` row."""

    @property
    def round_time_s(self) -> float | None: ...

    @property
    def samples_trained(self) -> int: ...

    @property
    def raw_throughput_sps(self) -> float | None: ...

    @property
    def fair_throughput(self) -> float | None: ...

    @property
    def fl_throughput_sps(self) -> float | None: ...


@dataclass(frozen=True)
class RunMetrics:
    """A run's metrics: the means over its rounds (a round without a value adds nothing)."""

    raw_throughput_sps: float | None
    fair_throughput: float | None
    fl_throughput_sps: float | None


def run_metrics(rounds: Iterable[RoundSummary]) -> RunMetrics:
    """A run's raw, fair and FL throughput: each the mean over the rounds that have it.

    Args:
        rounds: the run's rounds (partial ones included; a failed round has no metrics, so
            passing it changes nothing).
    """
    rounds = list(rounds)
    return RunMetrics(
        raw_throughput_sps=mean_or_none(r.raw_throughput_sps for r in rounds),
        fair_throughput=mean_or_none(r.fair_throughput for r in rounds),
        fl_throughput_sps=mean_or_none(r.fl_throughput_sps for r in rounds),
    )


# ------------------------------------------------------------------------------ comparisons


DeviceRoundKey = tuple[str, str, int]
"""``(strategy, device, round index)``."""

Speedups = dict[str, dict[str, dict[str, dict[Any, float]]]]
"""``{"per_device" | "per_round": {metric: {strategy: {device name | round index: speedup}}}}``."""


def comparison_speedups(
    device_rounds: Mapping[DeviceRoundKey, DeviceMetrics], strategies: Sequence[str], *, baseline: str
) -> Speedups:
    """Raw and fair speedups over the baseline strategy, inside each device and per round
    (Yu et al. 2022, Figs. 4 and 5).

    Args:
        device_rounds: each device's metrics per ``(strategy, device, round index)``.
        strategies: the strategies to report, in display order.
        baseline: the strategy speedups are taken against (the registry's baseline).

    Returns:
        ``{"per_device": {metric: {strategy: {device: speedup}}}, "per_round": {metric:
        {strategy: {round: speedup}}}}``, metric in :data:`METRICS`: per device, the mean over
        rounds of the device's metric over the baseline's mean on that device; per round, the
        mean over devices of the device's metric over the baseline's on that device in that
        round. Entries without a metric or a positive baseline are left out; devices that do
        not count have no metric.
    """
    devices = sorted({d for _, d, _ in device_rounds})
    rounds = sorted({r for _, _, r in device_rounds})
    missing = DeviceMetrics(counts=False)

    def value(s: str, d: str, r: int, metric: str) -> float | None:
        return device_rounds.get((s, d, r), missing).get(metric)

    out: Speedups = {"per_device": {}, "per_round": {}}
    for metric in METRICS:
        per_device: dict[str, dict[Any, float]] = {}
        per_round: dict[str, dict[Any, float]] = {}
        for s in strategies:
            per_device[s] = {}
            for d in devices:
                ratio = speedup(
                    mean_or_none(value(s, d, r, metric) for r in rounds),
                    mean_or_none(value(baseline, d, r, metric) for r in rounds),
                )
                if ratio is not None:
                    per_device[s][d] = ratio
            per_round[s] = {}
            for r in rounds:
                mean = mean_or_none(speedup(value(s, d, r, metric), value(baseline, d, r, metric)) for d in devices)
                if mean is not None:
                    per_round[s][r] = mean
        out["per_device"][metric] = per_device
        out["per_round"][metric] = per_round
    return out


def time_split(rounds: Mapping[tuple[str, int], RoundMetrics]) -> dict[tuple[str, str], tuple[float, float]]:
    """Each strategy's and device's mean compute and idle time over rounds (seconds).

    Args:
        rounds: :class:`RoundMetrics` per ``(strategy, round index)``.

    Returns:
        ``{(strategy, device): (mean compute_s, mean idle_s)}`` for devices that counted in at
        least one round with known times.
    """
    compute: dict[tuple[str, str], list[float]] = defaultdict(list)
    idle: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (strategy, _index), m in rounds.items():
        for device, d in m.devices.items():
            if d.compute_s is not None and d.idle_s is not None:
                compute[(strategy, device)].append(d.compute_s)
                idle[(strategy, device)].append(d.idle_s)
    return {key: (sum(c) / len(c), sum(idle[key]) / len(idle[key])) for key, c in compute.items()}


# ------------------------------------------------------------------------------ time to accuracy


@dataclass(frozen=True)
class AccuracyPoint:
    """One round of a run, for one task, as time to accuracy reads it (module docstring).

    Attributes:
        round_index: the round's index (points are given in index order).
        round_time_s: the round's FL round time, seconds; ``None`` (a failed round) adds 0.
        elapsed_s: wall-clock seconds from the run's start (``Run.started_at``) to the round's
            aggregation done (``Round.finished_at``); ``None`` when either is unknown.
        samples_trained: samples of the task trained in the round by its succeeded assignments.
        test_accuracy: the task's global model's test accuracy after the round, in [0, 1];
            ``None`` when it was not evaluated (yet: a running run's newest rounds; or its
            evaluation failed). Such a round adds its times but cannot reach a target.
    """

    round_index: int
    round_time_s: float | None
    elapsed_s: float | None
    samples_trained: int
    test_accuracy: float | None


@dataclass(frozen=True)
class TimeToAccuracy:
    """How long a run took to bring a task to a target accuracy, on both clocks (module
    docstring).

    Attributes:
        rounds: rounds run up to and including the first that reached the target.
        time_s: the FL round-time clock: the sum of their FL round times, seconds.
        wall_time_s: the wall clock: seconds from the run's start until that round was
            aggregated (``None`` when unknown).
        samples: the task's samples trained in them.
        accuracy: the test accuracy that round reached.
    """

    rounds: int
    time_s: float
    wall_time_s: float | None
    samples: int
    accuracy: float


CLOCKS = {
    "time_to_accuracy_s": "FL round time",
    "wall_time_to_accuracy_s": "wall-clock from the run's start",
}
"""The two clocks of time to accuracy, by the report's figure name, with the label every view
shows (module docstring): the sum of FL round times, and the wall-clock time a researcher waits."""


def time_to_accuracy(points: Sequence[AccuracyPoint], target: float) -> TimeToAccuracy | None:
    """The FL round time, wall-clock time, rounds and samples until a task's test accuracy
    first reaches ``target`` (module docstring: the two clocks).

    Args:
        points: the run's rounds for the task, in round order (failed rounds included).
        target: test accuracy to reach, in :data:`~controlplane.common.limits.TARGET_ACCURACY`.

    Returns:
        A :class:`TimeToAccuracy`, or ``None`` when no round reached ``target``.

    Raises:
        ValueError: ``target`` outside that range.
    """
    if not TARGET_ACCURACY.contains(target):
        raise ValueError(f"target must be in {TARGET_ACCURACY.interval}, got {target}")
    time_s = 0.0
    samples = 0
    for k, p in enumerate(points):
        time_s += p.round_time_s or 0.0
        samples += p.samples_trained
        if p.test_accuracy is not None and p.test_accuracy >= target:
            return TimeToAccuracy(k + 1, time_s, p.elapsed_s, samples, p.test_accuracy)
    return None


def lowest_final_accuracy(finals: Iterable[Mapping[str, float | None]]) -> dict[str, float]:
    """The default target of each task: the lowest final test accuracy any run reached.

    Args:
        finals: one ``{task: final test accuracy or None}`` per run.

    Returns:
        ``{task: lowest accuracy}`` over the runs with one (a task no run has an accuracy of is
        left out); a target of 0 (a model that never classified a test sample right) is left out
        too, since every model reaches it before training.
    """
    lowest: dict[str, float] = {}
    for final in finals:
        for task, accuracy in final.items():
            if accuracy is not None and (task not in lowest or accuracy < lowest[task]):
                lowest[task] = accuracy
    return {task: a for task, a in lowest.items() if a > 0}


# ------------------------------------------------------------------------------ repeats


CONFIDENCE = 0.95
"""The confidence level of every interval and verdict."""

VERDICTS = ("better", "worse", "not distinguishable")

SCALES = ("linear", "log")
"""Where an :class:`Estimate` is taken: ``linear`` (arithmetic mean, additive interval) or ``log``
(geometric mean, multiplicative interval; module docstring)."""

SMALL_N = 3
"""Below this many values an interval is wide (``t_{0.975, 1} = 12.7``) or missing, and every view
says so (:func:`small_n_note`)."""


def small_n_note(n: int) -> str:
    """What a figure over ``n`` values must carry: ``"n = 2: interval wide"`` for two values,
    ``"n = 1: no interval"`` for one, ``""`` for none or :data:`SMALL_N` and more."""
    if n == 1:
        return "n = 1: no interval"
    if 1 < n < SMALL_N:
        return f"n = {n}: interval wide"
    return ""


@dataclass(frozen=True)
class Estimate:
    """A figure over repeats: its mean and confidence interval (module docstring).

    Attributes:
        mean: the arithmetic mean (``scale`` linear) or the geometric mean (log); ``None`` with
            no value.
        low, high: the interval's ends (``None`` with fewer than two values); on the log scale
            both are positive.
        n: how many values.
        values: the values themselves, one per repeat in the order given (``None`` left out):
            what the charts draw as points.
        scale: ``"linear"`` or ``"log"`` (:data:`SCALES`): where the mean and interval were taken.
    """

    mean: float | None
    low: float | None
    high: float | None
    n: int
    values: tuple[float, ...] = ()
    scale: str = "linear"

    def as_dict(self) -> dict[str, Any]:
        """``{"mean", "low", "high", "n", "values", "scale"}`` (what the API and exports show;
        ``values`` the per-repeat values, ``scale`` ``"linear"`` or ``"log"``)."""
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "values": list(self.values),
            "scale": self.scale,
        }


def _t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student-t quantile ``t_{(1+c)/2, df}``."""
    from scipy.stats import t as student_t  # deferred: SciPy loads only where an interval is computed

    return float(student_t.ppf((1 + confidence) / 2, df))


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance (``n - 1`` in the denominator) of two or more values."""
    n = len(values)
    mean = sum(values) / n
    return mean, sum((v - mean) ** 2 for v in values) / (n - 1)


def _t_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """``(mean, low, high)``: Student's t-interval of the mean of two or more values."""
    mean, var = _mean_var(values)
    half = _t_quantile(confidence, len(values) - 1) * math.sqrt(var / len(values))
    return mean, mean - half, mean + half


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale: {scale!r} is not allowed; allowed: {', '.join(SCALES)}")


def estimate(
    values: Iterable[float | None],
    *,
    scale: str = "linear",
    bounds: tuple[float, float] | None = None,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """The mean of ``values`` with its Student-t confidence interval (module docstring).

    Args:
        values: one value per repeat; ``None`` (a repeat without the figure) is left out.
        scale: ``"linear"``: the arithmetic mean ± ``t · s / √n``; ``"log"``: the geometric
            mean with ``exp(mean log x ± t · s_log / √n)`` (never 0 or below; Fleming & Wallace
            1986). A log-scale figure with a value that is not positive is taken on the linear
            scale, and the result's ``scale`` says so; its interval is then clipped to
            ``[0, ∞)`` (and to ``bounds``), since the figure cannot be negative.
        bounds: ``(lowest, highest)`` possible value: the interval is clipped to it (accuracies:
            ``(0, 1)``).
        confidence: in (0, 1).

    Returns:
        An :class:`Estimate`: no interval with fewer than two values, no mean with none.

    Raises:
        ValueError: an unknown ``scale``.
    """
    _check_scale(scale)
    present = tuple(float(v) for v in values if v is not None)
    n = len(present)
    if scale == "log" and any(v <= 0 for v in present):
        # a positive figure with a 0 in it: linear, but still never below 0
        scale = "linear"
        bounds = (max(0.0, bounds[0]), bounds[1]) if bounds is not None else (0.0, math.inf)
    if n == 0:
        return Estimate(None, None, None, 0, (), scale)
    if scale == "log":
        logs = [math.log(v) for v in present]
        if n == 1:
            return Estimate(present[0], None, None, 1, present, scale)
        mean, low, high = (math.exp(x) for x in _t_interval(logs, confidence))
    elif n == 1:
        return Estimate(present[0], None, None, 1, present, scale)
    else:
        mean, low, high = _t_interval(present, confidence)
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Estimate(mean, low, high, n, present, scale)


def difference_interval(
    candidate: Sequence[float], reference: Sequence[float], *, confidence: float = CONFIDENCE
) -> tuple[float, float, float] | None:
    """Welch's confidence interval of ``mean(candidate) - mean(reference)`` (Welch 1947), for
    samples that are not paired.

    Returns:
        ``(difference, low, high)``, or ``None`` with fewer than two values on either side.
        When both samples have no spread at all the interval is the difference itself.
    """
    if len(candidate) < 2 or len(reference) < 2:
        return None
    m1, v1 = _mean_var(candidate)
    m2, v2 = _mean_var(reference)
    a, b = v1 / len(candidate), v2 / len(reference)
    diff = m1 - m2
    se = math.sqrt(a + b)
    if se == 0:
        return diff, diff, diff
    df = (a + b) ** 2 / (a**2 / (len(candidate) - 1) + b**2 / (len(reference) - 1))
    half = _t_quantile(confidence, df) * se
    return diff, diff - half, diff + half


def paired_interval(
    differences: Sequence[float], *, confidence: float = CONFIDENCE
) -> tuple[float, float, float] | None:
    """The paired t-interval of the mean of per-pair differences (``c_k - r_k``, or
    ``log c_k - log r_k`` for ratios): ``(mean, low, high)``, ``None`` below two pairs; with no
    spread at all the interval is the mean itself."""
    if len(differences) < 2:
        return None
    mean, var = _mean_var(differences)
    if var == 0:
        return mean, mean, mean
    return _t_interval(differences, confidence)


@dataclass(frozen=True)
class Contrast:
    """How a candidate strategy's figure compares with a reference's (module docstring).

    Attributes:
        kind: ``"ratio"`` (log scale: candidate / reference, no difference at 1) or
            ``"difference"`` (linear: candidate − reference, no difference at 0).
        method: ``"paired t"`` (repeat ``k`` against repeat ``k``) or ``"Welch"`` (unpaired).
        mean, low, high: the contrast and its interval.
        n: pairs (paired) or the smaller of the two samples (Welch).
    """

    kind: str
    method: str
    mean: float
    low: float
    high: float
    n: int

    @property
    def null(self) -> float:
        """The value meaning no difference: 1 for a ratio, 0 for a difference."""
        return 1.0 if self.kind == "ratio" else 0.0

    def as_dict(self) -> dict[str, Any]:
        """``{"mean", "low", "high", "kind", "method", "n"}`` (the API's verdict ``difference``)."""
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "kind": self.kind,
            "method": self.method,
            "n": self.n,
        }


def contrast(
    candidate: Sequence[float | None],
    reference: Sequence[float | None],
    *,
    scale: str = "linear",
    paired: bool = False,
    confidence: float = CONFIDENCE,
) -> Contrast | None:
    """The contrast of ``candidate`` against ``reference`` with its interval (module docstring).

    Args:
        candidate, reference: one value per repeat; when ``paired``, position ``k`` of each is
            repeat ``k`` (``None``: that repeat has no value, and its pair is left out).
        scale: ``"log"``: the ratio of geometric means (paired: of ``c_k / r_k``); a value that
            is not positive takes the contrast to the linear scale. ``"linear"``: the
            difference of means.
        paired: pair the repeats (paired t-interval); with fewer than two pairs the unpaired
            Welch interval is used instead.

    Returns:
        A :class:`Contrast`, or ``None`` with fewer than two values on either side.

    Raises:
        ValueError: an unknown ``scale``; ``paired`` with sequences of different lengths.
    """
    _check_scale(scale)
    if paired and len(candidate) != len(reference):
        raise ValueError("paired: candidate and reference must have one value per repeat each")
    present = [float(v) for v in (*candidate, *reference) if v is not None]
    log = scale == "log" and all(v > 0 for v in present)
    f = math.log if log else float
    kind = "ratio" if log else "difference"
    back = math.exp if log else float
    pairs = (
        [(f(c), f(r)) for c, r in zip(candidate, reference, strict=True) if c is not None and r is not None]
        if paired
        else []
    )
    if len(pairs) >= 2:
        found = paired_interval([c - r for c, r in pairs], confidence=confidence)
        assert found is not None  # two pairs or more always have one
        mean, low, high = found
        return Contrast(kind, "paired t", back(mean), back(low), back(high), len(pairs))
    mine = [f(v) for v in candidate if v is not None]
    theirs = [f(v) for v in reference if v is not None]
    welch = difference_interval(mine, theirs, confidence=confidence)
    if welch is None:
        return None
    mean, low, high = welch
    return Contrast(kind, "Welch", back(mean), back(low), back(high), min(len(mine), len(theirs)))


def verdict(
    candidate: Sequence[float | None],
    reference: Sequence[float | None],
    *,
    higher_is_better: bool = True,
    scale: str = "linear",
    paired: bool = False,
    confidence: float = CONFIDENCE,
) -> str:
    """Whether ``candidate`` is ``"better"``, ``"worse"`` or ``"not distinguishable"`` from
    ``reference`` at ``confidence``: the interval of their :func:`contrast` lies entirely above
    or below no difference (module docstring).

    Args:
        candidate, reference: one value per repeat (``None`` left out; paired by position
            when ``paired``).
        higher_is_better: ``False`` for times (lower is better).
        scale, paired: as :func:`contrast`.
    """
    found = contrast(candidate, reference, scale=scale, paired=paired, confidence=confidence)
    if found is None:
        return "not distinguishable"
    if found.low > found.null:
        return "better" if higher_is_better else "worse"
    if found.high < found.null:
        return "worse" if higher_is_better else "better"
    return "not distinguishable"


Intervals = dict[str, dict[str, dict[str, dict[Any, tuple[float | None, float | None]]]]]
""":data:`Speedups`' shape with each speedup's ``(low, high)`` interval over repeats."""

SpeedupValues = dict[str, dict[str, dict[str, dict[Any, tuple[float, ...]]]]]
""":data:`Speedups`' shape with each speedup's per-repeat values (the charts' points)."""


class RepeatedSpeedups(NamedTuple):
    """:func:`repeated_speedups`' result, each shaped as :data:`Speedups`."""

    means: Speedups
    """Geometric means over repeats."""
    intervals: Intervals
    """``(low, high)`` on the log scale; ``(None, None)`` below two repeats."""
    values: SpeedupValues
    """Each repeat's speedup, in repeat order."""


def repeated_speedups(per_repeat: Sequence[Speedups], *, confidence: float = CONFIDENCE) -> RepeatedSpeedups:
    """Speedups of a comparison with repeats: each repeat's :func:`comparison_speedups` (each
    against its own baseline run, so every value is already a paired ratio) summarised over the
    repeats that have it on the log scale (:func:`estimate` with ``scale="log"``: the geometric
    mean and the paired t-interval of the log ratios; Fleming & Wallace 1986).

    Returns:
        ``(means, intervals, values)`` (:class:`RepeatedSpeedups`); no repeats give empty tables.
    """
    collected: dict[tuple[str, str, str, Any], list[float]] = defaultdict(list)
    for speedups in per_repeat:
        for view, by_metric in speedups.items():
            for metric, by_strategy in by_metric.items():
                for strategy, found in by_strategy.items():
                    for key, value in found.items():
                        collected[(view, metric, strategy, key)].append(value)

    def empty() -> dict[str, dict[str, dict[str, Any]]]:
        return {"per_device": {m: {} for m in METRICS}, "per_round": {m: {} for m in METRICS}}

    out = RepeatedSpeedups(empty(), empty(), empty())
    for (view, metric, strategy, key), repeats in collected.items():
        e = estimate(repeats, scale="log", confidence=confidence)
        if e.mean is None:
            continue
        out.means[view][metric].setdefault(strategy, {})[key] = e.mean
        out.intervals[view][metric].setdefault(strategy, {})[key] = (e.low, e.high)
        out.values[view][metric].setdefault(strategy, {})[key] = e.values
    for speedups in per_repeat:  # strategies with no value still get their (empty) entry
        for view, by_metric in speedups.items():
            for metric, by_strategy in by_metric.items():
                for strategy in by_strategy:
                    for table in out:
                        table[view][metric].setdefault(strategy, {})
    return out


def interleaved_orders(strategies: Sequence[str], repeats: int) -> list[list[str]]:
    """The order of every repeat's runs: repeat 0 as given, repeat 1 reversed, repeat 2 as given
    again, and so on (ABCDE, EDCBA, ABCDE...). Each strategy's mean position over two repeats is
    then the middle, so a drift of a shared machine (a neighbour starting, a host throttling)
    lands on every strategy alike instead of on whichever runs last.

    Raises:
        ValueError: ``repeats`` below 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    forward = list(strategies)
    return [forward if k % 2 == 0 else forward[::-1] for k in range(repeats)]


def format_estimate(e: Mapping[str, Any] | None, digits: int = 1, suffix: str = "") -> str:
    """A figure over repeats as text, the dashboard's and ``mtfl compare``'s one form of it
    (``{"mean", "low", "high", "n", "scale"}`` as reports carry it): ``"mean ± half-width"`` on
    the linear scale (a symmetric Student-t interval), ``"mean [low, high]"`` on the log scale
    (a multiplicative interval is not symmetric), the mean alone with no interval, ``"—"`` with
    no mean."""
    if not e or e["mean"] is None:
        return "—"
    text = f"{e['mean']:.{digits}f}{suffix}"
    if e["high"] is not None and e.get("scale") == "log":
        text += f" [{e['low']:.{digits}f}, {e['high']:.{digits}f}]"
    elif e["high"] is not None:
        text += f" ± {e['high'] - e['mean']:.{digits}f}"
    return text


def format_contrast(difference: Mapping[str, Any] | None) -> str:
    """A verdict's contrast (:meth:`Contrast.as_dict`) as text, the dashboard's and ``mtfl
    compare``'s one form of it: ``"×0.67 [0.55, 0.81], paired t, n = 3"`` for a ratio (log
    scale), ``"+1.5 [+0.2, +2.8], Welch, n = 3"`` for a difference, ``"—"`` without one."""
    if difference is None:
        return "—"
    how = f"{difference.get('method', 'Welch')}, n = {difference.get('n', '?')}"
    if difference.get("kind") == "ratio":
        return f"×{difference['mean']:.3g} [{difference['low']:.3g}, {difference['high']:.3g}], {how}"
    return f"{difference['mean']:+.3g} [{difference['low']:+.3g}, {difference['high']:+.3g}], {how}"
