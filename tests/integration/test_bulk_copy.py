"""Large ``enqueue_many`` calls go through COPY and write what the enqueue statement writes."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import PayloadNotSerializableError, bulk
from sqla_queue.task import JobSpec
from tests.support.app import Order, noop, queue, record

pytestmark = pytest.mark.integration

AT = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)


def varied_calls() -> list[JobSpec]:
    """Calls that use every option the rows carry."""
    return [
        record.call(value="plain"),
        record.options(priority=7, max_attempts=9).call(value="tuned"),
        noop.options(queue_id="account-1").call(),
        noop.options(queue_id="account-1", delay=dt.timedelta(minutes=10)).call(),
        noop.options(run_at=AT).call(),
        record.call(value='quotes " and \\ backslash\ttab\nnewline'),
    ]


def written(session: Session, ids: list[int]) -> list[tuple[Any, ...]]:
    """Each job and its execution as stored, with due times relative to the enqueue."""
    jobs, ex = queue.tables.jobs, queue.tables.executions
    rows = session.execute(
        select(
            jobs.c.task,
            jobs.c.payload,
            jobs.c.priority,
            jobs.c.queue_id,
            jobs.c.max_attempts,
            jobs.c.status,
            jobs.c.attempts,
            jobs.c.scheduled_at,
            jobs.c.created_at,
            ex.c.state,
            ex.c.attempt,
            ex.c.slot,
            ex.c.execute_at,
        )
        .join(ex, ex.c.id == jobs.c.id)
        .where(jobs.c.id.in_(ids))
        .order_by(jobs.c.id)
    ).all()
    out = []
    for r in rows:
        # Due times as seconds after the enqueueing transaction began (created_at).
        due = round((r.scheduled_at - r.created_at).total_seconds())
        assert r.execute_at == r.scheduled_at
        out.append((*r[:7], due if r.scheduled_at != AT else "AT", *r[9:12]))
    return out


def test_copy_writes_exactly_what_the_statement_writes(
    SessionLocal: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 10**9)
    with SessionLocal.begin() as session:
        by_statement = queue.enqueue_many(session, varied_calls())
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 1)
    with SessionLocal.begin() as session:
        assert bulk.uses_copy(session, 6)
        by_copy = queue.enqueue_many(session, varied_calls())
    assert by_copy == sorted(by_copy) and min(by_copy) > max(by_statement)
    with SessionLocal() as session:
        expected = written(session, by_statement)
        assert written(session, by_copy) == expected
    assert [row[-4] for row in expected] == [0, 0, 0, 600, "AT", 0]


def test_ids_follow_the_callers_order(SessionLocal: sessionmaker[Session]) -> None:
    calls = [record.call(value=str(i)) for i in range(bulk.COPY_THRESHOLD + 500)]
    with SessionLocal.begin() as session:
        assert bulk.uses_copy(session, len(calls))
        ids = queue.enqueue_many(session, calls)
    assert ids == sorted(ids) and len(set(ids)) == len(calls)
    with SessionLocal() as session:
        values = session.scalars(
            select(queue.tables.jobs.c.payload["kwargs"]["value"].as_string())
            .where(queue.tables.jobs.c.id.in_(ids))
            .order_by(queue.tables.jobs.c.id)
        ).all()
    assert values == [str(i) for i in range(len(calls))]


def test_a_bad_call_writes_nothing_and_the_transaction_stays_usable(
    SessionLocal: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 1)
    calls = [noop.call() for _ in range(50)] + [record.call(value={1, 2})]  # type: ignore[arg-type]
    with SessionLocal() as session:
        session.add(Order(email="a@example.com"))
        with pytest.raises(PayloadNotSerializableError, match="record"):
            queue.enqueue_many(session, calls)
        session.commit()
    with SessionLocal() as session:
        assert session.scalar(select(func.count()).select_from(queue.Job)) == 0
        assert session.scalar(select(func.count()).select_from(Order)) == 1


def test_rolled_back_copy_leaves_nothing_and_a_commit_notifies_once(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 1)
    dsn = db_url.replace("postgresql+psycopg://", "postgresql://")
    received: list[str] = []
    listening = threading.Event()

    def listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'LISTEN "{queue.tables.notify_channel}"')
            listening.set()
            for note in conn.notifies(timeout=2.0):
                received.append(note.channel)

    thread = threading.Thread(target=listen)
    thread.start()
    assert listening.wait(5)
    with Session(engine) as session:
        queue.enqueue_many(session, [noop.call() for _ in range(20)])
        session.rollback()
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(queue.Job)) == 0
    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, [noop.call() for _ in range(20)])
        queue.enqueue_many(session, [noop.call() for _ in range(20)])
    thread.join()
    assert received == [queue.tables.notify_channel]


def test_a_connection_in_autocommit_writes_both_tables(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        ids = queue.enqueue_many(connection, [noop.call() for _ in range(30)])
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(queue.Job)) == 30
        assert session.scalar(select(func.count()).select_from(queue.JobExecution)) == 30
        assert len(ids) == 30


async def test_async_session_copies_in_its_transaction(
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    SessionLocal: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 1)
    async with AsyncSessionLocal() as session:
        await queue.enqueue_many(session, [noop.call() for _ in range(25)])
        await session.rollback()
    async with AsyncSessionLocal() as session, session.begin():
        ids = await queue.enqueue_many(session, varied_calls())
    with SessionLocal() as session:
        assert session.scalar(select(func.count()).select_from(queue.Job)) == 6
        rows = written(session, ids)
    assert [row[-4] for row in rows] == [0, 0, 0, 600, "AT", 0]


def test_workers_run_copied_jobs(
    SessionLocal: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", 1)
    with SessionLocal.begin() as session:
        queue.enqueue_many(session, [noop.call() for _ in range(40)])
    stats = queue.worker(SessionLocal, tasks=["noop"], concurrency=10).run(burst=True)
    assert stats.succeeded == 40
