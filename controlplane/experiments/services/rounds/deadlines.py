"""How long a round waits for its devices, and how often its watchdog looks."""

from __future__ import annotations

from controlplane.conf import mtfl_setting


def round_deadline_s(*, predicted_round_time_s: float | None, factor: float | None = None) -> float:
    """How long a round waits for its devices, in seconds.

    ``factor × predicted_round_time_s`` when the plan predicts the round time (strategies
    that need a predictor), else ``MTFL_ROUND_DEADLINE_S``; never below
    ``MTFL_ROUND_DEADLINE_FLOOR_S`` (trainer start-up and data loading are not in the
    prediction).

    Args:
        predicted_round_time_s: the plan's predicted round time in seconds, or ``None``.
        factor: the experiment's ``deadline_factor``; ``None`` for ``MTFL_DEADLINE_FACTOR``.
    """
    floor = float(mtfl_setting("ROUND_DEADLINE_FLOOR_S"))
    if predicted_round_time_s is not None and predicted_round_time_s > 0:
        factor = float(factor if factor is not None else mtfl_setting("DEADLINE_FACTOR"))
        return max(floor, factor * float(predicted_round_time_s))
    return max(floor, float(mtfl_setting("ROUND_DEADLINE_S")))


def round_check_after_s(deadline_s: float) -> float:
    """Seconds until a round's next watchdog check: ``MTFL_ROUND_CHECK_S``, or the deadline
    (``deadline_s`` seconds away) if it comes first; never below 0."""
    return max(0.0, min(float(mtfl_setting("ROUND_CHECK_S")), deadline_s))
