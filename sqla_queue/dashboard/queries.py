"""What the dashboard reads beyond :mod:`sqla_queue.status`: pages of jobs, one job, and
finishes per minute for the throughput chart.

Every statement here reads through an index the rest of the library already keeps: a
page of jobs is the ``sqla-queue jobs`` listing
(:func:`~sqla_queue.statements.listing.job_listing_statement`) cut at the last id shown
(keyset pagination on the primary key, never ``OFFSET``, so page 1000 costs what page 1
does); a job is read by its primary key; the chart walks ``finished_ix`` newest first and
stops at a row cap, as the status windows do. No statement takes a row lock, so none
waits for, or delays, a claim.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from sqlalchemy.engine import Connection

from sqla_queue.admin import BIGINT_MAX
from sqla_queue.listing import JobRow
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import QUEUED, seconds
from sqla_queue.statements.listing import job_listing_statement, job_state

__all__ = [
    "JobFilters",
    "JobPage",
    "Throughput",
    "job_detail_statement",
    "job_page_statement",
    "read_job",
    "read_job_page",
    "read_throughput",
    "throughput_statement",
]


@dataclass(frozen=True)
class JobFilters:
    """The job list's filters, as its query string gives them (all optional)."""

    task: str | None = None
    state: str | None = None
    #: A unique key or ``queue_id``.
    key: str | None = None
    about_table: str | None = None
    about_key: str | None = None
    #: Show only jobs with a smaller id (the last id of the page before).
    before: int | None = None


@dataclass(frozen=True)
class JobPage:
    """One page of jobs, newest first, and the id the next page starts below."""

    rows: tuple[JobRow, ...]
    #: ``before=`` of the next (older) page; ``None`` on the last page.
    next_before: int | None
    #: By job id, the attempt its execution is on, for the queued jobs (a running job's
    #: ``attempts`` counts only the attempts that ended).
    live_attempts: dict[int, int] = field(default_factory=dict)


def job_page_statement(tables: QueueTables, filters: JobFilters) -> Select[Any]:
    """The ``sqla-queue jobs`` listing with ``filters``, below the ``before`` id if given,
    plus ``live_attempt``: the attempt of a queued job's execution (read by its primary
    key, only for a queued job).

    Parameters: those of :class:`~sqla_queue.statements.listing.JobListingParams` for the
    filters given, plus ``before`` (``bigint``) with ``filters.before``. A filter on a key
    walks the unique keys and the ``queue_id`` s separately, each cut at the limit, as the
    listing does: the ``before`` bound goes inside both walks, or page 2 would come from
    the walks of page 1.
    """
    jobs = tables.jobs
    base = job_listing_statement(
        tables,
        states=[filters.state] if filters.state else [],
        tasks=filters.task is not None,
        about=filters.about_table is not None,
        about_key=filters.about_key is not None,
    )
    ex = tables.executions.alias("live")
    live_attempt = select(ex.c.attempt).where(ex.c.id == jobs.c.id).scalar_subquery()
    base = base.add_columns(
        case((jobs.c.status == QUEUED, live_attempt), else_=None).label("live_attempt")
    )
    if filters.before is not None:
        base = base.where(jobs.c.id < bindparam("before", type_=BigInteger))
    if filters.key is None:
        return base
    wanted = bindparam("key", type_=Text)
    ids = base.with_only_columns(jobs.c.id)
    matched = sql_union(
        ids.where(jobs.c.unique_key == wanted), ids.where(jobs.c.queue_id == wanted)
    ).subquery("matched")
    return base.where(jobs.c.id.in_(select(matched.c.id)))


def read_job_page(
    connection: Connection, tables: QueueTables, filters: JobFilters, *, page_size: int
) -> JobPage:
    """One page of at most ``page_size`` jobs; one more is read to know if another follows."""
    params: dict[str, Any] = {"limit": page_size + 1}
    if filters.task is not None:
        params["tasks"] = [filters.task]
    if filters.key is not None:
        params["key"] = filters.key
    if filters.about_table is not None:
        params["about_table"] = filters.about_table
    if filters.about_key is not None:
        params["about_key"] = filters.about_key
    if filters.before is not None:
        params["before"] = min(filters.before, BIGINT_MAX)
    rows = connection.execute(job_page_statement(tables, filters), params).all()
    shown: list[JobRow] = []
    live: dict[int, int] = {}
    for row in rows[:page_size]:
        values = row._asdict()
        attempt = values.pop("live_attempt")
        shown.append(JobRow(**values))
        if attempt is not None:
            live[row.id] = int(attempt)
    more = len(rows) > page_size
    next_before = shown[-1].id if more and shown else None
    return JobPage(rows=tuple(shown), next_before=next_before, live_attempts=live)


def job_detail_statement(tables: QueueTables) -> Select[Any]:
    """One job (parameter ``id``) with its state and its live execution's columns, if any;
    both read by primary key."""
    jobs = tables.jobs
    # An alias: job_state's subquery reads the executions table itself, and would
    # correlate to an unaliased one in this FROM.
    ex = tables.executions.alias("live")
    return (
        select(
            jobs,
            job_state(tables).label("state"),
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


def read_job(connection: Connection, tables: QueueTables, job_id: int) -> dict[str, Any] | None:
    """Job ``job_id`` as a dict of :func:`job_detail_statement`'s columns, else ``None``."""
    if not 1 <= job_id <= BIGINT_MAX:
        return None
    row = connection.execute(job_detail_statement(tables), {"id": job_id}).first()
    return None if row is None else dict(row._mapping)


def _literal_whole(value: int, what: str) -> Any:
    # Written into the text, as the status windows are: a generic plan cannot see a bound
    # LIMIT, and might read the whole history. Only a checked int gets there.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1, got {value!r}")
    return literal_column(str(value), Integer)


def throughput_statement(tables: QueueTables, *, minutes: int = 60, cap: int = 20_000) -> Any:
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


@dataclass(frozen=True)
class Throughput:
    """Finishes per minute, oldest minute first, per task and over all of them."""

    #: The first minute of the chart (the database clock, truncated to the minute).
    start: dt.datetime
    minutes: int
    #: Per task: ``minutes`` counts, oldest first.
    per_task: dict[str, list[int]] = field(default_factory=dict)
    #: The cap cut the walk: minutes before this one were not read (their counts are 0).
    covered_from: dt.datetime | None = None

    @property
    def total(self) -> list[int]:
        """Finishes per minute over every task."""
        sums = [0] * self.minutes
        for counts in self.per_task.values():
            for i, n in enumerate(counts):
                sums[i] += n
        return sums


def read_throughput(
    connection: Connection,
    tables: QueueTables,
    now: dt.datetime,
    *,
    minutes: int = 60,
    cap: int = 20_000,
) -> Throughput:
    """Run :func:`throughput_statement` and spread its rows over ``minutes`` buckets
    ending with ``now``'s minute (``now``: the database clock of the same transaction)."""
    rows: Sequence[Any] = connection.execute(
        throughput_statement(tables, minutes=minutes, cap=cap)
    ).all()
    last = now.replace(second=0, microsecond=0)
    start = last - dt.timedelta(minutes=minutes - 1)
    per_task: dict[str, list[int]] = {}
    read = 0
    oldest: dt.datetime | None = None
    for row in rows:
        read += int(row.finished)
        oldest = row.oldest if oldest is None else min(oldest, row.oldest)
        index = int((row.minute - start).total_seconds() // 60)
        if 0 <= index < minutes:
            per_task.setdefault(row.task, [0] * minutes)[index] += int(row.finished)
    covered = oldest if read >= cap else None
    return Throughput(start=start, minutes=minutes, per_task=per_task, covered_from=covered)
