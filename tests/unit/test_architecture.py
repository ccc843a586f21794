"""The shape of the package, held by an AST scan of every import, lazy ones included.

The layers are the ``layers`` block of ``docs/concepts.md#architecture``, which the docs
build draws as a picture. A module
may import from its own layer or a lower one, never from a higher one; and no set of
modules may import each other in a circle, whether the imports sit at the top of a file,
inside a function, or under ``TYPE_CHECKING``. Sizes are held too: no module over 600
lines (the frozen migration copies aside) and no class over 450.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sqla_queue", "alembic_ext")


def _load_hook() -> ModuleType:
    """The docs build's hook that parses and draws the layers block."""
    spec = importlib.util.spec_from_file_location(
        "docs_architecture_hook", ROOT / "docs" / "_hooks" / "architecture.py"
    )
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hook
    spec.loader.exec_module(hook)
    return hook


HOOK = _load_hook()
CONCEPTS = (ROOT / "docs" / "concepts.md").read_text()

#: Bottom to top. A module belongs to the layer of the longest prefix that names it.
LAYERS = tuple((layer.name, layer.modules) for layer in reversed(HOOK.layers_in(CONCEPTS)))

#: Copies of past schema versions, frozen on purpose: their size is history, not design.
FROZEN = ("alembic_ext/versions/",)
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 450


@dataclass(frozen=True)
class Edge:
    """One import: the importing module, the module imported, and where."""

    source: str
    target: str
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts)


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _modules() -> set[str]:
    return {_module_name(path) for path in _sources()}


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module ``name`` loads: itself, or its package's ``__init__``; None when outside."""
    if name in modules:
        return name
    if f"{name}.__init__" in modules:
        return f"{name}.__init__"
    return None


def _edges_of(path: Path, modules: set[str]) -> Iterator[Edge]:
    return edges_in(_module_name(path), path.read_text(), modules)


def edges_in(source: str, code: str, modules: set[str]) -> Iterator[Edge]:
    """The imports of module ``source`` (whose text is ``code``) that load one of ``modules``."""
    package = source.rsplit(".", 1)[0] if not source.endswith("__init__") else source[:-9]
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target is not None:
                    yield Edge(source, target, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # ``from pkg import sub`` loads the submodule when there is one.
                target = _resolve(f"{base}.{alias.name}", modules) or _resolve(base, modules)
                if target is not None and target != source:
                    yield Edge(source, target, node.lineno)


def all_edges() -> list[Edge]:
    """Every import between modules of the packages, lazy and TYPE_CHECKING ones included."""
    modules = _modules()
    return [edge for path in _sources() for edge in _edges_of(path, modules)]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming ``module``."""
    best: tuple[int, int] | None = None
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            named = module == prefix or module.startswith(prefix + ".")
            if named and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise AssertionError(f"{module} is in no layer; add it to LAYERS")
    return best[1]


def circles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    for module in sorted(_modules()):
        layer_of(module)


def test_no_import_climbs_a_layer() -> None:
    climbing = [
        f"{edge.source}:{edge.line} imports {edge.target} "
        f"({LAYERS[layer_of(edge.source)][0]} -> {LAYERS[layer_of(edge.target)][0]})"
        for edge in all_edges()
        if layer_of(edge.target) > layer_of(edge.source)
    ]
    assert climbing == []


def test_no_import_circles() -> None:
    assert circles(all_edges()) == []


def test_the_scan_sees_lazy_relative_and_type_checking_imports() -> None:
    modules = {"pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.__init__"}
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.b import x\n"
        "def f():\n    from pkg import c\n"
        "from . import d\n"
        "import pkg\n"
    )
    targets = [edge.target for edge in edges_in("pkg.a", code, modules)]
    assert sorted(targets) == ["pkg.__init__", "pkg.b", "pkg.c", "pkg.d"]


def test_circles_are_found() -> None:
    assert circles([Edge("a", "b", 1), Edge("b", "c", 1), Edge("c", "a", 1)]) == [["a", "b", "c"]]
    assert circles([Edge("a", "b", 1), Edge("b", "c", 1)]) == []


def _frozen(path: Path) -> bool:
    relative = path.relative_to(ROOT).as_posix()
    return any(relative.startswith(prefix) for prefix in FROZEN)


def test_no_module_is_over_600_lines() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): count
        for path in _sources()
        if not _frozen(path) and (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_class_is_over_450_lines() -> None:
    long: dict[str, int] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                span = node.end_lineno - node.lineno + 1
                if span > MAX_CLASS_LINES:
                    long[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = span
    assert long == {}


def _queue_class() -> ast.ClassDef:
    tree = ast.parse((ROOT / "sqla_queue" / "queue.py").read_text())
    return next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Queue"
    )


#: What ``Queue`` may import inside a method: extras that are optional to install.
OPTIONAL_EXTRAS = ("sqla_queue.dashboard",)

#: SQLAlchemy's statement constructors: their use in ``queue.py`` would be SQL in the façade.
SQL_CONSTRUCTORS = {"select", "insert", "update", "delete", "text", "func", "literal_column"}


def test_queue_methods_never_return_any() -> None:
    loose = [
        node.name
        for node in _queue_class().body
        if isinstance(node, ast.FunctionDef)
        and not node.name.startswith("_")
        and node.returns is not None
        and ast.unparse(node.returns) == "Any"
    ]
    assert loose == []


def test_queue_imports_inside_methods_only_optional_extras() -> None:
    lazy = [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(_queue_class())
        if isinstance(node, ast.Import | ast.ImportFrom)
        and not (
            isinstance(node, ast.ImportFrom)
            and node.module is not None
            and node.module.startswith(OPTIONAL_EXTRAS)
        )
    ]
    assert lazy == []


def test_queue_builds_no_sql() -> None:
    tree = ast.parse((ROOT / "sqla_queue" / "queue.py").read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and (node.module == "sqlalchemy" or node.module.startswith("sqla_queue.statements"))
        for alias in node.names
    }
    assert imported & SQL_CONSTRUCTORS == set()
    assert not any(
        isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.startswith("sqla_queue.statements")
        for node in ast.walk(tree)
    )


def test_the_docs_picture_shows_every_layer_and_file() -> None:
    svg = HOOK.on_page_markdown(CONCEPTS)
    assert "```layers" not in svg
    for name, modules in LAYERS:
        assert f">{name}</text>" in svg.replace("&#x27;", "'")
        for module in modules:
            assert HOOK._path_of(module) in svg
