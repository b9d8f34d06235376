"""The one registry type every kind of extension uses (docs/extending.md).

A :class:`Registry` maps a name (the string stored in the database and carried on the wire) to a
typed record. Built-ins register themselves when their registry module is imported; third-party
plug-ins are installed Python packages that declare an entry point in the registry's group
(``mtfl.strategies``, ``mtfl.models``, ``mtfl.datasets``, ``mtfl.partitioners``,
``mtfl.aggregators``, ``mtfl.backends``), loaded with :func:`importlib.metadata.entry_points` the
first time the registry is read (pytest's and Flower's convention). An entry point names either a
record (registered under the entry point's name) or a zero-argument callable returning one.

Imports nothing beyond the standard library, so both the control plane's pure planning layer and a
GPU host's agent can use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class Named(Protocol):
    """What every record has: the ``name`` it is registered under."""

    @property
    def name(self) -> str:
        """The name the record is registered under."""
        ...


R = TypeVar("R", bound=Named)


class UnknownEntryError(ValueError):
    """A name no registry entry has.

    The message is ``"<field>: <reason>"``; :attr:`reason` alone (``"'x' is not allowed;
    allowed: a, b"``) is for callers whose error format names the field already (pydantic's).
    """

    def __init__(self, *, field: str, kind: str, name: object, allowed: tuple[str, ...]) -> None:
        self.reason = f"{name!r} is not allowed; allowed: {', '.join(allowed)}"
        super().__init__(f"{field}: {self.reason}")
        self.kind = kind
        self.name = str(name)
        self.allowed = allowed


class PluginLoadError(RuntimeError):
    """An installed entry point could not be loaded or gave something that is not a record."""


@dataclass(frozen=True)
class PluginFailure:
    """An entry point that failed to load: which one, from which distribution, and why."""

    group: str
    name: str
    value: str
    error: str


class Registry(Generic[R]):
    """Name → record for one kind of extension, with entry-point plug-ins.

    Args:
        kind: what the entries are, singular, for messages (``"strategy"``, ``"backend"``).
        group: the entry-point group plug-ins register in (``"mtfl.strategies"``).
        record_type: the record class; an entry point must give an instance of it.

    Plug-ins that fail to load are logged and kept in :attr:`failures` instead of making every
    name unusable: one broken package must not take the whole registry down.
    """

    def __init__(self, kind: str, group: str, record_type: type[R]) -> None:
        self.kind = kind
        self.group = group
        self.record_type = record_type
        self._entries: dict[str, R] = {}
        self._plugins_loaded = False
        self._lock = threading.RLock()
        self.failures: list[PluginFailure] = []

    def __copy__(self) -> Registry[R]:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Registry[R]:
        # A registry is the process's one table of its kind: a copy (DRF and Django deep-copy
        # their fields, and with them a bound ``names``) must see later registrations too.
        return self

    def register(self, record: R, *, replace: bool = False) -> R:
        """Add ``record`` under ``record.name`` and return it.

        Raises:
            TypeError: ``record`` is not a ``record_type``.
            ValueError: the name is empty or already taken (unless ``replace``).
        """
        if not isinstance(record, self.record_type):
            raise TypeError(
                f"{self.kind} registry takes {self.record_type.__name__} records, got {type(record).__name__}"
            )
        name = record.name
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty name")
        with self._lock:
            if name in self._entries and not replace and self._entries[name] is not record:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = record
        return record

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and plug-in reloads); unknown names are ignored."""
        with self._lock:
            self._entries.pop(name, None)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True
            for ep in entry_points(group=self.group):
                try:
                    self._register_entry_point(ep)
                except Exception as exc:  # a broken plug-in is reported, never fatal
                    failure = PluginFailure(self.group, ep.name, ep.value, f"{type(exc).__name__}: {exc}")
                    self.failures.append(failure)
                    log.warning("%s plug-in %r (%s) failed to load: %s", self.kind, ep.name, ep.value, failure.error)

    def _register_entry_point(self, ep: EntryPoint) -> None:
        obj = ep.load()
        if not isinstance(obj, self.record_type) and callable(obj):
            obj = obj()
        if not isinstance(obj, self.record_type):
            raise PluginLoadError(
                f"entry point {ep.name!r} gave {type(obj).__name__}, not a {self.record_type.__name__}"
            )
        if obj.name != ep.name:
            raise PluginLoadError(f"entry point {ep.name!r} gave a record named {obj.name!r}")
        self.register(obj)

    def reload_plugins(self) -> None:
        """Read the installed entry points again (after installing a plug-in in a running process)."""
        with self._lock:
            self._plugins_loaded = False
            self.failures.clear()
        self._load_plugins()

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-ins first, in registration order."""
        self._load_plugins()
        return tuple(self._entries)

    def records(self) -> tuple[R, ...]:
        """Every record, in the order of :meth:`names`."""
        self._load_plugins()
        return tuple(self._entries.values())

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[R]:
        return iter(self.records())

    def __len__(self) -> int:
        return len(self.names())

    def get(self, name: str, *, field: str | None = None) -> R:
        """The record registered as ``name``.

        Raises:
            UnknownEntryError: no such entry; the message names the field (``field`` or the
                kind) and lists the allowed names.
        """
        self._load_plugins()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownEntryError(
                field=field or self.kind, kind=self.kind, name=name, allowed=tuple(self._entries)
            ) from None

    def check(self, name: str, *, field: str | None = None) -> str:
        """``name`` if it is registered, else :class:`UnknownEntryError` (see :meth:`get`)."""
        self.get(name, field=field)
        return name

    def choices(self, label: Callable[[R], str] | None = None) -> list[tuple[str, str]]:
        """``(name, label)`` pairs for forms and CLI help; the label defaults to the name."""
        return [(r.name, label(r) if label else r.name) for r in self.records()]
