"""Schema version 6, frozen: version 5 followed by the frozen step to version 6."""

from __future__ import annotations

from alembic_ext.versions import v5, v5_to_v6
from alembic_ext.versions._names import Names

__all__ = ["TABLES", "VERSION", "create_statements", "drop_statements"]

VERSION = 6

#: The tables of this version, by the suffix that follows the prefix.
TABLES = (*v5.TABLES, "workflows", "workflow_nodes", "workflow_edges")

_DROP = (
    "DROP TABLE {workflow_edges}",
    "DROP TABLE {workflow_nodes}",
    "DROP TABLE {workflows}",
)


def create_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that create schema version 6 (and its schema, if named and absent)."""
    return v5.create_statements(schema, prefix) + v5_to_v6.upgrade_statements(schema, prefix)


def drop_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that drop schema version 6: its own tables, then version 5's."""
    names = Names(schema, prefix, frozenset({"workflow_edges", "workflow_nodes", "workflows"}))
    return [names.render(sql) for sql in _DROP] + v5.drop_statements(schema, prefix)
