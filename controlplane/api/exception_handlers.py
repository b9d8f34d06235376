"""One error format for the whole API (after HackSoft's ``api/exception_handlers.py``).

Every 4xx body is ``{"message": "...", "errors": {"<field>": ["..."]}}``: ``message`` is one
line naming the first field at fault, ``errors`` has every field's messages. A body that cannot
be parsed at all is reported under the field ``body``; errors with no input field at fault
(401, 403, 404, 405, 413, 415) have a message and empty ``errors``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler

from controlplane.api.parsers import RequestBodyTooLarge, max_body_bytes, too_large_message
from controlplane.common.errors import ApplicationError


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            if isinstance(key, int):  # errors of list items, keyed by index
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            for k, v in _flatten(value, name).items():
                out.setdefault(k, []).extend(v)
        return out
    if isinstance(detail, list):
        if all(not isinstance(d, (dict, list)) for d in detail):
            return {prefix or "non_field_errors": [str(d) for d in detail]}
        out = {}
        for i, value in enumerate(detail):
            for k, v in _flatten(value, f"{prefix}[{i}]").items():
                out.setdefault(k, []).extend(v)
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def flatten_errors(detail: Any) -> dict[str, list[str]]:
    """A serializer's errors as the API reports them under ``errors``: ``{"field": [...],
    "options.slack": [...], "tasks[0]": [...]}`` (the dashboard's forms show the same)."""
    return _flatten(detail)


def _body(errors: dict[str, list[str]], default: str) -> dict[str, Any]:
    if not errors:
        return {"message": default, "errors": {}}
    field, messages = next(iter(errors.items()))
    message = messages[0] if field == "non_field_errors" or messages[0].startswith(field) else f"{field}: {messages[0]}"
    return {"message": message, "errors": errors}


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    """DRF exception handler rendering validation and application errors the same way."""
    if isinstance(exc, ApplicationError):
        return Response(_body(exc.as_dict(), exc.message), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(as_serializer_error(exc))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, RequestDataTooBig):  # Django's own check of request.body
        exc = RequestBodyTooLarge(too_large_message(None, max_body_bytes() or 0))
    if isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        exc = exceptions.ParseError(str(exc))
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ParseError) and not isinstance(exc.detail, (dict, list)):
        response.data = _body({"body": [str(exc.detail)]}, "the request body cannot be parsed")
    elif isinstance(exc, exceptions.ValidationError) or isinstance(exc.detail, (dict, list)):
        response.data = _body(_flatten(exc.detail), "invalid input")
    else:
        detail = response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        response.data = {"message": str(detail), "errors": {}}
    return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's ``handler404``: a URL under ``/api/`` that no route matches (``/api/devices/x/y/``,
    an artifact key with a newline) gets the API's JSON error body; other URLs get the usual page."""
    if request.path_info.startswith("/api/"):
        return JsonResponse({"message": f"no API endpoint at {request.path_info!r}", "errors": {}}, status=404)
    return page_not_found(request, exception)
