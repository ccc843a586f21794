"""Schema version 5, frozen: version 4 followed by the frozen step to version 5."""

from __future__ import annotations

from alembic_ext.versions import v4, v4_to_v5
from alembic_ext.versions._names import Names

__all__ = ["TABLES", "VERSION", "create_statements", "drop_statements"]

VERSION = 5

#: The tables of this version, by the suffix that follows the prefix.
TABLES = (*v4.TABLES, "task_controls", "rate_starts", "schedules", "daemons", "workers")

_DROP = (
    "DROP TABLE {workers}",
    "DROP TABLE {daemons}",
    "DROP TABLE {schedules}",
    "DROP TABLE {rate_starts}",
    "DROP TABLE {task_controls}",
)


def create_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that create schema version 5 (and its schema, if named and absent)."""
    return v4.create_statements(schema, prefix) + v4_to_v5.upgrade_statements(schema, prefix)


def drop_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that drop schema version 5: its own tables, then version 4's."""
    names = Names(
        schema,
        prefix,
        frozenset({"workers", "daemons", "schedules", "rate_starts", "task_controls"}),
    )
    return [names.render(sql) for sql in _DROP] + v4.drop_statements(schema, prefix)
