"""A small, realistic queue for the dashboard's tests and screenshots.

Jobs that really ran (a worker thread runs them: results, real failures with their
tracebacks, one with a long message), jobs still waiting, one running, a linked row, a
unique key and one live worker's row (serving seven tasks, which a page must fit).
"""

from __future__ import annotations

import datetime as dt
import socket
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import Order, queue
from tests.support.running import pretend_claimed, wait_for, worker_thread

#: A failure message longer than any table cell: words, then a token without a break.
LONG_ERROR = (
    "payment gateway refused the charge: the card issuer answered 'do not honor' after "
    "three retries; see https://payments.example.com/charges/"
    + "ch_"
    + "3f9a" * 30
    + " for the full exchange, and check the customer's billing address"
)
#: A queue_id longer than any table cell, without a break.
LONG_KEY = "tenant-" + "a1b2c3" * 20
#: The tasks the live worker's beat says it serves.
WORKER_TASKS = ["boom", "crash", "echo", "flaky", "keyed", "noop", "record"]


@dataclass(frozen=True)
class Seeded:
    """The ids the tests look for."""

    failed: list[int]
    succeeded: list[int]
    pending: list[int]
    linked: int
    unique: int
    scheduled: int
    #: A noop job that the live worker runs (its first attempt).
    running: int
    #: A noop job suspended as a durable job waiting for signal ``approved``.
    suspended: int


def seed(engine: Engine) -> Seeded:
    """Fill the queue: run echo and boom jobs to the end, then queue more that wait."""
    factory = sessionmaker(engine)
    with factory.begin() as session:
        session.add(Order(id=42, email="ada@example.com"))
    with factory.begin() as session:
        order = session.get(Order, 42)
        succeeded = [queue.enqueue(session, "echo", {"value": {"n": i}}) for i in range(3)]
        linked = queue.enqueue(session, "echo", {"value": "receipt"}, about=order)
        unique = queue.enqueue(session, "echo", {"value": 7}, unique_key="report-2024-06")
        failed = [
            queue.enqueue(session, "boom", {"message": f"card declined ({i})"}) for i in range(2)
        ]
        failed.append(queue.enqueue(session, "boom", {"message": LONG_ERROR}))
    finished = [*succeeded, linked, unique, *failed]
    worker = queue.worker(factory, tasks=["echo", "boom"], concurrency=2, poll_interval=0.2)
    with worker_thread(worker):
        wait_for(lambda: _count_finished(factory, finished) == len(finished), timeout=60)
    with factory.begin() as session:
        pending = [queue.enqueue(session, "noop") for _ in range(3)]
        pending.append(queue.enqueue(session, "noop", queue_id=LONG_KEY))
        scheduled = queue.enqueue(session, "noop", delay=dt.timedelta(hours=1))
        running = queue.enqueue(session, "noop")
        # A worker that is alive now, as its registry beat would leave it, running a job.
        worker_id = uuid.uuid4()
        session.execute(
            insert(queue.tables.workers).values(
                worker_id=worker_id,
                hostname=socket.gethostname(),
                pid=4242,
                tasks=WORKER_TASKS,
                concurrency=8,
                running=1,
                finished=128,
            )
        )
        pretend_claimed(session.connection(), running, worker=worker_id)
        # A durable job waiting for a signal (suspended: the overview gains its column).
        waiting = queue.enqueue(session, "noop")
        executions = queue.tables.executions
        session.execute(
            update(executions)
            .where(executions.c.id == waiting)
            .values(
                state="suspended",
                wait="signal:approved",
                execute_at=dt.datetime(9999, 12, 31, tzinfo=dt.UTC),
            )
        )
    return Seeded(failed, [*succeeded], pending, linked, unique, scheduled, running, waiting)


def _count_finished(factory: sessionmaker[Session], ids: list[int]) -> int:
    jobs = queue.tables.jobs
    with factory() as session:
        statement = select(func.count()).where(jobs.c.id.in_(ids), jobs.c.finished_at.is_not(None))
        return int(session.execute(statement).scalar_one())


def job_status(engine: Engine, job_id: int) -> str:
    """``jobs.status`` of ``job_id``."""
    jobs = queue.tables.jobs
    with engine.connect() as connection:
        return str(
            connection.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one()
        )


def is_paused(engine: Engine, task: str) -> bool:
    """Whether ``task`` has a control row saying it is paused."""
    controls = queue.tables.controls
    with engine.connect() as connection:
        row = connection.execute(
            select(controls.c.paused).where(controls.c.task == task)
        ).scalar_one_or_none()
    return bool(row)


def add_history(engine: Engine, *, minutes: int = 60) -> int:
    """Finished jobs spread over the last ``minutes`` minutes, at a rate that varies, so
    the throughput chart has a shape; returns how many were added."""
    jobs = queue.tables.jobs
    name = f"{jobs.schema}.{jobs.name}" if jobs.schema else jobs.name
    with engine.begin() as connection:
        added = connection.exec_driver_sql(
            f"""
            INSERT INTO {name} (task, payload, status, attempts, max_attempts,
                                created_at, scheduled_at, finished_at, result)
            SELECT CASE WHEN mod(n, 5) = 0 THEN 'noop' ELSE 'echo' END,
                   '{{"args": [], "kwargs": {{}}}}'::jsonb,
                   CASE WHEN mod(n, 97) = 0 THEN 'failed' ELSE 'succeeded' END, 1, 1,
                   t - interval '2 seconds', t - interval '2 seconds', t, 'null'::jsonb
            FROM generate_series(1, %(minutes)s) AS m,
                 generate_series(1, (40 + 30 * sin(m / 6.0))::int) AS n,
                 LATERAL (SELECT now() - m * interval '1 minute'
                                 + n * interval '1 second' AS t) AS tick
            """,
            {"minutes": minutes},
        ).rowcount
    return int(added)
