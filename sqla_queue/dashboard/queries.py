"""What the dashboard reads beyond :mod:`sqla_queue.status`: pages of jobs, one job (and
the workflow it is a node of), and finishes per minute for the throughput chart.

The statements are built in :mod:`sqla_queue.statements.dashboard`, which says how each
one reads; here they are run and their rows shaped for the pages.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from sqla_queue.checks import INT8_MAX as BIGINT_MAX
from sqla_queue.listing import JobRow
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.dashboard import (
    job_detail_statement,
    job_page_statement,
    throughput_statement,
)
from sqla_queue.workflows.listing import NodeOf, workflow_of_job

__all__ = [
    "JobFilters",
    "JobPage",
    "Throughput",
    "read_job",
    "read_job_page",
    "read_throughput",
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
    statement = job_page_statement(
        tables,
        state=filters.state,
        task=filters.task is not None,
        key=filters.key is not None,
        about=filters.about_table is not None,
        about_key=filters.about_key is not None,
        before=filters.before is not None,
    )
    rows = connection.execute(statement, params).all()
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


def read_job(connection: Connection, tables: QueueTables, job_id: int) -> dict[str, Any] | None:
    """Job ``job_id`` as a dict of the columns of
    :func:`~sqla_queue.statements.dashboard.job_detail_statement`, plus ``workflow_id``
    and ``workflow_node`` (its workflow and node name when it is a workflow's node, else
    ``None``) and ``workflow_held_by`` (for a held node, the failed parent to requeue);
    ``None`` when there is no such job."""
    if not 1 <= job_id <= BIGINT_MAX:
        return None
    row = connection.execute(job_detail_statement(tables), {"id": job_id}).first()
    if row is None:
        return None
    node: NodeOf | None = workflow_of_job(connection, tables, job_id)
    return {
        **row._mapping,
        "workflow_id": node.workflow_id if node is not None else None,
        "workflow_node": node.name if node is not None else None,
        # A held node: the failed parent to requeue to resume it.
        "workflow_held_by": node.failed_parent if node is not None else None,
    }


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
    """Run :func:`~sqla_queue.statements.dashboard.throughput_statement` and spread its
    rows over ``minutes`` buckets ending with ``now``'s minute (``now``: the database clock
    of the same transaction)."""
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
