"""Periodic schedules: each schedule's row, created once and advanced by compare-and-set.

The row's ``last_tick`` is what makes every tick enqueued exactly once across workers:
a scheduler advances it from the value it read (:func:`advance_schedule_statement`) in the
same transaction as the tick's jobs, and enqueues only when that update returned the row.
A second scheduler racing for the same ticks waits on the first one's row lock, then
finds ``last_tick`` changed (PostgreSQL re-checks the ``WHERE`` against the committed row
under READ COMMITTED) and updates nothing.

Each builder has a ``TypedDict`` next to it naming its parameters.
"""

from __future__ import annotations

import datetime as dt
from typing import TypedDict

from sqlalchemy import DateTime, Select, Text, Update, any_, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert

from sqla_queue.models.tables import QueueTables

__all__ = [
    "AdvanceScheduleParams",
    "CreateScheduleParams",
    "ReadSchedulesParams",
    "advance_schedule_statement",
    "all_schedules_statement",
    "create_schedule_statement",
    "database_now_statement",
    "read_schedules_statement",
]


class CreateScheduleParams(TypedDict):
    """Parameters of :func:`create_schedule_statement` (one dict per schedule)."""

    name: str
    task: str
    #: The latest tick at or before now: the schedule fires first at the tick after it.
    last_tick: dt.datetime


class ReadSchedulesParams(TypedDict):
    """Parameters of :func:`read_schedules_statement`."""

    #: The schedule names to read (``text[]``).
    names: list[str]


class AdvanceScheduleParams(TypedDict):
    """Parameters of :func:`advance_schedule_statement`.

    (Not ``name`` and ``task``: an UPDATE reserves its columns' names for its own binds.)
    """

    #: The schedule's name.
    schedule: str
    #: The task it enqueues (stored again, so a listing shows the current one).
    task_name: str
    #: The ``last_tick`` this scheduler read: the update applies only if it is unchanged.
    seen: dt.datetime
    #: The latest tick this pass enqueues (or passes over).
    new_tick: dt.datetime


def create_schedule_statement(tables: QueueTables) -> Insert:
    """Store a schedule's row unless it exists: a row that exists keeps its ``last_tick``.

    Parameters: :class:`CreateScheduleParams`. Returns nothing; run it with every
    schedule's params at once (``executemany``).
    """
    schedules = tables.schedules
    stmt = insert(schedules).values(
        name=bindparam("name", type_=Text),
        task=bindparam("task", type_=Text),
        last_tick=bindparam("last_tick", type_=DateTime(timezone=True)),
    )
    return stmt.on_conflict_do_nothing(index_elements=[schedules.c.name])


def read_schedules_statement(tables: QueueTables) -> Select[str, str, dt.datetime]:
    """``(name, task, last_tick)`` of the stored schedules among ``names``.

    Parameters: :class:`ReadSchedulesParams`. A plain read: it locks nothing.
    """
    schedules = tables.schedules
    return select(schedules.c.name, schedules.c.task, schedules.c.last_tick).where(
        schedules.c.name == any_(bindparam("names", type_=ARRAY(Text)))
    )


def all_schedules_statement(tables: QueueTables) -> Select[str, str, dt.datetime]:
    """``(name, task, last_tick)`` of every stored schedule, by name. No parameters."""
    schedules = tables.schedules
    return select(schedules.c.name, schedules.c.task, schedules.c.last_tick).order_by(
        schedules.c.name
    )


def advance_schedule_statement(tables: QueueTables) -> Update:
    """Move a schedule's ``last_tick`` from ``seen`` to ``new_tick``, if nobody else did.

    Parameters: :class:`AdvanceScheduleParams`. ``RETURNING last_tick``: a row means this
    transaction owns the ticks in ``(seen, new_tick]`` and must enqueue them before it
    commits; no row means another scheduler did (or the row is gone), and nothing is
    enqueued. ``new_tick > seen`` is required too, so that a stale plan never moves the
    row backwards.
    """
    schedules = tables.schedules
    seen = bindparam("seen", type_=DateTime(timezone=True))
    new_tick = bindparam("new_tick", type_=DateTime(timezone=True))
    return (
        update(schedules)
        .where(
            schedules.c.name == bindparam("schedule", type_=Text),
            schedules.c.last_tick == seen,
            schedules.c.last_tick < new_tick,
        )
        .values(last_tick=new_tick, task=bindparam("task_name", type_=Text), updated_at=func.now())
        .returning(schedules.c.last_tick)
    )


def database_now_statement() -> Select[dt.datetime]:
    """The database clock (``clock_timestamp()``, not the transaction's start). No parameters.

    Every worker decides which ticks are due and which were missed by this one clock.
    """
    return select(func.clock_timestamp())
