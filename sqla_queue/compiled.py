"""Statements compiled once per dialect: the one compile cache of the library.

``Connection.execute`` of a Core statement looks its compiled form up in SQLAlchemy's
cache, then builds and processes the parameters, on every call. For the statements that
run thousands of times a second (a worker's claim and completions) or once per business
transaction (an enqueue), that was a third or more of the client CPU. Here a statement is
compiled once for a dialect, and the text, the values SQLAlchemy bound itself and the
conversions its types apply are kept (:class:`CompiledStatement`); each run then only
lines up the caller's values, in one of two forms:

- :meth:`CompiledStatement.params`: the driver's named parameters, for
  ``Connection.exec_driver_sql`` (the enqueue's fast path, see :mod:`sqla_queue.enqueue`),
  which sends exactly the text ``execute`` would have sent, with the same events and the
  same exception wrapping;
- :meth:`CompiledStatement.template`: the text with PostgreSQL's own ``$n`` placeholders,
  for psycopg's raw cursor (the worker's, see :mod:`sqla_queue.worker.raw`).

:class:`StatementCache` holds them for one dialect, by statement. This module does no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from sqla_queue.checks import is_whole_number

__all__ = [
    "CompiledStatement",
    "StatementCache",
    "Template",
    "compile_statement",
    "driver_statement_for",
]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_POSTCOMPILE = re.compile(r"__\[POSTCOMPILE_(\w+)\]")


@dataclass(frozen=True)
class Template:
    """A statement's ``$n`` text for one set of literal values, and its parameters in order."""

    sql: str
    names: tuple[str, ...]


class CompiledStatement:
    """One statement compiled for one dialect; a ``$n`` template per literal-execute value set.

    >>> from sqlalchemy import column, select, table, bindparam
    >>> from sqlalchemy.dialects import postgresql
    >>> t = table("jobs", column("id"))
    >>> stmt = select(t.c.id).where(t.c.id > bindparam("after")).limit(
    ...     bindparam("n", literal_execute=True))
    >>> compiled = compile_statement(stmt, postgresql.psycopg.dialect())
    >>> template = compiled.template({"after": 7, "n": 3})
    >>> " ".join(template.sql.split()), template.names
    ('SELECT jobs.id FROM jobs WHERE jobs.id > $1 LIMIT 3', ('after',))
    """

    __slots__ = (
        "defaults",
        "literal_names",
        "processed_defaults",
        "processors",
        "templates",
        "text",
    )

    def __init__(self, compiled: SQLCompiler) -> None:
        #: The SQL text, in the dialect's own (named) parameter style.
        self.text: str = str(compiled)
        #: Each bind's conversion on the way in (an ARRAY's, say), as ``execute`` applies it.
        self.processors: dict[str, Any] = dict(getattr(compiled, "_bind_processors", {}))
        #: Values SQLAlchemy bound itself (the notify channel, the ``1`` of ``attempt + 1``).
        #: A bind without a value (``bindparam("worker")``) is required from the caller.
        self.defaults: dict[str, Any] = {
            name: value
            for name, value in compiled.params.items()
            if not compiled.binds[name].required
        }
        #: :attr:`defaults` converted once, for :meth:`params`.
        self.processed_defaults: dict[str, Any] = {
            name: _processed(self.processors, name, value) for name, value in self.defaults.items()
        }
        #: The literal-execute parameters, rendered into the text by :meth:`template`.
        self.literal_names: tuple[str, ...] = tuple(dict.fromkeys(_POSTCOMPILE.findall(self.text)))
        #: The ``$n`` templates made so far, by literal values.
        self.templates: dict[tuple[int, ...], Template] = {}

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The driver's named parameters for one execution with the caller's ``values``."""
        params = dict(self.processed_defaults)
        for name, value in values.items():
            params[name] = _processed(self.processors, name, value)
        return params

    def template(self, params: Mapping[str, Any]) -> Template:
        """The ``$n`` text for the literal values in ``params``, made once per value set."""
        literals = tuple(_whole_number(name, params[name]) for name in self.literal_names)
        found = self.templates.get(literals)
        if found is None:
            values = dict(zip(self.literal_names, literals, strict=True))
            text = _POSTCOMPILE.sub(lambda m: str(values[m.group(1)]), self.text)
            names: list[str] = []
            for name in _PLACEHOLDER.findall(text):
                if name not in names:
                    names.append(name)

            def number(match: re.Match[str]) -> str:
                return f"${names.index(match.group(1)) + 1}"

            # psycopg would undo the %% escaping; the raw cursor sends the text as it is.
            sql = _PLACEHOLDER.sub(number, text).replace("%%", "%")
            found = Template(sql, tuple(names))
            self.templates[literals] = found
        return found


def _processed(processors: Mapping[str, Any], name: str, value: Any) -> Any:
    process = processors.get(name)
    return value if process is None or value is None else process(value)


def _whole_number(name: str, value: Any) -> int:
    # Only whole numbers are ever rendered into the text: nothing a caller passes can
    # change the statement's shape.
    if not is_whole_number(value):
        raise TypeError(f"{name} must be an int to be rendered into a statement, got {value!r}")
    return int(value)


def compile_statement(statement: ClauseElement, dialect: Dialect) -> CompiledStatement:
    """``statement`` compiled once for ``dialect``."""
    # Every statement the library runs compiles with the SQL compiler.
    return CompiledStatement(cast(SQLCompiler, statement.compile(dialect=dialect)))


def driver_statement_for(statement: ClauseElement, dialect: Dialect) -> CompiledStatement | None:
    """``statement`` compiled for ``dialect``'s ``exec_driver_sql``, or None where it must go
    through ``execute``.

    Only drivers that take parameters by name (psycopg, psycopg2) are served, and only a
    statement whose text is final once compiled (no parameter expanded at execution);
    anything else keeps SQLAlchemy's own execution.
    """
    if dialect.paramstyle not in ("pyformat", "named"):
        return None
    compiled = statement.compile(dialect=dialect)
    if not isinstance(compiled, SQLCompiler) or compiled.literal_execute_params:
        return None
    if compiled.post_compile_params:
        return None
    return CompiledStatement(compiled)


class StatementCache:
    """The statements compiled for one dialect, by statement: each is compiled once.

    A statement is looked up by identity and kept alive beside its id, so that the id
    cannot be reused by another statement while the entry exists.
    """

    __slots__ = ("_entries", "dialect")

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._entries: dict[int, tuple[ClauseElement, CompiledStatement]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, statement: ClauseElement) -> CompiledStatement:
        """``statement`` compiled for this cache's dialect (compiled on first use)."""
        entry = self._entries.get(id(statement))
        if entry is None or entry[0] is not statement:
            entry = (statement, compile_statement(statement, self.dialect))
            self._entries[id(statement)] = entry
        return entry[1]
