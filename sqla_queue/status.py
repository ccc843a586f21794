"""What the queue is doing now: per-task counts, throughput and the live workers.

:func:`read_status` (and :meth:`sqla_queue.Queue.status`, which passes it the queue's
tables, tasks and declared limits) reads one :class:`QueueStatus` in a handful of small
queries, each bounded by an index or by the live ``job_executions`` table, never by the
history in ``jobs``. ``sqla-queue status``, ``sqla-queue top`` and the web dashboard all
read it; a dashboard may call it every second against a large table without slowing
the workers' claims (it takes no row locks).

What the numbers mean (the database clock decides every time window):

* ``pending``: executions due now (``execute_at <= now()``), claimable unless the task is
  paused or at its limit; ``scheduled``: pending but due later (a delay, a retry's
  backoff); ``waiting``: queued behind an earlier job of their ``queue_id``;
  ``running``: held by a worker; ``suspended``: durable jobs in a wait (a sleep, a
  signal, a row, a step version), held by no worker until they wake.
* ``oldest_due_seconds``: how long the oldest due execution has been due: a queue that
  keeps up shows a few seconds at most.
* ``failed_last_day``: jobs of the task that failed (for good: retries exhausted or
  non-retryable) in the last 24 hours. ``sqla-queue failed`` lists them; a total over all
  time is not kept, because counting it would cost as much as the history is long.
* ``finished_last_minute`` / ``finished_last_hour``: jobs that reached a final state
  (succeeded, failed or cancelled) in the window: the task's throughput.
* ``limit`` / ``seats_in_use``: the concurrency limit workers apply (stored, else declared
  in code), and the capacity seats that running executions hold.

The two windows over ``jobs`` read at most ``scan_cap`` rows each, newest first; when a
window holds more, its counts are lower bounds and :attr:`QueueStatus.capped` says so.

Call it in a fresh transaction (a new Session, or ``engine.connect()``): every window is
measured from the transaction's ``now()``. An asyncio application runs it through
``await async_connection.run_sync(read_status, tables)``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sqla_queue.checks import INT8_MAX, check_seconds, check_whole_number
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.planner import planner_guard
from sqla_queue.statements.status import (
    LiveWorkersParams,
    clock_statement,
    execution_counts_statement,
    failed_window_statement,
    finished_window_statement,
    live_workers_statement,
    running_by_worker_statement,
    stored_settings_statement,
)

__all__ = [
    "DEFAULT_SCAN_CAP",
    "FAILED_WINDOW",
    "LIVE_WITHIN",
    "MAX_LIVE_WITHIN",
    "QueueStatus",
    "TaskStatus",
    "WorkerStatus",
    "read_status",
]

#: Seconds of history that ``failed_last_day`` counts.
FAILED_WINDOW = 86_400.0
#: The most rows of ``jobs`` that each window (throughput, failures) reads, newest first.
DEFAULT_SCAN_CAP = 100_000
#: A worker whose last beat is older than this many seconds is not shown (it is presumed
#: dead; the next beat of any live worker deletes its row). Matches the registry's expiry.
LIVE_WITHIN = 60.0
#: The longest ``live_within`` (a year): the database subtracts it from its clock.
MAX_LIVE_WITHIN = 365 * 86_400.0


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class TaskStatus:
    """One task's counts, limit and controls, as of :attr:`QueueStatus.now`."""

    #: The task's name.
    task: str
    #: Executions due now, waiting for a worker.
    pending: int
    #: Executions pending but due later (delayed, or a retry waiting out its backoff).
    scheduled: int
    #: Executions queued behind an earlier job of the same ``queue_id``.
    waiting: int
    #: Executions held by a worker now.
    running: int
    #: Seconds since the oldest due execution became due; ``None`` when nothing is due.
    oldest_due_seconds: float | None
    #: The concurrency limit workers apply (stored, else declared); ``None``: unlimited.
    limit: int | None
    #: Capacity seats held by running executions (0 for a task without a limit).
    seats_in_use: int
    #: Workers do not claim the task (``sqla-queue pause``); enqueues go on.
    paused: bool
    #: Jobs that failed for good in the last 24 hours.
    failed_last_day: int
    #: Jobs that reached a final state (succeeded, failed, cancelled) in the last minute.
    finished_last_minute: int
    #: The same over the last hour.
    finished_last_hour: int
    #: Durable jobs suspended in a wait (sleep, signal, row, step version): no worker
    #: holds them, and none claims them before they wake.
    suspended: int = 0

    def as_json(self) -> dict[str, Any]:
        """The fields as JSON-ready values (the names are the field names)."""
        return {
            "task": self.task,
            "pending": self.pending,
            "scheduled": self.scheduled,
            "waiting": self.waiting,
            "running": self.running,
            "suspended": self.suspended,
            "oldest_due_seconds": self.oldest_due_seconds,
            "limit": self.limit,
            "seats_in_use": self.seats_in_use,
            "paused": self.paused,
            "failed_last_day": self.failed_last_day,
            "finished_last_minute": self.finished_last_minute,
            "finished_last_hour": self.finished_last_hour,
        }


@dataclass(frozen=True)
class WorkerStatus:
    """One live worker, as its last beat left its row in the workers table."""

    #: The worker's id (the ``worker_id`` of the executions it holds).
    worker_id: uuid.UUID
    #: ``socket.gethostname()`` of its machine (its container, in a container).
    hostname: str
    #: Its process id on that host.
    pid: int
    #: The tasks it claims, sorted.
    tasks: tuple[str, ...]
    #: Its handler seats (``--concurrency``).
    concurrency: int
    #: Executions it holds now (read from the executions table, not from its last beat).
    running: int
    #: Jobs it finished (succeeded, failed or cancelled) since it started, at its last beat.
    finished: int
    #: When it started (the database clock).
    started_at: dt.datetime
    #: Its last beat (the database clock).
    seen_at: dt.datetime
    #: Seconds from its last beat to :attr:`QueueStatus.now`.
    seen_seconds_ago: float

    def as_json(self) -> dict[str, Any]:
        """The fields as JSON-ready values: the id as a string, times in ISO 8601."""
        return {
            "worker_id": str(self.worker_id),
            "hostname": self.hostname,
            "pid": self.pid,
            "tasks": list(self.tasks),
            "concurrency": self.concurrency,
            "running": self.running,
            "finished": self.finished,
            "started_at": _iso(self.started_at),
            "seen_at": _iso(self.seen_at),
            "seen_seconds_ago": self.seen_seconds_ago,
        }


@dataclass(frozen=True)
class QueueStatus:
    """The whole queue at one moment: every task with something to show, every live worker."""

    #: The database clock when it was read (the transaction's ``now()``).
    now: dt.datetime
    #: One entry per task, by name: the tasks the queue registers or declares, and any
    #: other task with executions, a limit, a control row or recent history.
    tasks: tuple[TaskStatus, ...]
    #: The live workers, by host, pid and start.
    workers: tuple[WorkerStatus, ...]
    #: A window over ``jobs`` held more than ``scan_cap`` rows: its counts are lower bounds.
    capped: bool = False

    def task(self, name: str) -> TaskStatus:
        """The entry of task ``name``; :class:`KeyError` when there is none."""
        for entry in self.tasks:
            if entry.task == name:
                return entry
        raise KeyError(name)

    @property
    def pending(self) -> int:
        """Executions due now, over every task."""
        return sum(t.pending for t in self.tasks)

    @property
    def running(self) -> int:
        """Executions running now, over every task."""
        return sum(t.running for t in self.tasks)

    @property
    def suspended(self) -> int:
        """Durable jobs suspended in a wait, over every task."""
        return sum(t.suspended for t in self.tasks)

    @property
    def finished_last_minute(self) -> int:
        """Jobs finished in the last minute, over every task."""
        return sum(t.finished_last_minute for t in self.tasks)

    @property
    def finished_last_hour(self) -> int:
        """Jobs finished in the last hour, over every task."""
        return sum(t.finished_last_hour for t in self.tasks)

    def as_json(self) -> dict[str, Any]:
        """``{"now", "capped", "tasks": [...], "workers": [...]}``, JSON-ready."""
        return {
            "now": _iso(self.now),
            "capped": self.capped,
            "tasks": [t.as_json() for t in self.tasks],
            "workers": [w.as_json() for w in self.workers],
        }


# Savepoint name for the planner guard; the guard's settings end with the savepoint.
_SAVEPOINT = "sqla_queue_status"


@contextmanager
def _index_walks_only(connection: Connection) -> Iterator[None]:
    """Run the index walks (``jobs`` windows, running rows) under the worker's planner
    guard, then undo it.

    Statistics taken while ``jobs`` was small (or never) make a sort of the whole window
    look cheaper than walking ``finished_ix`` newest first; on a large history that sort
    reads every row of the window. The guard (no sequential scans, bitmap scans or sorts)
    leaves the index walk as the one plan. It is ``SET LOCAL`` inside a savepoint rolled
    back at the end, so the caller's transaction keeps its own settings. A connection in
    autocommit mode has no transaction to scope it to: it runs unguarded.
    """
    dbapi = connection.connection.dbapi_connection
    if getattr(dbapi, "autocommit", False) is True:
        yield
        return
    connection.exec_driver_sql(f"SAVEPOINT {_SAVEPOINT}")
    try:
        connection.execute(planner_guard(generic_plans=False))
        yield
    finally:
        # Also recovers the caller's transaction if a window failed (it only read).
        connection.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        connection.exec_driver_sql(f"RELEASE SAVEPOINT {_SAVEPOINT}")


def read_status(
    bind: Session | Connection,
    tables: QueueTables,
    *,
    tasks: Iterable[str] = (),
    declared_limits: Mapping[str, int] | None = None,
    live_within: float | dt.timedelta = LIVE_WITHIN,
    scan_cap: int = DEFAULT_SCAN_CAP,
) -> QueueStatus:
    """Read the queue's status through ``bind`` (in its transaction; nothing is written).

    ``tasks`` are listed even when they have nothing to show (the queue's registered
    tasks); ``declared_limits`` are the limits declared in code, which a stored limit
    overrides. Workers seen within ``live_within`` seconds (at most
    :data:`MAX_LIVE_WITHIN`) are listed. Each window over ``jobs`` reads at most
    ``scan_cap`` rows: a whole number from 1 to the largest ``bigint`` (it is the SQL
    ``LIMIT``). A value out of its range raises ``TypeError`` or ``ValueError`` naming
    it, before anything is read.
    """
    scan_cap = check_whole_number("scan_cap", scan_cap, 1, INT8_MAX)
    live_within = check_seconds(
        "live_within", live_within, maximum=MAX_LIVE_WITHIN, positive=True, timedelta=True
    )
    connection = bind.connection() if isinstance(bind, Session) else bind
    now: dt.datetime = connection.execute(clock_statement()).scalar_one()
    counts = {row.task: row for row in connection.execute(execution_counts_statement(tables))}
    with _index_walks_only(connection):
        held = {
            row.worker_id: int(row.running)
            for row in connection.execute(running_by_worker_statement(tables))
        }
        finished_rows = connection.execute(
            finished_window_statement(tables, window=3600.0, recent=60.0, cap=scan_cap)
        ).all()
        failed_rows = connection.execute(
            failed_window_statement(tables, window=FAILED_WINDOW, cap=scan_cap)
        ).all()
    finished = {row.task: row for row in finished_rows}
    failed = {row.task: int(row.failed) for row in failed_rows}
    stored = {row.task: row for row in connection.execute(stored_settings_statement(tables))}
    params: LiveWorkersParams = {"live_within": float(live_within)}
    worker_rows = connection.execute(live_workers_statement(tables), params).all()

    declared = dict(declared_limits or {})
    names = set(tasks) | set(counts) | set(finished) | set(failed) | set(stored) | set(declared)
    entries = []
    for name in sorted(names):
        count = counts.get(name)
        done = finished.get(name)
        setting = stored.get(name)
        stored_limit = setting.concurrency_limit if setting is not None else None
        oldest = count.oldest_due_seconds if count is not None else None
        entries.append(
            TaskStatus(
                task=name,
                pending=int(count.pending) if count is not None else 0,
                scheduled=int(count.scheduled) if count is not None else 0,
                waiting=int(count.waiting) if count is not None else 0,
                running=int(count.running) if count is not None else 0,
                oldest_due_seconds=None if oldest is None else max(0.0, float(oldest)),
                limit=stored_limit if stored_limit is not None else declared.get(name),
                seats_in_use=int(count.seats) if count is not None else 0,
                paused=bool(setting.paused) if setting is not None else False,
                failed_last_day=failed.get(name, 0),
                finished_last_minute=int(done.finished_recent) if done is not None else 0,
                finished_last_hour=int(done.finished_window) if done is not None else 0,
                suspended=int(count.suspended) if count is not None else 0,
            )
        )
    workers = tuple(
        WorkerStatus(
            worker_id=row.worker_id,
            hostname=row.hostname,
            pid=row.pid,
            tasks=tuple(sorted(row.tasks)),
            concurrency=row.concurrency,
            running=held.get(row.worker_id, 0),
            finished=int(row.finished),
            started_at=row.started_at,
            seen_at=row.seen_at,
            seen_seconds_ago=max(0.0, float(row.seen_seconds_ago)),
        )
        for row in worker_rows
    )
    # A walk that stopped at its cap may have left rows of the window unread.
    capped = (
        sum(int(row.finished_window) for row in finished_rows) >= scan_cap
        or sum(failed.values()) >= scan_cap
    )
    return QueueStatus(now=now, tasks=tuple(entries), workers=workers, capped=capped)
