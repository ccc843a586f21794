"""What ``sqla-queue status``, ``top`` and the dashboards read (:mod:`sqla_queue.status`).

A dashboard may run these every second against a large history, next to busy workers,
so each one's work is bounded: by the live ``job_executions`` table (which holds only
the jobs not finished yet), by a partial index over ``jobs`` walked newest first and cut
at a row cap, or by a table of a few rows. None of them takes a row lock, so none ever
waits for, or delays, a claim.

The windows and caps over ``jobs`` are written into the SQL text, not bound: a prepared
statement's generic plan, made without the values, cannot see that a ``LIMIT`` is small
or a window short, and could choose to read the whole history. The builders' arguments
give them; the default values are the library's. Each builder has a ``TypedDict`` next
to it naming its bound parameters (empty when it has none).
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import Double, Integer, Select, bindparam, func, literal_column, select
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.checks import INT8_MAX, check_in_range, is_number
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import FAILED, PENDING, RUNNING, SUSPENDED, WAITING, seconds

__all__ = [
    "ClockParams",
    "ExecutionCountsParams",
    "FailedWindowParams",
    "FinishedWindowParams",
    "LiveWorkersParams",
    "RunningByWorkerParams",
    "StoredSettingsParams",
    "clock_statement",
    "execution_counts_statement",
    "failed_window_statement",
    "finished_window_statement",
    "live_workers_statement",
    "running_by_worker_statement",
    "stored_settings_statement",
]


class ClockParams(TypedDict):
    """Parameters of :func:`clock_statement`: none."""


class ExecutionCountsParams(TypedDict):
    """Parameters of :func:`execution_counts_statement`: none."""


class RunningByWorkerParams(TypedDict):
    """Parameters of :func:`running_by_worker_statement`: none."""


class FinishedWindowParams(TypedDict):
    """Parameters of :func:`finished_window_statement`: none (its window is in the text)."""


class FailedWindowParams(TypedDict):
    """Parameters of :func:`failed_window_statement`: none (its window is in the text)."""


class StoredSettingsParams(TypedDict):
    """Parameters of :func:`stored_settings_statement`: none."""


class LiveWorkersParams(TypedDict):
    """Parameters of :func:`live_workers_statement`."""

    #: Workers whose last beat is older than this many seconds are left out.
    live_within: float


def _whole(value: int, what: str) -> ColumnElement[Any]:
    # Rendered into the text: only a checked int that a LIMIT (bigint) holds gets there.
    return literal_column(str(check_in_range(what, value, 1, INT8_MAX)), Integer)


def _ago(amount: float, what: str) -> ColumnElement[Any]:
    """``now() - interval 'amount seconds'``, the amount checked and written into the text."""
    if not is_number(amount) or not amount > 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {amount!r}")
    return func.now() - seconds(literal_column(repr(float(amount)), Double))


def clock_statement() -> Select[Any]:
    """The transaction's ``now()``, which every window of a status reading is measured
    from. No parameters."""
    return select(func.now())


def execution_counts_statement(tables: QueueTables) -> Select[Any]:
    """Per task: ``pending`` (due), ``scheduled``, ``waiting``, ``running``, ``suspended``,
    ``seats`` and ``oldest_due_seconds``. No parameters.

    One pass over the live executions, grouped by task: a table of live jobs only, whose
    size is the backlog, never the history. ``seats`` counts every execution holding a
    capacity slot: running, and reclaimed ones that kept their seat while pending again.
    """
    ex = tables.executions
    now = func.now()
    pending = ex.c.state == PENDING
    due = pending & (ex.c.execute_at <= now)
    return (
        select(
            ex.c.task,
            func.count().filter(due).label("pending"),
            func.count().filter(pending & (ex.c.execute_at > now)).label("scheduled"),
            func.count().filter(ex.c.state == WAITING).label("waiting"),
            func.count().filter(ex.c.state == RUNNING).label("running"),
            func.count().filter(ex.c.state == SUSPENDED).label("suspended"),
            func.count().filter(ex.c.slot.is_not(None)).label("seats"),
            func.extract("epoch", now - func.min(ex.c.execute_at).filter(due)).label(
                "oldest_due_seconds"
            ),
        )
        .group_by(ex.c.task)
        .order_by(ex.c.task)
    )


def running_by_worker_statement(tables: QueueTables) -> Select[Any]:
    """Per worker: ``running``, the executions it holds now. No parameters.

    Reads ``running_ix`` (the running rows only: at most every worker's handler seats),
    under the planner guard that :mod:`sqla_queue.status` puts around it.
    """
    ex = tables.executions
    return (
        select(ex.c.worker_id, func.count().label("running"))
        .where(ex.c.state == RUNNING)
        .group_by(ex.c.worker_id)
    )


def finished_window_statement(
    tables: QueueTables, *, window: float = 3600.0, recent: float = 60.0, cap: int = 100_000
) -> Select[Any]:
    """Per task: jobs that reached a final state in the last ``window`` seconds
    (``finished_window``), of which ``failed_window`` failed and ``finished_recent`` did
    so in the last ``recent`` seconds. No parameters.

    Walks ``finished_ix`` newest first and stops after ``cap`` rows: when the window holds
    more, the counts (summed over tasks, they equal ``cap``) are lower bounds.
    """
    jobs = tables.jobs
    walk = (
        select(jobs.c.task, jobs.c.status, jobs.c.finished_at)
        .where(jobs.c.finished_at.is_not(None), jobs.c.finished_at >= _ago(window, "window"))
        .order_by(jobs.c.finished_at.desc())
        .limit(_whole(cap, "cap"))
        .subquery("recent")
    )
    return (
        select(
            walk.c.task,
            func.count().label("finished_window"),
            func.count()
            .filter(walk.c.finished_at >= _ago(recent, "recent"))
            .label("finished_recent"),
            func.count().filter(walk.c.status == FAILED).label("failed_window"),
        )
        .group_by(walk.c.task)
        .order_by(walk.c.task)
    )


def failed_window_statement(
    tables: QueueTables, *, window: float = 86_400.0, cap: int = 100_000
) -> Select[Any]:
    """Per task: ``failed``, the jobs that failed for good in the last ``window`` seconds.
    No parameters.

    Walks ``failed_ix`` newest first and stops after ``cap`` rows (the counts, summed,
    then equal ``cap`` and are lower bounds).
    """
    jobs = tables.jobs
    walk = (
        select(jobs.c.task)
        .where(jobs.c.status == FAILED, jobs.c.finished_at >= _ago(window, "window"))
        .order_by(jobs.c.finished_at.desc())
        .limit(_whole(cap, "cap"))
        .subquery("failures")
    )
    return (
        select(walk.c.task, func.count().label("failed"))
        .group_by(walk.c.task)
        .order_by(walk.c.task)
    )


def stored_settings_statement(tables: QueueTables) -> Select[Any]:
    """Per task with a stored limit or control row: ``(task, concurrency_limit, paused)``.
    No parameters. Both tables hold a row per configured task, no more."""
    limits, controls = tables.limits, tables.controls
    joined = limits.join(controls, limits.c.task == controls.c.task, full=True)
    task = func.coalesce(limits.c.task, controls.c.task).label("task")
    return (
        select(
            task,
            limits.c.concurrency_limit,
            func.coalesce(controls.c.paused, literal_column("false")).label("paused"),
        )
        .select_from(joined)
        .order_by(task)
    )


def live_workers_statement(tables: QueueTables) -> Select[Any]:
    """The workers seen in the last ``live_within`` seconds, by host, pid and start, each
    with ``seen_seconds_ago`` and the database clock (``now``). Parameters:
    :class:`LiveWorkersParams`."""
    w = tables.workers
    now = func.now()
    return (
        select(
            w.c.worker_id,
            w.c.hostname,
            w.c.pid,
            w.c.tasks,
            w.c.concurrency,
            w.c.running,
            w.c.finished,
            w.c.started_at,
            w.c.seen_at,
            func.extract("epoch", now - w.c.seen_at).label("seen_seconds_ago"),
        )
        .where(w.c.seen_at >= now - seconds(bindparam("live_within", type_=Double)))
        .order_by(w.c.hostname, w.c.pid, w.c.started_at)
    )
