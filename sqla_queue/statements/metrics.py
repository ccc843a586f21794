"""The scrape-time query: pending, running and oldest due age per task, each walk bounded.

A metrics scrape comes every few seconds from every replica, whatever the queue's backlog,
so the query must cost the same for ten pending jobs as for ten million. Per task of the
``tasks`` parameter it makes four index walks, each stopped after ``cap`` entries:

- pending executions without a seat, in ``task_claim_ix`` (the claim's own index), and
  with one (reclaimed jobs of limited tasks), in ``seated_ix``: counted up to ``cap`` each;
- running executions of the task, up to ``cap`` (running rows are few: at most the
  workers' total concurrency);
- the oldest due time among the first ``cap`` seatless pending entries in claim order
  (priority, then due time): exact when the task's backlog uses one priority or is
  shorter than ``cap``, else the oldest of the highest priorities.

So a count that reads ``cap`` means "at least ``cap``". The statement runs after the
worker's planner guard (no sequential or bitmap scans, no sorts), so stale statistics
cannot turn a walk into a scan of the table, and under a ``statement_timeout``.

:func:`statement_timeout_statement` sets that timeout, in the scrape's own transaction.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import Integer, Select, Text, bindparam, func, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING, RUNNING

__all__ = ["QueueStatsParams", "queue_stats_statement", "statement_timeout_statement"]


class QueueStatsParams(TypedDict):
    """Parameters of :func:`queue_stats_statement`."""

    #: The task names to report.
    tasks: list[str]
    #: Entries each walk reads at most (rendered into the text: LIMIT needs a constant
    #: for the planner to cost the walk as short).
    cap: int


def queue_stats_statement(tables: QueueTables) -> Select[Any]:
    """``(task, pending, running, oldest_due_age)`` for each task of ``tasks``.

    ``oldest_due_age`` is in seconds on the database clock, NULL when nothing of the
    task is due.
    """
    ex = tables.executions
    names = (
        func.unnest(bindparam("tasks", type_=ARRAY(Text)))
        .table_valued("task")
        .render_derived(name="t")
    )
    cap = bindparam("cap", type_=Integer, literal_execute=True)
    pending = ex.c.state == PENDING

    def capped_count(*where: Any) -> Any:
        walk = (
            select(literal_column("1").label("one"))
            .where(ex.c.task == names.c.task, *where)
            .limit(cap)
            .correlate(names)
            .subquery()
        )
        return select(func.count()).select_from(walk).scalar_subquery()

    fresh = (
        select(ex.c.execute_at)
        .where(ex.c.task == names.c.task, pending, ex.c.slot.is_(None))
        .order_by(ex.c.priority.desc(), ex.c.execute_at, ex.c.id)
        .limit(cap)
        .correlate(names)
        .subquery("fresh")
    )
    oldest = (
        select(func.min(fresh.c.execute_at))
        .where(fresh.c.execute_at <= func.now())
        .scalar_subquery()
    )
    return select(
        names.c.task.label("task"),
        (
            capped_count(pending, ex.c.slot.is_(None))
            + capped_count(pending, ex.c.slot.is_not(None))
        ).label("pending"),
        capped_count(ex.c.state == RUNNING).label("running"),
        func.extract("epoch", func.now() - oldest).label("oldest_due_age"),
    ).select_from(names)


def statement_timeout_statement(milliseconds: int) -> Select[Any]:
    """``set_config('statement_timeout', milliseconds, true)``: a ``SET LOCAL`` that lasts
    for the rest of the transaction. The value is bound; no other parameters."""
    return select(func.set_config("statement_timeout", str(milliseconds), True))
