"""Every code name docs/architecture.md and docs/DESIGN.md cite exists in the code, so the docs
name only what is there (issue 32: DESIGN.md named ``start_round`` and ``finish_round`` long
after they were gone).

A cited name is a backticked span of one of three forms:

- a path ending in ``.py`` (``rounds/record.py``, ``workers/launch.py``): some file of the
  project's source ends with it;
- a call ``name()`` or ``a.b()``: a function, class or method of that name is defined in the
  project (for ``a.b()``, as the dotted name below);
- a dotted name ``a.b`` / ``a.b.c`` whose first part is a project module, package or class
  (``metrics.round_metrics``, ``controlplane.planning.metrics``, ``Round.device_metrics``): some
  module of that name (or ending with that dotted path) defines the rest, read from the source
  (top-level definitions, assignments and imports; a class's body), never imported. A dotted
  name whose first part is not the project's (``torch.cuda.max_memory_reserved``) is not checked.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "docs" / "architecture.md", ROOT / "docs" / "DESIGN.md"]
SOURCES = ("controlplane", "workers", "benchmarks", "examples", "tests")

FENCE = re.compile(r"```.*?```", re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w./-]+\.py$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?$")
CALL = re.compile(r"^[A-Za-z_]\w*\(\)$")
NOT_CODE = frozenset({"options.replan"})
"""Spans shaped like a dotted name that are not one: a run's option (``Run.options["replan"]``)."""


@functools.cache
def _files() -> tuple[Path, ...]:
    return tuple(
        p.relative_to(ROOT)
        for top in SOURCES
        for p in (ROOT / top).rglob("*.py")
        if ".venv" not in p.parts and "node_modules" not in p.parts
    )


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse((ROOT / path).read_text(encoding="utf-8"), str(path))


def _body_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines: functions, classes, assignments, imports."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            names.update(_body_names(node.body))
    return names


def _modules(dotted: list[str]) -> list[Path]:
    """Source files of the modules or packages whose dotted path ends with ``dotted``."""
    suffix = "/".join(dotted)
    found = []
    for path in _files():
        name = path.with_suffix("").as_posix()
        if name.endswith("/__init__"):
            name = name[: -len("/__init__")]
        if name == suffix or name.endswith("/" + suffix):
            found.append(path)
    return found


@functools.cache
def _classes() -> dict[str, list[ast.ClassDef]]:
    classes: dict[str, list[ast.ClassDef]] = {}
    for path in _files():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)
    return classes


@functools.cache
def _definitions() -> frozenset[str]:
    return frozenset(
        node.name
        for path in _files()
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


def _resolves(body: list[ast.stmt], rest: list[str]) -> bool:
    """Whether ``rest`` names something defined in ``body``, through nested classes."""
    if not rest:
        return True
    node = _body_names(body).get(rest[0])
    if node is None:
        return False
    if len(rest) == 1:
        return True
    return isinstance(node, ast.ClassDef) and _resolves(node.body, rest[1:])


def _is_project(first: str) -> bool:
    return bool(_modules([first])) or first in _classes()


def _dotted_exists(parts: list[str]) -> bool:
    """Whether the longest module prefix of ``parts`` found defines the rest (any module of that
    name will do: the docs say ``metrics.round_metrics`` for ``controlplane.planning.metrics``)."""
    for cut in range(len(parts), 0, -1):
        modules = _modules(parts[:cut])
        if modules:
            return any(_resolves(_tree(m).body, parts[cut:]) for m in modules)
    return any(_resolves(c.body, parts[1:]) for c in _classes().get(parts[0], []))


def _cited() -> list[tuple[str, str]]:
    cited = []
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        for span in SPAN.findall(text):
            span = span.strip()
            if span in NOT_CODE:
                continue
            if PATH.match(span) or CALL.match(span) or (DOTTED.match(span) and _is_project(span.split(".")[0])):
                cited.append((doc.name, span))
    return sorted(set(cited))


def _exists(span: str) -> bool:
    if PATH.match(span):
        return any(p.as_posix() == span or p.as_posix().endswith("/" + span) for p in _files())
    if CALL.match(span):
        return span[:-2] in _definitions()
    return _dotted_exists(span.removesuffix("()").split("."))


def test_the_docs_cite_code_names():
    # The check below must have something to check: the step-by-step names the round's functions.
    spans = {span for _, span in _cited()}
    assert {"rounds/record.py", "metrics.round_metrics"} <= spans


@pytest.mark.parametrize(("doc", "span"), _cited())
def test_every_code_name_the_docs_cite_exists(doc, span):
    assert _exists(span), f"docs/{doc} cites `{span}`, which is not in the code"


@pytest.mark.parametrize(
    ("span", "exists"),
    [
        ("rounds/record.py", True),
        ("rounds/start.py", False),
        ("metrics.round_metrics", True),
        ("services.start_round", False),
        ("finish_round()", False),
        ("round_record()", True),
        ("controlplane.planning.metrics.DeviceMetrics.as_json", True),
        ("Round.device_metrics", True),
        ("Round.no_such_column", False),
    ],
)
def test_the_check_tells_a_name_that_exists_from_one_that_does_not(span, exists):
    assert _exists(span) is exists
