"""The worker loop at its edges (issue 26): paused and rate-limited tasks, transactional
handlers on the wrong engine or in an aborted transaction, abandoned async handlers.

Each test runs a real worker against PostgreSQL. Handlers the shared test app lacks live on
a scratch queue of this module (``edge_`` tables), created per test as the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sqla_queue import JobContext, Queue
from sqla_queue.instrumentation import NoOpObserver
from sqla_queue.logic.outcomes import ClaimedJob, OutcomeKind
from tests.support.app import noop, queue
from tests.support.running import states, wait_for, worker_thread

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Fast maintenance: pauses and rate limits reach a running worker within 0.2 s.
FAST: dict[str, Any] = {
    "reclaim_interval": 0.2,
    "poll_interval": 0.1,
    "install_signal_handlers": False,
}


def enqueue_noops(SessionLocal: sessionmaker[Session], n: int, **options: Any) -> list[int]:
    task = noop.options(**options) if options else noop
    with SessionLocal.begin() as session:
        return [task.enqueue(session) for _ in range(n)]


def test_worker_id_is_none_until_the_run_then_the_id_it_registers_and_claims_with(
    SessionLocal: sessionmaker[Session],
) -> None:
    worker = queue.worker(SessionLocal, tasks=["noop"], **FAST)
    assert worker.worker_id is None
    workers = queue.tables.workers
    with worker_thread(worker):
        wait_for(lambda: worker.worker_id is not None)
        with SessionLocal() as session:
            wait_for(lambda: session.scalar(select(func.count()).select_from(workers)) == 1)
            registered = session.scalar(select(workers.c.worker_id))
        assert registered == worker.worker_id


# -- 1. a paused task does not kill its workers ----------------------------------------------


def test_a_sync_worker_whose_tasks_are_all_paused_idles_then_works_once_resumed(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.pause(session, "noop")
    ids = enqueue_noops(SessionLocal, 3)
    worker = queue.worker(SessionLocal, tasks=["noop"], **FAST)
    with worker_thread(worker):
        wait_for(lambda: worker.decider is not None and worker.decider.paused == {"noop"})
        time.sleep(1.0)  # five maintenance intervals, each followed by an idle wait
        assert states(SessionLocal, ids) == {"queued": 3}
        with SessionLocal.begin() as session:
            queue.resume(session, "noop")
        wait_for(lambda: states(SessionLocal, ids) == {"succeeded": 3}, timeout=10)


async def test_an_async_worker_whose_tasks_are_all_paused_idles_then_works_once_resumed(
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.pause(session, "noop")
        queue.pause(session, "record_async")
    ids = enqueue_noops(SessionLocal, 3)
    worker = queue.async_worker(AsyncSessionLocal, tasks=["noop", "record_async"], **FAST)
    run = asyncio.ensure_future(worker.run())
    try:
        await asyncio.sleep(1.0)
        assert not run.done(), run.exception() if run.done() else None
        assert worker.decider is not None and worker.decider.paused == {"noop", "record_async"}
        assert states(SessionLocal, ids) == {"queued": 3}
        with SessionLocal.begin() as session:
            queue.resume(session, "noop")
        deadline = time.monotonic() + 10
        while states(SessionLocal, ids) != {"succeeded": 3}:
            assert time.monotonic() < deadline, "the resumed task was not run"
            assert not run.done(), run.exception() if run.done() else None
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)


def test_the_worker_command_with_its_only_task_paused_keeps_running(
    db_url: str, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        queue.pause(session, "noop")
    command = [
        sys.executable,
        "-m",
        "sqla_queue",
        "worker",
        "tests.support.app:queue",
        "--url",
        db_url,
        "--tasks",
        "noop",
        "--poll-interval",
        "0.2",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # Registered: started, with its signal handlers in place (a SIGTERM during the
        # imports would end it with -15 however well it idles).
        wait_for(lambda: process.poll() is not None or registered(SessionLocal), timeout=60)
        time.sleep(3.0)  # past its first maintenance, which reads the pause, and a wait
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr


def registered(SessionLocal: sessionmaker[Session]) -> bool:
    """Whether a worker has its row in the workers table."""
    with SessionLocal() as session:
        return bool(session.scalar(select(func.count()).select_from(queue.tables.workers)))


# -- 5. rate limits: a burst run and a full window; a raised limit ---------------------------


def run_burst(worker: Any, timeout: float) -> tuple[float, Any]:
    """Run ``worker.run(burst=True)`` in a thread; its duration and stats. The worker is
    stopped if it is still running after ``timeout`` (the test then fails)."""
    result: dict[str, Any] = {}

    def target() -> None:
        result["stats"] = worker.run(burst=True)

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    took = time.monotonic() - started
    if thread.is_alive():
        worker.stop()
        thread.join(30)
        pytest.fail(f"the burst run was still running after {timeout}s")
    return took, result["stats"]


def test_a_burst_run_returns_when_its_claims_filled_the_window_and_nothing_is_left(
    SessionLocal: sessionmaker[Session],
) -> None:
    """Two jobs, two starts per week: the claim that takes both fills the window. The run
    ends when they are done, not a week later; a job not yet due is left, as always."""
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 2, per=dt.timedelta(days=7))
    ids = enqueue_noops(SessionLocal, 2)
    later = enqueue_noops(SessionLocal, 1, delay=3600)
    worker = queue.worker(SessionLocal, tasks=["noop"], install_signal_handlers=False)
    took, stats = run_burst(worker, timeout=10)
    assert stats.succeeded == 2
    assert states(SessionLocal, ids) == {"succeeded": 2}
    assert states(SessionLocal, later) == {"queued": 1}
    assert took < 5


def test_a_burst_run_waits_for_the_window_while_due_jobs_are_left_behind_it(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 2, per=1.0)
    ids = enqueue_noops(SessionLocal, 5)
    worker = queue.worker(SessionLocal, tasks=["noop"], install_signal_handlers=False)
    took, stats = run_burst(worker, timeout=20)
    assert stats.succeeded == 5 and states(SessionLocal, ids) == {"succeeded": 5}
    assert took >= 2.0 - 0.05  # three windows: 2 + 2 + 1


def test_an_async_burst_run_returns_when_the_window_is_full_and_nothing_is_left(
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 1, per=dt.timedelta(days=7))
    ids = enqueue_noops(SessionLocal, 1)
    worker = queue.async_worker(AsyncSessionLocal, tasks=["noop"], install_signal_handlers=False)

    async def burst() -> Any:
        return await asyncio.wait_for(worker.run(burst=True), 10)

    stats = asyncio.run(burst())
    assert stats.succeeded == 1 and states(SessionLocal, ids) == {"succeeded": 1}


def test_a_raised_limit_reaches_a_worker_waiting_on_a_full_window(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 1, per=dt.timedelta(hours=1))
    ids = enqueue_noops(SessionLocal, 3)
    worker = queue.worker(SessionLocal, tasks=["noop"], **FAST)
    with worker_thread(worker):
        wait_for(lambda: states(SessionLocal, ids) == {"succeeded": 1, "queued": 2})
        time.sleep(0.6)  # three maintenances: the full window holds
        assert states(SessionLocal, ids) == {"succeeded": 1, "queued": 2}
        with SessionLocal.begin() as session:
            queue.set_rate_limit(session, "noop", 100, per=dt.timedelta(hours=1))
        wait_for(lambda: states(SessionLocal, ids) == {"succeeded": 3}, timeout=5)


# -- 7. transactional handlers: AUTOCOMMIT refused; an aborted transaction named -------------


@pytest.mark.parametrize("how", ["create_engine", "execution_options"])
def test_a_transactional_task_on_an_autocommit_engine_is_refused_at_start(
    db_url: str, how: str
) -> None:
    if how == "create_engine":
        engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    else:
        engine = create_engine(db_url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with pytest.raises(ValueError, match=r"tx_write.*AUTOCOMMIT.*not in AUTOCOMMIT"):
            queue.worker(sessionmaker(engine), tasks=["tx_write", "noop"])
        # Tasks that commit on their own are not affected.
        assert queue.worker(sessionmaker(engine), tasks=["noop"]) is not None
    finally:
        engine.dispose()


def test_a_worker_on_an_autocommit_connection_is_refused_at_start(db_url: str) -> None:
    """No worker runs on one connection, AUTOCOMMIT or not: it needs connections of its own."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(TypeError, match="bound to an engine, not to one connection"):
                queue.worker(sessionmaker(connection), tasks=["tx_write"])
    finally:
        engine.dispose()


def test_a_transactional_task_on_an_ordinary_engine_is_accepted(
    SessionLocal: sessionmaker[Session],
) -> None:
    assert queue.worker(SessionLocal, tasks=["tx_write"]) is not None


@pytest.mark.parametrize("how", ["create_engine", "execution_options"])
def test_an_async_transactional_task_on_an_autocommit_engine_is_refused_at_start(
    db_url: str, how: str
) -> None:
    async_url = db_url  # postgresql+psycopg works for both faces
    if how == "create_engine":
        engine = create_async_engine(async_url, isolation_level="AUTOCOMMIT")
    else:
        engine = create_async_engine(async_url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with pytest.raises(ValueError, match=r"tx_write_async.*AUTOCOMMIT"):
            queue.async_worker(async_sessionmaker(engine), tasks=["tx_write_async"])
        assert queue.async_worker(async_sessionmaker(engine), tasks=["noop"]) is not None
    finally:
        asyncio.run(engine.dispose())


class EdgeBase(DeclarativeBase):
    pass


class Thing(EdgeBase):
    __tablename__ = "edge_things"

    id: Mapped[int] = mapped_column(primary_key=True)


edges = Queue(EdgeBase, prefix="edge_")


@edges.task(name="swallow", pass_context=True, transactional=True)
def swallow(ctx: JobContext[Session], how: str) -> str:
    """Hit a database error on ``ctx.session``, catch it, and return as if all went well."""
    session = ctx.session
    if how == "statement":
        with contextlib.suppress(DBAPIError):
            session.execute(text("SELECT 1 / 0"))
    else:
        session.add(Thing(id=1))
        session.flush()
        session.expunge_all()
        session.add(Thing(id=1))
        with contextlib.suppress(DBAPIError):
            session.flush()
    return "fine"


@edges.task(name="swallow_async", pass_context=True, transactional=True)
async def swallow_async(ctx: JobContext[AsyncSession]) -> str:
    with contextlib.suppress(DBAPIError):
        await ctx.session.execute(text("SELECT 1 / 0"))
    return "fine"


#: Set by the stubborn handler once it runs; it then ignores every cancellation.
STUBBORN_STARTED = threading.Event()


@edges.task(name="stubborn_async")
async def stubborn_async() -> None:
    STUBBORN_STARTED.set()
    while True:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed: it will not stop
            await asyncio.sleep(30)


@pytest.fixture
def EdgeSession(owner_engine: Engine) -> sessionmaker[Session]:
    with owner_engine.begin() as connection:
        edges.create_all(connection)
        EdgeBase.metadata.create_all(connection, tables=[Thing.__table__])  # type: ignore[list-item]
    return sessionmaker(owner_engine)


def last_error(SessionLocal: sessionmaker[Session], job_id: int) -> tuple[str, dict[str, Any]]:
    with SessionLocal() as session:
        job = session.get(edges.Job, job_id)
        assert job is not None
        return str(job.status), job.errors[-1]


@pytest.mark.parametrize("how", ["statement", "flush"])
def test_a_handler_that_swallows_a_database_error_is_told_its_transaction_was_aborted(
    EdgeSession: sessionmaker[Session], how: str
) -> None:
    with EdgeSession.begin() as session:
        job_id = swallow.enqueue(session, how=how)
    edges.worker(EdgeSession, install_signal_handlers=False).run(burst=True)
    status, error = last_error(EdgeSession, job_id)
    assert status == "failed"
    message = error["message"]
    assert message.startswith("the handler's transaction was aborted by an error it caught: ")
    cause = "division by zero" if how == "statement" else "edge_things_pkey"
    assert cause in message, message
    assert "set_config" not in message and "plan_cache_mode" not in message, message
    with EdgeSession() as session:
        assert session.scalar(select(func.count()).select_from(Thing)) == 0


def test_an_async_handler_that_swallows_a_database_error_is_told_its_transaction_was_aborted(
    db_url: str, EdgeSession: sessionmaker[Session]
) -> None:
    with EdgeSession.begin() as session:
        job_id = swallow_async.enqueue(session)

    async def burst() -> None:
        engine = create_async_engine(db_url)
        try:
            worker = edges.async_worker(
                async_sessionmaker(engine), tasks=["swallow_async"], install_signal_handlers=False
            )
            await worker.run(burst=True)
        finally:
            await engine.dispose()

    asyncio.run(burst())
    status, error = last_error(EdgeSession, job_id)
    assert status == "failed"
    assert "aborted by an error it caught: division by zero" in error["message"], error
    assert "set_config" not in error["message"]


# -- 8. no false reports from an abandoned async handler -------------------------------------


class Finishes(NoOpObserver):
    """Every attempt end the worker reports, by kind."""

    def __init__(self) -> None:
        self.kinds: list[OutcomeKind] = []

    def job_finished(
        self,
        job: ClaimedJob,
        kind: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        self.kinds.append(kind)


def test_an_abandoned_async_handler_collected_later_reports_no_failed_attempt(
    EdgeSession: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    """A sync worker stops past the shutdown timeout while an ``async def`` handler
    ignores its cancellation; once the abandoned task is garbage-collected, no failed
    attempt is logged, none reaches the observers, and the job stays handed back."""
    STUBBORN_STARTED.clear()
    with EdgeSession.begin() as session:
        job_id = stubborn_async.enqueue(session)
    observer = Finishes()
    worker = edges.worker(
        EdgeSession,
        tasks=["stubborn_async"],
        shutdown_timeout=0.2,
        observers=[observer],
        **FAST,
    )
    caplog.set_level(logging.DEBUG, logger="sqla_queue")
    with worker_thread(worker):
        assert STUBBORN_STARTED.wait(10)
    for _ in range(3):
        gc.collect()
    time.sleep(0.1)
    assert OutcomeKind.FAILED not in observer.kinds, observer.kinds
    assert observer.kinds.count(OutcomeKind.RELEASE) <= 1
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures
    assert not any("GeneratorExit" in r.getMessage() for r in caplog.records)
    with EdgeSession() as session:
        job = session.get(edges.Job, job_id)
        assert job is not None and str(job.status) == "queued"
