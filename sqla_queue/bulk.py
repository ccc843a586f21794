"""Large enqueues written with COPY instead of the JSON statement, on psycopg connections.

``enqueue_many`` of at least :data:`COPY_THRESHOLD` calls reserves the new ids from the
jobs' identity sequence, then streams the jobs and their executions with two
``COPY ... FROM STDIN``. The rows are the
ones the enqueue statement would write: the same defaults, the same FIFO ids in the
caller's order, due times on the database's clock (its transaction time, read in the same
statement as the ids), and one NOTIFY, all in the caller's transaction. Every call is
validated and serialized before the first row is sent, so a bad one means nothing is
written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg import sql
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue._identifiers import validate_task_name
from sqla_queue.core.payload import dump_json, make_payload
from sqla_queue.models.tables import ExecutionState, QueueTables
from sqla_queue.task import JobSpec

if TYPE_CHECKING:
    from sqla_queue._binds import AnyBind
    from sqla_queue.enqueue import TaskDefaults

__all__ = ["COPY_THRESHOLD", "CopyPlan", "copy_enqueue", "prepare_copy_rows", "uses_copy"]

#: Calls in one ``enqueue_many`` from which COPY is used: below it, the one-statement JSON
#: path costs less than COPY's extra round trips.
COPY_THRESHOLD = 2_000


class CopyRow(NamedTuple):
    """One validated call, serialized: everything but its id and due time."""

    task: str
    payload: str
    priority: int
    queue_id: str | None
    max_attempts: int
    run_at: dt.datetime | None
    delay: float | None


def prepare_copy_rows(specs: Iterable[JobSpec], defaults_for: Any) -> list[CopyRow]:
    """Validate and serialize every call; raises before anything could be written."""
    rows: list[CopyRow] = []
    # Each task name is checked and looked up once, not once per call.
    known: dict[str, TaskDefaults] = {}
    for spec in specs:
        defaults = known.get(spec.task)
        if defaults is None:
            validate_task_name(spec.task)
            defaults = known[spec.task] = defaults_for(spec.task)
        opts = spec.options
        rows.append(
            CopyRow(
                task=spec.task,
                payload=dump_json(make_payload(spec.args, spec.kwargs), task=spec.task),
                priority=defaults.priority if opts.priority is None else opts.priority,
                queue_id=opts.queue_id,
                max_attempts=(
                    defaults.max_attempts if opts.max_attempts is None else opts.max_attempts
                ),
                run_at=opts.run_at,
                delay=opts.delay,
            )
        )
    return rows


@dataclass(frozen=True)
class CopyPlan:
    """The statements of one COPY enqueue and the records they stream. No I/O."""

    tables: QueueTables
    notify: bool

    def reserve(self) -> sql.Composed:
        """SQL returning ``(now(), id)`` for ``n`` new ids (``%s`` is ``n``).

        ``now()`` is the transaction's time, which the enqueue statement also uses.
        """
        jobs = self.tables.jobs
        name = _quoted(jobs.schema, jobs.name)
        return sql.SQL(
            "SELECT now(), nextval(pg_get_serial_sequence({table}, 'id'))"
            " FROM generate_series(1, %s)"
        ).format(table=sql.Literal(name))

    def copy_jobs(self) -> sql.Composed:
        """``COPY jobs (...) FROM STDIN`` for :meth:`job_records`."""
        return _copy(
            self.tables.jobs,
            ("id", "task", "payload", "priority", "queue_id", "max_attempts", "scheduled_at"),
        )

    def copy_executions(self) -> sql.Composed:
        """``COPY job_executions (...) FROM STDIN`` for :meth:`execution_records`."""
        return _copy(
            self.tables.executions, ("id", "task", "priority", "queue_id", "state", "execute_at")
        )

    def notify_statement(self) -> tuple[str, tuple[str]]:
        """The one NOTIFY of the enqueue, as the enqueue statement sends it."""
        return "SELECT pg_notify(%s, '')", (self.tables.notify_channel,)

    @staticmethod
    def due(row: CopyRow, now: dt.datetime) -> dt.datetime:
        """When ``row`` may first run: its ``run_at``, else the transaction time plus delay."""
        if row.run_at is not None:
            return row.run_at
        return now + dt.timedelta(seconds=row.delay or 0.0)

    def job_records(
        self, rows: Sequence[CopyRow], ids: Sequence[int], now: dt.datetime
    ) -> Iterator[tuple[Any, ...]]:
        """The jobs' rows, in the column order of :meth:`copy_jobs`."""
        for row, job_id in zip(rows, ids, strict=True):
            yield (
                job_id,
                row.task,
                row.payload,
                row.priority,
                row.queue_id,
                row.max_attempts,
                self.due(row, now),
            )

    def execution_records(
        self, rows: Sequence[CopyRow], ids: Sequence[int], now: dt.datetime
    ) -> Iterator[tuple[Any, ...]]:
        """The executions' rows, in the column order of :meth:`copy_executions`."""
        pending = ExecutionState.PENDING
        for row, job_id in zip(rows, ids, strict=True):
            yield (job_id, row.task, row.priority, row.queue_id, pending, self.due(row, now))


def _quoted(schema: str | None, name: str) -> str:
    # pg_get_serial_sequence parses its argument as an SQL name: quote each part.
    parts = [schema, name] if schema else [name]
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


def _reserved(rows: Sequence[Any]) -> tuple[dt.datetime, list[int]]:
    # Sorted: nextval hands this call increasing values, which keep the caller's order.
    return rows[0][0], sorted(int(r[1]) for r in rows)


def _copy(table: Any, columns: Sequence[str]) -> sql.Composed:
    name = sql.Identifier(table.schema, table.name) if table.schema else sql.Identifier(table.name)
    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        name, sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


def uses_copy(bind: AnyBind, count: int) -> bool:
    """Whether an enqueue of ``count`` calls on ``bind`` goes through COPY."""
    if count < COPY_THRESHOLD:
        return False
    dialect = bind.get_bind().dialect if isinstance(bind, Session | AsyncSession) else bind.dialect
    return dialect.driver == "psycopg"


def copy_enqueue(
    bind: AnyBind, plan: CopyPlan, rows: list[CopyRow]
) -> list[int] | Coroutine[Any, Any, list[int]]:
    """Write ``rows`` with COPY in ``bind``'s transaction; their ids in order."""
    if isinstance(bind, AsyncSession | AsyncConnection):
        return _copy_async(bind, plan, rows)
    connection = bind.connection() if isinstance(bind, Session) else bind
    return _copy_sync(connection, plan, rows)


def _copy_sync(connection: Connection, plan: CopyPlan, rows: list[CopyRow]) -> list[int]:
    driver = connection.connection.driver_connection
    assert driver is not None, "the caller's connection is open"
    # Inside the caller's transaction both COPYs stand or fall with it. A connection in
    # autocommit would commit each on its own: there they get one transaction. (Not
    # transaction() always: on an idle connection outside autocommit, psycopg would
    # commit that block at once, under the caller's feet.)
    atomic = driver.transaction() if driver.autocommit else contextlib.nullcontext()
    with atomic, driver.cursor() as cursor:
        now, ids = _reserved(cursor.execute(plan.reserve(), (len(rows),)).fetchall())
        with cursor.copy(plan.copy_jobs()) as copy:
            for record in plan.job_records(rows, ids, now):
                copy.write_row(record)
        with cursor.copy(plan.copy_executions()) as copy:
            for record in plan.execution_records(rows, ids, now):
                copy.write_row(record)
        if plan.notify:
            cursor.execute(*plan.notify_statement())
    return ids


async def _copy_async(
    bind: AsyncSession | AsyncConnection, plan: CopyPlan, rows: list[CopyRow]
) -> list[int]:
    connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
    driver = (await connection.get_raw_connection()).driver_connection
    assert driver is not None, "the caller's connection is open"
    atomic = driver.transaction() if driver.autocommit else contextlib.nullcontext()
    async with atomic, driver.cursor() as cursor:
        await cursor.execute(plan.reserve(), (len(rows),))
        now, ids = _reserved(await cursor.fetchall())
        async with cursor.copy(plan.copy_jobs()) as copy:
            for record in plan.job_records(rows, ids, now):
                await copy.write_row(record)
        async with cursor.copy(plan.copy_executions()) as copy:
            for record in plan.execution_records(rows, ids, now):
                await copy.write_row(record)
        if plan.notify:
            await cursor.execute(*plan.notify_statement())
    return ids
