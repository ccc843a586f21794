"""Operator statements: requeue failed jobs, list them, prune finished ones."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    Integer,
    Select,
    any_,
    bindparam,
    delete,
    func,
    insert,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningDelete

from sqla_queue.models.tables import JobStatus, QueueTables
from sqla_queue.statements._common import FAILED, PENDING, QUEUED, seconds, state_literal

__all__ = ["failed_jobs_statement", "prune_statement", "requeue_statement"]


def requeue_statement(tables: QueueTables) -> Select[int]:
    """Put failed or cancelled jobs back in the queue with a fresh set of attempts.

    Parameter ``ids`` (bigint[]). Jobs in any other state are left alone, so requeueing
    twice, or requeueing a job that is still queued, never creates a second execution.
    Their error history is kept. Returns the ids that were requeued.
    """
    jobs = tables.jobs
    ex = tables.executions
    revived = (
        update(jobs)
        .where(
            jobs.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger))),
            jobs.c.status.in_([FAILED, state_literal(JobStatus.CANCELLED)]),
        )
        .values(status=QUEUED, finished_at=null(), attempts=0)
        .returning(jobs.c.id, jobs.c.task, jobs.c.priority, jobs.c.queue_id)
        .cte("revived")
    )
    added = (
        insert(ex)
        .from_select(
            ["id", "task", "priority", "queue_id", "state", "execute_at"],
            select(
                revived.c.id,
                revived.c.task,
                revived.c.priority,
                revived.c.queue_id,
                PENDING,
                func.now(),
            ),
        )
        .returning(ex.c.id)
        .cte("added")
    )
    return select(added.c.id).order_by(added.c.id)


def failed_jobs_statement(tables: QueueTables) -> Select[*tuple[Any, ...]]:
    """The most recently failed jobs, newest first. Parameter ``limit`` (int)."""
    jobs = tables.jobs
    return (
        select(
            jobs.c.id,
            jobs.c.task,
            jobs.c.attempts,
            jobs.c.finished_at,
            jobs.c.errors[-1].label("last_error"),
        )
        .where(jobs.c.status == FAILED)
        .order_by(jobs.c.finished_at.desc())
        .limit(bindparam("limit", type_=Integer))
    )


def prune_statement(tables: QueueTables) -> ReturningDelete[int]:
    """Delete finished jobs older than ``older_than`` seconds (parameter ``older_than``).

    Only succeeded and cancelled jobs go; failed ones stay for inspection unless the
    ``include_failed`` parameter is true.
    """
    jobs = tables.jobs
    age = seconds(bindparam("older_than", type_=Double))
    kinds = [state_literal(JobStatus.SUCCEEDED), state_literal(JobStatus.CANCELLED)]
    return (
        delete(jobs)
        .where(
            jobs.c.finished_at < func.now() - age,
            (jobs.c.status.in_(kinds))
            | ((jobs.c.status == FAILED) & bindparam("include_failed", type_=Boolean)),
        )
        .returning(jobs.c.id)
    )
