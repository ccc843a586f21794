"""An async worker's threads and LISTEN connect as the application's async engine does.

Its heartbeater, services and LISTEN connection cannot use the async engine (they run in
threads): they get a synchronous psycopg engine. It must reach the same database with the
same settings: ``connect_args`` (``options``, SSL, ``application_name``) and ``connect``
listeners (a ``SET search_path``), or, when those cannot be repeated (an
``async_creator``), the worker refuses to start and names ``background_engine``.
Each worker backend is seen in ``pg_stat_activity`` by its ``application_name``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from sqla_queue import Queue
from sqla_queue.worker.background import libpq_url
from tests.support.app import QUEUE_SCHEMA
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration


def _queue() -> Queue:
    queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, notify=True)

    @queue.task(name="connections_noop")
    def noop() -> None:
        """Never runs: the tests watch the worker's own connections."""

    return queue


@pytest.fixture
def observer(db_url: str) -> Iterator[Engine]:
    engine = create_engine(db_url, poolclass=NullPool)
    yield engine
    engine.dispose()


def _backends(observer: Engine) -> list[tuple[str, str]]:
    """(application_name, query) of every other backend on the test database."""
    with observer.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT application_name, query FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            )
        ).all()
    return [(str(name), str(query)) for name, query in rows]


def _listening(observer: Engine) -> bool:
    """The worker LISTENs and its services' pool holds a connection (3 backends at least)."""
    backends = _backends(observer)
    return len(backends) >= 3 and any(q.startswith("LISTEN") for _, q in backends)


def _worker_kwargs(**extra: Any) -> dict[str, Any]:
    return {
        "install_signal_handlers": False,
        "listen": True,
        "poll_interval": 0.05,
        "heartbeat_interval": 0.1,
        **extra,
    }


async def _watch(engine: AsyncEngine, observer: Engine, **settings: Any) -> list[tuple[str, str]]:
    """The backends of an async worker on ``engine`` once it listens, then stop it."""
    worker = _queue().async_worker(async_sessionmaker(engine), **_worker_kwargs(**settings))
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_for, lambda: _listening(observer) or run.done(), 20)
        if run.done():
            run.result()  # its error, if it stopped
        return _backends(observer)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)


def _set_application_name(name: str) -> Any:
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        # SQLAlchemy's documented recipe: a session setting made outside a transaction.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET application_name = '{name}'")
        cursor.close()
        dbapi_connection.autocommit = autocommit

    return on_connect


async def test_threads_and_listen_keep_connect_args(db_url: str, observer: Engine) -> None:
    engine = create_async_engine(
        db_url,
        connect_args={"application_name": "aqw-args", "options": "-c search_path=public"},
    )
    try:
        backends = await _watch(engine, observer)
    finally:
        await engine.dispose()
    assert {name for name, _ in backends} == {"aqw-args"}, backends
    assert [name for name, q in backends if q.startswith("LISTEN")] == ["aqw-args"]


async def test_threads_and_listen_run_connect_listeners(db_url: str, observer: Engine) -> None:
    engine = create_async_engine(db_url)
    event.listen(engine.sync_engine, "connect", _set_application_name("aqw-listener"))
    try:
        backends = await _watch(engine, observer)
    finally:
        await engine.dispose()
    assert {name for name, _ in backends} == {"aqw-listener"}, backends
    assert [name for name, q in backends if q.startswith("LISTEN")] == ["aqw-listener"]


def _creator_engine(db_url: str) -> AsyncEngine:
    """An engine whose URL names no database: only its ``async_creator`` knows it."""
    conninfo = libpq_url(make_url(db_url))

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(conninfo, application_name="aqw-creator")

    return create_async_engine("postgresql+psycopg://", async_creator=connect)


async def test_an_async_creator_engine_is_refused_naming_background_engine(
    db_url: str,
) -> None:
    engine = _creator_engine(db_url)
    try:
        worker = _queue().async_worker(async_sessionmaker(engine), **_worker_kwargs())
        with pytest.raises(TypeError, match=r"async_creator.*background_engine="):
            await asyncio.wait_for(worker.run(), 30)
    finally:
        await engine.dispose()


def _asyncpg_url(db_url: str) -> str:
    return make_url(db_url).set(drivername="postgresql+asyncpg").render_as_string(False)


async def test_asyncpg_connect_args_are_refused_naming_background_engine(db_url: str) -> None:
    engine = create_async_engine(
        _asyncpg_url(db_url), connect_args={"server_settings": {"search_path": "public"}}
    )
    try:
        worker = _queue().async_worker(async_sessionmaker(engine), **_worker_kwargs())
        with pytest.raises(TypeError, match=r"server_settings.*background_engine="):
            await asyncio.wait_for(worker.run(), 30)
    finally:
        await engine.dispose()


async def test_an_asyncpg_engine_its_url_describes_runs_as_before(
    db_url: str, observer: Engine
) -> None:
    engine = create_async_engine(_asyncpg_url(db_url))
    try:
        backends = await _watch(engine, observer)
    finally:
        await engine.dispose()
    assert any(q.startswith("LISTEN") for _, q in backends), backends


async def test_an_async_creator_engine_runs_with_a_background_engine(
    db_url: str, observer: Engine
) -> None:
    engine = _creator_engine(db_url)
    given = create_engine(db_url, connect_args={"application_name": "aqw-given"})
    try:
        backends = await _watch(engine, observer, background_engine=given)
    finally:
        await engine.dispose()
        given.dispose()
    names = {name for name, _ in backends}
    assert names == {"aqw-creator", "aqw-given"}, backends
    assert [name for name, q in backends if q.startswith("LISTEN")] == ["aqw-given"]


def test_a_sync_worker_listens_with_its_engines_connect_args(db_url: str, observer: Engine) -> None:
    engine = create_engine(db_url, connect_args={"application_name": "aqw-sync"})
    worker = _queue().worker(sessionmaker(engine), **_worker_kwargs())
    try:
        with worker_thread(worker):
            wait_for(lambda: _listening(observer), 20)
            backends = _backends(observer)
    finally:
        engine.dispose()
    assert {name for name, _ in backends} == {"aqw-sync"}, backends
    assert [name for name, q in backends if q.startswith("LISTEN")] == ["aqw-sync"]


def test_background_engine_must_be_a_sync_postgresql_engine(db_url: str) -> None:
    engine = create_async_engine(db_url)
    with pytest.raises(TypeError, match="background_engine must be a synchronous"):
        _queue().async_worker(async_sessionmaker(engine), background_engine=engine)


def _record_heartbeat_search_paths(observer: Engine, queue: Queue) -> None:
    """Log the ``search_path`` of every statement that moves an execution's ``alive_at``."""
    executions = queue.tables.executions
    table = f'"{executions.schema}"."{executions.name}"'
    with observer.begin() as conn:
        conn.execute(text("CREATE TABLE public.beat_paths (search_path text NOT NULL)"))
        conn.execute(
            text(
                "CREATE FUNCTION public.record_beat_path() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO public.beat_paths VALUES (current_setting('search_path')); "
                "RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER record_beat_path BEFORE UPDATE OF alive_at ON {table} "
                "FOR EACH ROW WHEN (NEW.alive_at IS DISTINCT FROM OLD.alive_at) "
                "EXECUTE FUNCTION public.record_beat_path()"
            )
        )


def _set_search_path(dbapi_connection: Any, record: Any) -> None:
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    cursor = dbapi_connection.cursor()
    cursor.execute("SET search_path = aqw_listener, public")
    cursor.close()
    dbapi_connection.autocommit = autocommit


@pytest.mark.parametrize(
    ("how", "search_path"),
    [("connect_args", "aqw_args,public"), ("listener", "aqw_listener, public")],
)
async def test_heartbeats_run_with_the_engines_search_path(
    db_url: str, observer: Engine, how: str, search_path: str
) -> None:
    queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, lost_interval=2.0)

    @queue.task(name="connections_slow")
    async def slow() -> None:
        """Hold the job for a dozen heartbeats."""
        await asyncio.sleep(1.2)

    _record_heartbeat_search_paths(observer, queue)
    if how == "connect_args":
        engine = create_async_engine(
            db_url, connect_args={"options": "-c search_path=aqw_args,public"}
        )
    else:
        engine = create_async_engine(db_url)
        event.listen(engine.sync_engine, "connect", _set_search_path)
    try:
        factory = async_sessionmaker(engine)
        async with factory.begin() as session:
            await slow.enqueue(session)
        worker = queue.async_worker(factory, **_worker_kwargs(listen=False))
        await asyncio.wait_for(worker.run(burst=True), 30)
    finally:
        await engine.dispose()
    with observer.connect() as conn:
        paths = conn.execute(text("SELECT search_path FROM public.beat_paths")).scalars().all()
    assert len(paths) >= 5, paths  # the claim, and heartbeats every 0.1 s for 1.2 s
    assert set(paths) == {search_path}, paths
