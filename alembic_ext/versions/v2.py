"""Schema version 2, frozen: version 1 followed by the frozen step to version 2.

Defining a fresh install as "the previous version, then the step" keeps one copy of every
statement, and it guarantees that a fresh install and an upgraded one are the same schema.
"""

from __future__ import annotations

from alembic_ext.versions import v1, v1_to_v2
from alembic_ext.versions._names import Names

__all__ = ["TABLES", "VERSION", "create_statements", "drop_statements"]

VERSION = 2

#: The tables of this version, by the suffix that follows the prefix.
TABLES = (*v1.TABLES, "task_limits")

_DROP_LIMITS = "DROP TABLE {task_limits}"


def create_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that create schema version 2 (and its schema, if named and absent)."""
    return v1.create_statements(schema, prefix) + v1_to_v2.upgrade_statements(schema, prefix)


def drop_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that drop schema version 2."""
    names = Names(schema, prefix, frozenset({"task_limits"}))
    return [names.render(_DROP_LIMITS), *v1.drop_statements(schema, prefix)]
