"""The OpenAPI schema as the API behaves: every operation documents the 4xx it can answer, with
the one error body :mod:`controlplane.api.exception_handlers` produces, and request bodies that
refuse unknown fields (:class:`~controlplane.api.serializers.StrictSerializer`) say so
(``additionalProperties: false``)."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

ERROR_DESCRIPTIONS = {
    "400": "Invalid input: `errors` names every field at fault (`body` when the body cannot be parsed), "
    "`message` the first.",
    "401": "No or invalid credentials.",
    "403": "Not allowed for these credentials.",
    "404": "No such object, or one the caller may not see.",
    "409": "Not possible in the object's current state.",
    "413": "The request body is larger than the API accepts.",
    "415": "The Content-Type is not one the operation takes.",
}


class ErrorSerializer(serializers.Serializer):
    """Every 4xx body of the API."""

    message = serializers.CharField(help_text="one line; names the first field at fault, if any")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="messages per field (`options.slack`, `plan[0].batch_size`, `body`); empty when no "
        "input field is at fault",
    )


def error_codes(method: str, *, is_list: bool) -> list[str]:
    """The 4xx codes an operation documents.

    Every operation: 401, 403, 404 (also for any path: an unknown ``?format=``). Lists (their
    filters) and writes: 400. Writes: 409, 413, 415.
    """
    codes = ["401", "403", "404"]
    if method in MUTATING_METHODS or is_list:
        codes.append("400")
    if method in MUTATING_METHODS:
        codes += ["409", "413", "415"]
    return sorted(codes)


class ApiAutoSchema(AutoSchema):
    """drf-spectacular's schema with :func:`error_codes` responses added to every operation
    (an operation's own ``@extend_schema(responses=...)`` for a code wins),
    ``additionalProperties: false`` on the request bodies of strict serializers and
    ``allowEmptyValue`` on filters."""

    def _map_basic_serializer(self, serializer, direction):
        # deferred: settings name this schema class, so it loads before the models the serializers need
        from controlplane.api.serializers import StrictSerializer

        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
        return schema

    def _get_filter_parameters(self):
        # django-filter reads an empty value (``?status=``, what the browsable API's filter
        # form sends) as "no filter": say so.
        return [
            {**parameter, "allowEmptyValue": True} if parameter.get("in") == "query" else parameter
            for parameter in super()._get_filter_parameters()
        ]

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in error_codes(self.method, is_list=self._is_list_view()):
            if code not in responses:
                body = self._get_response_for_code(ErrorSerializer, code, media_types=["application/json"])
                responses[code] = {**body, "description": ERROR_DESCRIPTIONS[code]}
        return responses
