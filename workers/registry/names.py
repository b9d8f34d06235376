"""Registry names in wire messages, checked where a message is built or received.

The wire schema (:mod:`workers.protocol.messages`) depends on nothing of the project: a field that
holds a model, data set, backend or aggregator name is a ``str`` marked with
:class:`~workers.protocol.messages.RegisteredName` (its kind and the field name errors give it),
and the schema checks only its shape. :func:`check_names` checks every marked name of a message
against this process's registries, plug-ins included, so a plug-in's name passes where the
plug-in is installed. It is called by the agent on every request it receives, by the trainer and
the profiler on their specs, and by the control plane on the messages it builds for agents and
the reports it receives from them.

An unknown name is a :class:`pydantic.ValidationError` of the message's class, as the schema
itself would raise: its location is the field's path in the message (``("assignments", 0,
"task", "architecture")``), its type ``unknown_name`` and its message the registry's reason
(``"'tiny' is not allowed; allowed: resnet18, …"``, :class:`~workers.registry.base.UnknownEntryError`).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from workers.protocol.messages import RegisteredName
from workers.registry.aggregators import AGGREGATOR_REGISTRY
from workers.registry.backends import BACKEND_REGISTRY
from workers.registry.base import Registry, UnknownEntryError
from workers.registry.datasets import DATASET_REGISTRY
from workers.registry.models import MODEL_REGISTRY

M = TypeVar("M", bound=BaseModel)

REGISTRIES: Mapping[str, Registry[Any]] = {
    "model": MODEL_REGISTRY,
    "dataset": DATASET_REGISTRY,
    "backend": BACKEND_REGISTRY,
    "aggregator": AGGREGATOR_REGISTRY,
}
"""The registry of each :attr:`RegisteredName.kind <workers.protocol.messages.RegisteredName.kind>`."""

Location = tuple[int | str, ...]


def check_names(message: M) -> M:
    """``message`` itself, once every registry name in it is known to this process.

    Nested messages, lists, tuples and dicts of them are walked; each ``str`` value of a field
    marked :class:`~workers.protocol.messages.RegisteredName` is looked up in the registry of its
    kind (:data:`REGISTRIES`).

    Raises:
        pydantic.ValidationError: titled with the message's class, one ``unknown_name`` error per
            unknown name, located at its path in the message.
        KeyError: a marker names a kind no registry has (a schema error).
    """
    errors: list[InitErrorDetails] = []
    _walk_model(message, (), errors)
    if errors:
        raise ValidationError.from_exception_data(type(message).__name__, errors)
    return message


def _walk_model(message: BaseModel, loc: Location, errors: list[InitErrorDetails]) -> None:
    for name, field in type(message).model_fields.items():
        value = getattr(message, name)
        where = (*loc, name)
        for marker in field.metadata:
            if isinstance(marker, RegisteredName):
                _check(marker, value, where, errors)
        _walk(field.annotation, value, where, errors)


def _walk(annotation: Any, value: Any, loc: Location, errors: list[InitErrorDetails]) -> None:
    """Check the marked names in ``value``, typed ``annotation`` (the field's, or an item's)."""
    if isinstance(value, BaseModel):
        _walk_model(value, loc, errors)
        return
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        for marker in args[1:]:
            if isinstance(marker, RegisteredName):
                _check(marker, value, loc, errors)
        _walk(args[0], value, loc, errors)
    elif origin in (Union, types.UnionType):
        for option in args:
            _walk(option, value, loc, errors)
    elif isinstance(value, (list, tuple)):
        items = args if origin is tuple and args and args[-1] is not Ellipsis else (args[:1] or (Any,)) * len(value)
        for index, (item_type, item) in enumerate(zip(items, value, strict=False)):
            _walk(item_type, item, (*loc, index), errors)
    elif isinstance(value, Mapping):
        value_type = args[1] if len(args) == 2 else Any
        for key, item in value.items():
            _walk(value_type, item, (*loc, key), errors)


def _check(marker: RegisteredName, value: Any, loc: Location, errors: list[InitErrorDetails]) -> None:
    if not isinstance(value, str):
        return
    try:
        REGISTRIES[marker.kind].check(value, field=marker.field)
    except UnknownEntryError as exc:
        # the schema's own error form: pydantic would prefix a ValueError with "Value error, ",
        # and the location already names the field
        error = PydanticCustomError("unknown_name", "{reason}", {"reason": exc.reason})
        errors.append(InitErrorDetails(type=error, loc=loc, input=value))
