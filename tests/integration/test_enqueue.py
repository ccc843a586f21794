"""Enqueue joins the caller's transaction: Session, AsyncSession and Connection."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import PayloadNotSerializableError, UnknownTaskError
from tests.support.app import Order, Result, noop, queue, record, record_async

pytestmark = pytest.mark.integration


def job_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(queue.Job)) or 0


def exec_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(queue.JobExecution)) or 0


def test_rollback_means_the_job_never_existed_and_commit_runs_once(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal() as session:
        session.add(Order(email="gone@example.com"))
        record.enqueue(session, value="rolled back")
        session.rollback()
    with SessionLocal.begin() as session:
        session.add(Order(email="kept@example.com"))
        kept = record.enqueue(session, value="committed")

    stats = queue.worker(SessionLocal, concurrency=4).run(burst=True)

    with SessionLocal() as session:
        results = session.execute(select(Result.job_id, Result.value)).all()
        assert results == [(kept, "committed")]
        assert job_count(session) == 1
        assert session.get(queue.Job, kept).status == "succeeded"  # type: ignore[union-attr]
        assert exec_count(session) == 0
    assert stats.succeeded == 1


async def test_async_session_rollback_and_commit(
    AsyncSessionLocal: async_sessionmaker[AsyncSession], SessionLocal: sessionmaker[Session]
) -> None:
    async with AsyncSessionLocal() as session:
        await record_async.enqueue(session, value="rolled back")
        await session.rollback()
    async with AsyncSessionLocal() as session, session.begin():
        kept = await record_async.enqueue(session, value="committed")

    stats = await queue.async_worker(AsyncSessionLocal, concurrency=4).run(burst=True)

    assert stats.succeeded == 1
    with SessionLocal() as session:
        assert session.execute(select(Result.job_id, Result.value)).all() == [(kept, "committed")]
        assert job_count(session) == 1


def test_connection_enqueue_joins_its_transaction(engine: Engine) -> None:
    with engine.connect() as connection:
        noop.enqueue(connection)
        connection.rollback()
        job_id = noop.enqueue(connection)
        connection.commit()
    with Session(engine) as session:
        assert [j.id for j in session.scalars(select(queue.Job))] == [job_id]


def test_non_json_payload_is_refused_and_writes_nothing(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal() as session:
        session.add(Order(email="a@example.com"))
        with pytest.raises(PayloadNotSerializableError, match=r"record.*value.*datetime"):
            record.enqueue(session, value=dt.datetime.now())  # type: ignore[arg-type]
        # The business transaction is intact and usable.
        session.commit()
    with SessionLocal() as session:
        assert job_count(session) == 0
        assert session.scalar(select(func.count()).select_from(Order)) == 1


def test_bulk_validation_fails_before_any_row(SessionLocal: sessionmaker[Session]) -> None:
    specs = [noop.call() for _ in range(10)] + [record.call(value={1, 2})]  # type: ignore[arg-type]
    with SessionLocal.begin() as session, pytest.raises(PayloadNotSerializableError):
        queue.enqueue_many(session, specs)
    with SessionLocal() as session:
        assert job_count(session) == 0


def test_unknown_task_name_is_a_clear_error(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal() as session:
        with pytest.raises(UnknownTaskError, match=r"'sned_email'.*declare_task"):
            queue.enqueue(session, "sned_email", {"to": "x"})
        assert job_count(session) == 0


def test_declared_name_enqueues_without_handler(engine: Engine) -> None:
    from sqlalchemy import MetaData

    from sqla_queue import Queue

    producer = Queue(metadata=MetaData(), schema="app_jobs")
    producer.declare_task("record", max_attempts=2)
    with engine.begin() as connection:
        job_id = producer.enqueue(connection, "record", {"value": "by name"}, priority=5)
    with Session(engine) as session:
        job = session.get(queue.Job, job_id)
        assert job is not None
        assert (job.task, job.payload, job.priority, job.max_attempts) == (
            "record",
            {"args": [], "kwargs": {"value": "by name"}},
            5,
            2,
        )


def test_enqueue_many_keeps_order_and_options(SessionLocal: sessionmaker[Session]) -> None:
    specs = [record.options(priority=i % 3).call(value=str(i)) for i in range(12_000)]
    with SessionLocal.begin() as session:
        ids = queue.enqueue_many(session, specs)
    assert ids == sorted(ids)
    assert len(set(ids)) == 12_000
    with SessionLocal() as session:
        rows = session.execute(
            select(queue.Job.id, queue.Job.payload, queue.Job.priority).order_by(queue.Job.id)
        ).all()
        assert [r.payload["kwargs"]["value"] for r in rows] == [str(i) for i in range(12_000)]
        assert [r.priority for r in rows[:4]] == [0, 1, 2, 0]
        assert exec_count(session) == 12_000


def test_delay_and_run_at_use_the_database_clock(SessionLocal: sessionmaker[Session]) -> None:
    at = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    with SessionLocal.begin() as session:
        now = session.scalar(select(func.now()))
        delayed = noop.options(delay=dt.timedelta(minutes=10)).enqueue(session)
        scheduled = noop.options(run_at=at).enqueue(session)
    with SessionLocal() as session:
        d = session.get(queue.JobExecution, delayed)
        s = session.get(queue.JobExecution, scheduled)
        assert d is not None and s is not None and now is not None
        assert abs((d.execute_at - now).total_seconds() - 600) < 1
        assert s.execute_at == at


def test_options_are_validated(SessionLocal: sessionmaker[Session]) -> None:
    with pytest.raises(ValueError, match="not both"):
        noop.options(delay=1, run_at=dt.datetime.now(dt.UTC))
    with pytest.raises(ValueError, match="timezone-aware"):
        noop.options(run_at=dt.datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="queue_id"):
        noop.options(queue_id="")


def test_one_notification_per_committed_transaction(db_url: str, engine: Engine) -> None:
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
        for _ in range(3):
            noop.enqueue(session)
        session.rollback()
    with Session(engine) as session, session.begin():
        for _ in range(5):
            noop.enqueue(session)
        queue.enqueue_many(session, [noop.call() for _ in range(100)])
    thread.join()
    assert received == [queue.tables.notify_channel]
