"""Transactional tasks against real PostgreSQL: the handler's writes and its job's
completion commit together, or not at all.

The handlers (``tx_write`` and ``tx_write_async`` in tests/support/app.py) insert the
job's ``results`` row through ``ctx.session`` and never commit: only the worker does, with
the completion. A stale worker is staged by taking the execution over from another
connection while the handler waits at its gate.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from sqla_queue import JobContext, Queue, RunStats
from tests.support.app import (
    Result,
    echo,
    gate,
    queue,
    reset_gates,
    tx_write,
    tx_write_async,
)
from tests.support.lifecycle import JOBS, execution_row, job_row, status_of
from tests.support.running import pretend_claimed, worker_thread

pytestmark = pytest.mark.integration

FACES = ["sync", "async"]


@pytest.fixture(autouse=True)
def _gates() -> Iterator[None]:
    yield
    reset_gates()


def results(engine: Engine) -> dict[int, str | None]:
    with engine.connect() as connection:
        return dict(connection.execute(select(Result.job_id, Result.value)).all())  # type: ignore[arg-type]


def children(engine: Engine, parent: int) -> list[int]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                select(JOBS.c.id).where(
                    JOBS.c.task == "echo",
                    JOBS.c.payload["kwargs"]["value"].astext == (f"child of {parent}"),
                )
            ).scalars()
        )


async def until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


class Running:
    """A sync or an async worker running until :meth:`stop`, from an async test."""

    def __init__(
        self,
        face: str,
        sync_factory: sessionmaker[Session],
        async_factory: async_sessionmaker[AsyncSession],
        **settings: Any,
    ) -> None:
        settings.setdefault("poll_interval", 0.05)
        settings.setdefault("install_signal_handlers", False)
        settings.setdefault("concurrency", 4)
        self.face = face
        if face == "sync":
            self.worker: Any = queue.worker(sync_factory, tasks=["tx_write", "echo"], **settings)
            self._context = worker_thread(self.worker)
            self._stats = self._context.__enter__()
        else:
            self.worker = queue.async_worker(
                async_factory, tasks=["tx_write_async", "echo"], **settings
            )
            self._task = asyncio.ensure_future(self.worker.run())

    async def stop(self) -> RunStats:
        if self.face == "sync":
            await asyncio.to_thread(self._context.__exit__, None, None, None)
            return self._stats[0]
        self.worker.stop()
        stats: RunStats = await asyncio.wait_for(self._task, 30)
        return stats


def _enqueue(face: str, session: Session, **kwargs: Any) -> int:
    task = tx_write if face == "sync" else tx_write_async
    return task.enqueue(session, **kwargs)


@pytest.mark.parametrize("face", FACES)
async def test_writes_and_outcomes_commit_together(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    face: str,
) -> None:
    with SessionLocal.begin() as session:
        ok = _enqueue(face, session, value="ok", child=True)
        second_try = _enqueue(face, session, value="again", fail_attempts=1)
        hopeless = _enqueue(face, session, value="never", fail_attempts=2, child=True)
        later = _enqueue(face, session, value="later", reschedule=True)
    worker = Running(face, SessionLocal, AsyncSessionLocal)
    try:
        await until(
            lambda: (
                all(status_of(engine, j) != "queued" for j in (ok, second_try, hopeless))
                and execution_row(engine, later).execute_at is not None
                and later in results(engine)
                and bool(children(engine, ok))
                and status_of(engine, children(engine, ok)[0]) == "succeeded"
            )
        )
    finally:
        stats = await worker.stop()
    written = results(engine)
    # Success: the write and the job's success (and its child job) landed together.
    assert job_row(engine, ok).status == "succeeded"
    assert written[ok] == "ok@1"
    assert len(children(engine, ok)) == 1
    # A raise rolls its attempt's write back: only the second attempt's write exists.
    job = job_row(engine, second_try)
    assert (job.status, job.attempts, len(job.errors)) == ("succeeded", 2, 1)
    assert written[second_try] == "again@2"
    # Failed for good: no write, and no child job from either attempt.
    assert (job_row(engine, hopeless).status, job_row(engine, hopeless).attempts) == ("failed", 2)
    assert hopeless not in written
    assert children(engine, hopeless) == []
    # A returned Reschedule commits with the write, and the job waits for its next run.
    assert written[later] == "later@1"
    assert job_row(engine, later).status == "queued"
    assert execution_row(engine, later).state == "pending"
    assert stats.succeeded >= 3


@pytest.mark.parametrize("face", FACES)
async def test_a_reclaimed_execution_cannot_commit_its_handlers_writes(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    face: str,
) -> None:
    with SessionLocal.begin() as session:
        stale = _enqueue(face, session, value="stale", gate_name="stale", child=True)
    # A long heartbeat: the stale worker does not learn that it lost the job before the end.
    worker = Running(face, SessionLocal, AsyncSessionLocal, heartbeat_interval=60)
    try:
        await until(gate("stale").entered.is_set)
        # Another worker took the execution over (as a reclaim and a new claim would).
        other = uuid.uuid4()
        with engine.begin() as connection:
            pretend_claimed(connection, stale, worker=other, attempt=2)
        gate("stale").open()
        await until(lambda: worker.worker.decider.stats["fenced"] == 1)
    finally:
        stats = await worker.stop()
    assert (stats.fenced, stats.succeeded) == (1, 0)
    assert stale not in results(engine)
    assert children(engine, stale) == []
    job = job_row(engine, stale)
    assert (job.status, job.result) == ("queued", None)
    row = execution_row(engine, stale)
    assert (row.state, row.worker_id, row.attempt) == ("running", other, 2)


@pytest.mark.parametrize("face", FACES)
async def test_a_cancelled_transactional_job_keeps_no_writes(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    face: str,
) -> None:
    with SessionLocal.begin() as session:
        job_id = _enqueue(face, session, value="x", gate_name="told", child=True)
    worker = Running(face, SessionLocal, AsyncSessionLocal, heartbeat_interval=0.1)
    try:
        await until(gate("told").entered.is_set)
        with SessionLocal.begin() as session:
            assert queue.cancel(session, [job_id]) == {job_id: "requested"}
        if face == "sync":
            # The request reaches the handler's context through a heartbeat; the handler
            # then ignores it and returns: the job still ends cancelled, its writes undone.
            await until(lambda: gate("told").saw_cancel is True)
            gate("told").open()
        # (An async handler's task is cancelled at its next await.)
        await until(lambda: status_of(engine, job_id) != "queued")
    finally:
        await worker.stop()
    assert status_of(engine, job_id) == "cancelled"
    assert job_id not in results(engine)
    assert children(engine, job_id) == []


def test_transactional_needs_pass_context() -> None:
    class Scratch(DeclarativeBase):
        """A base of its own: the test app's metadata stays as it is."""

    scratch = Queue(Scratch)
    with pytest.raises(ValueError, match="pass_context=True"):

        @scratch.task(name="bad", transactional=True)
        def bad() -> None: ...

    with pytest.raises(TypeError, match="transactional"):

        @scratch.task(name="worse", pass_context=True, transactional="yes")  # type: ignore[call-overload]
        def worse(ctx: JobContext[Session]) -> None: ...

    @scratch.task(name="good", pass_context=True, transactional=True)
    def good(ctx: JobContext[Session]) -> None: ...

    assert good.task_options.transactional is True
    assert sorted(scratch.tasks) == ["good"]


def test_a_plain_task_in_the_same_worker_keeps_its_own_commits(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """Transactional and plain handlers share a worker; the plain one is unchanged."""
    with SessionLocal.begin() as session:
        plain = echo.enqueue(session, value="plain")
        tx = tx_write.enqueue(session, value="tx")
    stats = queue.worker(SessionLocal, tasks=["echo", "tx_write"]).run(burst=True)
    assert stats.succeeded == 2
    assert {status_of(engine, plain), status_of(engine, tx)} == {"succeeded"}
    assert job_row(engine, plain).result == "plain"
    assert job_row(engine, tx).result == "tx"
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(Result)).scalar_one() == 1
