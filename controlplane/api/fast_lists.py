"""A faster ``many=True`` representation for the API's long read-only lists.

DRF represents each row field by field through generic machinery (``get_attribute`` walking a
dotted source, a PK-only object for every foreign key, a timezone lookup for every datetime):
for a page of 100 assignments of 30 fields that was a third of the request's time. The lists
of rounds, assignments, checkpoints and profile samples are read-only model rows, so most of
their fields are a plain attribute of the row passed through ``int``, ``float`` or ``str``;
:class:`FastReadListSerializer` reads those directly and leaves every other field to DRF. The
output is DRF's, value for value (tests/controlplane/test_fast_lists.py compares the two on
every list that uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.utils import timezone
from rest_framework import fields as drf_fields
from rest_framework import relations, serializers
from rest_framework.settings import api_settings

_PLAIN: dict[type, Callable[[Any], Any]] = {
    drf_fields.IntegerField: int,
    drf_fields.FloatField: float,
    drf_fields.CharField: str,
}


def _iso(value, tz) -> str:
    # DRF's DateTimeField.to_representation of an aware datetime with ISO 8601 output: in the
    # current time zone, "+00:00" written as "Z".
    text = value.astimezone(tz).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _row_reader(field: serializers.Field, model: type[models.Model] | None, tz, iso: bool) -> Callable[[Any], Any]:
    """How to read one field of one row: a fast reader where the field is a plain attribute of
    the row, DRF's own path otherwise. ``None`` stays ``None`` (as DRF leaves it)."""
    source = field.source_attrs
    drf = _drf_reader(field)
    if len(source) != 1:
        return drf
    name = source[0]
    if isinstance(field, relations.PrimaryKeyRelatedField) and model is not None:
        try:
            model_field = model._meta.get_field(name)
        except FieldDoesNotExist:
            return drf
        if getattr(model_field, "many_to_one", False) and field.pk_field is None:
            return attrgetter(model_field.attname)  # DRF answers the related object's pk
        return drf
    get = attrgetter(name)
    if type(field) in _PLAIN:
        convert = _PLAIN[type(field)]

        def read(row, get=get, convert=convert):
            value = get(row)
            return None if value is None else convert(value)

        return read
    if (
        type(field) is drf_fields.DateTimeField
        and tz is not None
        and not hasattr(field, "timezone")
        and getattr(field, "format", drf_fields.empty) in (drf_fields.empty, drf_fields.ISO_8601)
        and iso
    ):

        def read_datetime(row, get=get):
            value = get(row)
            if not value:
                return None
            return _iso(value, tz) if timezone.is_aware(value) else field.to_representation(value)

        return read_datetime
    if type(field) is drf_fields.BooleanField:

        def read_bool(row, get=get):
            value = get(row)
            return None if value is None else bool(value)

        return read_bool
    return drf


def _drf_datetime_format_is_iso() -> bool:
    return str(api_settings.DATETIME_FORMAT).lower() == drf_fields.ISO_8601


def _drf_reader(field: serializers.Field) -> Callable[[Any], Any]:
    def read(row):
        attribute = field.get_attribute(row)
        check = attribute.pk if isinstance(attribute, relations.PKOnlyObject) else attribute
        return None if check is None else field.to_representation(attribute)

    return read


class FastReadListSerializer(serializers.ListSerializer):
    """``many=True`` for a read-only :class:`~rest_framework.serializers.ModelSerializer`: the
    same list of dicts as DRF's ``ListSerializer``, built with one reader per field chosen once
    per list (see the module docstring). Use as ``Meta.list_serializer_class``."""

    def to_representation(self, data):
        rows = data.all() if isinstance(data, models.manager.BaseManager) else data
        child = self.child
        model = getattr(getattr(child, "Meta", None), "model", None)
        tz = timezone.get_current_timezone() if settings.USE_TZ else None
        iso = _drf_datetime_format_is_iso()
        readers = [(field.field_name, _row_reader(field, model, tz, iso)) for field in child._readable_fields]
        return [{name: read(row) for name, read in readers} for row in rows]
