"""Schema version 3, frozen: version 2 followed by the frozen step to version 3."""

from __future__ import annotations

from alembic_ext.versions import v2, v2_to_v3

__all__ = ["TABLES", "VERSION", "create_statements", "drop_statements"]

VERSION = 3

#: The tables of this version, by the suffix that follows the prefix.
TABLES = v2.TABLES


def create_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that create schema version 3 (and its schema, if named and absent)."""
    return v2.create_statements(schema, prefix) + v2_to_v3.upgrade_statements(schema, prefix)


def drop_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that drop schema version 3 (the same tables as version 2)."""
    return v2.drop_statements(schema, prefix)
