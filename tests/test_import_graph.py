"""The project's import graph: no circles, no private names taken from another module, and the
layers' one direction of imports (docs/DESIGN.md §2).

Every ``.py`` under ``controlplane/``, ``workers/`` and ``benchmarks/`` is parsed with :mod:`ast`;
every ``import`` and ``from … import`` statement counts, at module level and inside functions,
classes and ``try``/``if`` blocks alike (an import inside a function still runs, later), with
relative imports resolved against the importing module's package. Only the project's own modules
are nodes of the graph.

How an import becomes edges:

- ``import a.b.c`` and ``from a.b.c import x`` give the edge ``m → a.b.c``; ``from a.b import c``
  where ``a/b/c.py`` (or ``a/b/c/__init__.py``) exists gives ``m → a.b.c`` (the submodule is what
  is loaded), otherwise ``m → a.b`` (a name defined by the package's ``__init__``).
- Importing a module first executes every package above it, so ``m → a.b.c`` also gives
  ``m → a.b`` and ``m → a`` — **unless ``m`` is inside that package**. A module inside a package
  runs only once its package's ``__init__`` has started, so its import of a sibling
  (``a.b.c → a.b.d``) does not execute ``a/b/__init__`` again and is no circle. A package
  ``__init__`` that imports a submodule which in turn imports names from the package itself
  (``from a.b import x``, an explicit edge back) is a real circle: the submodule would see a
  half-initialised package. So the rule is exactly Python's: implicit edges to the enclosing
  packages of the target, never to packages that enclose the importer too.
- Imports under ``if TYPE_CHECKING:`` never run: they are left out of the circle check, but still
  held to the private-name and layer rules (a type-only import of Django into ``workers/`` is still
  a dependency a GPU host's reader must not meet).
- ``importlib.import_module`` of a computed name (entry-point plug-ins) is not an import statement
  and is not seen here.

Packages: a module's package is its first two dotted parts (``workers.registry.base`` belongs to
``workers.registry``); a top-level module (``controlplane.celery``, ``workers.launch``) is a package
of its own, and ``benchmarks`` (scripts) is left out. The package graph is the module graph with
each package collapsed to one node (TYPE_CHECKING imports left out, function-level ones counted):
it must have no loop either, so each package imports the others in one direction only.

Imports inside functions: each says why it is there, with a ``deferred:`` comment (a heavy or
optional dependency loaded on first use); one that only hid a loop belongs at module level.

Private names: ``from a import _name`` (one leading underscore; dunders such as ``__version__``
are public) is refused whenever ``a`` is a module of the project other than the importer. A
package ``__init__`` may re-export names of its own submodules, public ones only. Importing a
private *module* (``a/_impl.py``) is allowed from inside the package that holds it only.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controlplane", "workers", "benchmarks")
"""Top-level directories walked (``benchmarks`` is a folder of scripts and a package alike)."""

LAYERS = {
    "workers": ("django", "rest_framework", "controlplane", "plotly", "psycopg"),
    "controlplane.planning": ("django", "rest_framework", "celery", "kombu", "torch", "torchvision"),
}
"""Layer → top-level names its modules never import (docs/DESIGN.md §2, "Layers")."""


@dataclass(frozen=True)
class Import:
    """One imported module (or ``from`` module and name) at one line of one module."""

    importer: str
    target: str
    line: int
    names: tuple[str, ...] = ()
    type_checking: bool = False


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(ROOT).parts):
                continue
            found[_module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path) -> list[Import]:
    """Every import statement of a module, anywhere in it, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, alias.name, node.lineno, (), type_checking) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append(Import(module, target, node.lineno, tuple(a.name for a in node.names), type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(tree, False)
    return found


MODULES = _modules()
IMPORTS = [imp for name, path in MODULES.items() for imp in _imports(name, path)]


def _targets(imp: Import) -> list[str]:
    """The project modules an import loads (see the module docstring), without the implicit
    parent packages."""
    if imp.names:
        subs = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in MODULES]
        rest = [n for n in imp.names if f"{imp.target}.{n}" not in MODULES]
        return subs + ([imp.target] if rest and imp.target in MODULES else [])
    return [imp.target] if imp.target in MODULES else []


def _enclosing(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for imp in IMPORTS:
        if imp.type_checking:
            continue
        for target in _targets(imp):
            inside = set(_enclosing(imp.importer)) | (
                {imp.importer} if MODULES[imp.importer].name == "__init__.py" else set()
            )
            for node in [*_enclosing(target), target]:
                if node == imp.importer or node not in MODULES:
                    continue
                if node != target and node in inside:
                    continue  # a package the importer is already inside (see the module docstring)
                graph.add_edge(imp.importer, node, line=imp.line, implicit=node != target)
    return graph


def test_the_walk_sees_every_layer_and_function_level_imports():
    """The walk itself: the three trees are there and an import inside a function is an edge."""
    assert {"controlplane.celery", "workers.protocol.messages", "controlplane.planning.strategies"} <= set(MODULES)
    assert any(imp.importer == "controlplane.celery" and imp.target == "celery" for imp in IMPORTS)
    graph = _graph()
    assert graph.number_of_edges() > 200
    # A function-level import (run_begin loads the model zoo on first use only) is an edge too.
    nested = [
        imp for imp in IMPORTS if imp.target == "workers.training.zoo" and imp.importer.startswith("controlplane.")
    ]
    assert nested and all(
        graph.has_edge(imp.importer, "workers.training.zoo") for imp in nested if not imp.type_checking
    )


def test_relative_imports_resolve_against_the_importers_package(tmp_path):
    package = tmp_path / "controlplane" / "x"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("from . import b\nfrom ..y import z\n\ndef f():\n    from .b import g\n")
    got = {(i.target, i.names) for i in _imports("controlplane.x.a", package / "a.py")}
    assert got == {("controlplane.x", ("b",)), ("controlplane.y", ("z",)), ("controlplane.x.b", ("g",))}
    got = {(i.target, i.names) for i in _imports("controlplane.x", package / "__init__.py")}
    assert got == {("controlplane.x.a", ("f",))}


def _cycle_report(graph: nx.DiGraph, component: set[str]) -> str:
    sub = graph.subgraph(component)
    cycle = nx.find_cycle(sub)
    edges = "\n".join(
        f"    {a} -> {b}  ({MODULES[a].relative_to(ROOT)}:{sub.edges[a, b]['line']}"
        f"{', via its package' if sub.edges[a, b]['implicit'] else ''})"
        for a, b in cycle
    )
    return f"  {{{', '.join(sorted(component))}}}\n  closed by:\n{edges}"


def _package(module: str) -> str | None:
    """The package ``module`` belongs to in the package graph (see the module docstring), or
    ``None`` for a module the package check leaves out (``benchmarks``)."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return None
    return ".".join(parts[:2])


def _package_graph(graph: nx.DiGraph) -> nx.DiGraph:
    """The quotient of the module graph by :func:`_package`: an edge ``p → q`` holds, as
    ``edge``, one module edge ``(a, b)`` from ``p`` to ``q`` (an explicit import when there is
    one, the first in sorted order)."""
    packages = nx.DiGraph()
    for a, b in sorted(graph.edges):
        p, q = _package(a), _package(b)
        if p is None or q is None or p == q:
            continue
        held = packages.edges[p, q]["edge"] if packages.has_edge(p, q) else None
        if held is None or (graph.edges[held]["implicit"] and not graph.edges[a, b]["implicit"]):
            packages.add_edge(p, q, edge=(a, b))
    return packages


def _package_loops(graph: nx.DiGraph) -> list[str]:
    """One report per strongly connected component of more than one package: a cycle through
    it, and for each step the module edge (file:line) that closes it."""
    packages = _package_graph(graph)
    reports = []
    for component in sorted((c for c in nx.strongly_connected_components(packages) if len(c) > 1), key=sorted):
        cycle = nx.find_cycle(packages.subgraph(component))
        steps = []
        for p, q in cycle:
            a, b = packages.edges[p, q]["edge"]
            implicit = ", via its package" if graph.edges[a, b]["implicit"] else ""
            steps.append(
                f"    {p} -> {q}: {a} -> {b}  ({MODULES[a].relative_to(ROOT)}:{graph.edges[a, b]['line']}{implicit})"
            )
        loop = " -> ".join([cycle[0][0], *(q for _, q in cycle)])
        reports.append(f"  {{{', '.join(sorted(component))}}}\n  loop: {loop}\n" + "\n".join(steps))
    return reports


def test_no_import_loops_between_packages():
    loops = _package_loops(_graph())
    assert not loops, "packages that import each other (module-level and function-level imports):\n" + "\n".join(loops)


def test_no_import_circles():
    graph = _graph()
    circles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    circles += [{n} for n in graph.nodes if graph.has_edge(n, n)]
    assert not circles, "import circles (module-level and function-level imports):\n" + "\n".join(
        _cycle_report(graph, c) for c in sorted(circles, key=sorted)
    )


def _private_violations() -> list[str]:
    bad = []
    for imp in IMPORTS:
        if imp.target.split(".")[0] not in PACKAGES:
            continue
        for name in imp.names:
            full = f"{imp.target}.{name}"
            if not name.startswith("_") or name.startswith("__"):
                continue
            if full in MODULES:  # a private submodule: only from inside its own package
                if imp.importer == imp.target or imp.importer.startswith(imp.target + "."):
                    continue
            elif imp.target == imp.importer:
                continue
            bad.append(f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line}: from {imp.target} import {name}")
        for part in imp.target.split(".")[1:]:
            if part.startswith("_") and not part.startswith("__"):
                holder = imp.target[: imp.target.index(part) - 1]
                if not (imp.importer == holder or imp.importer.startswith(holder + ".")):
                    bad.append(
                        f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line}: import of the private "
                        f"module {imp.target}"
                    )
    return bad


WIRE_SCHEMA = "workers.protocol.messages"
"""The messages both sides exchange: they depend on nothing of the project but their own package."""


def test_the_wire_schema_imports_only_pydantic_the_standard_library_and_its_own_package():
    """Names in messages are checked where messages are built or received
    (:mod:`workers.registry.names`), not by the schema importing the registries."""
    allowed_project = ("workers.protocol",)
    bad = [
        f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line}: {imp.target}"
        for imp in IMPORTS
        if imp.importer == WIRE_SCHEMA
        and not (
            imp.target.split(".")[0] in ("pydantic", "pydantic_core", "__future__")
            or imp.target.split(".")[0] in sys.stdlib_module_names
            or any(imp.target == p or imp.target.startswith(p + ".") for p in allowed_project)
        )
    ]
    assert not bad, f"{WIRE_SCHEMA} imports beyond pydantic, the standard library and workers.protocol:\n" + "\n".join(
        bad
    )


def test_no_private_name_is_imported_from_another_module():
    bad = _private_violations()
    assert not bad, "private names imported across modules (make them public, with a docstring):\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_only_downwards(layer):
    refused = LAYERS[layer]
    bad = [
        f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line}: {imp.target}"
        for imp in IMPORTS
        if (imp.importer == layer or imp.importer.startswith(layer + ".")) and imp.target.split(".")[0] in refused
    ]
    assert not bad, f"{layer} imports what its layer must not ({', '.join(refused)}):\n" + "\n".join(bad)


def test_the_rules_catch_what_they_are_meant_to(tmp_path, monkeypatch):
    """The checks themselves, on a small made-up tree: a circle through a package ``__init__``,
    a sibling import that is none, and a private name taken from another module."""
    fake = {
        "controlplane.p": "from controlplane.p.a import f\n",
        "controlplane.p.a": "from controlplane.p.b import g\n\ndef f():\n    from controlplane.p import h\n",
        "controlplane.p.b": "def g():\n    pass\n",
        "controlplane.q": "from controlplane.p.b import _hidden\n",
    }
    modules = {}
    for name, text in fake.items():
        is_package = name.count(".") == 1 and name != "controlplane.q"
        path = (
            tmp_path / Path(*name.split(".")) / "__init__.py"
            if is_package
            else tmp_path / (name.replace(".", "/") + ".py")
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[name] = path
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "MODULES", modules)
    imports = [imp for name, path in modules.items() for imp in _imports(name, path)]
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "IMPORTS", imports)
    graph = _graph()
    circles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    # p/__init__ → p.a → p (a function-level import of a name of the package itself): a circle;
    # p.a → p.b (a sibling) closes none.
    assert circles == [{"controlplane.p", "controlplane.p.a"}]
    assert (
        not graph.has_edge("controlplane.p.a", "controlplane.p")
        or graph.edges["controlplane.p.a", "controlplane.p"]["implicit"] is False
    )
    assert graph.has_edge("controlplane.q", "controlplane.p")  # q runs p/__init__ to reach p.b
    assert _private_violations() == ["controlplane/q.py:1: from controlplane.p.b import _hidden"]


REASONED = ("controlplane", "workers")
"""Trees whose function-level imports must say why (``benchmarks`` are scripts: left out)."""

DEFERRED = "deferred:"
"""What the comment giving an import's reason contains (``# deferred: torch stays out of …``)."""


def _function_level_imports(path: Path) -> list[tuple[ast.stmt, ast.stmt | None]]:
    """Every import statement inside a function of ``path`` (not under ``if TYPE_CHECKING:``),
    with the statement just before it in the same block (``None`` when it is the first)."""
    found: list[tuple[ast.stmt, ast.stmt | None]] = []

    def walk(block: list[ast.stmt], in_function: bool) -> None:
        previous: ast.stmt | None = None
        for statement in block:
            if isinstance(statement, (ast.Import, ast.ImportFrom)) and in_function:
                found.append((statement, previous))
            if isinstance(statement, ast.If) and _is_type_checking(statement.test):
                walk(statement.orelse, in_function)  # the TYPE_CHECKING branch never runs
            else:
                inner = in_function or isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
                for field in ("body", "orelse", "finalbody"):
                    sub = getattr(statement, field, None)
                    if isinstance(sub, list):
                        walk(sub, inner)
                for part in [*getattr(statement, "handlers", []), *getattr(statement, "cases", [])]:
                    walk(part.body, inner)
            previous = statement

    walk(ast.parse(path.read_text(), filename=str(path)).body, False)
    return found


def _unreasoned_imports(path: Path) -> list[str]:
    """``file:line: statement`` of each function-level import of ``path`` without a reason.

    An import has one when the line it starts on carries a ``# … deferred: …`` comment, when the
    line directly above it is such a comment, or when it continues, line after line, a block of
    imports whose first has one (a few imports of one heavy dependency under one reason).
    """
    lines = path.read_text().splitlines()

    def comment(number: int) -> str:
        text = lines[number - 1] if 0 < number <= len(lines) else ""
        return text[text.index("#") :] if "#" in text else ""

    reasoned: set[int] = set()
    bad = []
    for statement, previous in _function_level_imports(path):
        above = lines[statement.lineno - 2].strip() if statement.lineno > 1 else ""
        ok = (
            DEFERRED in comment(statement.lineno)
            or (above.startswith("#") and DEFERRED in above)
            or (
                isinstance(previous, (ast.Import, ast.ImportFrom))
                and id(previous) in reasoned
                and previous.end_lineno == statement.lineno - 1
            )
        )
        if ok:
            reasoned.add(id(statement))
        else:
            bad.append(f"{path.relative_to(ROOT)}:{statement.lineno}: {ast.unparse(statement)}")
    return bad


def test_imports_inside_functions_say_why():
    """An import inside a function defers a heavy or optional dependency (torch kept out of the
    web process, a plug-in loaded on first use) and says so; one that only hid an import loop
    belongs at module level once the loop is gone (:func:`test_no_import_loops_between_packages`)."""
    bad = [
        line for name, path in MODULES.items() if name.split(".")[0] in REASONED for line in _unreasoned_imports(path)
    ]
    assert not bad, (
        f"imports inside functions without a reason (a '# {DEFERRED} why' comment on the line or the line "
        "above; move one that only hid a loop to module level):\n" + "\n".join(bad)
    )


def _fake_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> nx.DiGraph:
    """The module graph of a made-up tree (``files``: path relative to the root → text), with the
    module's globals pointed at it for the rest of the test."""
    modules = {}
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    this = __import__(__name__, fromlist=["x"])
    monkeypatch.setattr(this, "ROOT", tmp_path)
    for relative in files:
        modules[_module_name(tmp_path / relative)] = tmp_path / relative
    monkeypatch.setattr(this, "MODULES", modules)
    monkeypatch.setattr(this, "IMPORTS", [imp for name, path in modules.items() for imp in _imports(name, path)])
    return _graph()


LOOP_TREE = {
    "controlplane/__init__.py": "",
    "controlplane/a/__init__.py": "",
    "controlplane/a/x.py": "from controlplane.b.y import g\n",
    "controlplane/a/w.py": "def h():\n    pass\n",
    "controlplane/b/__init__.py": "",
    "controlplane/b/y.py": "def g():\n    pass\n",
    "controlplane/b/z.py": "def f():\n    from controlplane.a.w import h\n",
    "controlplane/c.py": "from controlplane.a.x import g\n",
    "benchmarks/run.py": "from controlplane.c import g\n",
    "benchmarks/more.py": "import benchmarks.run\n",
}
"""a.x → b.y at module level, b.z → a.w in a function: no module circle, but the packages
``controlplane.a`` and ``controlplane.b`` import each other; the top-level ``controlplane.c`` and
the benchmarks only sit above them."""


def test_the_package_check_refuses_a_loop_between_packages(tmp_path, monkeypatch):
    graph = _fake_tree(tmp_path, monkeypatch, LOOP_TREE)
    assert not [c for c in nx.strongly_connected_components(graph) if len(c) > 1]  # no module circle

    loops = _package_loops(graph)

    assert len(loops) == 1
    report = loops[0]
    assert report.startswith("  {controlplane.a, controlplane.b}\n  loop: controlplane.")
    assert "controlplane.a -> controlplane.b: controlplane.a.x -> controlplane.b.y  (controlplane/a/x.py:1)" in report
    assert "controlplane.b -> controlplane.a: controlplane.b.z -> controlplane.a.w  (controlplane/b/z.py:2)" in report


def test_the_package_check_passes_without_the_loop(tmp_path, monkeypatch):
    """The same tree with b.z's import gone, or only under TYPE_CHECKING: no loop."""
    for z in (
        "def f():\n    pass\n",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from controlplane.a.w import h\n",
    ):
        graph = _fake_tree(tmp_path, monkeypatch, {**LOOP_TREE, "controlplane/b/z.py": z})
        assert _package_loops(graph) == []
        assert _package("controlplane.c") == "controlplane.c" and _package("benchmarks.run") is None


def test_the_reasons_check_wants_a_deferred_comment(tmp_path, monkeypatch):
    text = (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "\n"
        "if TYPE_CHECKING:\n"
        "    import torch\n"
        "\n"
        "\n"
        "def a():\n"
        "    import torch  # deferred: torch stays out of the web process\n"
        "    import torch.nn.functional as F\n"
        "\n"
        "    from controlplane.b import g\n"
        "\n"
        "\n"
        "def b():\n"
        "    # deferred: a plug-in module, loaded on first use\n"
        "    from controlplane.plugin import thing\n"
        "    if thing:\n"
        "        import json  # needed here\n"
        "\n"
        "\n"
        "class C:\n"
        "    def m(self):\n"
        "        from controlplane.b import g\n"
    )
    _fake_tree(tmp_path, monkeypatch, {"controlplane/m.py": text})
    assert _unreasoned_imports(tmp_path / "controlplane/m.py") == [
        "controlplane/m.py:12: from controlplane.b import g",
        "controlplane/m.py:19: import json",
        "controlplane/m.py:24: from controlplane.b import g",
    ]
