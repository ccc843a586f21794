"""Awaitable results against real PostgreSQL: every source kind, every ending, NOTIFY and poll.

``queue.result`` waits on a connection of its own. These tests finish the awaited job
right after the wait began (with a worker, or with the worker's completion statement run
by hand) and time how soon the wait returns: well under the 5 s poll when the completion
NOTIFYs, within the poll when it does not.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, selectinload, sessionmaker

from sqla_queue import (
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    ResultTimeoutError,
)
from sqla_queue.logic.outcomes import OutcomeKind
from tests.support.app import boom, echo, gate, gated, queue, reset_gates
from tests.support.lifecycle import JOBS, claim, complete, job_row
from tests.support.running import pretend_claimed, wait_for, worker_thread

pytestmark = pytest.mark.integration

#: Well under the 5 s poll of a LISTENing wait: the wait was woken by the NOTIFY.
WOKEN = 2.0


@pytest.fixture(autouse=True)
def _gates() -> Any:
    yield
    reset_gates()


def awaited(engine: Engine, job_id: int) -> bool:
    row = job_row(engine, job_id)
    return bool(row.awaited)


class Waiter:
    """``queue.result`` in a thread: its value or exception, and when it returned."""

    def __init__(self, source: Any, job_id: int, timeout: float = 15.0) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.returned_at: float | None = None
        self.thread = threading.Thread(target=self._wait, args=(source, job_id, timeout))
        self.thread.start()

    def _wait(self, source: Any, job_id: int, timeout: float) -> None:
        try:
            self.value = queue.result(source, job_id, timeout=timeout)
        except BaseException as exc:
            self.error = exc
        self.returned_at = time.monotonic()

    def join(self) -> None:
        self.thread.join(20)
        assert not self.thread.is_alive()


def finish_by_hand(engine: Engine, job_id: int, kind: OutcomeKind, result: Any = None) -> float:
    """Claim and complete ``job_id`` with the worker's statements; when it committed."""
    worker = uuid.uuid4()
    with engine.begin() as connection:
        [row] = [r for r in claim(connection, worker, ["echo", "boom"]) if r.id == job_id]
    error = None if kind is OutcomeKind.SUCCEEDED else {"type": "x.Err", "message": "bad"}
    with engine.begin() as connection:
        assert complete(connection, worker, job_id, row.attempt, kind, result, error) == [job_id]
    return time.monotonic()


# -- every source, every ending -----------------------------------------------------------


def test_every_sync_source_returns_the_value(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = echo.enqueue(session, value={"total": 42, "items": [1, 2]})
    assert queue.worker(SessionLocal).run(burst=True).succeeded == 1
    expected = {"total": 42, "items": [1, 2]}
    assert queue.result(engine, job_id) == expected
    assert queue.result(SessionLocal, job_id, timeout=dt.timedelta(seconds=5)) == expected
    with SessionLocal() as session:
        session.begin()
        # The session's own transaction is not used (nor disturbed).
        assert queue.result(session, job_id) == expected
        assert session.in_transaction()
    with engine.connect() as connection:
        assert queue.result(connection, job_id, timeout=None) == expected


async def test_every_async_source_returns_the_value(
    async_engine: AsyncEngine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    async with AsyncSessionLocal.begin() as session:
        job_id = await echo.enqueue(session, value=[1, "two"])
    assert (await queue.async_worker(AsyncSessionLocal).run(burst=True)).succeeded == 1
    assert await queue.result(async_engine, job_id) == [1, "two"]
    assert await queue.result(AsyncSessionLocal, job_id) == [1, "two"]
    async with AsyncSessionLocal() as session:
        assert await queue.result(session, job_id) == [1, "two"]
    async with async_engine.connect() as connection:
        assert await queue.result(connection, job_id) == [1, "two"]


def test_a_failed_job_raises_its_last_error(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = boom.options(max_attempts=2).enqueue(session, message="card declined")
    worker = queue.worker(SessionLocal, poll_interval=0.05, install_signal_handlers=False)
    # The retry waits out the queue's default backoff; move it along.
    with worker_thread(worker):
        wait_for(lambda: job_row(engine, job_id).attempts == 1, timeout=10)
        with engine.begin() as connection:
            connection.execute(
                update(queue.tables.executions)
                .where(queue.tables.executions.c.id == job_id)
                .values(execute_at=dt.datetime.now(dt.UTC))
            )
        with pytest.raises(JobFailedError) as caught:
            queue.result(engine, job_id, timeout=10)
    error = caught.value
    assert error.job_id == job_id
    assert error.error is not None
    assert (error.error["type"], error.error["message"]) == ("builtins.ValueError", "card declined")
    assert "raise ValueError(message)" in str(error.error["traceback"])
    assert [e["attempt"] for e in error.errors] == [1, 2]
    assert "card declined" in str(error)


async def test_async_failure_cancel_not_found_and_timeout(
    engine: Engine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    async with AsyncSessionLocal.begin() as session:
        failed = await boom.enqueue(session, message="nope")
        cancelled = await echo.enqueue(session)
        never = await echo.options(delay=3600).enqueue(session)
    assert await queue.cancel(AsyncSessionLocal, [cancelled]) == {cancelled: "cancelled"}
    await queue.async_worker(AsyncSessionLocal, tasks=["boom"]).run(burst=True)
    with pytest.raises(JobFailedError, match="nope"):
        await queue.result(AsyncSessionLocal, failed)
    with pytest.raises(JobCancelledError) as caught:
        await queue.result(AsyncSessionLocal, cancelled)
    assert caught.value.job_id == cancelled
    with pytest.raises(JobNotFoundError):
        await queue.result(AsyncSessionLocal, 987_654)
    started = time.monotonic()
    with pytest.raises(ResultTimeoutError, match="still queued") as timed_out:
        await queue.result(AsyncSessionLocal, never, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 2.0
    assert isinstance(timed_out.value, TimeoutError)
    assert timed_out.value.job_id == never


def test_cancel_not_found_and_timeouts(engine: Engine) -> None:
    with engine.begin() as connection:
        cancelled, never, running = (echo.enqueue(connection) for _ in range(3))
        pretend_claimed(connection, running)
    # queue.cancel commits on a connection of its own: the enqueue must have committed.
    assert queue.cancel(engine, [cancelled]) == {cancelled: "cancelled"}
    with pytest.raises(JobCancelledError):
        queue.result(engine, cancelled)
    with pytest.raises(JobNotFoundError) as missing:
        queue.result(engine, 987_654)
    assert missing.value.job_id == 987_654
    for job_id, state in ((never, "queued"), (running, "running")):
        started = time.monotonic()
        with pytest.raises(ResultTimeoutError, match=f"still {state}"):
            queue.result(engine, job_id, timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 2.0
    with pytest.raises((TypeError, ValueError)):
        queue.result(engine, never, timeout=-1)
    with pytest.raises(TypeError):
        queue.result(object(), never)


# -- woken by NOTIFY, or by the poll ------------------------------------------------------


@pytest.mark.parametrize("source", ["engine", "session"])
def test_a_wait_is_woken_by_the_completions_notify(
    engine: Engine, SessionLocal: sessionmaker[Session], source: str
) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection, value="fast")
    with SessionLocal() as session:
        waiter = Waiter(engine if source == "engine" else session, job_id)
        wait_for(lambda: awaited(engine, job_id), timeout=10, interval=0.01)
        done = finish_by_hand(engine, job_id, OutcomeKind.SUCCEEDED, "fast")
        waiter.join()
    assert waiter.error is None and waiter.value == "fast"
    assert waiter.returned_at is not None and waiter.returned_at - done < WOKEN


async def test_an_async_wait_is_woken_by_the_completions_notify(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection, value="fast")
    wait = asyncio.ensure_future(queue.result(async_engine, job_id, timeout=15))
    while not awaited(engine, job_id):
        await asyncio.sleep(0.01)
    done = await asyncio.to_thread(finish_by_hand, engine, job_id, OutcomeKind.FAILED)
    with pytest.raises(JobFailedError, match="bad"):
        await wait
    assert time.monotonic() - done < WOKEN


def test_results_of_jobs_a_real_worker_runs(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        slow = gated.enqueue(session, name="slow", value="late")
        failing = gated.options(max_attempts=1).enqueue(session, name="slow", then="raise")
    worker = queue.worker(
        SessionLocal, tasks=["gated"], concurrency=2, install_signal_handlers=False
    )
    with worker_thread(worker):
        waiters = [Waiter(SessionLocal, slow), Waiter(engine, failing)]
        assert gate("slow").entered.wait(10)
        wait_for(lambda: awaited(engine, slow) and awaited(engine, failing), timeout=10)
        gate("slow").open()
        opened = time.monotonic()
        for waiter in waiters:
            waiter.join()
    assert waiters[0].value == "late"
    assert isinstance(waiters[1].error, JobFailedError)
    assert all(w.returned_at is not None and w.returned_at - opened < WOKEN for w in waiters)


def test_only_awaited_jobs_notify(engine: Engine, db_url: str) -> None:
    with engine.begin() as connection:
        quiet, loud = (echo.enqueue(connection) for _ in range(2))
        connection.execute(update(JOBS).where(JOBS.c.id == loud).values(awaited=True))
    worker = uuid.uuid4()
    with engine.begin() as connection:
        claimed = {r.id: r.attempt for r in claim(connection, worker, ["echo"])}
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.tables.finished_channel}"')
        for job_id in (quiet, loud):
            with engine.begin() as connection:
                assert complete(connection, worker, job_id, claimed[job_id]) == [job_id]
        notes = [n.payload for n in listener.notifies(timeout=1.0)]
    assert notes == [str(loud)]


def _poll_only(engine: Engine, job_id: int) -> float:
    """Once the wait marked the job awaited, unmark it and complete the job: no NOTIFY."""
    with engine.begin() as connection:
        connection.execute(update(JOBS).where(JOBS.c.id == job_id).values(awaited=False))
    return finish_by_hand(engine, job_id, OutcomeKind.SUCCEEDED, "polled")


async def test_without_a_notify_the_poll_still_finds_the_result(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    """The sync and the async wait (both LISTENing, both polling every 5 s) at once."""
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
    sync_waiter = Waiter(engine, job_id)
    async_wait = asyncio.ensure_future(queue.result(async_engine, job_id, timeout=15))
    started = time.monotonic()
    # Both waits have read the job (queued) once, after marking it awaited.
    while not awaited(engine, job_id):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    done = await asyncio.to_thread(_poll_only, engine, job_id)
    assert await asyncio.wait_for(async_wait, 10) == "polled"
    async_returned = time.monotonic()
    await asyncio.to_thread(sync_waiter.join)
    assert sync_waiter.value == "polled"
    for returned in (async_returned, sync_waiter.returned_at):
        assert returned is not None
        # Not woken (no notification came), but found by the next poll.
        assert returned - done > 0.5
        assert returned - started < 6.5


async def test_a_driver_without_listen_polls_quickly(db_url: str, engine: Engine) -> None:
    asyncpg_engine = create_async_engine(db_url.replace("+psycopg", "+asyncpg"))
    try:
        with engine.begin() as connection:
            job_id = echo.enqueue(connection)
        wait = asyncio.ensure_future(queue.result(asyncpg_engine, job_id, timeout=15))
        while not awaited(engine, job_id):
            await asyncio.sleep(0.01)
        done = await asyncio.to_thread(_poll_only, engine, job_id)
        assert await asyncio.wait_for(wait, 10) == "polled"
        # Its polls back off from 50 ms to at most a second.
        assert time.monotonic() - done < 1.5
    finally:
        await asyncpg_engine.dispose()


def test_a_cancel_wakes_the_wait_at_once(engine: Engine) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
    waiter = Waiter(engine, job_id)
    wait_for(lambda: awaited(engine, job_id), timeout=10, interval=0.01)
    assert queue.cancel(engine, [job_id]) == {job_id: "cancelled"}
    cancelled = time.monotonic()
    waiter.join()
    assert isinstance(waiter.error, JobCancelledError)
    assert waiter.returned_at is not None and waiter.returned_at - cancelled < WOKEN


def test_a_lost_job_cancelled_by_the_reclaim_wakes_the_wait_at_once(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
        pretend_claimed(connection, job_id, alive_for=dt.timedelta(minutes=5))
    assert queue.cancel(engine, [job_id]) == {job_id: "requested"}
    waiter = Waiter(engine, job_id, timeout=WOKEN + 1.0)
    wait_for(lambda: awaited(engine, job_id), timeout=10, interval=0.01)
    # A worker's first maintenance sweep finds the execution lost: it is cancelled.
    queue.worker(SessionLocal, tasks=["echo"]).run(burst=True)
    swept = time.monotonic()
    waiter.join()
    assert isinstance(waiter.error, JobCancelledError), waiter.error
    assert waiter.returned_at is not None and waiter.returned_at - swept < WOKEN


# -- what an app shows: Job.state and friends ---------------------------------------------


def _jobs(session: Session, ids: list[int]) -> dict[int, Any]:
    found = session.scalars(
        select(queue.Job).where(queue.Job.id.in_(ids)).options(selectinload(queue.Job.execution))
    )
    return {job.id: job for job in found}


def test_job_state_in_every_state(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        pending = echo.enqueue(session)
        scheduled = echo.options(delay=3600).enqueue(session)
        head = echo.options(queue_id="q").enqueue(session)
        waiting = echo.options(queue_id="q").enqueue(session)
        running = echo.enqueue(session)
        cancelling = echo.enqueue(session)
        succeeded = echo.enqueue(session, value="ok")
        failed = boom.enqueue(session, message="broken")
        cancelled = echo.enqueue(session)
    with engine.begin() as connection:
        worker = uuid.uuid4()
        claimed = {r.id: r for r in claim(connection, worker, ["echo", "boom"], batch=20)}
        for job_id in (pending, head):
            connection.execute(
                update(queue.tables.executions)
                .where(queue.tables.executions.c.id == job_id)
                .values(state="pending", worker_id=None)
            )
        complete(connection, worker, succeeded, claimed[succeeded].attempt, result="ok")
        complete(
            connection,
            worker,
            failed,
            claimed[failed].attempt,
            OutcomeKind.FAILED,
            error={"type": "builtins.ValueError", "message": "broken"},
        )
        complete(connection, worker, cancelled, claimed[cancelled].attempt, OutcomeKind.CANCELLED)
    # After the claim's commit: queue.cancel, on a connection of its own, would wait for it.
    assert queue.cancel(engine, [cancelling]) == {cancelling: "requested"}
    assert set(claimed) >= {pending, head, running, cancelling, succeeded, failed, cancelled}
    ids = [pending, scheduled, head, waiting, running, cancelling, succeeded, failed, cancelled]
    with SessionLocal() as session:
        jobs = _jobs(session, ids)
        states = {job_id: jobs[job_id].state for job_id in ids}
        assert states == {
            pending: "pending",
            scheduled: "scheduled",
            head: "pending",
            waiting: "waiting",
            running: "running",
            cancelling: "cancelling",
            succeeded: "succeeded",
            failed: "failed",
            cancelled: "cancelled",
        }
        finished = {j for j in ids if jobs[j].is_finished}
        assert finished == {succeeded, failed, cancelled}
        assert jobs[failed].last_error is not None
        assert jobs[failed].last_error["message"] == "broken"
        assert jobs[succeeded].last_error is None
        assert jobs[succeeded].execution is None
        assert jobs[running].execution is not None
        assert jobs[running].execution.state == "running"
        assert jobs[cancelling].execution.cancel_requested is True
        assert not jobs[running].awaited
    with SessionLocal() as session:
        # Lazy loading works too (one query per job).
        lone = session.get(queue.Job, waiting)
        assert lone is not None and lone.state == "waiting"


async def test_job_state_through_an_async_session(
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
) -> None:
    async with AsyncSessionLocal.begin() as session:
        job_id = await echo.options(delay=60).enqueue(session)
    async with AsyncSessionLocal() as session:
        job = (
            await session.scalars(
                select(queue.Job)
                .where(queue.Job.id == job_id)
                .options(selectinload(queue.Job.execution))
            )
        ).one()
        assert (job.state, job.is_finished, job.last_error) == ("scheduled", False, None)
