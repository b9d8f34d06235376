"""Pagination of the API's lists."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
"""The most rows one page holds (``?limit=``)."""

MAX_OFFSET = 2**63 - 1


class CheckedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` and ``?offset=`` as DRF reads them, but checked like every other input: a
    value that is not an integer in range is a 400 naming the parameter and its range, never
    silently replaced by the default (DRF's behaviour), and no page is larger than
    :data:`MAX_LIMIT` rows."""

    max_limit = MAX_LIMIT

    def get_limit(self, request) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return _integer(self.limit_query_param, raw, 1, self.max_limit)

    def get_offset(self, request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return _integer(self.offset_query_param, raw, 0, MAX_OFFSET)

    def get_schema_operation_parameters(self, view) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, self.max_limit), self.offset_query_param: (0, MAX_OFFSET)}
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {**parameter["schema"], "minimum": low, "maximum": high}
        return parameters


def _integer(name: str, raw: str, low: int, high: int) -> int:
    message = f"must be an integer from {low} to {high}"
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise ValidationError({name: [f"{message}, got {raw[:40]!r}"]})
    value = int(text)
    if not low <= value <= high:
        raise ValidationError({name: [f"{message}, got {value}"]})
    return value
