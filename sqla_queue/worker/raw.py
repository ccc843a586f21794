"""The worker's statements in PostgreSQL's own ``$n`` form, for psycopg's raw cursors.

A worker runs a handful of statements thousands of times a second. Through
``Connection.execute`` each run costs SQLAlchemy's execution machinery, and psycopg then
re-parses the ``%(name)s`` placeholders of any statement longer than 4 KB (the slot-aware
claim is). Measured on the development machine (bench/levers.py), that was more client CPU
per claim than the rest of the claim put together.

Here each statement is compiled once with the connection's dialect and its placeholders
numbered once (by the library's one compile cache, :mod:`sqla_queue.compiled`), and each
run only lines up the values. The faces execute the result on the
driver connection with a raw cursor, which sends the text as it is. Only psycopg is served;
with any other driver the faces run the statements through SQLAlchemy as before. This
module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

from sqla_queue.compiled import StatementCache

__all__ = [
    "RawStatements",
    "RenderedStatement",
    "driver_error",
    "raw_statements_for",
    "supports_raw",
    "unit_statement",
]


def supports_raw(dialect: Dialect) -> bool:
    """Whether the worker can run its statements on this dialect's driver directly."""
    return dialect.name == "postgresql" and dialect.driver == "psycopg"


def raw_statements_for(
    dialect: Dialect, *, enabled: bool, execution_options: Mapping[str, Any]
) -> RawStatements | None:
    """The renderer a worker face uses, or None to run statements through SQLAlchemy.

    An engine with a ``schema_translate_map`` (a tenant's) keeps SQLAlchemy's execution,
    which applies the map; the raw text is compiled once, without it.
    """
    if "schema_translate_map" in execution_options:
        return None
    return RawStatements(dialect) if enabled and supports_raw(dialect) else None


@dataclass(frozen=True)
class RenderedStatement:
    """One statement ready for a raw cursor: ``$n`` text and the values in order."""

    sql: str
    args: list[Any]


_BEGIN = RenderedStatement("BEGIN", [])
_COMMIT = RenderedStatement("COMMIT", [])


class RawStatements:
    """Renders the worker's statements for one dialect, each compiled once.

    >>> from sqlalchemy import column, select, table, bindparam
    >>> from sqlalchemy.dialects import postgresql
    >>> t = table("jobs", column("id"))
    >>> stmt = select(t.c.id).where(t.c.id > bindparam("after")).limit(
    ...     bindparam("n", literal_execute=True))
    >>> r = RawStatements(postgresql.psycopg.dialect()).render(stmt, {"after": 7, "n": 3})
    >>> " ".join(r.sql.split())
    'SELECT jobs.id FROM jobs WHERE jobs.id > $1 LIMIT 3'
    >>> r.args
    [7]
    """

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled = StatementCache(dialect)
        # Imported here: psycopg is an optional driver, and only its dialect gets here.
        from psycopg import Pipeline

        #: Whether the libpq under psycopg has pipeline mode (libpq 14 and later).
        self.pipeline_supported = bool(Pipeline.is_supported())

    def render(self, statement: Any, params: Mapping[str, Any]) -> RenderedStatement:
        """``statement`` with ``params`` as ``$n`` text and positional values."""
        compiled = self._compiled.get(statement)
        template = compiled.template(params)
        values = {**compiled.defaults, **params}
        processors = compiled.processors
        args: list[Any] = []
        for name in template.names:
            try:
                value = values[name]
            except KeyError:
                raise KeyError(f"missing statement parameter {name!r}") from None
            process = processors.get(name)
            args.append(value if process is None or value is None else process(value))
        return RenderedStatement(template.sql, args)

    def render_steps(
        self,
        steps: Sequence[tuple[Any, Mapping[str, Any]]],
        *,
        atomic: bool,
        commit: bool = True,
    ) -> list[tuple[RenderedStatement, bool]]:
        """Every statement of a unit of work, each with whether its rows are wanted.

        An ``atomic`` unit is wrapped in BEGIN and COMMIT, whose rows nobody wants; without
        ``commit``, the face sends the COMMIT itself, after what follows the steps.
        """
        rendered = [(self.render(stmt, params), True) for stmt, params in steps]
        if atomic:
            return [(_BEGIN, False), *rendered, *([(_COMMIT, False)] if commit else [])]
        return rendered

    def sends_together(self, steps: Sequence[object], *, atomic: bool) -> bool:
        """Whether a unit's rendered ``steps`` go to the server in one pipeline.

        Only an atomic unit of several statements does: BEGIN, the statements and COMMIT
        in one round trip. The statements of a unit that is not atomic each commit on their
        own, which a pipeline (one implicit transaction up to its sync) would change.
        """
        return atomic and len(steps) > 1 and self.pipeline_supported


def unit_statement(steps: Sequence[tuple[RenderedStatement, bool]]) -> RenderedStatement:
    """The statements of a unit sent together, as one, to name in an error any of them raised.

    A unit of several statements goes to the server in psycopg's pipeline mode: all of
    them in one round trip, their results read after. An error then surfaces for the unit
    rather than at the statement that caused it; its SQLSTATE and constraint still tell
    what happened.
    """
    return RenderedStatement(
        ";\n".join(rendered.sql for rendered, _ in steps),
        [arg for rendered, _ in steps for arg in rendered.args],
    )


def driver_error(
    exc: BaseException, rendered: RenderedStatement, dialect: Dialect
) -> BaseException:
    """``exc``, raised by the driver, as the SQLAlchemy error ``Connection.execute`` raises.

    The faces then treat a raw statement's failure exactly like any other: the same
    ``DBAPIError`` handling, the same SQLSTATE reading.
    """
    return DBAPIError.instance(
        rendered.sql,
        rendered.args,
        exc,
        dialect.loaded_dbapi.Error,
        dialect=dialect,
    )
