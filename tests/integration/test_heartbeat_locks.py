"""The heartbeat waits for no lock (issue 36, sections 1 and 6).

At ``prefetch=5000`` a worker's heartbeat used to deadlock with its own completion, both
locking thousands of execution rows in different orders, and to log the 30 KB statement
each time. The heartbeat now stamps only the rows it can lock at once (``SKIP LOCKED``),
so it can neither wait nor deadlock; and a log line quotes at most 500 characters of an
error.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from tests.support.app import noop, queue
from tests.support.running import pretend_claimed

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EX = queue.tables.executions


def test_fast_heartbeats_at_prefetch_5000_never_deadlock_with_completions(
    SessionLocal: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    with SessionLocal.begin() as session:
        queue.enqueue_many(session, [noop.call() for _ in range(5000)])
    worker = queue.worker(
        SessionLocal,
        tasks=["noop"],
        concurrency=10,
        prefetch=5000,
        heartbeat_interval=0.02,
        install_signal_handlers=False,
    )
    with caplog.at_level(logging.WARNING, logger="sqla_queue"):
        stats = worker.run(burst=True)
    assert stats.succeeded == 5000
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [p for p in problems if "deadlock" in p.lower()], problems[:3]
    # Whatever was logged quotes a bounded text.
    assert all(len(p) < 2000 for p in problems), max(map(len, problems))
    with SessionLocal() as session:
        done = session.scalar(select(func.count()).where(JOBS.c.status == "succeeded"))
    assert done == 5000


def test_a_beat_skips_a_locked_execution_and_keeps_the_worker_alive(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A caller locks one of two held executions; the beat neither waits for it nor
    stamps it, still reports both as held, and stamps the worker's own row."""
    with SessionLocal.begin() as session:
        first, second = noop.enqueue(session), noop.enqueue(session)
    with engine.begin() as connection:
        worker = pretend_claimed(connection, first)
        connection.execute(
            EX.update()
            .where(EX.c.id == second)
            .values(state="running", worker_id=worker, attempt=1)
        )
        connection.execute(
            EX.update()
            .where(EX.c.id.in_([first, second]))
            .values(alive_at=text("now() - interval '1 hour'"))
        )
    beat = statements.heartbeat_statement(queue.tables)
    params = {
        "worker": worker,
        "ids": [first, second],
        "attempts": [1, 1],
        "hostname": "h",
        "pid": 1,
        "tasks": ["noop"],
        "concurrency": 2,
    }
    with engine.connect() as caller, engine.connect() as beater:
        caller.begin()
        caller.execute(select(EX.c.id).where(EX.c.id == second).with_for_update())
        with beater.begin():
            # A wait for the caller's lock would fail the test after 2 s.
            beater.execute(text("SET LOCAL lock_timeout = '2s'"))
            rows = beater.execute(beat, params).all()
        assert sorted(rows) == [(first, False), (second, False)]
        caller.rollback()
    with engine.connect() as reader:
        stamped = dict(
            reader.execute(
                select(EX.c.id, EX.c.alive_at > func.now() - text("interval '1 minute'")).where(
                    EX.c.id.in_([first, second])
                )
            ).all()
        )
        seen = reader.scalar(
            select(queue.tables.workers.c.seen_at > func.now() - text("interval '1 minute'")).where(
                queue.tables.workers.c.worker_id == worker
            )
        )
    assert stamped == {first: True, second: False}
    assert seen is True
    # The reclaim leaves both alone: the worker's row is fresh, whatever the rows say.
    with engine.begin() as sweeper:
        reclaimed = sweeper.execute(statements.reclaim_statement(queue.tables), {"held": []}).all()
    assert reclaimed == []


def test_a_live_workers_own_orphaned_row_is_reclaimed_by_its_own_sweep(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A claim whose reply was lost leaves a row running under a live worker that does not
    know it: nobody beats for it. Other workers leave it (its worker's row is fresh); the
    worker's own sweep takes it back, since it does not hold it."""
    with SessionLocal.begin() as session:
        orphan = noop.enqueue(session)
    with engine.begin() as connection:
        worker = pretend_claimed(connection, orphan, alive_for=dt.timedelta(minutes=5))
        # The worker is alive: its row was stamped just now.
        connection.execute(
            queue.tables.workers.insert().values(
                worker_id=worker, hostname="h", pid=1, tasks=["noop"], concurrency=1
            )
        )
    reclaim = statements.reclaim_statement(queue.tables)
    with engine.begin() as other:
        assert other.execute(reclaim, {"held": [], "worker": uuid.uuid4()}).all() == []
    with engine.begin() as own:
        rows = own.execute(reclaim, {"held": [], "worker": worker}).all()
    assert [row.id for row in rows] == [orphan]
