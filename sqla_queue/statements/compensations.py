"""Compensations of durable jobs: the steps whose undo must be enqueued, and the record
that it was (schema version 7).

A step committed with ``compensate=`` stores its compensation's enqueue row. Once its job
has failed for good or was cancelled, a sweep (:func:`compensations_due_statement`) takes
the steps of a few such jobs, locked, in reverse commit order; the caller enqueues their
rows under one ``queue_id`` per job (so they run one after the other, in that order) and
records each job's id on its step (:func:`mark_compensated_statement`) in the same
transaction. A step with ``compensated_by`` set is never taken again: each compensation is
enqueued exactly once, whoever sweeps.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningDelete, ReturningUpdate

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import CANCELLED, FAILED

__all__ = [
    "CompensationsDueParams",
    "MarkCompensatedParams",
    "ReopenParams",
    "compensations_due_statement",
    "mark_compensated_statement",
    "reopen_compensated_statement",
]


class CompensationsDueParams(TypedDict):
    """At most ``limit`` jobs per sweep."""

    limit: int


class MarkCompensatedParams(TypedDict):
    """The steps (job, name) whose compensation job is ``ids``, pairwise."""

    jobs: list[int]
    names: list[str]
    ids: list[int]


class ReopenParams(TypedDict):
    """The jobs (requeued ones) whose compensated steps start again."""

    ids: list[int]


def reopen_compensated_statement(tables: QueueTables) -> ReturningDelete[Any]:
    """Delete the checkpoints of jobs ``ids`` whose compensation was enqueued: when a
    requeued job runs again, those steps run again (their work was undone), instead of
    replaying the undone result. Parameters: :class:`ReopenParams`. Returns ``(job_id,
    name)`` of each reopened step.

    Sent by a requeue after its update of the jobs, as a statement of its own: the sweep
    (:func:`compensations_due_statement`) locks its jobs ``FOR NO KEY UPDATE SKIP
    LOCKED``, so a sweep that holds a job makes the requeue's update wait until it has
    committed its marks, which this statement's fresh snapshot then sees; and a sweep that
    comes after the update skips the job, then finds it queued.
    """
    steps = tables.job_steps
    return (
        delete(steps)
        .where(
            steps.c.job_id == any_(bindparam("ids", type_=ARRAY(BigInteger))),
            steps.c.compensated_by.is_not(None),
        )
        .returning(steps.c.job_id, steps.c.name)
    )


def compensations_due_statement(tables: QueueTables) -> Select[Any]:
    """The compensations to enqueue, of at most ``limit`` failed or cancelled jobs.

    Returns ``(job_id, name, compensate)``, each job's steps in reverse commit order. The
    jobs are taken with ``SKIP LOCKED`` (two sweeps share the work), their steps locked
    ``FOR UPDATE`` and read again after the lock: a step another sweep marked meanwhile
    is not returned.
    """
    steps = tables.job_steps
    jobs = tables.jobs
    waiting = steps.c.compensate.is_not(None) & steps.c.compensated_by.is_(None)
    ended = jobs.c.status.in_([FAILED, CANCELLED])
    owners = (
        select(steps.c.job_id)
        .distinct()
        .join(jobs, jobs.c.id == steps.c.job_id)
        .where(waiting, ended)
        .limit(bindparam("limit", type_=Integer))
        .cte("owners")
    )
    locked = (
        select(jobs.c.id)
        .where(jobs.c.id.in_(select(owners.c.job_id)), ended)
        .with_for_update(of=jobs, key_share=True, skip_locked=True)
        .cte("locked")
    )
    return (
        select(steps.c.job_id, steps.c.name, steps.c.compensate)
        .where(steps.c.job_id.in_(select(locked.c.id)), waiting)
        .order_by(steps.c.job_id, steps.c.seq.desc())
        .with_for_update(of=steps)
    )


def mark_compensated_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Record the compensation job of each step. Parameters:
    :class:`MarkCompensatedParams`. Returns ``(job_id, name)`` of each marked step."""
    steps = tables.job_steps
    given = select(
        func.unnest(bindparam("jobs", type_=ARRAY(BigInteger))).label("job"),
        func.unnest(bindparam("names", type_=ARRAY(Text))).label("step"),
        func.unnest(bindparam("ids", type_=ARRAY(BigInteger))).label("comp"),
    ).subquery("given")
    return (
        update(steps)
        .where(steps.c.job_id == given.c.job, steps.c.name == given.c.step)
        .values(compensated_by=given.c.comp)
        .returning(steps.c.job_id, steps.c.name)
    )
