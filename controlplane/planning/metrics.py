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
* a device's compute time: its first trainer's start to its last one's end; its idle time: the
  round time minus its compute time (the wait for the slowest device);
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

**Time to accuracy** (:func:`time_to_accuracy`). A run's rounds are read in index order; for a
task, round ``r`` has the round time ``round_time_s`` (first trainer start to last trainer end
over the devices that count: the FL round time the planners minimise; a failed round has none
and adds 0 s), the wall time ``wall_time_s`` (dispatch to aggregation done, start-up and FedAvg
included), the samples of that task trained by its succeeded assignments, and the test accuracy
of the task's global model after the round (its checkpoint). A round's times end when its global
model was saved: the model is evaluated beside the next round, and that evaluation's duration
counts in no round's time, so the time to accuracy is the time until the model that reached
the target existed, not until its evaluation said so. The time to accuracy of a task for
a target accuracy ``a*`` is ``Σ round_time_s`` over rounds ``0..r``, where ``r`` is the first
round whose test accuracy is ``≥ a*``; the rounds to accuracy are ``r + 1``; the wall time and
the samples to accuracy are the sums of those rounds' wall times and samples. A run that never
reaches ``a*`` has none. A comparison's default target for a task
(:func:`lowest_final_accuracy`) is the lowest final test accuracy any of its runs reached, so
every run with a final accuracy reaches it.

**Repeats and confidence** (:func:`estimate`, :func:`verdict`). A comparison with ``n`` repeats
reports every figure as the mean over repeats with a Student-t confidence interval,
``mean ± t_{(1+c)/2, n-1} · s / √n`` (``s`` the sample standard deviation; ``c = 0.95``); with one
value there is no interval. A strategy is *better* or *worse* than a reference when Welch's
confidence interval of the difference of their means (``Δ ± t_{(1+c)/2, ν} · √(s_1²/n_1 +
s_2²/n_2)``, ``ν`` by the Welch–Satterthwaite equation; Welch 1947) lies entirely on one side
of 0, else *not distinguishable*; lower is better for times to accuracy. With fewer than two
values on either side there is no verdict but *not distinguishable*.

Throughputs are in samples per second (``sps``), times in seconds, timestamps in Unix seconds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
        idle_s: round time minus ``compute_s``: the wait for the slowest device, seconds.
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
    first = min((s for s, _ in spans), default=None)
    last = max((e for _, e in spans), default=None)
    per_device: dict[str, DeviceMetrics] = {}
    for name, t in devices.items():
        if not t.counts:
            per_device[name] = DeviceMetrics(counts=False)
            continue
        compute = (t.finished_at - t.started_at) if t.started_at is not None and t.finished_at is not None else None
        idle = None
        if compute is not None and first is not None and last is not None:
            idle = (last - first) - compute
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
        wall_time_s: dispatch to aggregation done, seconds; ``None`` when unknown.
        samples_trained: samples of the task trained in the round by its succeeded assignments.
        test_accuracy: the task's global model's test accuracy after the round, in [0, 1];
            ``None`` when it was not evaluated (yet: a running run's newest rounds; or its
            evaluation failed). Such a round adds its times but cannot reach a target.
    """

    round_index: int
    round_time_s: float | None
    wall_time_s: float | None
    samples_trained: int
    test_accuracy: float | None


@dataclass(frozen=True)
class TimeToAccuracy:
    """How long a run took to bring a task to a target accuracy (module docstring).

    Attributes:
        rounds: rounds run up to and including the first that reached the target.
        time_s: the sum of their FL round times, seconds.
        wall_time_s: the sum of their wall times, seconds (``None`` if one is unknown).
        samples: the task's samples trained in them.
        accuracy: the test accuracy that round reached.
    """

    rounds: int
    time_s: float
    wall_time_s: float | None
    samples: int
    accuracy: float


def time_to_accuracy(points: Sequence[AccuracyPoint], target: float) -> TimeToAccuracy | None:
    """The time, rounds, wall time and samples until a task's test accuracy first reaches
    ``target`` (module docstring: the definition).

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
    wall: float | None = 0.0
    samples = 0
    for k, p in enumerate(points):
        time_s += p.round_time_s or 0.0
        wall = None if wall is None or p.wall_time_s is None else wall + p.wall_time_s
        samples += p.samples_trained
        if p.test_accuracy is not None and p.test_accuracy >= target:
            return TimeToAccuracy(k + 1, time_s, wall, samples, p.test_accuracy)
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


@dataclass(frozen=True)
class Estimate:
    """A figure over repeats: the mean and its Student-t confidence interval.

    Attributes:
        mean: the mean of the values (``None`` with none).
        low, high: the interval's ends (``None`` with fewer than two values).
        n: how many values.
    """

    mean: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        """``{"mean", "low", "high", "n"}`` (what the API and exports show)."""
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def _t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student-t quantile ``t_{(1+c)/2, df}``."""
    from scipy.stats import t as student_t  # deferred: SciPy loads only where an interval is computed

    return float(student_t.ppf((1 + confidence) / 2, df))


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance (``n - 1`` in the denominator) of two or more values."""
    n = len(values)
    mean = sum(values) / n
    return mean, sum((v - mean) ** 2 for v in values) / (n - 1)


def estimate(values: Iterable[float | None], *, confidence: float = CONFIDENCE) -> Estimate:
    """The mean of ``values`` with its Student-t confidence interval (module docstring).

    Args:
        values: one value per repeat; ``None`` (a repeat without the figure) is left out.
        confidence: in (0, 1).

    Returns:
        An :class:`Estimate`: no interval with fewer than two values, no mean with none.
    """
    present = [float(v) for v in values if v is not None]
    n = len(present)
    if n == 0:
        return Estimate(None, None, None, 0)
    if n == 1:
        return Estimate(present[0], None, None, 1)
    mean, var = _mean_var(present)
    half = _t_quantile(confidence, n - 1) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def difference_interval(
    candidate: Sequence[float], reference: Sequence[float], *, confidence: float = CONFIDENCE
) -> tuple[float, float, float] | None:
    """Welch's confidence interval of ``mean(candidate) - mean(reference)`` (Welch 1947).

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


def verdict(
    candidate: Iterable[float | None],
    reference: Iterable[float | None],
    *,
    higher_is_better: bool = True,
    confidence: float = CONFIDENCE,
) -> str:
    """Whether ``candidate`` is ``"better"``, ``"worse"`` or ``"not distinguishable"`` from
    ``reference`` at ``confidence`` (Welch's interval of the difference, module docstring).

    Args:
        candidate, reference: one value per repeat (``None`` left out).
        higher_is_better: ``False`` for times (lower is better).
    """
    interval = difference_interval(
        [float(v) for v in candidate if v is not None],
        [float(v) for v in reference if v is not None],
        confidence=confidence,
    )
    if interval is None:
        return "not distinguishable"
    _diff, low, high = interval
    if low > 0:
        return "better" if higher_is_better else "worse"
    if high < 0:
        return "worse" if higher_is_better else "better"
    return "not distinguishable"


Intervals = dict[str, dict[str, dict[str, dict[Any, tuple[float | None, float | None]]]]]
""":data:`Speedups`' shape with each speedup's ``(low, high)`` interval over repeats."""


def repeated_speedups(per_repeat: Sequence[Speedups], *, confidence: float = CONFIDENCE) -> tuple[Speedups, Intervals]:
    """Speedups of a comparison with repeats: each repeat's :func:`comparison_speedups` (each
    against its own baseline run) averaged over the repeats that have it, with its Student-t
    interval (:func:`estimate`; ``(None, None)`` below two repeats).

    Returns:
        ``(means, intervals)``, both shaped as :data:`Speedups`; no repeats give empty tables.
    """
    collected: dict[tuple[str, str, str, Any], list[float]] = defaultdict(list)
    for speedups in per_repeat:
        for view, by_metric in speedups.items():
            for metric, by_strategy in by_metric.items():
                for strategy, values in by_strategy.items():
                    for key, value in values.items():
                        collected[(view, metric, strategy, key)].append(value)
    means: Speedups = {"per_device": {m: {} for m in METRICS}, "per_round": {m: {} for m in METRICS}}
    intervals: Intervals = {"per_device": {m: {} for m in METRICS}, "per_round": {m: {} for m in METRICS}}
    for (view, metric, strategy, key), found in collected.items():
        e = estimate(found, confidence=confidence)
        if e.mean is None:
            continue
        means[view][metric].setdefault(strategy, {})[key] = e.mean
        intervals[view][metric].setdefault(strategy, {})[key] = (e.low, e.high)
    for speedups in per_repeat:  # strategies with no value still get their (empty) entry
        for view, by_metric in speedups.items():
            for metric, by_strategy in by_metric.items():
                for strategy in by_strategy:
                    means[view][metric].setdefault(strategy, {})
                    intervals[view][metric].setdefault(strategy, {})
    return means, intervals


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
    """``"mean ± half-width"`` of an estimate as reports carry it (``{"mean", "low", "high",
    "n"}``; its Student-t interval is symmetric), the mean alone with no interval, ``"—"`` with
    no mean: the dashboard's and ``mtfl compare``'s one text for a figure over repeats."""
    if not e or e["mean"] is None:
        return "—"
    text = f"{e['mean']:.{digits}f}{suffix}"
    if e["high"] is not None:
        text += f" ± {e['high'] - e['mean']:.{digits}f}"
    return text
