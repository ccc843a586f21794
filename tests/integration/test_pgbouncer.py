"""Enqueue and workers through a real PgBouncer in transaction pooling mode.

Each test's engine goes through the session's PgBouncer (tests/support/pgbouncer.py) with
psycopg's prepared statements off, as PgBouncer 1.18 needs. The worker's guard is
``SET LOCAL``, so nothing of it reaches the next client of a server connection; LISTEN goes
to a direct connection (``listen_url``) or the worker polls.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.worker.failures import Fault, classify, explain
from tests.support.app import noop, queue, record_async
from tests.support.pgbouncer import ENGINE_OPTIONS, PgBouncer, pgbouncer_or_skip
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
#: The settings the worker's guard changes (statements/planner.py), read back elsewhere.
GUARDED = (
    "plan_cache_mode",
    "enable_seqscan",
    "enable_bitmapscan",
    "enable_sort",
    "jit",
    "idle_in_transaction_session_timeout",
)


@pytest.fixture
def bounced(pgbouncer: PgBouncer, db_url: str) -> Iterator[Engine]:
    """An engine on this test's database through PgBouncer."""
    engine = create_engine(pgbouncer.url(db_url), pool_size=5, max_overflow=20, **ENGINE_OPTIONS)
    yield engine
    engine.dispose()


@pytest.fixture
async def async_bounced(pgbouncer: PgBouncer, db_url: str) -> AsyncIterator[AsyncEngine]:
    """An async engine on this test's database through PgBouncer."""
    engine = create_async_engine(pgbouncer.url(db_url), pool_size=5, **ENGINE_OPTIONS)
    yield engine
    await engine.dispose()


def _statuses(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(select(JOBS.c.status, func.count()).group_by(JOBS.c.status))
        return {str(status): count for status, count in rows}


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def test_enqueue_is_transactional_through_pgbouncer(bounced: Engine) -> None:
    with Session(bounced) as session:
        noop.enqueue(session)
        session.rollback()
    assert _statuses(bounced) == {}
    with Session(bounced) as session, session.begin():
        noop.enqueue(session)
        queue.enqueue_many(session, [noop.call() for _ in range(9)])
    assert _statuses(bounced) == {"queued": 10}


def test_sync_worker_drains_through_pgbouncer(bounced: Engine) -> None:
    with Session(bounced) as session, session.begin():
        queue.enqueue_many(session, [noop.call() for _ in range(300)])
    worker = queue.worker(
        sessionmaker(bounced),
        concurrency=8,
        generic_plans=True,
        raw_statements=True,
        listen=False,
        install_signal_handlers=False,
    )
    # Well over psycopg's prepare_threshold of runs of each statement, on a pool whose
    # server connections the handlers' sessions share with the run loop's.
    stats = worker.run(burst=True)
    assert stats.succeeded == 300
    assert _statuses(bounced) == {"succeeded": 300}


async def test_async_worker_drains_through_pgbouncer(
    bounced: Engine, async_bounced: AsyncEngine
) -> None:
    with Session(bounced) as session, session.begin():
        queue.enqueue_many(session, [record_async.call(value=str(i)) for i in range(100)])
        queue.enqueue_many(session, [noop.call() for _ in range(100)])
    worker = queue.async_worker(
        async_sessionmaker(async_bounced, expire_on_commit=False),
        concurrency=8,
        generic_plans=True,
        raw_statements=True,
        listen=False,
        install_signal_handlers=False,
    )
    stats = await worker.run(burst=True)
    assert stats.succeeded == 200
    assert _statuses(bounced) == {"succeeded": 200}


def _listening(db_url: str) -> bool:
    """Whether a session on the test's database LISTENs on the queue's channel."""
    with psycopg.connect(_libpq(db_url), autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = %s",
            [f'LISTEN "{queue.tables.notify_channel}"'],
        ).fetchone()
        return bool(row and row[0])


def test_worker_listens_on_a_direct_url_and_wakes_on_an_enqueue_through_pgbouncer(
    bounced: Engine, db_url: str
) -> None:
    poll = 30.0
    worker = queue.worker(
        sessionmaker(bounced),
        listen_url=db_url,
        poll_interval=poll,
        install_signal_handlers=False,
    )
    with worker_thread(worker):
        wait_for(lambda: _listening(db_url), timeout=10)
        time.sleep(0.5)  # the wake-up of the listener's first connect has been served
        started = time.monotonic()
        with Session(bounced) as session, session.begin():
            noop.enqueue(session)
        wait_for(lambda: _statuses(bounced) == {"succeeded": 1}, timeout=10)
        waited = time.monotonic() - started
    # The NOTIFY went out through PgBouncer at commit; the direct LISTEN heard it.
    assert waited < 5.0 < poll


def test_worker_without_listen_polls_through_pgbouncer(bounced: Engine, db_url: str) -> None:
    worker = queue.worker(
        sessionmaker(bounced), listen=False, poll_interval=0.2, install_signal_handlers=False
    )
    with worker_thread(worker):
        time.sleep(0.3)
        with Session(bounced) as session, session.begin():
            noop.enqueue(session)
        wait_for(lambda: _statuses(bounced) == {"succeeded": 1}, timeout=10)
        assert not _listening(db_url)


@pytest.fixture
def single_connection_bouncer(admin_url: str) -> Iterator[PgBouncer]:
    """A PgBouncer with one server connection per database: every client shares it."""
    yield from pgbouncer_or_skip(admin_url, pool_size=1, reserve_pool_size=0)


def _guarded_settings(connection: psycopg.Connection[tuple[object, ...]]) -> dict[str, str]:
    return {name: str(connection.execute(f"SHOW {name}").fetchone()[0]) for name in GUARDED}  # type: ignore[index]


def test_another_client_does_not_inherit_the_workers_plan_settings(
    single_connection_bouncer: PgBouncer, db_url: str
) -> None:
    url = single_connection_bouncer.url(db_url)
    engine = create_engine(url, pool_size=5, max_overflow=5, **ENGINE_OPTIONS)
    try:
        with Session(engine) as session, session.begin():
            queue.enqueue_many(session, [noop.call() for _ in range(50)])
        worker = queue.worker(
            sessionmaker(engine),
            concurrency=4,
            generic_plans=True,
            listen=False,
            install_signal_handlers=False,
        )
        assert worker.run(burst=True).succeeded == 50
    finally:
        engine.dispose()
    with psycopg.connect(_libpq(db_url), autocommit=True) as direct:
        defaults = _guarded_settings(direct)
    assert defaults["plan_cache_mode"] == "auto"
    with (
        psycopg.connect(_libpq(url), autocommit=True, prepare_threshold=None) as first,
        psycopg.connect(_libpq(url), autocommit=True, prepare_threshold=None) as second,
    ):
        # One server connection behind both: the very one the worker ran on.
        pid = first.execute("SELECT pg_backend_pid()").fetchone()
        assert second.execute("SELECT pg_backend_pid()").fetchone() == pid
        assert _guarded_settings(second) == defaults


def test_a_lost_prepared_statement_stops_the_worker_with_the_fix(
    pgbouncer: PgBouncer, db_url: str
) -> None:
    """What PgBouncer 1.18 does to psycopg's prepared statements, and how the worker says so."""
    url = _libpq(pgbouncer.url(db_url))
    with (
        psycopg.connect(url, autocommit=True, prepare_threshold=0) as prepared,
        psycopg.connect(url, autocommit=True) as other,
    ):
        prepared.execute("SELECT 1 + %s", [1])  # prepared on the server connection it ran on
        with other.transaction():
            other.execute("SELECT 1")  # holds that server connection: the next goes elsewhere
            with pytest.raises(psycopg.Error) as caught:
                prepared.execute("SELECT 1 + %s", [1])
    assert classify(caught.value, ()) is Fault.POOLER
    message = explain(Fault.POOLER, caught.value, queue.tables, "claim")
    assert "prepare_threshold" in message
    assert "max_prepared_statements" in message
