"""What operators read and change of durable jobs: the suspended ones, a job's committed
steps, and the stored versions of steps (schema version 7)."""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    func,
    literal,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate

from sqla_queue.models.tables import QueueTables, StepKind
from sqla_queue.statements._common import PENDING, QUEUED, SUSPENDED
from sqla_queue.statements.durable import FOREVER_SQL

__all__ = [
    "MigrateStepsParams",
    "SuspendedParams",
    "fire_statement",
    "job_steps_statement",
    "migrate_steps_statement",
    "step_versions_statement",
    "suspended_statement",
    "wake_jobs_statement",
]


class SuspendedParams(TypedDict):
    """The suspended jobs of ``task`` (``None``: every task), at most ``limit``."""

    task: str | None
    limit: int


class MigrateStepsParams(TypedDict):
    """Declare the stored step ``step`` of ``task``'s queued jobs, stored by version
    ``from_version``, valid for ``to_version``."""

    task: str
    step: str
    from_version: int
    to_version: int


def suspended_statement(tables: QueueTables) -> Select[Any]:
    """The suspended jobs, soonest due first.

    Returns ``(id, task, queue_id, wait, execute_at)``: what each waits for, and until
    when (the far-future date of :data:`~sqla_queue.statements.durable.FOREVER_SQL` for
    no deadline).
    """
    ex = tables.executions
    task = cast(bindparam("task", type_=Text), Text)
    return (
        select(ex.c.id, ex.c.task, ex.c.queue_id, ex.c.wait, ex.c.execute_at)
        .where(ex.c.state == SUSPENDED, (task.is_(None)) | (ex.c.task == task))
        .order_by(ex.c.execute_at, ex.c.id)
        .limit(bindparam("limit", type_=Integer))
    )


def job_steps_statement(tables: QueueTables) -> Select[Any]:
    """Job ``job``'s committed checkpoints, in commit order, for an operator.

    Returns ``(name, kind, version, attempt, result, compensated_by, has_compensation,
    committed_at)``.
    """
    steps = tables.job_steps
    return (
        select(
            steps.c.name,
            steps.c.kind,
            steps.c.version,
            steps.c.attempt,
            steps.c.result,
            steps.c.compensated_by,
            steps.c.compensate.is_not(None).label("has_compensation"),
            steps.c.committed_at,
        )
        .where(steps.c.job_id == bindparam("job", type_=BigInteger))
        .order_by(steps.c.seq)
    )


def step_versions_statement(tables: QueueTables) -> Select[Any]:
    """The stored versions of each step and cursor of the queued durable jobs.

    Returns ``(task, step, version, jobs)``: how many queued jobs hold that step at that
    version, by task.
    """
    steps = tables.job_steps
    jobs = tables.jobs
    return (
        select(jobs.c.task, steps.c.name, steps.c.version, func.count().label("jobs"))
        .join(jobs, jobs.c.id == steps.c.job_id)
        .where(jobs.c.status == QUEUED, steps.c.kind != StepKind.WAIT)
        .group_by(jobs.c.task, steps.c.name, steps.c.version)
        .order_by(jobs.c.task, steps.c.name, steps.c.version)
    )


def migrate_steps_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Mark step ``step`` of ``task``'s queued jobs, stored at ``from_version``, as
    ``to_version``: the operator declares its stored result valid for the new code.

    Parameters: :class:`MigrateStepsParams`. Returns the jobs' ids.
    """
    steps = tables.job_steps
    jobs = tables.jobs
    return (
        update(steps)
        .where(
            steps.c.job_id == jobs.c.id,
            jobs.c.status == QUEUED,
            jobs.c.task == bindparam("task", type_=Text),
            steps.c.name == bindparam("step", type_=Text),
            steps.c.version == bindparam("from_version", type_=Integer),
        )
        .values(version=bindparam("to_version", type_=Integer))
        .returning(steps.c.job_id)
    )


def wake_jobs_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Wake the suspended jobs of ``ids`` that wait for ``waits_for`` (``None``: for
    anything). Returns their ids; the workers are notified if any woke."""
    ex = tables.executions
    waits_for = cast(bindparam("waits_for", type_=Text), Text)
    return (
        update(ex)
        .where(
            ex.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger))),
            # By primary key, never by a partial index over every suspended row.
            func.coalesce(ex.c.state, "") == SUSPENDED,
            waits_for.is_(None) | (func.coalesce(ex.c.wait, "") == waits_for),
        )
        .values(state=PENDING, execute_at=func.now(), wait=null())
        .returning(
            ex.c.id,
            func.pg_notify(literal(tables.notify_channel, Text), literal("", Text)).label("n"),
        )
    )


def fire_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Bring the deadline of suspended jobs (``ids``; ``None``: all) to now: a test's way
    to end a sleep, or a wait's deadline, without waiting. Returns their ids.

    Only a wait that has a deadline is fired (a wait for a signal, a row or an operator
    without one is left waiting), and only the job's current wait: its wait steps whose
    deadline is still ahead and that were not met.
    """
    ex = tables.executions
    steps = tables.job_steps
    ids = cast(bindparam("ids", type_=ARRAY(BigInteger)), ARRAY(BigInteger))
    fired = (
        select(ex.c.id)
        .where(
            ex.c.state == SUSPENDED,
            ex.c.execute_at < literal_column(FOREVER_SQL),
            ids.is_(None) | (ex.c.id == func.any(ids)),
        )
        .cte("fired")
    )
    until = cast(steps.c.result["until"].astext, DateTime(timezone=True))
    moved = (
        update(steps)
        .where(
            steps.c.kind == StepKind.WAIT,
            steps.c.job_id.in_(select(fired.c.id)),
            until > func.now(),
            steps.c.result["met"].astext.is_(None),
        )
        .values(result=func.jsonb_build_object(literal_column("'until'"), func.now()))
        .cte("moved")
    )
    return (
        update(ex)
        .where(ex.c.id.in_(select(fired.c.id)))
        .values(execute_at=func.now())
        .returning(ex.c.id)
        .add_cte(moved)
    )
