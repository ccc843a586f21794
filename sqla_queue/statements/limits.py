"""Concurrency limits stored in the database, shared by every worker.

Each builder has a ``TypedDict`` next to it naming its parameters (a unit test checks them
against the compiled statement's bound names).
"""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import Delete, Integer, Select, Text, any_, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert

from sqla_queue.models.tables import QueueTables

__all__ = [
    "DeleteLimitParams",
    "LimitedTasksParams",
    "SetLimitParams",
    "delete_limit_statement",
    "limited_tasks_statement",
    "set_limit_statement",
    "stored_limits_statement",
]


class SetLimitParams(TypedDict):
    """Parameters of :func:`set_limit_statement`."""

    task: str
    #: The limit to store (at least 1; the table's check constraint says so too).
    concurrency_limit: int


class DeleteLimitParams(TypedDict):
    """Parameters of :func:`delete_limit_statement`."""

    task: str


class LimitedTasksParams(TypedDict):
    """Parameters of :func:`limited_tasks_statement`."""

    #: The task names to look up (``text[]``).
    tasks: list[str]


def set_limit_statement(tables: QueueTables) -> Insert:
    """Store ``concurrency_limit`` for ``task``, replacing any stored value.

    Parameters: :class:`SetLimitParams`.
    """
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
    """Remove the stored limit of ``task``: the value declared in code applies again.

    Parameters: :class:`DeleteLimitParams`.
    """
    return delete(tables.limits).where(tables.limits.c.task == bindparam("task", type_=Text))


def limited_tasks_statement(tables: QueueTables) -> Select[str]:
    """Which of ``tasks`` (text[]) have a stored limit. Parameters: :class:`LimitedTasksParams`."""
    limits = tables.limits
    return select(limits.c.task).where(limits.c.task == any_(bindparam("tasks", type_=ARRAY(Text))))


def stored_limits_statement(tables: QueueTables) -> Select[str, int]:
    """Every stored limit, as ``(task, concurrency_limit)`` rows. No parameters."""
    limits = tables.limits
    return select(limits.c.task, limits.c.concurrency_limit)
