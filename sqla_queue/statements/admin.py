"""Operator statements: requeue failed jobs, list them, prune finished ones.

Each builder has a ``TypedDict`` next to it naming its parameters: the one contract between
the statement's bound names and the Python that executes it (:mod:`sqla_queue.admin`). A
unit test compiles each statement and checks its bound names against these keys.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    Select,
    any_,
    bindparam,
    delete,
    exists,
    false,
    func,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.models.tables import JobStatus, QueueTables
from sqla_queue.statements._common import DONE, FAILED, QUEUED, seconds, state_literal
from sqla_queue.statements.enqueue import keyed_rows

__all__ = [
    "FailedJobsParams",
    "PruneParams",
    "RequeueParams",
    "failed_jobs_statement",
    "prune_statement",
    "requeue_keys_statement",
    "requeue_statement",
]


class RequeueParams(TypedDict):
    """Parameters of :func:`requeue_statement`."""

    #: The jobs to requeue (``bigint[]``).
    ids: list[int]


class FailedJobsParams(TypedDict):
    """Parameters of :func:`failed_jobs_statement`."""

    #: How many jobs to list at most.
    limit: int


class PruneParams(TypedDict):
    """Parameters of :func:`prune_statement`."""

    #: Minimum age, in seconds since ``finished_at``, of the jobs to delete.
    older_than: float
    #: Whether failed jobs go too.
    include_failed: bool


def requeue_keys_statement(tables: QueueTables) -> Select[Any]:
    """The unique keys of the jobs a requeue would put back: ``(id, task, unique_key)``.

    Parameters: :class:`RequeueParams`. Only failed and cancelled jobs enqueued with a
    ``unique_key`` are listed, in id order: each must take its key again
    (:func:`~sqla_queue.statements.unique.take_keys_statement`) before it is requeued.
    """
    jobs = tables.jobs
    return (
        select(jobs.c.id, jobs.c.task, jobs.c.unique_key)
        .where(
            jobs.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger))),
            _requeueable(jobs),
            jobs.c.unique_key.is_not(None),
        )
        .order_by(jobs.c.id)
    )


def _requeueable(jobs: Any) -> Any:
    return jobs.c.status.in_([FAILED, state_literal(JobStatus.CANCELLED)])


def requeue_statement(tables: QueueTables) -> Select[int]:
    """Put failed or cancelled jobs back in the queue with a fresh set of attempts.

    Parameters: :class:`RequeueParams`, the ids (bigint[]). Jobs in any other state are
    left alone, so requeueing twice, or requeueing a job that is still queued, never creates
    a second execution. Their error history is kept. Returns the ids that were requeued.

    A keyed job (``queue_id``) goes back in line as a new job due now would
    (:func:`~sqla_queue.statements.enqueue.keyed_rows`): it waits behind its key's head
    and the jobs already waiting, and is ``pending`` only when its key is idle. A unique
    job must have taken its key first (see :func:`requeue_keys_statement`): the caller
    names only the ids it may requeue.
    """
    jobs = tables.jobs
    ex = tables.executions
    revived = (
        update(jobs)
        .where(jobs.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger))), _requeueable(jobs))
        .values(status=QUEUED, finished_at=null(), attempts=0)
        .returning(
            jobs.c.id,
            jobs.c.task,
            jobs.c.priority,
            jobs.c.queue_id,
            func.now().label("scheduled_at"),
        )
        .cte("revived")
    )
    rows = keyed_rows(tables, revived).subquery("rows")
    nodes = tables.workflow_nodes
    # A workflow's node runs as one again: its completion releases its dependents.
    is_node = exists(select(nodes.c.job_id).where(nodes.c.job_id == rows.c.id))
    back = pg_insert(ex).from_select(
        ["id", "task", "priority", "queue_id", "state", "execute_at", "workflow"],
        select(*rows.c, is_node),
    )
    added = (
        # A finished execution may still be parked 'done' (a keyed job, or a cancelled
        # one, until the workers' next sweep): it becomes the new execution. It has not
        # started (no lease), so it holds no key's head until it is claimed.
        back.on_conflict_do_update(
            index_elements=[ex.c.id],
            set_={
                "state": back.excluded.state,
                "execute_at": back.excluded.execute_at,
                "attempt": 0,
                "worker_id": null(),
                "alive_at": null(),
                "lease_seconds": null(),
                "slot": null(),
                "cancel_requested": false(),
                "workflow": back.excluded.workflow,
            },
            where=ex.c.state == DONE,
        )
        .returning(ex.c.id)
        .cte("added")
    )
    return select(added.c.id).order_by(added.c.id)


def failed_jobs_statement(tables: QueueTables) -> Select[*tuple[Any, ...]]:
    """The most recently failed jobs, newest first. Parameters: :class:`FailedJobsParams`."""
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
        # bigint: the limit may be as large as check_failed_limit lets it be.
        .limit(bindparam("limit", type_=BigInteger))
    )


def prune_statement(tables: QueueTables) -> Select[Any]:
    """Delete finished jobs older than ``older_than`` seconds; one row of counts.

    Parameters: :class:`PruneParams`. Only succeeded and cancelled jobs go; failed ones stay
    for inspection unless ``include_failed`` is true. The unique keys those jobs still hold
    go with them (a key whose holder is gone is free anyway; this keeps the table small),
    and so do a durable job's committed steps and signals. The row counts what left each
    table: ``jobs``, ``unique_keys``, ``job_steps`` and ``job_signals``. What outlives its
    job's row otherwise (workflows, steps of jobs deleted by ``history="none"``) is
    :func:`~sqla_queue.statements.prune.prune_leftovers_statement`'s.
    """
    jobs = tables.jobs
    keys = tables.unique_keys
    age = seconds(bindparam("older_than", type_=Double))
    kinds = [state_literal(JobStatus.SUCCEEDED), state_literal(JobStatus.CANCELLED)]
    pruned = (
        delete(jobs)
        .where(
            jobs.c.finished_at < func.now() - age,
            (jobs.c.status.in_(kinds))
            | ((jobs.c.status == FAILED) & bindparam("include_failed", type_=Boolean)),
        )
        .returning(jobs.c.id, jobs.c.unique_key)
        .cte("pruned")
    )
    freed = (
        delete(keys)
        .where(keys.c.job_id == pruned.c.id, pruned.c.unique_key.is_not(None))
        .returning(keys.c.job_id)
        .cte("freed")
    )
    # A durable job's steps and signals go with it (schema version 7).
    steps = tables.job_steps
    signals = tables.job_signals
    steps_gone = (
        delete(steps)
        .where(steps.c.job_id.in_(select(pruned.c.id)))
        .returning(steps.c.job_id)
        .cte("steps_gone")
    )
    signals_gone = (
        delete(signals)
        .where(signals.c.job_id.in_(select(pruned.c.id)))
        .returning(signals.c.job_id)
        .cte("signals_gone")
    )
    return select(
        *(
            select(func.count()).select_from(cte).scalar_subquery().label(role)
            for role, cte in (
                ("jobs", pruned),
                ("unique_keys", freed),
                ("job_steps", steps_gone),
                ("job_signals", signals_gone),
            )
        )
    )
