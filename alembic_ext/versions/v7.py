"""Schema version 7, frozen: version 6 followed by the frozen step to version 7."""

from __future__ import annotations

from alembic_ext.versions import v6, v6_to_v7
from alembic_ext.versions._names import Names

__all__ = ["TABLES", "VERSION", "create_statements", "drop_statements"]

VERSION = 7

#: The tables of this version, by the suffix that follows the prefix.
TABLES = (*v6.TABLES, "job_steps", "job_signals")

_DROP = (
    "DROP TABLE {job_signals}",
    "DROP TABLE {job_steps}",
)


def create_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that create schema version 7 (and its schema, if named and absent)."""
    return v6.create_statements(schema, prefix) + v6_to_v7.upgrade_statements(schema, prefix)


def drop_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that drop schema version 7: its own tables, then version 6's."""
    names = Names(schema, prefix, frozenset({"job_signals", "job_steps"}))
    return [names.render(sql) for sql in _DROP] + v6.drop_statements(schema, prefix)
