"""Listing jobs for people: their state in one word, filtered by task, state, key or row.

:func:`job_listing_statement` is what ``sqla-queue jobs`` runs (through
:func:`sqla_queue.listing.list_jobs`). It lists newest first, at most ``limit`` jobs, and
reads the executions table only through its primary key: a listing never competes with the
claim for the executions' indexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

from sqlalchemy import (
    BigInteger,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    union,
)
from sqlalchemy.dialects.postgresql import ARRAY

from sqla_queue.models.tables import JobStatus, NodeState, QueueTables
from sqla_queue.statements._common import PENDING, QUEUED, RUNNING, SUSPENDED, state_literal
from sqla_queue.statements.durable import NO_DEADLINE_YEAR

__all__ = [
    "JOB_STATES",
    "LIVE_STATES",
    "JobListingParams",
    "job_listing_statement",
    "job_state",
    "job_wait",
    "oldest_live",
]

#: What a job still queued shows as (:attr:`sqla_queue.Job.state`): running, running and
#: asked to stop, behind its ``queue_id``, due later, due now, a durable job suspended
#: in a wait (a sleep, a signal, a row, a step version), or a workflow's node that waits
#: for its parents (``blocked``) or for an operator to requeue a failed one (``held``).
LIVE_STATES = (
    "running",
    "cancelling",
    "waiting",
    "scheduled",
    "pending",
    "suspended",
    "blocked",
    "held",
)
#: Every word :func:`job_listing_statement` can filter on: the statuses (``queued`` is
#: every live state), then the live states.
JOB_STATES = (*JobStatus.ALL, *LIVE_STATES)


_UNDECIDED = [state_literal(s) for s in NodeState.UNDECIDED]

# The year of FOREVER_SQL (sqla_queue.statements.durable): a due time in it is no deadline.


class JobListingParams(TypedDict):
    """Parameters of :func:`job_listing_statement`; the filters it was built with are required."""

    #: How many jobs to list at most.
    limit: int
    #: Task names (``text[]``), with ``tasks=True``.
    tasks: NotRequired[list[str]]
    #: A unique key or ``queue_id``, with ``key=True``.
    key: NotRequired[str]
    #: The linked row's table (``about_table``), with ``about=True``.
    about_table: NotRequired[str]
    #: The linked row's key (``about_key``), with ``about_key=True``.
    about_key: NotRequired[str]
    #: Job ids (``bigint[]``), with ``ids=True``.
    ids: NotRequired[list[int]]


def job_state(tables: QueueTables) -> Any:
    """The one word :attr:`sqla_queue.Job.state` shows, computed by the database.

    The job's final status once it finished; else, from its execution: ``running``,
    ``cancelling`` (running, asked to stop), ``waiting`` (behind its ``queue_id``),
    ``scheduled`` (due later), ``pending`` (due now) or ``suspended`` (a durable job in a
    wait); without one, a workflow node's ``blocked`` or ``held``. An expression over ``jobs``: the
    execution is read by a subquery on its primary key, and only for a job still queued.
    """
    jobs = tables.jobs
    ex = tables.executions
    live = (
        select(
            case(
                (
                    ex.c.state == RUNNING,
                    case(
                        (ex.c.cancel_requested, state_literal("cancelling")),
                        else_=state_literal("running"),
                    ),
                ),
                (
                    ex.c.state == PENDING,
                    case(
                        (ex.c.execute_at > func.now(), state_literal("scheduled")),
                        else_=state_literal("pending"),
                    ),
                ),
                else_=ex.c.state,
            )
        )
        .where(ex.c.id == jobs.c.id)
        .scalar_subquery()
    )
    # A workflow's node that waits has no execution: its node's state says why.
    nodes = tables.workflow_nodes
    waiting = (
        select(nodes.c.state)
        .where(nodes.c.job_id == jobs.c.id, nodes.c.state.in_(_UNDECIDED))
        .scalar_subquery()
    )
    return case(
        (jobs.c.status != QUEUED, jobs.c.status), else_=func.coalesce(live, waiting, QUEUED)
    )


def oldest_live(tables: QueueTables) -> Any:
    """The smallest id a queued job can have: the oldest execution's, or the oldest
    waiting workflow node's (which has none). One probe of each primary key."""
    ex = tables.executions
    nodes = tables.workflow_nodes
    return func.least(
        select(func.min(ex.c.id)).scalar_subquery(),
        select(func.min(nodes.c.job_id)).where(nodes.c.state.in_(_UNDECIDED)).scalar_subquery(),
    )


def job_wait(tables: QueueTables) -> tuple[Any, Any]:
    """What a suspended job waits for, and until when: two expressions over ``jobs``.

    The first is the execution's ``wait`` (``sleep``, ``signal:<name>``,
    ``row:<condition>:<key>``, ``version:<step>``), the second its deadline; both are
    ``NULL`` for a job that is not suspended, and the deadline is ``NULL`` too for a wait
    without one (stored as the far-future :data:`~sqla_queue.statements.durable.FOREVER_SQL`).
    Each reads the execution by its primary key, and only for a job still queued.
    """
    jobs = tables.jobs
    ex = tables.executions
    suspended = (ex.c.id == jobs.c.id, ex.c.state == SUSPENDED)
    waits_for = select(ex.c.wait).where(*suspended).scalar_subquery()
    # The far-future year is "no deadline"; read in any session time zone, it stays 9999.
    year = func.extract("year", ex.c.execute_at)
    deadline = case((year < literal_column(str(NO_DEADLINE_YEAR)), ex.c.execute_at), else_=None)
    until = select(deadline).where(*suspended).scalar_subquery()
    queued = jobs.c.status == QUEUED
    return case((queued, waits_for), else_=None), case((queued, until), else_=None)


def job_listing_statement(
    tables: QueueTables,
    *,
    states: Sequence[str] = (),
    tasks: bool = False,
    key: bool = False,
    about: bool = False,
    about_key: bool = False,
    ids: bool = False,
) -> Select[Any]:
    """Jobs newest first (by id), with their state, filtered; at most ``limit`` of them.

    Parameters: :class:`JobListingParams`, one per filter this statement was built with.
    ``states`` (words of :data:`JOB_STATES`, written into the SQL) keeps the jobs in any of
    them; ``tasks`` the jobs of the ``tasks`` array; ``key`` those whose ``unique_key`` or
    ``queue_id`` is ``key``; ``about`` those linked to a row of table ``about_table``
    (and, with ``about_key``, to the row with that key); ``ids`` those of the ``ids``
    array.

    How it reads: the jobs table newest first through its primary key, or through
    ``about_ix`` (a linked row), ``unique_key_ix`` (a key) or ``failed_ix`` (failed jobs)
    when the planner finds them more selective; the executions table only by primary key,
    a few probes per queued job looked at (:func:`job_state`, :func:`job_wait`). A filter
    on live states alone stops the walk at the oldest execution's id, or the oldest
    waiting workflow node's (:func:`oldest_live`): no job older than that is still
    queued. The jobs table has no index on ``status`` or ``queue_id`` (each would cost
    every enqueue and completion): a rare final status, or a ``queue_id`` with few jobs,
    is found by walking the jobs newest first until ``limit`` match.
    """
    jobs = tables.jobs
    unknown = sorted(set(states) - set(JOB_STATES))
    if unknown:
        raise ValueError(f"unknown job states {unknown}; use some of {', '.join(JOB_STATES)}")
    state = job_state(tables)
    waits_for, until = job_wait(tables)
    limit = bindparam("limit", type_=BigInteger)
    statement = (
        select(
            jobs.c.id,
            jobs.c.task,
            jobs.c.status,
            state.label("state"),
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.priority,
            jobs.c.queue_id,
            jobs.c.unique_key,
            jobs.c.about_table,
            jobs.c.about_key,
            jobs.c.created_at,
            jobs.c.scheduled_at,
            jobs.c.finished_at,
            jobs.c.errors[-1].label("last_error"),
            waits_for.label("waits_for"),
            until.label("until"),
        )
        .order_by(jobs.c.id.desc())
        .limit(limit)
    )
    filters: list[Any] = []
    if states:
        final = [s for s in JobStatus.ALL if s in states and s != JobStatus.QUEUED]
        live = [s for s in LIVE_STATES if s in states]
        every_live = JobStatus.QUEUED in states
        # Statuses written as literals, so failed_ix's predicate (status = 'failed') matches.
        wanted = [state_literal(s) for s in final]
        if every_live or not live:
            filters.append(jobs.c.status.in_([*wanted, *([QUEUED] if every_live else [])]))
        else:
            some_live = and_(jobs.c.status == QUEUED, state.in_([state_literal(s) for s in live]))
            filters.append(or_(jobs.c.status.in_(wanted), some_live) if final else some_live)
        if not final:
            # Only live jobs: none is older than the oldest execution (one probe of its
            # primary key), so the walk stops there instead of at the first job ever.
            filters.append(jobs.c.id >= oldest_live(tables))
    if tasks:
        filters.append(jobs.c.task == any_(bindparam("tasks", type_=ARRAY(Text))))
    if about:
        filters.append(jobs.c.about_table == bindparam("about_table", type_=Text))
        filters.append(jobs.c.about_key.is_not(None))
        if about_key:
            filters.append(jobs.c.about_key == bindparam("about_key", type_=Text))
    if ids:
        filters.append(jobs.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger))))
    if key:
        # Two walks, each newest first and cut at the limit: the unique keys through
        # unique_key_ix, the queue_ids through the primary key. An OR of the two would
        # keep the planner off the index.
        wanted_key = bindparam("key", type_=Text)
        by_unique = (
            select(jobs.c.id)
            .where(jobs.c.unique_key == wanted_key, *filters)
            .order_by(jobs.c.id.desc())
            .limit(limit)
        )
        by_queue = (
            select(jobs.c.id)
            .where(jobs.c.queue_id == wanted_key, *filters)
            .order_by(jobs.c.id.desc())
            .limit(limit)
        )
        matched = union(by_unique, by_queue).subquery("matched")
        return statement.where(jobs.c.id.in_(select(matched.c.id)))
    return statement.where(*filters)
