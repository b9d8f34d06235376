"""Request parsers: the API's JSON, form and multipart parsers with the checks every body gets.

- **Size.** A body whose ``Content-Length`` is over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django's
  setting, 2.5 MiB by default; the API's largest legitimate bodies, 1,000 plan entries or
  sample counts, are about 100 kB) is refused with 413 before a byte of it is read. The agent
  artifact endpoints (``/api/agent/artifacts/``) have no parsers: they stream the body
  themselves under their own limit (``MTFL_MAX_ARTIFACT_BYTES``), so this one never applies
  to them.
- **Non-finite numbers.** Python's ``json`` reads ``NaN``, ``Infinity``, ``-Infinity`` and
  overflowing literals such as ``1e999``; none of them is JSON and none is a meaningful
  learning rate, share or budget. They are refused with 400 naming the field that holds one
  (``plan[0].batch_size``, the same names the exception handler gives serializer errors).
- **Malformed JSON** is a 400 naming ``body``; a body nested too deeply to parse is one too
  (the standard library raises ``RecursionError`` for it, which DRF does not catch).
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

NON_FINITE_MESSAGE = "must be a finite number (NaN, Infinity and -Infinity are not JSON numbers)"


class RequestBodyTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "the request body is too large"
    default_code = "request_too_large"


def max_body_bytes() -> int | None:
    """The largest request body the API parses (``DATA_UPLOAD_MAX_MEMORY_SIZE``; ``None``: no limit)."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def too_large_message(length: int | None, limit: int) -> str:
    size = f"{length} bytes" if length is not None else "too large"
    return f"the request body is {size}; at most {limit} bytes are accepted (DATA_UPLOAD_MAX_MEMORY_SIZE)"


def check_body_size(parser_context: dict | None) -> None:
    """Refuse a body whose declared length is over :func:`max_body_bytes` (413).

    Raises:
        RequestBodyTooLarge: naming the length and the limit.
    """
    limit = max_body_bytes()
    request = (parser_context or {}).get("request")
    if limit is None or request is None:
        return
    raw = request.META.get("CONTENT_LENGTH") or "0"
    try:
        length = int(raw)
    except ValueError:
        raise exceptions.ParseError(f"Content-Length {raw!r} is not a number of bytes") from None
    if length > limit:
        raise RequestBodyTooLarge(too_large_message(length, limit))


def _text_encoding(parser_context: dict | None) -> str:
    """The request's charset, if it is a text encoding (a bytes-to-bytes codec such as
    ``bz2_codec`` would decompress the body after its size was checked)."""
    encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
    try:
        "".encode(encoding)
    except (LookupError, UnicodeError):
        raise exceptions.ParseError(f"unsupported charset {encoding!r} in the Content-Type header") from None
    return encoding


class _NonFinite:
    """Stands in for a non-finite number while parsing, so its place can be named."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token


def _non_finite_paths(value: Any, path: str = "") -> list[tuple[str, str]]:
    """``[(path, token)]`` of every :class:`_NonFinite` in ``value``, paths spelt as the
    exception handler spells nested errors (``options.slack``, ``plan[0].batch_size``)."""
    if isinstance(value, _NonFinite):
        return [(path or "body", value.token)]
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _non_finite_paths(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _non_finite_paths(item, f"{path}[{index}]")
    return found


class SafeJSONParser(JSONParser):
    """DRF's JSON parser with the size, non-finite and malformed-body checks (module docstring)."""

    def parse(self, stream, media_type=None, parser_context=None):
        check_body_size(parser_context)
        encoding = _text_encoding(parser_context)
        seen_non_finite = False

        def non_finite(token: str) -> _NonFinite:
            nonlocal seen_non_finite
            seen_non_finite = True
            return _NonFinite(token)

        def parse_float(text: str) -> float | _NonFinite:
            number = float(text)
            return number if math.isfinite(number) else non_finite(text)

        try:
            data = json.loads(stream.read().decode(encoding), parse_constant=non_finite, parse_float=parse_float)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - the body is nested too deeply") from None
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"JSON parse error - the body is not {encoding} text: {exc.reason}") from None
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        if seen_non_finite:
            raise exceptions.ValidationError(
                {path: [f"{NON_FINITE_MESSAGE}; got {token}"] for path, token in _non_finite_paths(data)}
            )
        return data


class SizeLimitedFormParser(FormParser):
    """DRF's form parser, refusing bodies over :func:`max_body_bytes` with 413."""

    def parse(self, stream, media_type=None, parser_context=None):
        check_body_size(parser_context)
        return super().parse(stream, media_type, parser_context)


class SizeLimitedMultiPartParser(MultiPartParser):
    """DRF's multipart parser, refusing bodies over :func:`max_body_bytes` with 413 (Django
    limits only a multipart body's non-file fields; the API takes no files)."""

    def parse(self, stream, media_type=None, parser_context=None):
        check_body_size(parser_context)
        return super().parse(stream, media_type, parser_context)
