"""What the web dashboard reads beyond the status statements: a page of jobs, one job, and
finishes per minute for the throughput chart (:mod:`sqla_queue.dashboard.queries` runs them).

Every statement here reads through an index the rest of the library already keeps: a
page of jobs is the ``sqla-queue jobs`` listing
(:func:`~sqla_queue.statements.listing.job_listing_statement`) cut at the last id shown
(keyset pagination on the primary key, never ``OFFSET``, so page 1000 costs what page 1
does); a job is read by its primary key; the chart walks ``finished_ix`` newest first and
stops at a row cap, as the status windows do. No statement takes a row lock, so none
waits for, or delays, a claim.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Double,
    Integer,
    Select,
    Text,
    bindparam,
    case,
    func,
    literal_column,
    select,
)
from sqlalchemy import union as sql_union

from sqla_queue.checks import is_whole_number
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import QUEUED, seconds
from sqla_queue.statements.listing import job_listing_statement, job_state, job_wait

__all__ = ["job_detail_statement", "job_page_statement", "throughput_statement"]


def job_page_statement(
    tables: QueueTables,
    *,
    state: str | None = None,
    task: bool = False,
    key: bool = False,
    about: bool = False,
    about_key: bool = False,
    before: bool = False,
) -> Select[Any]:
    """The ``sqla-queue jobs`` listing with the filters given, below the ``before`` id if
    given, plus ``live_attempt``: the attempt of a queued job's execution (read by its
    primary key, only for a queued job).

    ``state`` (a word of :data:`~sqla_queue.statements.listing.JOB_STATES`) is written into
    the SQL; each other flag adds its bound parameter. Parameters: those of
    :class:`~sqla_queue.statements.listing.JobListingParams` for the filters given (``tasks``
    with ``task``), plus ``before`` (``bigint``) with ``before`` and ``key`` (text) with
    ``key``. A filter on a key walks the unique keys and the ``queue_id`` s separately,
    each cut at the limit, as the listing does: the ``before`` bound goes inside both
    walks, or page 2 would come from the walks of page 1.
    """
    jobs = tables.jobs
    base = job_listing_statement(
        tables,
        states=[state] if state else [],
        tasks=task,
        about=about,
        about_key=about_key,
    )
    ex = tables.executions.alias("live")
    live_attempt = select(ex.c.attempt).where(ex.c.id == jobs.c.id).scalar_subquery()
    base = base.add_columns(
        case((jobs.c.status == QUEUED, live_attempt), else_=None).label("live_attempt")
    )
    if before:
        base = base.where(jobs.c.id < bindparam("before", type_=BigInteger))
    if not key:
        return base
    wanted = bindparam("key", type_=Text)
    ids = base.with_only_columns(jobs.c.id)
    matched = sql_union(
        ids.where(jobs.c.unique_key == wanted), ids.where(jobs.c.queue_id == wanted)
    ).subquery("matched")
    return base.where(jobs.c.id.in_(select(matched.c.id)))


def job_detail_statement(tables: QueueTables) -> Select[Any]:
    """One job (parameter ``id``) with its state, its live execution's columns, if any,
    and, when it is a suspended durable job, what it waits for (``waits_for``) and until
    when (``until``, ``NULL`` for no deadline); all read by primary key."""
    jobs = tables.jobs
    # An alias: job_state's subquery reads the executions table itself, and would
    # correlate to an unaliased one in this FROM.
    ex = tables.executions.alias("live")
    waits_for, until = job_wait(tables)
    return (
        select(
            jobs,
            job_state(tables).label("state"),
            waits_for.label("waits_for"),
            until.label("until"),
            ex.c.state.label("execution_state"),
            ex.c.execute_at,
            ex.c.attempt.label("execution_attempt"),
            ex.c.reclaims,
            ex.c.worker_id,
            ex.c.alive_at,
            ex.c.slot,
            ex.c.cancel_requested,
        )
        .select_from(jobs.outerjoin(ex, ex.c.id == jobs.c.id))
        .where(jobs.c.id == bindparam("id", type_=BigInteger))
    )


def _literal_whole(value: int, what: str) -> Any:
    # Written into the text, as the status windows are: a generic plan cannot see a bound
    # LIMIT, and might read the whole history. Only a checked int gets there.
    if not is_whole_number(value) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1, got {value!r}")
    return literal_column(str(value), Integer)


def throughput_statement(
    tables: QueueTables, *, minutes: int = 60, cap: int = 20_000
) -> Select[Any]:
    """Per task and minute (``date_trunc``): finishes in the last ``minutes`` minutes,
    with the oldest finish each group read (``oldest``). No parameters.

    Walks ``finished_ix`` newest first and stops after ``cap`` rows: when the window holds
    more, only its newest part is counted, and ``oldest`` says where it starts.
    """
    jobs = tables.jobs
    since = func.now() - seconds(literal_column(repr(float(minutes * 60)), Double))
    walk = (
        select(jobs.c.task, jobs.c.finished_at)
        .where(jobs.c.finished_at.is_not(None), jobs.c.finished_at >= since)
        .order_by(jobs.c.finished_at.desc())
        .limit(_literal_whole(cap, "cap"))
        .subquery("recent")
    )
    minute = func.date_trunc("minute", walk.c.finished_at).label("minute")
    return (
        select(
            walk.c.task,
            minute,
            func.count().label("finished"),
            func.min(walk.c.finished_at).label("oldest"),
        )
        .group_by(walk.c.task, minute)
        .order_by(walk.c.task, minute)
    )
