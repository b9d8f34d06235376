"""Writing many rows at once, for the services that record a round of 1,000 devices.

Django's ``bulk_create`` and ``bulk_update`` spend their time in Python, per row and field:
``bulk_update`` builds and resolves one ``CASE WHEN pk = … THEN …`` expression per row and
field, and both prepare every value through the full field machinery after building a model
instance per row. Recording a round of 3,000 assignments (insert when it starts, update when it
ends) and its 3,000 profile samples took seconds that way, longer than everything else in the
round. The two functions here send one prepared statement and run it for every row
(``cursor.executemany``: a C loop on SQLite, a pipelined batch on PostgreSQL with psycopg 3).
Values are converted as the ORM would convert them (``Field.get_db_prep_save``), except for
the plain types the database drivers take as they are (integers, floats, strings, booleans,
foreign-key ids), which are passed through.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import NOT_PROVIDED, Field, Model
from django.db.models.constants import OnConflict
from django.utils import timezone

# Internal types whose values the drivers (sqlite3, psycopg) take unconverted, and whose
# get_db_prep_save only checks or casts a value that already has the right Python type.
_PLAIN = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
        "FloatField",
        "CharField",
        "TextField",
        "SlugField",
        "BooleanField",
        "ForeignKey",
        "OneToOneField",
    }
)


def _converter(field: Field, connection) -> Callable[[Any], Any] | None:
    """``None`` when values of ``field`` go to the driver as they are, else the conversion."""
    internal = field.get_internal_type()
    if internal in _PLAIN:
        return None
    if internal == "DateTimeField" and settings.USE_TZ:
        return _datetime_converter(field, connection)
    return lambda value: field.get_db_prep_save(value, connection)


def db_value(model: type[Model], name: str, value: Any, connection) -> Any:
    """``value`` of the field ``name`` as it goes to the database (what ``get_db_prep_save``
    gives, by the fast paths of this module)."""
    field = model._meta.get_field(name)
    converter = _converter(field, connection)
    return value if converter is None or value is None else converter(value)


def _datetime_converter(field: Field, connection) -> Callable[[Any], Any] | None:
    """Aware datetimes as the backend's ``adapt_datetimefield_value`` writes them, without the
    checks around it (a third of a round's recording went there): psycopg takes them as they
    are; SQLite stores the naive time in the connection's zone as ``str()`` gives it. Anything
    else (naive, an expression) goes the ORM's way."""

    def slow(value):
        return field.get_db_prep_save(value, connection)

    if connection.vendor == "postgresql":
        return lambda value: value if type(value) is dt.datetime and value.tzinfo is not None else slow(value)
    if connection.vendor == "sqlite":
        zone = connection.timezone

        def sqlite(value):
            if type(value) is dt.datetime and value.tzinfo is not None:
                return str(value.astimezone(zone).replace(tzinfo=None))
            return slow(value)

        return sqlite
    return slow


def _prepared(fields: Sequence[Field], connection, rows: Iterable[Sequence[Any]]) -> list[list[Any]]:
    converters = [_converter(f, connection) for f in fields]
    if not any(converters):
        return [list(row) for row in rows]
    # Rows repeat values (one timestamp for a device's tasks, one configuration object for its
    # samples, one "now" for every created_at): each distinct value is converted once. None is
    # NULL for every field and never converted.
    cache: list[dict] = [{} for _ in converters]

    def convert(k: int, value: Any) -> Any:
        memo = cache[k]
        # containers by identity (the rows hold them, so no id is reused meanwhile); other
        # values by type and value (1, 1.0 and True are equal but not the same JSON)
        key = id(value) if isinstance(value, (list, dict)) else (type(value), value)
        try:
            return memo[key]
        except KeyError:
            memo[key] = converted = converters[k](value)
            return converted
        except TypeError:  # unhashable
            return converters[k](value)

    plain = [c is None for c in converters]
    return [[v if plain[k] or v is None else convert(k, v) for k, v in enumerate(row)] for row in rows]


def _writable(model: type[Model], names: Iterable[str]) -> list[Field]:
    meta = model._meta
    fields = []
    for name in names:
        field = meta.get_field(name)
        if not field.concrete or field.primary_key or field.many_to_many:
            raise ValueError(f"only concrete non-key fields can be written this way; {name!r} is not one")
        fields.append(field)
    return fields


def bulk_set(model: type[Model], objects: Sequence[Model], fields: Sequence[str]) -> int:
    """Write ``fields`` of every object in ``objects`` to its row (matched by primary key).

    The same rows end up as with ``model.objects.bulk_update(objects, fields)``: nothing else
    about the objects is saved (no signals, no ``save()``, ``auto_now`` fields untouched). Runs
    in one transaction (inside the caller's if there is one).

    Args:
        model: the model class of the objects.
        objects: saved instances (each with a primary key).
        fields: names of concrete, non-primary-key fields to write.

    Returns:
        The number of objects written.

    Raises:
        django.core.exceptions.FieldDoesNotExist: a name is not a field of ``model``.
        ValueError: a field is the primary key or not concrete, or an object has no primary key.
    """
    if not objects:
        return 0
    meta = model._meta
    columns = _writable(model, fields)
    if any(obj.pk is None for obj in objects):
        raise ValueError("bulk_set needs saved objects: one has no primary key")
    connection = connections[router.db_for_write(model)]
    quote = connection.ops.quote_name
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(f'{quote(f.column)} = %s' for f in columns)} "
        f"WHERE {quote(meta.pk.column)} = %s"
    )
    rows = _prepared(
        [*columns, meta.pk], connection, ([getattr(obj, f.attname) for f in columns] + [obj.pk] for obj in objects)
    )
    with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as cursor:
        cursor.executemany(sql, rows)
    return len(rows)


def bulk_insert(model: type[Model], rows: Sequence[Mapping[str, Any]], *, ignore_conflicts: bool = False) -> int:
    """Insert one row per mapping of attribute names (``round_id``, not ``round``) to values;
    a field left out gets its model default (``default=``), as ``Model(...)`` would give it.

    Like ``model.objects.bulk_create(...)`` without building the instances: no primary keys
    come back (select them afterwards if needed), no signals, and ``auto_now_add`` /
    ``auto_now`` fields left out are set to now.

    Args:
        ignore_conflicts: skip rows that break a unique constraint (as ``bulk_create``'s).

    Returns:
        The number of rows sent (with ``ignore_conflicts``, some may have been skipped).

    Raises:
        ValueError: an unknown attribute name, or a field left out that has no default and
            is not nullable.
    """
    if not rows:
        return 0
    meta = model._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    known = {f.attname for f in fields}
    unknown = sorted({name for row in rows for name in row} - known)
    if unknown:
        raise ValueError(f"{model.__name__} has no field {unknown[0]!r} to insert")
    now = timezone.now()
    defaults: dict[str, Any] = {}
    for f in fields:
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            defaults[f.attname] = now
        elif f.default is not NOT_PROVIDED:
            defaults[f.attname] = f.get_default()
        elif f.null:
            defaults[f.attname] = None
    connection = connections[router.db_for_write(model)]
    required = {f.attname for f in fields} - defaults.keys()
    for row in rows:
        if not required <= row.keys():
            name = sorted(required - row.keys())[0]
            raise ValueError(f"{model.__name__}.{name} has no default: give it a value")
    attnames = [f.attname for f in fields]
    values = [[row[a] if a in row else defaults[a] for a in attnames] for row in rows]
    quote = connection.ops.quote_name
    on_conflict = OnConflict.IGNORE if ignore_conflicts else None
    sql = (
        f"{connection.ops.insert_statement(on_conflict=on_conflict)} {quote(meta.db_table)} "
        f"({', '.join(quote(f.column) for f in fields)}) VALUES ({', '.join(['%s'] * len(fields))})"
    )
    suffix = connection.ops.on_conflict_suffix_sql(fields, on_conflict, None, None)
    if suffix:
        sql = f"{sql} {suffix}"
    with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as cursor:
        cursor.executemany(sql, _prepared(fields, connection, values))
    return len(values)
