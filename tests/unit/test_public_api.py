"""The public API, pinned: every name that ``sqla_queue`` and ``alembic_ext`` export, with the
signatures of its functions, classes and their public methods, properties and attributes.

An accidental break (a renamed argument, a default changed, a method gone, a name no longer
exported) shows up as a diff of ``snapshots/public_api.txt`` in review. After an intended
change, regenerate it and commit the diff with the change::

    SQLA_QUEUE_UPDATE_SNAPSHOTS=1 python -m pytest tests/unit/test_public_api.py

The rendering is the same on every Python and SQLAlchemy of the version matrix: annotations
are the source's own text (every module uses ``from __future__ import annotations``), and
memory addresses are left out of default values.

The other tests keep private modules private: nothing exported is private or a module, and
no user-facing code (README, docs, examples) imports from a module whose name starts with
an underscore.
"""

from __future__ import annotations

import enum
import functools
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import alembic_ext
import sqla_queue

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).parent / "snapshots" / "public_api.txt"
PACKAGES = (sqla_queue, alembic_ext)
_OURS = ("sqla_queue", "alembic_ext")
# Dunder methods that are part of a class's API (``__init__`` is the class's own signature).
_PUBLIC_DUNDERS = frozenset(
    {
        "__call__",
        "__enter__",
        "__exit__",
        "__aenter__",
        "__aexit__",
        "__iter__",
        "__aiter__",
        "__len__",
        "__getitem__",
        "__contains__",
        "__bool__",
        "__await__",
    }
)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_HEADER = """\
# The public API of sqla_queue and alembic_ext, pinned by tests/unit/test_public_api.py.
# A diff here is an API change: check it is intended, then regenerate with
#   SQLA_QUEUE_UPDATE_SNAPSHOTS=1 python -m pytest tests/unit/test_public_api.py
"""


def _ours(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in _OURS


def _annotation(value: object) -> str:
    if value is inspect.Parameter.empty:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, typing.ForwardRef):
        return value.__forward_arg__
    return inspect.formatannotation(value)


def _value(value: object) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return _ADDRESS.sub("", repr(value))


def _parameter(parameter: inspect.Parameter) -> str:
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    text = stars.get(parameter.kind, "") + parameter.name
    annotation = _annotation(parameter.annotation)
    if annotation:
        text += f": {annotation}"
    if parameter.default is not inspect.Parameter.empty:
        text += f" = {_value(parameter.default)}" if annotation else f"={_value(parameter.default)}"
    return text


def _signature(obj: Callable[..., Any]) -> str:
    """``(a: int, /, b: str = 'x', *, c: bool = False) -> None``, annotations as written."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    rendered: list[str] = []
    positional_only = False
    keyword_only_marker = True
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional_only = True
        elif positional_only:
            rendered.append("/")
            positional_only = False
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            keyword_only_marker = False
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY and keyword_only_marker:
            rendered.append("*")
            keyword_only_marker = False
        rendered.append(_parameter(parameter))
    if positional_only:
        rendered.append("/")
    text = f"({', '.join(rendered)})"
    returns = _annotation(signature.return_annotation)
    return f"{text} -> {returns}" if returns else text


def _overloads(function: Callable[..., Any]) -> list[str]:
    return [_signature(overload) for overload in typing.get_overloads(function)]


def _function_lines(prefix: str, name: str, function: Callable[..., Any]) -> list[str]:
    lines = [f"{prefix}{name}{_signature(function)}"]
    lines += [f"{prefix}{name}{overload}  [overload]" for overload in _overloads(function)]
    return lines


def _members(cls: type) -> dict[str, tuple[type, object]]:
    """The class's public members, from itself and its bases in this project, by name."""
    members: dict[str, tuple[type, object]] = {}
    for klass in reversed(cls.__mro__):
        if not _ours(klass):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") and name not in _PUBLIC_DUNDERS:
                continue
            members[name] = (klass, value)
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if not name.startswith("_") and name not in members:
                members[name] = (klass, _Annotated(annotation))
    return members


class _Annotated(typing.NamedTuple):
    annotation: object


def _member_lines(cls: type, name: str, owner: type, value: object) -> list[str]:
    indent = "    "
    if isinstance(value, _Annotated):
        return [f"{indent}{name}: {_annotation(value.annotation)}"]
    if isinstance(value, staticmethod):
        return _function_lines(f"{indent}staticmethod ", name, value.__func__)
    if isinstance(value, classmethod):
        return _function_lines(f"{indent}classmethod ", name, getattr(cls, name))
    if isinstance(value, property):
        returns = _annotation(inspect.signature(value.fget).return_annotation) if value.fget else ""
        kind = "property" if value.fset is None else "property (settable)"
        return [f"{indent}{kind} {name} -> {returns}"]
    if isinstance(value, functools.cached_property):
        returns = _annotation(inspect.signature(value.func).return_annotation)
        return [f"{indent}cached_property {name} -> {returns}"]
    if isinstance(value, types.FunctionType):
        return _function_lines(f"{indent}def ", name, value)
    annotation = _annotation(vars(owner).get("__annotations__", {}).get(name, ""))
    typed = f": {annotation}" if annotation else ""
    return [f"{indent}{name}{typed} = {_value(value)}"]


def _class_lines(name: str, cls: type) -> list[str]:
    bases = ", ".join(base.__name__ for base in cls.__bases__ if base is not object)
    lines = [f"class {name}({bases})" if bases else f"class {name}"]
    if "__init__" in vars(cls) or "__new__" in vars(cls) or _ours(cls.__init__):
        lines.append(f"    {name}{_signature(cls)}")
    members = _members(cls)
    for member in sorted(members):
        owner, value = members[member]
        lines += _member_lines(cls, member, owner, value)
    return lines


def _export_lines(package: types.ModuleType, name: str) -> list[str]:
    qualified = f"{package.__name__}.{name}"
    value = getattr(package, name)
    if isinstance(value, type):
        return _class_lines(qualified, value)
    if callable(value):
        return _function_lines("def ", qualified, value)
    if isinstance(value, int) and not isinstance(value, bool):
        return [f"{qualified}: int = {value}"]
    return [f"{qualified}: {type(value).__name__}"]


def render_public_api() -> str:
    """The snapshot's text: every exported name of both packages, with its signatures."""
    lines = [_HEADER]
    for package in PACKAGES:
        lines.append(f"[{package.__name__}]  __all__ = {sorted(package.__all__)}")
        for name in sorted(package.__all__):
            lines += _export_lines(package, name)
        lines.append("")
    return "\n".join(lines)


def test_public_api_matches_snapshot() -> None:
    """Any change to the public API shows up here as a diff to review.

    Regenerate with SQLA_QUEUE_UPDATE_SNAPSHOTS=1 after checking the change is intended.
    """
    text = render_public_api()
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text()


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_names_exist_once_and_are_not_private(package: types.ModuleType) -> None:
    names = list(package.__all__)
    assert len(names) == len(set(names)), "a name is listed twice in __all__"
    for name in names:
        assert hasattr(package, name), f"{package.__name__}.__all__ lists {name!r}, not defined"
        assert not name.startswith("_") or name == "__version__", f"{name!r} is private"
        assert not isinstance(getattr(package, name), types.ModuleType), (
            f"{package.__name__}.{name} is a module: export its names instead"
        )


def _imports_of_private_modules(text: str) -> Iterator[str]:
    pattern = re.compile(
        r"^\s*(?:from|import)\s+((?:sqla_queue|alembic_ext)(?:\.\w+)*)", re.MULTILINE
    )
    for match in pattern.finditer(text):
        if any(part.startswith("_") for part in match.group(1).split(".")[1:]):
            yield match.group(0).strip()


def _user_facing_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "examples").rglob("*.py"))
    return [path for path in files if path.is_file()]


def test_user_facing_code_imports_no_private_module() -> None:
    """README, docs and examples show only the public modules: users copy what they see."""
    found = {
        str(path.relative_to(ROOT)): list(_imports_of_private_modules(path.read_text()))
        for path in _user_facing_files()
    }
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_private_import_finder_finds_them() -> None:
    sample = (
        "from sqla_queue._binds import x\nimport alembic_ext._registration\nimport sqla_queue\n"
    )
    assert list(_imports_of_private_modules(sample)) == [
        "from sqla_queue._binds",
        "import alembic_ext._registration",
    ]


def test_the_reference_documents_no_private_module() -> None:
    """mkdocstrings pages (``::: module``) name public modules only."""
    directives = re.compile(r"^:::\s*(\S+)", re.MULTILINE)
    private = [
        f"{path.relative_to(ROOT)}: {target}"
        for path in sorted((ROOT / "docs").rglob("*.md"))
        for target in directives.findall(path.read_text())
        if any(part.startswith("_") for part in target.split("."))
    ]
    assert private == []
