"""The one registry type every kind of extension uses (docs/extending.md).

A :class:`Registry` maps a name (the string stored in the database and carried on the wire) to a
typed record. Built-ins register themselves when their registry module is imported; third-party
plug-ins are installed Python packages that declare an entry point in the registry's group
(``mtfl.strategies``, ``mtfl.models``, ``mtfl.datasets``, ``mtfl.partitioners``,
``mtfl.aggregators``, ``mtfl.backends``), loaded with :func:`importlib.metadata.entry_points` the
first time the registry is read (pytest's and Flower's convention). An entry point names either a
record (registered under the entry point's name), or a callable: a registry built with
``from_entry_point`` (models, datasets) wraps the callable itself into a record (the model builder,
the data set loader), any other registry calls it with no arguments for its record.

Every entry remembers where it came from (:meth:`Registry.source`): ``"<distribution> <version>"``
of the package whose entry point registered it, ``"mtfl-lab <version>"`` for entries registered in
code (the built-ins); agents declare these strings in their inventory
(:mod:`workers.registry.inventory`).

Imports nothing beyond the standard library, so both the control plane's pure planning layer and a
GPU host's agent can use it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import numbers
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from typing import Any, Generic, Literal, Protocol, TypeVar

log = logging.getLogger(__name__)


ParamValue = int | float | bool | str
"""A declared parameter's value: ``int`` for an ``"int"`` :class:`Parameter`, ``float`` for a
``"float"`` one, ``bool`` for a ``"bool"`` one and ``str`` for a ``"choice"`` one."""

PARAMETER_KINDS = ("int", "float", "bool", "choice")
"""The kinds a :class:`Parameter` may have: two numeric ones with a range, a switch and a name
out of a fixed list."""

_TRUE_FALSE = {"true": True, "false": False}
"""The text forms a ``"bool"`` parameter takes besides JSON booleans: what a command line's
``NAME=VALUE`` and a form's select send."""


@dataclass(frozen=True)
class Parameter:
    """A parameter a registered record declares: a partition rule's (an experiment's
    ``partition_params``) or an aggregator's (its ``aggregation_params``).

    Attributes:
        name: the key in ``partition_params`` (``"alpha"``), a Python identifier.
        label: one line for forms and docs.
        kind: ``"int"`` or ``"float"`` (a number in a range); ``"bool"`` (``true`` or
            ``false``); ``"choice"`` (one of :attr:`choices`).
        minimum: smallest allowed value (excluded when ``minimum_open``); numeric kinds only.
        maximum: largest allowed value (included); numeric kinds only.
        minimum_open: the range is ``(minimum, maximum]`` instead of ``[minimum, maximum]``.
        default: the value when an experiment gives none; ``None``: the parameter is required.
        choices: the names a ``"choice"`` parameter takes, in the order forms list them.

    Raises:
        ValueError: (at construction) an empty or non-identifier name, an unknown ``kind``, a
            range that is empty or not finite, a ``"choice"`` without choices, or a default
            that is not allowed.
    """

    name: str
    label: str
    kind: Literal["int", "float", "bool", "choice"]
    minimum: float = 0.0
    maximum: float = 0.0
    minimum_open: bool = False
    default: ParamValue | None = None
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a partition parameter's name must be an identifier, got {self.name!r}")
        if self.kind not in PARAMETER_KINDS:
            raise ValueError(
                f"partition parameter {self.name!r}: kind must be one of {', '.join(PARAMETER_KINDS)}, got {self.kind!r}"
            )
        if self.kind == "choice" and not (self.choices and all(isinstance(c, str) and c for c in self.choices)):
            raise ValueError(
                f"parameter {self.name!r}: a choice needs its choices (non-empty names), got {self.choices!r}"
            )
        if not (math.isfinite(self.minimum) and math.isfinite(self.maximum)) or self.minimum > self.maximum:
            raise ValueError(
                f"partition parameter {self.name!r}: minimum and maximum must be finite with minimum <= maximum, "
                f"got {self.minimum!r}, {self.maximum!r}"
            )
        if self.minimum_open and self.minimum == self.maximum:
            raise ValueError(f"partition parameter {self.name!r}: the range ({self.minimum}, {self.maximum}] is empty")
        if self.default is not None:
            self.check(self.default)

    @property
    def numeric(self) -> bool:
        """Whether the parameter is a number in a range (``"int"`` or ``"float"``)."""
        return self.kind in ("int", "float")

    @property
    def allowed(self) -> str:
        """The allowed values as written in errors and forms: ``"a number in (0, 1000]"``,
        ``"true or false"``, ``"one of tau_squared, zero"``."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return f"one of {', '.join(self.choices)}"
        what = "an integer" if self.kind == "int" else "a number"
        low = "(" if self.minimum_open else "["
        return f"{what} in {low}{_number(self.minimum)}, {_number(self.maximum)}]"

    def check(self, value: object, *, group: str = "partition_params") -> ParamValue:
        """Return ``value`` as this parameter's type if it is allowed.

        An ``"int"`` parameter takes an integer (a float with an integral value, as JSON and
        forms may send ``2.0``, is taken as that integer); a ``"float"`` one any finite number;
        a ``"bool"`` one ``True``/``False`` or the text ``"true"``/``"false"`` (any case: what a
        command line and a form send); a ``"choice"`` one one of :attr:`choices`, exactly.

        Args:
            group: the field the parameters are given in, for messages (``"partition_params"``,
                ``"aggregation_params"``).

        Raises:
            ValueError: naming ``<group>.<name>`` and the allowed values, for a value that is
                not of the kind, not finite, outside the range or not one of the choices.
        """
        field = f"{group}.{self.name}"
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE_FALSE:
                return _TRUE_FALSE[value.strip().lower()]
            raise ValueError(f"{field} must be {self.allowed}, got {value!r}")
        if self.kind == "choice":
            if isinstance(value, str) and value in self.choices:
                return value
            raise ValueError(f"{field} must be {self.allowed}, got {value!r}")
        # numbers.Real takes NumPy's scalars too (they register with it) without importing NumPy.
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{field} must be {self.allowed}, got {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{field} must be {self.allowed}, got {value!r}")
        if self.kind == "int" and not number.is_integer():
            raise ValueError(f"{field} must be {self.allowed}, got {value!r}")
        below = number <= self.minimum if self.minimum_open else number < self.minimum
        if below or number > self.maximum:
            raise ValueError(f"{field} must be {self.allowed}, got {value!r}")
        return int(number) if self.kind == "int" else number


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Named(Protocol):
    """What every record has: the ``name`` it is registered under."""

    @property
    def name(self) -> str:
        """The name the record is registered under."""
        ...


R = TypeVar("R", bound=Named)

PROJECT_DISTRIBUTION = "mtfl-lab"
"""The distribution whose code registers the built-ins."""


@functools.cache
def builtin_source() -> str:
    """``"mtfl-lab <installed version>"``, or ``"mtfl-lab"`` when the project runs uninstalled
    (a source checkout on ``sys.path``): the :meth:`Registry.source` of entries registered in code."""
    try:
        return f"{PROJECT_DISTRIBUTION} {version(PROJECT_DISTRIBUTION)}"
    except PackageNotFoundError:
        return PROJECT_DISTRIBUTION


def entry_point_source(ep: EntryPoint) -> str:
    """``"<distribution> <version>"`` of the package declaring ``ep`` (``"unknown"`` when
    importlib cannot tell, e.g. an entry point built by hand)."""
    dist = ep.dist
    if dist is None:
        return "unknown"
    name = dist.metadata["Name"] or dist.name
    return f"{name} {dist.version}"


def plugin_label(name: str, obj: object, source: str) -> str:
    """A callable plug-in's one-line label: ``"<name> — <first docstring line>"``, or
    ``"<name> (<source>)"`` when ``obj`` has no docstring (forms, ``mtfl plugins`` and the API
    show :meth:`Registry.source` beside the label, so a documented one does not repeat it)."""
    doc = inspect.getdoc(obj)
    first = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
    return f"{name} — {first}" if first else f"{name} ({source})"


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
        from_entry_point: ``(name, loaded object, source) -> record``, for an entry point whose
            object is not a record: it wraps the object (a model builder, a data set loader)
            into one named ``name``; ``source`` is ``"<distribution> <version>"``. ``None``: such
            an object must be a zero-argument callable returning a record.

    Plug-ins that fail to load are logged and kept in :attr:`failures` instead of making every
    name unusable: one broken package must not take the whole registry down.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        record_type: type[R],
        from_entry_point: Callable[[str, Any, str], R] | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self.record_type = record_type
        self.from_entry_point = from_entry_point
        self._entries: dict[str, R] = {}
        self._sources: dict[str, str] = {}
        self._plugins_loaded = False
        self._lock = threading.RLock()
        self.failures: list[PluginFailure] = []

    def __copy__(self) -> Registry[R]:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Registry[R]:
        # A registry is the process's one table of its kind: a copy (DRF and Django deep-copy
        # their fields, and with them a bound ``names``) must see later registrations too.
        return self

    def register(self, record: R, *, replace: bool = False, source: str | None = None) -> R:
        """Add ``record`` under ``record.name`` and return it.

        ``source`` is where it comes from, ``"<distribution> <version>"`` (:meth:`source`); the
        default, for records registered in code, is :func:`builtin_source`.

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
            same = self._entries.get(name) is record
            self._entries[name] = record
            if source or not same:  # the same record again keeps where it came from
                self._sources[name] = source or builtin_source()
        return record

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and plug-in reloads); unknown names are ignored."""
        with self._lock:
            self._entries.pop(name, None)
            self._sources.pop(name, None)

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
        source = entry_point_source(ep)
        if not isinstance(obj, self.record_type) and callable(obj):
            obj = self.from_entry_point(ep.name, obj, source) if self.from_entry_point else obj()
        if not isinstance(obj, self.record_type):
            raise PluginLoadError(
                f"entry point {ep.name!r} gave {type(obj).__name__}, not a {self.record_type.__name__}"
            )
        if obj.name != ep.name:
            raise PluginLoadError(f"entry point {ep.name!r} gave a record named {obj.name!r}")
        with self._lock:
            # reload_plugins wraps a callable into a new record: the same entry point's earlier
            # record is replaced, another package's (or a built-in) of that name is not.
            again = ep.name in self._entries and self._sources.get(ep.name) == source
        self.register(obj, source=source, replace=again)

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

    def source(self, name: str) -> str:
        """Where entry ``name`` comes from: ``"<distribution> <version>"`` of the plug-in package
        that registered it, ``"mtfl-lab <version>"`` for an entry registered in code.

        Raises:
            UnknownEntryError: no such entry (see :meth:`get`).
        """
        self.get(name)
        with self._lock:
            return self._sources[name]

    def failure(self, name: str) -> PluginFailure | None:
        """The load failure of the entry point named ``name``, if the last load had one."""
        self._load_plugins()
        return next((f for f in reversed(self.failures) if f.name == name), None)

    def check(self, name: str, *, field: str | None = None) -> str:
        """``name`` if it is registered, else :class:`UnknownEntryError` (see :meth:`get`)."""
        self.get(name, field=field)
        return name

    def choices(self, label: Callable[[R], str] | None = None) -> list[tuple[str, str]]:
        """``(name, label)`` pairs for forms and CLI help; the label defaults to the name."""
        return [(r.name, label(r) if label else r.name) for r in self.records()]
