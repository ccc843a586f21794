"""Schema version 4, frozen: version 3 followed by the frozen step to version 4."""

from __future__ import annotations

from alembic_ext.versions import v3, v3_to_v4
from alembic_ext.versions._names import Names

__all__ = ["TABLES", "VERSION", "create_statements", "drop_statements"]

VERSION = 4

#: The tables of this version, by the suffix that follows the prefix.
TABLES = (*v3.TABLES, "unique_keys")

_DROP_UNIQUE_KEYS = "DROP TABLE {unique_keys}"


def create_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that create schema version 4 (and its schema, if named and absent)."""
    return v3.create_statements(schema, prefix) + v3_to_v4.upgrade_statements(schema, prefix)


def drop_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that drop schema version 4: its own table, then version 3's."""
    names = Names(schema, prefix, frozenset({"unique_keys"}))
    return [names.render(_DROP_UNIQUE_KEYS), *v3.drop_statements(schema, prefix)]
