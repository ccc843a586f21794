"""A table's PostgreSQL storage parameters, on SQLAlchemy 2.0 and 2.1 alike.

SQLAlchemy 2.1 takes them as the ``postgresql_with`` keyword of ``Table`` and renders them
inside ``CREATE TABLE ... WITH (...)``. SQLAlchemy 2.0 does not know that keyword (it refuses
the table), so there the table gets an ``ALTER TABLE ... SET (...)`` that runs right after
its ``CREATE TABLE``, in the same transaction, whenever ``metadata.create_all`` (and so
``queue.create_all``) creates it. Both leave the same ``reloptions`` in the catalog, which is
what the frozen migrations of ``alembic_ext`` create and what the migration tests compare.

One difference remains visible, and only to code that compiles ``CreateTable`` by hand: on
2.0 its text has no ``WITH`` clause (the parameters come from the event, not the statement).

This module is the only place that knows which SQLAlchemy is installed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sqlalchemy import DDL, Table, event
from sqlalchemy.dialects.postgresql.base import PGDialect

__all__ = ["TABLE_WITH_KEYWORD", "set_storage_parameters"]

#: Whether the installed SQLAlchemy accepts ``postgresql_with`` on a ``Table`` (2.1 and
#: later); detected from the dialect's declared arguments rather than a version number.
TABLE_WITH_KEYWORD = "with" in dict(PGDialect.construct_arguments or ()).get(Table, {})

# A parameter is a plain lower-case name (fillfactor, autovacuum_vacuum_scale_factor,
# toast.autovacuum_enabled) and its value a number or a word: nothing that needs quoting.
_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")
_VALUE = re.compile(r"^[A-Za-z0-9_.]+$")


def _rendered(parameters: Mapping[str, str]) -> str:
    for name, value in parameters.items():
        if not _NAME.match(name) or not _VALUE.match(value):
            raise ValueError(f"not a plain storage parameter: {name} = {value!r}")
    return ", ".join(f"{name} = {value}" for name, value in parameters.items())


def set_storage_parameters(table: Table, parameters: Mapping[str, str]) -> None:
    """Give ``table`` the storage parameters ``parameters`` (e.g. ``{"fillfactor": "70"}``).

    Call it once, right after the ``Table`` is built. On SQLAlchemy 2.1 it sets the
    ``postgresql_with`` option; on 2.0 it attaches an ``after_create`` DDL for PostgreSQL.
    ``Table.to_metadata`` copies either. Raises :class:`ValueError` for a name or value that
    is not a plain word or number.
    """
    rendered = _rendered(parameters)
    if not parameters:
        return
    if TABLE_WITH_KEYWORD:
        table.dialect_kwargs["postgresql_with"] = dict(parameters)
        return
    # %(fullname)s is the table's quoted, schema-qualified name, as the connection's
    # schema_translate_map (if any) maps it.
    statement = f"ALTER TABLE %(fullname)s SET ({rendered})"
    ddl = DDL(statement).execute_if(dialect="postgresql")  # type: ignore[no-untyped-call,unused-ignore]
    # propagate: Table.to_metadata copies only the listeners registered with it.
    event.listen(table, "after_create", ddl, propagate=True)
