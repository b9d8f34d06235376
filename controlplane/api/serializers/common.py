"""Shared field helpers of the API's serializers: strict fields that refuse what DRF would convert,
integers whose errors give their range, registered names, ids or names."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.limits import (
    Limit,
)

MAX_ID = 2**63 - 1
MAX_LIST = 1000


class ChoiceField(serializers.ChoiceField):
    """A choice field whose error lists the allowed values."""

    def to_internal_value(self, data):
        if data == "" and self.allow_blank:
            return ""
        if not isinstance(data, str) or data not in self.choice_strings_to_values:
            allowed = ", ".join(map(str, self.choices))
            raise serializers.ValidationError(f"{data!r} is not allowed; allowed: {allowed}")
        return self.choice_strings_to_values[data]


class RegisteredField(ChoiceField):
    """A name from a registry (strategies, models, data sets, backends...), read from the registry
    each time a request is validated or the schema is drawn, so a plug-in registered at run
    time is accepted at once; the error lists the allowed names.

    Args:
        names: ``() -> names``, e.g. ``STRATEGY_REGISTRY.names``.
    """

    def __init__(self, names: Callable[[], Iterable[str]], **kwargs):
        self._names = names
        super().__init__(choices=(), **kwargs)

    @property
    def choices(self) -> dict[str, str]:
        return {name: name for name in self._names()}

    @choices.setter
    def choices(self, _value) -> None:
        """The registry decides: whatever ``ChoiceField.__init__`` sets is ignored."""

    @property
    def grouped_choices(self) -> dict[str, str]:
        return self.choices

    @grouped_choices.setter
    def grouped_choices(self, _value) -> None:
        """As :attr:`choices`."""

    @property
    def choice_strings_to_values(self) -> dict[str, str]:
        return self.choices

    @choice_strings_to_values.setter
    def choice_strings_to_values(self, _value) -> None:
        """As :attr:`choices`."""


class StrictCharField(serializers.CharField):
    """A string field that refuses numbers and other types instead of converting them."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError(f"must be a string, got {type(data).__name__}")
        return super().to_internal_value(data)


def integer(lo: int, hi: int, **kwargs) -> serializers.IntegerField:
    """An integer field in ``[lo, hi]`` whose errors give the allowed range (and the OpenAPI
    schema its ``minimum``/``maximum``)."""
    allowed = f"allowed {lo} to {hi}"
    return serializers.IntegerField(
        min_value=lo,
        max_value=hi,
        error_messages={
            "invalid": f"must be an integer: {allowed}",
            "min_value": f"must be at least {{min_value}}: {allowed}",
            "max_value": f"must be at most {{max_value}}: {allowed}",
            "max_string_length": f"is too long for an integer: {allowed}",
        },
        **kwargs,
    )


def bounded(limit: Limit, **kwargs) -> serializers.IntegerField:
    """:func:`integer` over an integer field's declared range (:mod:`controlplane.common.limits`)."""
    return integer(int(limit.low), int(limit.high), **kwargs)


class StrictFloatField(serializers.FloatField):
    """A float field that refuses booleans (``float(True)`` is 1.0) as well as NaN and infinity."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A boolean field that takes JSON ``true``/``false`` only, not the strings and numbers DRF
    reads as booleans (``"yes"``, ``0``)."""

    default_error_messages = {"invalid": "must be true or false"}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


def number(**kwargs) -> serializers.FloatField:
    """A float field that refuses NaN, infinity and booleans (ranges are checked by the services)."""
    return StrictFloatField(error_messages={"invalid": "must be a finite number"}, **kwargs)


MAX_PARAM_TEXT = 64
"""The longest text a declared parameter's value may be (a ``choice`` parameter's name)."""


@extend_schema_field(
    {"oneOf": [{"type": "number"}, {"type": "boolean"}, {"type": "string", "maxLength": MAX_PARAM_TEXT}]}
)
class ParamValueField(serializers.Field):
    """A declared parameter's value (``aggregation_params``): a finite number (as a float, as
    :func:`number` reads it), ``true``/``false``, or a short name (a ``choice`` parameter's, or
    ``"true"`` typed on a command line). Which of these a parameter takes, and its range or
    names, the services check against the record's declaration
    (:class:`workers.registry.base.Parameter`)."""

    default_error_messages = {
        "invalid": f"must be a finite number, true or false, or a name of at most {MAX_PARAM_TEXT} characters"
    }

    def to_internal_value(self, data):
        if isinstance(data, bool):
            return data
        if isinstance(data, str):
            if len(data) > MAX_PARAM_TEXT:
                self.fail("invalid")
            try:  # a number sent as text reads as the number, as number() reads it
                value = float(data)
            except ValueError:
                return data
            return value if math.isfinite(value) else self.fail("invalid")
        if isinstance(data, (int, float)) and math.isfinite(data):
            return float(data)
        self.fail("invalid")

    def to_representation(self, value):
        return value


def id_list(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=integer(1, MAX_ID), allow_empty=False, max_length=MAX_LIST, **kwargs)


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them and the fields it accepts.

    ``fixed_fields`` maps fields a client may know but not write here to the reason.
    """

    fixed_fields: dict[str, str] = {}

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            errors = {
                name: [self.fixed_fields[name]]
                if name in self.fixed_fields
                else [f"unknown field; allowed: {', '.join(self.fields)}"]
                for name in sorted(set(data.keys()) - set(self.fields))
            }
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            {"type": "string", "minLength": 1, "maxLength": 63},
        ]
    }
)
class IdOrNameField(serializers.Field):
    """An object given by its id (an integer) or its name (a string), e.g. a pool or a device;
    the services look it up (an unknown one is a 400 naming the field)."""

    default_error_messages = {
        "invalid": "must be an id (an integer from 1) or a name (a string of 1 to 63 characters)",
    }

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, int):
            if not 1 <= data <= MAX_ID:
                self.fail("invalid")
            return data
        if isinstance(data, str) and 1 <= len(data) <= 63 and data.strip() == data:
            return data
        self.fail("invalid")

    def to_representation(self, value):
        return value
