"""Startup verification: one catalog query, and a clear refusal when anything is missing."""

from __future__ import annotations

import re

from sqlalchemy import Connection, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from sqla_queue.errors import SchemaMismatchError
from sqla_queue.models.tables import SCHEMA_VERSION, QueueTables
from sqla_queue.schema.manifest import RequiredObject, required_objects

__all__ = ["CATALOG_QUERY", "find_missing", "verify_schema"]

FIX_COMMAND = "alembic upgrade head"

# One round trip for everything: tables, columns, indexes, constraints and the version
# comment, restricted to the queue's own tables in its schema.
CATALOG_QUERY = text(
    """
    WITH t AS (
        SELECT c.oid, c.relname
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = coalesce(:schema, current_schema())
          AND c.relkind IN ('r', 'p')
          AND c.relname = ANY(:tables)
    )
    SELECT 'table' AS kind, t.relname AS tbl, t.relname AS name FROM t
    UNION ALL
    SELECT 'column', t.relname, a.attname::text
    FROM t JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid
    WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'index', t.relname, i.relname::text
    FROM t JOIN pg_catalog.pg_index x ON x.indrelid = t.oid
    JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
    UNION ALL
    SELECT 'constraint', t.relname, con.conname::text
    FROM t JOIN pg_catalog.pg_constraint con ON con.conrelid = t.oid
    UNION ALL
    SELECT 'comment', t.relname, obj_description(t.oid, 'pg_class') FROM t
    """
).bindparams(
    bindparam("schema", type_=Text),
    bindparam("tables", type_=ARRAY(Text)),
)

_VERSION = re.compile(r"sqla_queue schema version (\d+)")


def find_missing(
    connection: Connection, tables: QueueTables
) -> tuple[list[RequiredObject], int | None]:
    """The required objects absent from the database, and the database's schema version.

    The version is read from the comment on the executions table; ``None`` means no queue
    tables were found at all.
    """
    required = required_objects(tables)
    names = sorted({tables.jobs.name, tables.executions.name})
    rows = connection.execute(CATALOG_QUERY, {"schema": tables.schema, "tables": names}).all()
    present = {(kind, tbl, name) for kind, tbl, name in rows if kind != "comment"}
    version: int | None = None
    for kind, tbl, name in rows:
        if kind == "comment" and tbl == tables.executions.name and name:
            match = _VERSION.search(name)
            version = int(match.group(1)) if match else 0
    if version is None and ("table", tables.executions.name, tables.executions.name) in present:
        version = 0
    missing = [obj for obj in required if (obj.kind, obj.table, obj.name) not in present]
    return missing, version


def verify_schema(connection: Connection, tables: QueueTables) -> None:
    """Raise :class:`SchemaMismatchError` unless every required object exists."""
    missing, version = find_missing(connection, tables)
    if not missing:
        return
    found = "no queue tables" if version is None else f"schema version {version}"
    listing = "\n".join(f"  - {obj.describe(tables.schema)}" for obj in missing)
    raise SchemaMismatchError(
        f"sqla_queue cannot run: the database has {found}, this library needs schema "
        f"version {SCHEMA_VERSION}. Missing ({len(missing)}):\n{listing}\n"
        f"Fix: run `{FIX_COMMAND}` (or queue.create_all(connection) on a database "
        "without Alembic).",
        [obj.describe(tables.schema) for obj in missing],
    )
