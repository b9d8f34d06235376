"""Throughput metrics of multi-task FL (docs/DESIGN.md §1; Yu et al. 2022, §5 and footnote 1).

All throughputs are in samples per second (``sps``), times in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def raw_throughput(throughputs_sps: Iterable[float]) -> float:
    """Raw throughput of one device, ``T = Σ_i P_i`` (samples/s summed over its tasks)."""
    return float(sum(throughputs_sps))


def fair_throughput(throughputs_sps: Sequence[float], standalone_sps: Sequence[float]) -> float:
    """Fair throughput of one device, ``T_f = Σ_i P_i / P_i^alone``.

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
    """``value / baseline`` (e.g. a strategy's throughput over ``temporal``'s); ``None`` when
    either is missing or the baseline is not positive."""
    if value is None or baseline is None or not baseline > 0:
        return None
    return value / baseline


def round_time(spans: Iterable[tuple[float, float]]) -> float | None:
    """Round (synchronisation cycle) time: from the first trainer's start to the last one's end.

    Args:
        spans: ``(started_at, finished_at)`` of every assignment of the round, Unix seconds.

    Returns:
        ``max(finished_at) - min(started_at)`` in seconds, or ``None`` with no spans.
    """
    spans = list(spans)
    if not spans:
        return None
    return max(end for _, end in spans) - min(start for start, _ in spans)


def fl_throughput(samples_trained: int, round_time_s: float | None) -> float | None:
    """FL throughput of a round: samples trained in the round / round time (samples/s)."""
    if round_time_s is None or not round_time_s > 0:
        return None
    return samples_trained / round_time_s


def mean_or_none(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are not ``None``; ``None`` if there are none."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
