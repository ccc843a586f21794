"""Workers against real PostgreSQL: outcomes, retries, context, task filters, verification."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import SCHEMA_VERSION, Reschedule, SchemaMismatchError
from tests.support.app import ExecutionLog, Result, boom, flaky, noop, queue, record, record_async
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration


def statuses(session: Session) -> dict[str, int]:
    rows = session.execute(select(queue.Job.status, func.count()).group_by(queue.Job.status))
    return dict(rows.all())


@pytest.mark.parametrize("raw_statements", [True, False], ids=["raw", "sqlalchemy"])
def test_handler_exception_fails_the_job_and_the_worker_goes_on(
    SessionLocal: sessionmaker[Session], raw_statements: bool
) -> None:
    with SessionLocal.begin() as session:
        bad = boom.enqueue(session, message="card declined")
        good = [record.enqueue(session, value=str(i)) for i in range(5)]

    worker = queue.worker(SessionLocal, concurrency=3, raw_statements=raw_statements)
    stats = worker.run(burst=True)

    assert (stats.succeeded, stats.failed) == (5, 1)
    with SessionLocal() as session:
        job = session.get(queue.Job, bad)
        assert job is not None
        assert job.status == "failed"
        assert job.finished_at is not None
        (error,) = job.errors
        assert error["type"] == "builtins.ValueError"
        assert error["message"] == "card declined"
        assert "raise ValueError(message)" in error["traceback"]
        assert error["attempt"] == 1
        assert sorted(session.scalars(select(Result.job_id))) == good
        assert session.scalar(select(func.count()).select_from(queue.JobExecution)) == 0


def test_worker_with_task_subset_leaves_other_tasks_pending(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        for _ in range(3):
            noop.enqueue(session)
            boom.enqueue(session)

    stats = queue.worker(SessionLocal, tasks=["noop"]).run(burst=True)

    assert stats.claimed == 3
    with SessionLocal() as session:
        pending = session.scalars(select(queue.JobExecution.task)).all()
        assert pending == ["boom"] * 3
        assert statuses(session) == {"succeeded": 3, "queued": 3}


@pytest.mark.parametrize("raw_statements", [True, False], ids=["raw", "sqlalchemy"])
async def test_async_worker_runs_def_and_async_handlers(
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    SessionLocal: sessionmaker[Session],
    raw_statements: bool,
) -> None:
    async with AsyncSessionLocal() as session, session.begin():
        ids = [await record_async.enqueue(session, value=str(i)) for i in range(20)]
        await noop.enqueue(session)
        await boom.enqueue(session)

    worker = queue.async_worker(AsyncSessionLocal, concurrency=5, raw_statements=raw_statements)
    stats = await worker.run(burst=True)

    assert (stats.succeeded, stats.failed) == (21, 1)
    with SessionLocal() as session:
        assert sorted(session.scalars(select(Result.job_id))) == ids


def test_retries_follow_backoff_then_succeed(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        job_id = flaky.enqueue(session, failures=3)

    def finished() -> bool:
        with SessionLocal() as session:
            job = session.get(queue.Job, job_id)
            return job is not None and job.status != "queued"

    worker = queue.worker(SessionLocal, poll_interval=0.05, install_signal_handlers=False)
    with worker_thread(worker):
        wait_for(finished, timeout=30)

    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None
        assert (job.status, job.attempts, job.result) == ("succeeded", 4, 4)
        assert [e["attempt"] for e in job.errors] == [1, 2, 3]
        assert all(e["type"] == "builtins.RuntimeError" for e in job.errors)
        starts = session.scalars(
            select(ExecutionLog.started_at)
            .where(ExecutionLog.job_id == job_id)
            .order_by(ExecutionLog.id)
        ).all()
    assert len(starts) == 4
    policy = flaky.task_options.retry
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    for attempt, gap in enumerate(gaps, start=1):
        # Never earlier than the backoff allows; late by at most a poll and some slack.
        assert gap >= policy.floor(attempt) - 0.01, (attempt, gap)
        assert gap <= policy.ceiling(attempt) + 1.0, (attempt, gap)


def test_exhausted_attempts_stay_failed_and_requeue_runs_again(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        job_id = boom.enqueue(session)
    queue.worker(SessionLocal).run(burst=True)
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [job_id, 999_999]) == [job_id]
        # A second requeue of a job that is queued again changes nothing.
        assert queue.requeue(session, [job_id]) == []
    stats = queue.worker(SessionLocal).run(burst=True)
    assert stats.failed == 1
    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None and job.status == "failed"
        assert len(job.errors) == 2


def test_reschedule_does_not_use_an_attempt(SessionLocal: sessionmaker[Session]) -> None:
    calls: list[int] = []

    @queue.task(name="reschedule_once", pass_context=True, max_attempts=1)
    def reschedule_once(ctx):  # type: ignore[no-untyped-def]
        calls.append(ctx.attempt)
        if len(calls) == 1:
            return Reschedule(in_=dt.timedelta(seconds=0))
        return "second run"

    try:
        with SessionLocal.begin() as session:
            job_id = reschedule_once.enqueue(session)
        queue.worker(SessionLocal, tasks=["reschedule_once"]).run(burst=True)
        with SessionLocal() as session:
            job = session.get(queue.Job, job_id)
            assert job is not None
            assert (job.status, job.result, job.errors) == ("succeeded", "second run", [])
        assert calls == [1, 1]
    finally:
        queue._registry._tasks.pop("reschedule_once")


def test_worker_refuses_to_start_without_a_required_index(
    owner_engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with owner_engine.begin() as connection:
        connection.execute(text("DROP INDEX app_jobs.sqla_queue_job_executions_task_claim_ix"))
        noop.enqueue(connection)
    with pytest.raises(SchemaMismatchError) as info:
        queue.worker(SessionLocal).run(burst=True)
    message = str(info.value)
    assert "app_jobs.sqla_queue_job_executions_task_claim_ix" in message
    assert "alembic upgrade head" in message
    assert f"schema version {SCHEMA_VERSION}" in message
    with SessionLocal() as session:
        assert statuses(session) == {"queued": 1}


def test_stop_before_run_returns_at_once(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        noop.enqueue(session)
    worker = queue.worker(SessionLocal)
    worker.stop()
    stats = worker.run()
    assert stats.claimed == 0


async def test_async_requeue_and_prune(
    AsyncSessionLocal: async_sessionmaker[AsyncSession], SessionLocal: sessionmaker[Session]
) -> None:
    async with AsyncSessionLocal() as session, session.begin():
        failed = await boom.enqueue(session)
        done = await noop.enqueue(session)
    await queue.async_worker(AsyncSessionLocal).run(burst=True)
    async with AsyncSessionLocal() as session, session.begin():
        # Nothing is old enough yet.
        assert await queue.prune(session, older_than=dt.timedelta(hours=1)) == 0
        assert await queue.prune(session, older_than=dt.timedelta(0)) == 1
    with SessionLocal() as session:
        assert session.get(queue.Job, done) is None
        assert session.get(queue.Job, failed) is not None
    async with AsyncSessionLocal() as session, session.begin():
        assert await queue.requeue(session, [failed]) == [failed]
    with SessionLocal() as session:
        assert statuses(session) == {"queued": 1}


def test_worker_starts_when_the_server_closed_its_pooled_connection(
    engine: Engine, owner_engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The start-up schema check retries a connection lost under it, then runs as usual."""
    with SessionLocal.begin() as session:
        noop.enqueue(session)
    with engine.connect() as connection:
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    # The pool keeps that connection; the server now closes it behind the pool's back.
    with owner_engine.connect() as admin:
        assert admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar_one()

    stats = queue.worker(SessionLocal).run(burst=True)

    assert stats.succeeded == 1


async def test_async_worker_starts_when_the_server_closed_its_pooled_connection(
    AsyncSessionLocal: async_sessionmaker[AsyncSession], owner_engine: Engine
) -> None:
    async with AsyncSessionLocal() as session, session.begin():
        await noop.enqueue(session)
        pid = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    with owner_engine.connect() as admin:
        assert admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar_one()

    stats = await queue.async_worker(AsyncSessionLocal).run(burst=True)

    assert stats.succeeded == 1


@pytest.mark.parametrize("raw_statements", [True, False], ids=["raw", "sqlalchemy"])
def test_an_execution_whose_job_row_was_deleted_is_removed_and_the_rest_runs(
    SessionLocal: sessionmaker[Session], raw_statements: bool
) -> None:
    # Schema version 3 has no foreign key between the tables: a job deleted by hand leaves
    # its execution behind, which must neither run nor be held until reclaimed.
    with SessionLocal.begin() as session:
        orphan = noop.enqueue(session)
        good = [record.enqueue(session, value=str(i)) for i in range(3)]
        session.execute(text(f"DELETE FROM {queue.tables.jobs.fullname} WHERE id = {orphan}"))

    stats = queue.worker(SessionLocal, concurrency=2, raw_statements=raw_statements).run(burst=True)

    assert (stats.claimed, stats.succeeded) == (4, 3)
    with SessionLocal() as session:
        assert session.scalar(select(func.count()).select_from(queue.JobExecution)) == 0
        assert sorted(session.scalars(select(Result.job_id))) == good


def test_a_job_due_after_the_year_9999_stops_no_worker(
    SessionLocal: sessionmaker[Session],
) -> None:
    # A valid timestamptz that no Python datetime can hold: the claim's next due time must
    # never carry it back, or every claim of every worker would fail on reading it. Enqueue
    # refuses such a due time now, so the row is written by hand (or an older version).
    with SessionLocal.begin() as session:
        far = noop.options(delay=60).enqueue(session)
        near = record.enqueue(session, value="near")
        executions = queue.JobExecution
        session.execute(
            update(executions)
            .where(executions.id == far)
            .values(execute_at=func.now() + dt.timedelta(days=1e12 / 86_400))
        )

    stats = queue.worker(SessionLocal, poll_interval=0.05).run(burst=True)

    assert (stats.claimed, stats.succeeded) == (1, 1)
    with SessionLocal() as session:
        assert session.scalars(select(Result.job_id)).all() == [near]
        assert session.scalars(select(queue.JobExecution.id)).all() == [far]
