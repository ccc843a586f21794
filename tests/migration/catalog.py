"""A catalog snapshot of a set of schemas, for proving two databases hold the same schema.

Everything is read back from PostgreSQL's catalogs in PostgreSQL's own words
(``format_type``, ``pg_get_expr``, ``pg_get_indexdef``, ``pg_get_constraintdef``), so two
schemas built by different DDL text compare equal exactly when PostgreSQL sees no difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, text

_QUERIES: dict[str, str] = {
    "relations": """
        SELECT n.nspname, c.relname, c.relkind::text, c.relpersistence::text,
               coalesce(array_to_string(c.reloptions, ','), ''),
               coalesce(obj_description(c.oid, 'pg_class'), '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(:schemas)
    """,
    "columns": """
        SELECT n.nspname, c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), ''),
               a.attidentity::text, a.attgenerated::text,
               coalesce(col_description(c.oid, a.attnum), '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = ANY(:schemas) AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relkind IN ('r', 'p', 'v', 'm')
    """,
    "indexes": """
        SELECT n.nspname, t.relname, i.relname, pg_get_indexdef(x.indexrelid),
               x.indisprimary, x.indisunique
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class t ON t.oid = x.indrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = ANY(:schemas)
    """,
    "constraints": """
        SELECT n.nspname, coalesce(t.relname, ''), con.conname, con.contype::text,
               pg_get_constraintdef(con.oid), con.condeferrable, con.condeferred
        FROM pg_constraint con
        JOIN pg_namespace n ON n.oid = con.connamespace
        LEFT JOIN pg_class t ON t.oid = con.conrelid
        WHERE n.nspname = ANY(:schemas)
    """,
    "sequences": """
        SELECT n.nspname, c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
               s.seqmax, s.seqmin, s.seqcache, s.seqcycle
        FROM pg_sequence s
        JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(:schemas)
    """,
    "functions": """
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
               md5(pg_get_functiondef(p.oid))
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = ANY(:schemas) AND p.prokind IN ('f', 'p')
    """,
    "triggers": """
        SELECT n.nspname, c.relname, tg.tgname, pg_get_triggerdef(tg.oid)
        FROM pg_trigger tg
        JOIN pg_class c ON c.oid = tg.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(:schemas) AND NOT tg.tgisinternal
    """,
    "types": """
        SELECT n.nspname, t.typname, t.typtype::text
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = ANY(:schemas) AND t.typtype IN ('e', 'd', 'r', 'm')
    """,
}

Snapshot = dict[str, list[tuple[Any, ...]]]


def snapshot(connection: Connection, schemas: Sequence[str]) -> Snapshot:
    """Every table, column, index, constraint, sequence, function, trigger and type in
    ``schemas``, with definitions as PostgreSQL prints them."""
    return {
        kind: sorted(
            tuple(row) for row in connection.execute(text(sql), {"schemas": list(schemas)})
        )
        for kind, sql in _QUERIES.items()
    }


def without(shot: Snapshot, tables: Sequence[str]) -> Snapshot:
    """``shot`` minus the rows of the named tables (and the relations named so)."""
    drop = set(tables)
    return {
        kind: [row for row in rows if not (len(row) > 1 and row[1] in drop)]
        for kind, rows in shot.items()
    }


def differences(left: Snapshot, right: Snapshot) -> list[str]:
    """Human-readable lines, one per row present on one side only; empty when equal."""
    lines: list[str] = []
    for kind in sorted(set(left) | set(right)):
        a, b = set(left.get(kind, [])), set(right.get(kind, []))
        lines += [f"{kind}: only left:  {row}" for row in sorted(a - b, key=repr)]
        lines += [f"{kind}: only right: {row}" for row in sorted(b - a, key=repr)]
    return lines


def queue_objects(connection: Connection, prefix: str) -> list[tuple[str, str, str]]:
    """Any relation, type or function, in any schema, whose name starts with ``prefix``."""
    rows = connection.execute(
        text(
            """
            SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE starts_with(c.relname, :prefix)
            UNION ALL
            SELECT n.nspname, t.typname, 'type' FROM pg_type t
            JOIN pg_namespace n ON n.oid = t.typnamespace
            WHERE starts_with(t.typname, :prefix) OR starts_with(t.typname, '_' || :prefix)
            UNION ALL
            SELECT n.nspname, p.proname, 'function' FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE starts_with(p.proname, :prefix)
            """
        ),
        {"prefix": prefix},
    )
    return sorted((str(a), str(b), str(c)) for a, b, c in rows)


def without_column_order(shot: Snapshot) -> Snapshot:
    """``shot`` with column positions dropped: an upgrade appends columns a create may not."""
    columns = [row[:2] + row[3:] for row in shot.get("columns", [])]
    return {**shot, "columns": sorted(columns)}
