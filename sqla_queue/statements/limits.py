"""Concurrency limits stored in the database, shared by every worker."""

from __future__ import annotations

from sqlalchemy import Delete, Integer, Select, Text, any_, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert

from sqla_queue.models.tables import QueueTables

__all__ = ["delete_limit_statement", "limited_tasks_statement", "set_limit_statement"]


def set_limit_statement(tables: QueueTables) -> Insert:
    """Store ``concurrency_limit`` for ``task``, replacing any stored value."""
    limits = tables.limits
    stmt = insert(limits).values(
        task=bindparam("task", type_=Text),
        concurrency_limit=bindparam("concurrency_limit", type_=Integer),
    )
    return stmt.on_conflict_do_update(
        index_elements=[limits.c.task],
        set_={"concurrency_limit": stmt.excluded.concurrency_limit, "updated_at": func.now()},
    )


def delete_limit_statement(tables: QueueTables) -> Delete:
    """Remove the stored limit of ``task``: the value declared in code applies again."""
    return delete(tables.limits).where(tables.limits.c.task == bindparam("task", type_=Text))


def limited_tasks_statement(tables: QueueTables) -> Select[str]:
    """Which of ``tasks`` (text[]) have a stored limit."""
    limits = tables.limits
    return select(limits.c.task).where(limits.c.task == any_(bindparam("tasks", type_=ARRAY(Text))))
