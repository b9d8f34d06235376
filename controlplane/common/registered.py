"""Registry look-ups as the services make them: an unknown name is an :class:`ApplicationError`
naming the request field and listing the allowed names (plug-ins included)."""

from __future__ import annotations

from typing import TypeVar

from controlplane.common.errors import ApplicationError
from workers.registry.base import Named, Registry, UnknownEntryError

R = TypeVar("R", bound=Named)


def registered(registry: Registry[R], name: object, *, field: str) -> R:
    """The record ``registry`` holds under ``name``.

    Args:
        registry: any :class:`~workers.registry.base.Registry` (strategies, models, data sets,
            partitioners, aggregators, backends).
        name: the value from the request.
        field: the request field it came from, for the message and the API's error key.

    Raises:
        ApplicationError: ``name`` is not registered: ``"<field>: 'x' is not allowed; allowed:
            a, b"`` under ``field`` (HTTP 400).
    """
    try:
        return registry.get(name, field=field)  # type: ignore[arg-type]
    except UnknownEntryError as exc:
        raise ApplicationError(str(exc), field=field) from None
