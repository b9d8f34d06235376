"""JSON has no NaN or infinity: what the control plane sends out carries ``null`` instead.

A FloatField can hold NaN or ±inf (a device reports a throughput of ``inf`` after a 0-second
round, a predictor's error comes out NaN); Python's ``json.dumps`` then writes the bare tokens
``NaN``/``Infinity``, which no browser's ``JSON.parse`` and no strict client accepts, and DRF's
strict renderer refuses them with a ``ValueError`` (a 500). :func:`finite_or_none` replaces
them by ``None`` anywhere in a JSON-like value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

_PLAIN = (str, int, bool, type(None))


def finite_or_none(value: Any, default: Callable[[Any], Any] | None = None) -> Any:
    """``value`` with every non-finite float (NaN, inf, -inf) replaced by ``None``.

    Dicts (and their subclasses) become plain dicts, tuples and lists become lists; strings,
    integers, booleans and ``None`` are kept as they are.

    Args:
        value: a JSON-like value (dicts, lists, tuples, numbers, strings, ``None``).
        default: what a JSON encoder would call for any other object (e.g. a ``datetime``,
            a numpy array); its result is cleaned the same way. ``None`` keeps such objects
            unchanged.

    Returns:
        The cleaned value (a new container when ``value`` is one).
    """
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item, default) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item, default) for item in value]
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if default is not None:
        return finite_or_none(default(value), default)
    return value
