"""Two tenants of one queue, chosen on the connection by ``schema_translate_map``.

The queue's models name a placeholder schema, ``tenant``; each tenant's rows live in its
own schema (``tenant_a``, ``tenant_b``), and a connection picks one with the
``schema_translate_map`` execution option: on its engine, on the connection itself, through
``session.connection(execution_options=...)``, or on the connection a Session is bound to
(and the async twins of each). Both tenants hold jobs with the same ids, so that a call
that reads or writes the wrong tenant finds a job there and answers for it.

The sources of tenant B below are built on tenant A's engine and pick B on the connection
(or the session's connection), the way an application that routes per request does: a
library that falls back on the engine would answer with tenant A's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, MetaData, create_engine, select, text
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from sqla_queue import (
    JobCancelledError,
    JobContext,
    JobSpec,
    Queue,
    QueueFull,
    WorkflowNotFoundError,
)
from sqla_queue.listing import list_jobs
from sqla_queue.worker.background import libpq_url

pytestmark = pytest.mark.integration

PLACEHOLDER = "tenant"
A, B = "tenant_a", "tenant_b"
TRANSLATE = "schema_translate_map"


def _tenant_queue(*, notify: bool = True) -> Queue:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=PLACEHOLDER)

    q = Queue(Base, notify=notify)

    @q.task(name="double")
    def double(n: int) -> int:
        return 2 * n

    @q.task(name="bounded", max_pending=1)
    def bounded() -> None:
        return None

    @q.task(name="boom")
    def boom() -> None:
        raise RuntimeError("boom")

    @q.periodic("0 * * * *", name="hourly")
    def hourly() -> None:
        return None

    @q.task(name="total", pass_context=True)
    def total(ctx: JobContext[Session]) -> int:
        return sum(ctx.parent_results.values())

    return q


queue = _tenant_queue()


def tmap(tenant: str) -> dict[str, dict[str, str]]:
    """The execution options that choose ``tenant``."""
    return {TRANSLATE: {PLACEHOLDER: tenant}}


@pytest.fixture
def url(empty_db_url: str) -> str:
    """A database with both tenants' queues, made by ``create_all`` on each tenant's
    connection."""
    setup = create_engine(empty_db_url)
    for tenant in (A, B):
        with setup.connect() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {tenant}")
            tenant_connection = connection.execution_options(**tmap(tenant))
            queue.create_all(tenant_connection)
            tenant_connection.commit()
    setup.dispose()
    return empty_db_url


def test_create_all_makes_the_tenants_schema_and_verify_reads_it(empty_db_url: str) -> None:
    setup = create_engine(empty_db_url)
    try:
        with setup.connect() as connection:
            tenant_connection = connection.execution_options(**tmap("tenant_c"))
            queue.create_all(tenant_connection)
            tenant_connection.commit()
            queue.verify(tenant_connection)
            schemas = connection.scalars(text("SELECT nspname FROM pg_namespace")).all()
        assert "tenant_c" in schemas
        assert PLACEHOLDER not in schemas
    finally:
        setup.dispose()


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    """Tenant A's engine: the map is on the engine."""
    eng = create_engine(url, pool_size=5, max_overflow=10).execution_options(**tmap(A))
    yield eng
    eng.dispose()


@pytest.fixture
async def async_engine(url: str) -> AsyncIterator[AsyncEngine]:
    """Tenant A's async engine."""
    eng = create_async_engine(url, pool_size=5).execution_options(**tmap(A))
    yield eng
    await eng.dispose()


def tenant_engine(engine: Engine, tenant: str) -> Engine:
    return engine.execution_options(**tmap(tenant))


def enqueue_in(engine: Engine, tenant: str, *calls: tuple[str, dict[str, Any]]) -> list[int]:
    with Session(tenant_engine(engine, tenant)) as session:
        ids = [queue.enqueue(session, task, kwargs) for task, kwargs in calls]
        session.commit()
    return ids


def job_rows(engine: Engine, tenant: str) -> dict[int, tuple[str, Any]]:
    jobs = queue.tables.jobs
    with tenant_engine(engine, tenant).connect() as connection:
        rows = connection.execute(select(jobs.c.id, jobs.c.status, jobs.c.payload)).all()
    return {row.id: (row.status, row.payload["kwargs"]) for row in rows}


def run_tenant(engine: Engine, tenant: str) -> None:
    """Run every due job of ``tenant`` with a burst worker of the tenant's engine."""
    queue.worker(
        sessionmaker(tenant_engine(engine, tenant)),
        concurrency=1,
        poll_interval=0.1,
        install_signal_handlers=False,
    ).run(burst=True)


# -- the sources of tenant B, each on tenant A's engine ------------------------------------

SyncSource = Callable[[Engine, contextlib.ExitStack], Any]


def _b_engine(engine: Engine, stack: contextlib.ExitStack) -> Any:
    return tenant_engine(engine, B)


def _b_connection(engine: Engine, stack: contextlib.ExitStack) -> Any:
    return stack.enter_context(engine.connect()).execution_options(**tmap(B))


def _b_session_on_connection(engine: Engine, stack: contextlib.ExitStack) -> Any:
    return stack.enter_context(Session(bind=_b_connection(engine, stack)))


def _b_session_connection_options(engine: Engine, stack: contextlib.ExitStack) -> Any:
    session = stack.enter_context(Session(engine))
    session.connection(execution_options=tmap(B))
    return session


def _b_sessionmaker(engine: Engine, stack: contextlib.ExitStack) -> Any:
    return sessionmaker(tenant_engine(engine, B))


def _b_sessionmaker_on_connection(engine: Engine, stack: contextlib.ExitStack) -> Any:
    return sessionmaker(bind=_b_connection(engine, stack))


SYNC_SOURCES: dict[str, SyncSource] = {
    "engine": _b_engine,
    "connection": _b_connection,
    "session_on_connection": _b_session_on_connection,
    "session_connection_options": _b_session_connection_options,
    "sessionmaker": _b_sessionmaker,
    "sessionmaker_on_connection": _b_sessionmaker_on_connection,
}

ASYNC_SOURCES = [
    "async_engine",
    "async_connection",
    "async_session_on_connection",
    "async_session_connection_options",
    "async_sessionmaker",
]


async def async_b_source(kind: str, engine: AsyncEngine, stack: contextlib.AsyncExitStack) -> Any:
    async def connection() -> AsyncConnection:
        opened = await stack.enter_async_context(engine.connect())
        return await opened.execution_options(**tmap(B))

    if kind == "async_engine":
        return engine.execution_options(**tmap(B))
    if kind == "async_connection":
        return await connection()
    if kind == "async_session_on_connection":
        return await stack.enter_async_context(AsyncSession(bind=await connection()))
    if kind == "async_session_connection_options":
        session = await stack.enter_async_context(AsyncSession(engine))
        await session.connection(execution_options=tmap(B))
        return session
    assert kind == "async_sessionmaker"
    return async_sessionmaker(engine.execution_options(**tmap(B)))


def twin_jobs(engine: Engine) -> int:
    """One job of id 1 in each tenant: ``double(1)`` in A, ``double(10)`` in B."""
    (a,) = enqueue_in(engine, A, ("double", {"n": 1}))
    (b,) = enqueue_in(engine, B, ("double", {"n": 10}))
    assert a == b == 1
    return a


def test_channels_and_lock_keys_derive_from_the_translated_schema() -> None:
    from sqla_queue.models import build_tables
    from sqla_queue.statements.bounded import bound_lock_key

    plain = queue.tables
    b = plain.translated({PLACEHOLDER: B})
    assert (b.schema, b.effective_schema) == (PLACEHOLDER, B)
    assert b.notify_channel == f"{B}.sqla_queue_wakeup"
    assert b.finished_channel == f"{B}.sqla_queue_finished"
    assert plain.notify_channel == f"{PLACEHOLDER}.sqla_queue_wakeup"
    keys = {bound_lock_key(t, "bounded") for t in (plain, b, plain.translated({PLACEHOLDER: A}))}
    assert len(keys) == 3
    # No map, or one that leaves the schema alone, gives the tables back as they are.
    assert plain.translated(None) is plain
    assert plain.translated({"other": "x"}) is plain
    assert b.translated({PLACEHOLDER: B}) is b
    assert b.translated(None) == plain
    # A queue on the search path is moved by a map of None, as SQLAlchemy moves it.
    bare = build_tables(MetaData())
    assert bare.translated({None: B}).notify_channel == f"{B}.sqla_queue_wakeup"
    assert bare.notify_channel == "public.sqla_queue_wakeup"


# -- result and cancel: connections the library opens on the caller's behalf -----------------


def test_result_answers_from_the_callers_tenant(engine: Engine) -> None:
    # One run of each tenant's worker, then every kind of source reads the result: the
    # result only reads, so the kinds need no database of their own (one per kind, each with
    # its two burst workers, took ~1.2 s apiece).
    job = twin_jobs(engine)
    run_tenant(engine, A)
    run_tenant(engine, B)
    for kind, source_of in SYNC_SOURCES.items():
        with contextlib.ExitStack() as stack:
            assert queue.result(source_of(engine, stack), job, timeout=5) == 20, kind
        assert queue.result(engine, job, timeout=5) == 2, kind


@pytest.mark.parametrize("kind", list(SYNC_SOURCES))
def test_cancel_touches_only_the_callers_tenant(engine: Engine, kind: str) -> None:
    job = twin_jobs(engine)
    with contextlib.ExitStack() as stack:
        assert queue.cancel(SYNC_SOURCES[kind](engine, stack), [job]) == {job: "cancelled"}
    assert job_rows(engine, A)[job][0] == "queued"
    assert job_rows(engine, B)[job][0] == "cancelled"
    with pytest.raises(JobCancelledError):
        queue.result(tenant_engine(engine, B), job, timeout=1)


async def test_async_result_and_cancel_follow_the_callers_tenant(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    # One run of each tenant's worker for every kind of source (it was one database and two
    # burst workers per kind); each kind cancels a queued job of its own.
    job = twin_jobs(engine)
    (second,) = enqueue_in(engine, A, ("double", {"n": 2}))
    assert enqueue_in(engine, B, ("double", {"n": 20})) == [second]
    await asyncio.to_thread(run_tenant, engine, A)
    await asyncio.to_thread(run_tenant, engine, B)
    for kind in ASYNC_SOURCES:
        (third,) = enqueue_in(engine, A, ("double", {"n": 3}))
        assert enqueue_in(engine, B, ("double", {"n": 30})) == [third], kind
        async with contextlib.AsyncExitStack() as stack:
            source = await async_b_source(kind, async_engine, stack)
            assert await queue.result(source, job, timeout=5) == 20, kind
            assert await queue.cancel(source, [job, third]) == {
                job: "finished",
                third: "cancelled",
            }, kind
            assert await queue.cancel(source, []) == {}, kind
        assert job_rows(engine, A)[third][0] == "queued", kind
        assert job_rows(engine, B)[third][0] == "cancelled", kind


def test_result_listens_on_the_tenants_channel(engine: Engine, url: str) -> None:
    """The completion NOTIFYs on the tenant's finished channel, where the wait listens."""
    job = twin_jobs(engine)
    heard: list[str] = []
    with psycopg.connect(libpq_url(engine.url), autocommit=True) as listener:
        listener.execute(f'LISTEN "{B}.sqla_queue_finished"')
        waiter = threading.Thread(
            target=lambda: heard.append(str(queue.result(tenant_engine(engine, B), job)))
        )
        waiter.start()
        _wait_until(lambda: job_rows_awaited(engine, B, job))
        run_tenant(engine, A)
        assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == []
        started = time.monotonic()
        run_tenant(engine, B)
        waiter.join(10)
        notes = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert heard == ["20"]
    assert notes == [str(job)]
    # Woken by the NOTIFY, well before the wait's 5 s poll.
    assert time.monotonic() - started < 4


def job_rows_awaited(engine: Engine, tenant: str, job: int) -> bool:
    jobs = queue.tables.jobs
    with tenant_engine(engine, tenant).connect() as connection:
        return bool(connection.scalar(select(jobs.c.awaited).where(jobs.c.id == job)))


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


# -- enqueue: every form writes to the tenant its connection chose ---------------------------


@pytest.mark.parametrize("kind", [k for k in SYNC_SOURCES if "sessionmaker" not in k])
def test_every_enqueue_writes_to_the_callers_tenant(engine: Engine, kind: str) -> None:
    twin_jobs(engine)
    with contextlib.ExitStack() as stack:
        source = SYNC_SOURCES[kind](engine, stack)
        if isinstance(source, Engine):
            source = stack.enter_context(Session(source))
        ids = [
            queue.enqueue(source, "double", {"n": 2}),
            queue.get_task("double").enqueue(source, n=3),
            *queue.enqueue_many(source, [JobSpec("double", (), {"n": 4})]),
            queue.enqueue(source, "double", {"n": 5}, unique_key="k"),
            queue.enqueue(source, "bounded", {}),
        ]
        source.commit()
    assert ids == [2, 3, 4, 5, 6]
    assert set(job_rows(engine, A)) == {1}
    assert [kwargs for _, kwargs in job_rows(engine, B).values()] == [
        {"n": 10},
        {"n": 2},
        {"n": 3},
        {"n": 4},
        {"n": 5},
        {},
    ]


async def test_async_enqueues_write_to_the_callers_tenant(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    twin_jobs(engine)
    for kind in ASYNC_SOURCES[1:4]:
        async with contextlib.AsyncExitStack() as stack:
            source = await async_b_source(kind, async_engine, stack)
            await queue.enqueue(source, "double", {"n": 2})
            await queue.enqueue_many(source, [JobSpec("double", (), {"n": 3})])
            await queue.enqueue(source, "double", {"n": 4}, unique_key=kind)
            await source.commit()
    assert set(job_rows(engine, A)) == {1}
    assert len(job_rows(engine, B)) == 10


def test_enqueue_wakes_only_the_tenants_workers(engine: Engine) -> None:
    """The wake-up NOTIFY goes to the channel of the tenant the rows went to."""
    with psycopg.connect(libpq_url(engine.url), autocommit=True) as listener:
        for tenant in (A, B):
            listener.execute(f'LISTEN "{tenant}.sqla_queue_wakeup"')
        listener.execute(f'LISTEN "{PLACEHOLDER}.sqla_queue_wakeup"')
        enqueue_in(engine, B, ("double", {"n": 1}))
        with engine.connect() as connection:
            queue.enqueue(connection.execution_options(**tmap(A)), "double", {"n": 1})
            connection.commit()
        heard = [n.channel for n in listener.notifies(timeout=1, stop_after=2)]
    assert heard == [f"{B}.sqla_queue_wakeup", f"{A}.sqla_queue_wakeup"]


# -- bounded tasks: each tenant's lock is its own --------------------------------------------


def test_a_bounded_enqueue_never_waits_for_another_tenant(engine: Engine) -> None:
    """Tenant A's enqueuer holds the bounded task's lock until it commits; tenant B's
    enqueue of the same task neither waits for it nor counts A's job."""
    with Session(engine) as holder:
        queue.enqueue(holder, "bounded", {})
        with engine.connect() as connection:
            b = connection.execution_options(**tmap(B))
            b.exec_driver_sql("SET lock_timeout = '2s'")
            assert queue.enqueue(b, "bounded", {}) == 1
            with pytest.raises(QueueFull):
                queue.enqueue(b, "bounded", {})
            b.commit()
        holder.commit()
    assert set(job_rows(engine, A)) == set(job_rows(engine, B)) == {1}


# -- workers: claim, complete and listen in their engine's tenant -----------------------------


def test_a_tenants_worker_runs_only_its_tenants_jobs(engine: Engine) -> None:
    job = twin_jobs(engine)
    run_tenant(engine, B)
    assert job_rows(engine, A)[job][0] == "queued"
    assert job_rows(engine, B)[job][0] == "succeeded"


@pytest.mark.timeout(60)
def test_a_tenants_worker_wakes_on_its_tenants_channel(engine: Engine, url: str) -> None:
    """An idle worker with a long poll is woken by a NOTIFY on its tenant's channel."""
    silent = _tenant_queue(notify=False)
    worker = queue.worker(
        sessionmaker(tenant_engine(engine, B)),
        concurrency=1,
        poll_interval=30,
        install_signal_handlers=False,
    )
    assert worker.plan.tables.notify_channel == f"{B}.sqla_queue_wakeup"
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        time.sleep(1.5)  # connected, idle until its 30 s poll
        with Session(tenant_engine(engine, B)) as session:
            job = silent.enqueue(session, "double", {"n": 21})
            session.commit()
        with engine.connect() as connection:
            connection.exec_driver_sql(f'NOTIFY "{B}.sqla_queue_wakeup"')
            connection.commit()
        _wait_until(lambda: job_rows(engine, B)[job][0] == "succeeded", timeout=10)
    finally:
        worker.stop()
        thread.join(15)


# -- the calls that run in the caller's transaction -------------------------------------------


def test_admin_calls_read_and_write_the_callers_tenant(engine: Engine) -> None:
    (a_job,) = enqueue_in(engine, A, ("boom", {}))
    (b_job,) = enqueue_in(engine, B, ("boom", {}))
    assert a_job == b_job
    run_tenant(engine, A)
    run_tenant(engine, B)
    with engine.connect() as raw:
        b = raw.execution_options(**tmap(B))
        assert queue.requeue(b, [b_job]) == [b_job]
        queue.pause(b, "double")
        queue.set_rate_limit(b, "boom", 5, per=60)
        queue.set_limit(b, "double", 3)
        b.commit()
        assert [row.id for row in list_jobs(b, queue.tables, limit=10, states=["queued"])] == [
            b_job
        ]
        status = queue.status(b)
        assert status.task("boom").pending == 1
        assert queue.controls(b)["double"].paused
        assert queue.limits(b)["double"].stored == 3
        assert [state.name for state in queue.schedules(b)] == ["hourly"]
        assert queue.daemon_status(b) == []
        queue.verify(b)
        b.rollback()
    with engine.connect() as a:
        assert job_rows(engine, A)[a_job][0] == "failed"
        assert queue.controls(a) == {}
        assert "double" not in queue.limits(a)
        assert queue.status(a).task("boom").pending == 0
    with engine.connect() as raw:
        b = raw.execution_options(**tmap(B))
        queue.resume(b, "double")
        queue.set_rate_limit(b, "boom", None)
        queue.set_limit(b, "double", None)
        b.commit()
        assert queue.controls(b) == {}


def test_prune_deletes_only_the_callers_tenants_jobs(engine: Engine) -> None:
    job = twin_jobs(engine)
    run_tenant(engine, A)
    run_tenant(engine, B)
    with engine.connect() as raw:
        b = raw.execution_options(**tmap(B))
        b.execute(text("SELECT pg_sleep(0.01)"))
        assert queue.prune(b, older_than=dt.timedelta(0)) == 1
        b.commit()
    assert job_rows(engine, A)[job][0] == "succeeded"
    assert job_rows(engine, B) == {}


def test_jobs_about_reads_the_callers_tenant(engine: Engine) -> None:
    with Session(engine) as a, Session(engine) as b_session:
        b_session.connection(execution_options=tmap(B))
        for session, n in ((a, 1), (b_session, 10)):
            queue.enqueue(session, "double", {"n": n}, about=("orders", 7))
            session.commit()
        b_session.connection(execution_options=tmap(B))
        found = b_session.scalars(queue.jobs_about(("orders", 7))).all()
        assert [job.payload["kwargs"] for job in found] == [{"n": 10}]


# -- the dashboard and the metrics, on a tenant's engine --------------------------------------


def test_the_dashboard_of_a_tenant_shows_and_cancels_its_jobs(engine: Engine) -> None:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    import re
    import warnings

    with warnings.catch_warnings():
        # Starlette 1.x suggests another HTTP client for its TestClient; httpx still works.
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient

    job = twin_jobs(engine)
    b_engine = tenant_engine(engine, B)
    app = queue.dashboard(b_engine, auth=lambda request: "ops")
    with TestClient(app, follow_redirects=False) as client:
        page = client.get(f"/jobs/{job}")
        assert page.status_code == 200
        assert "10" in page.text
        match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert match is not None
        done = client.post(f"/jobs/{job}/cancel", data={"csrf_token": match.group(1)})
        assert done.status_code == 303
    assert job_rows(engine, A)[job][0] == "queued"
    assert job_rows(engine, B)[job][0] == "cancelled"


def test_metrics_count_the_tenants_jobs(engine: Engine) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from sqla_queue.metrics.prometheus import PrometheusMetrics

    twin_jobs(engine)
    enqueue_in(engine, B, ("double", {"n": 2}))
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    metrics.watch_queue(queue, tenant_engine(engine, B))
    try:
        pending = registry.get_sample_value("sqla_queue_jobs_pending", {"task": "double"})
        assert pending == 2
    finally:
        metrics.uninstrument()


# -- a partitioned history: each tenant's partitions are its own ------------------------------


def _partitioned_queue() -> Queue:
    class Base(DeclarativeBase):
        metadata = MetaData(schema="ptenant")

    q = Queue(Base, history="partitioned")
    q.declare_task("double")
    return q


def _partitions_in(connection: Connection, schema: str) -> int:
    count = connection.scalar(
        text(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema"
        ),
        {"schema": schema},
    )
    return int(count or 0)


def test_history_partitions_are_maintained_and_pruned_in_the_callers_tenant(
    empty_db_url: str,
) -> None:
    history = _partitioned_queue()
    setup = create_engine(empty_db_url)
    try:
        with setup.connect() as connection:
            for tenant in ("pa", "pb"):
                connection.exec_driver_sql(f"CREATE SCHEMA {tenant}")
                history.create_all(
                    connection.execution_options(schema_translate_map={"ptenant": tenant})
                )
            connection.commit()
            b = connection.execution_options(schema_translate_map={"ptenant": "pb"})
            before_a = _partitions_in(connection, "pa")
            created = history.maintain_history(b, ahead=4).created
            b.commit()
            assert created
            assert _partitions_in(connection, "pa") == before_a
            grown_b = _partitions_in(connection, "pb")
            assert grown_b > before_a
            listed = history.history_partitions(b)
            assert len([p for p in listed if not p.is_default]) == len(created)
            assert history.prune(b, older_than=dt.timedelta(0)) == 0
            b.commit()
    finally:
        setup.dispose()


# -- the pytest plugin's helpers ---------------------------------------------------------------


def test_assert_enqueued_and_drain_follow_the_callers_tenant(engine: Engine) -> None:
    from sqla_queue.testing.helpers import assert_enqueued, drain

    twin_jobs(engine)
    enqueue_in(engine, A, ("double", {"n": 2}), ("double", {"n": 3}))
    with engine.connect() as raw:
        b = raw.execution_options(**tmap(B))
        with assert_enqueued(queue, b, task="double", count=1) as found:
            queue.enqueue(b, "double", {"n": 20})
        assert found.ids == [2]
        b.commit()
    ran = drain(queue, sessionmaker(tenant_engine(engine, B)))
    assert [(job.id, job.result) for job in ran.jobs] == [(1, 20), (2, 40)]
    assert {status for status, _ in job_rows(engine, A).values()} == {"queued"}


async def test_an_async_tenants_worker_runs_and_reports_in_its_tenant(
    engine: Engine, async_engine: AsyncEngine, url: str
) -> None:
    job = twin_jobs(engine)
    b_engine = async_engine.execution_options(**tmap(B))
    worker = queue.async_worker(async_sessionmaker(b_engine), concurrency=1, poll_interval=0.1)
    assert worker.plan.tables.notify_channel == f"{B}.sqla_queue_wakeup"
    assert worker.plan.tables.finished_channel == f"{B}.sqla_queue_finished"
    await worker.run(burst=True)
    assert job_rows(engine, A)[job][0] == "queued"
    assert job_rows(engine, B)[job][0] == "succeeded"
    assert await queue.result(b_engine, job, timeout=5) == 20


# -- the GRANT hints name the tenant's schema, where the statement was refused --------------


@pytest.fixture
def b_role(url: str) -> Iterator[Engine]:
    """A login role with USAGE on tenant B's schema and SELECT on its tables, nothing more:
    it may read B's queue but neither claim its jobs nor change its limits or controls.
    Its engine chooses B with the map; the role holds nothing in the placeholder schema
    (which does not exist) nor in A's."""
    import uuid

    from sqlalchemy import make_url

    name = f"sqlaq_tenant_{uuid.uuid4().hex[:8]}"
    owner = create_engine(url, isolation_level="AUTOCOMMIT")
    with owner.connect() as connection:
        connection.exec_driver_sql(f'CREATE ROLE "{name}" LOGIN')
        connection.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{B}" TO "{name}"')
        connection.exec_driver_sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{B}" TO "{name}"')
    engine = create_engine(make_url(url).set(username=name)).execution_options(**tmap(B))
    try:
        yield engine
    finally:
        engine.dispose()
        with owner.connect() as connection:
            connection.exec_driver_sql(f'DROP OWNED BY "{name}"')
            connection.exec_driver_sql(f'DROP ROLE "{name}"')
        owner.dispose()


def _names_only_tenant_b(message: str) -> None:
    assert f"{B}." in message or f" {B}" in message, message
    assert f"{PLACEHOLDER}." not in message, message
    assert f"schema {PLACEHOLDER}" not in message.replace(f"schema {B}", ""), message


def test_a_tenants_worker_without_a_privilege_names_the_tenants_grants(
    engine: Engine, b_role: Engine
) -> None:
    from sqla_queue import WorkerStoppedError

    twin_jobs(engine)
    worker = queue.worker(
        sessionmaker(b_role),
        concurrency=1,
        poll_interval=0.1,
        install_signal_handlers=False,
        verify_schema=False,  # a privilege lost at run time: the worker's own message
    )
    with pytest.raises(WorkerStoppedError) as stopped:
        worker.run(burst=True)
    message = str(stopped.value)
    assert "lacks a privilege" in message
    assert f"USAGE on schema {B};" in message
    assert f"{B}.sqla_queue_jobs" in message and f"{B}.sqla_queue_job_executions" in message
    _names_only_tenant_b(message)


@pytest.mark.parametrize("write", ["set_limit", "pause", "set_rate_limit"])
def test_an_operator_write_refused_in_a_tenant_names_the_tenants_grant(
    b_role: Engine, write: str
) -> None:
    from sqla_queue import InsufficientPrivilegeError

    calls: dict[str, Callable[[Any], None]] = {
        "set_limit": lambda bind: queue.set_limit(bind, "double", 2),
        "pause": lambda bind: queue.pause(bind, "double"),
        "set_rate_limit": lambda bind: queue.set_rate_limit(bind, "double", 1, per=60),
    }
    table = "sqla_queue_task_limits" if write == "set_limit" else "sqla_queue_task_controls"
    # The role on its own engine (the map on the engine), and through a Session on a
    # connection of the placeholder's engine that chooses B itself.
    plain = b_role.execution_options(schema_translate_map=None)
    with b_role.connect() as on_engine, plain.connect() as raw:
        for bind in (on_engine, Session(bind=raw.execution_options(**tmap(B)))):
            with pytest.raises(InsufficientPrivilegeError) as refused:
                calls[write](bind)
            message = str(refused.value)
            assert f"ON {B}.{table} TO" in message, message
            assert refused.value.missing == [
                f"{p} on table {B}.{table}" for p in ("INSERT", "UPDATE", "DELETE")
            ]
            _names_only_tenant_b(message)
            bind.rollback()


def test_a_tenants_missing_table_is_named_in_the_tenants_schema(engine: Engine) -> None:
    from sqla_queue import SchemaMismatchError

    with engine.begin() as owner:
        owner.exec_driver_sql(f"DROP TABLE {B}.sqla_queue_workers")
    # B on its engine, and on a connection of A's engine that chooses B itself.
    for bind in (tenant_engine(engine, B).connect(), engine.connect().execution_options(**tmap(B))):
        with bind, pytest.raises(SchemaMismatchError) as refused:
            queue.verify(bind)
        assert refused.value.missing == [
            f"table {B}.sqla_queue_workers (with its columns, indexes and constraints)"
        ]
        assert f"{PLACEHOLDER}." not in str(refused.value)
    with engine.connect() as a:
        queue.verify(a)  # tenant A's is whole


# -- a worker needs an engine; drain and eager take a connection's tenant ------------------


def test_a_worker_refuses_a_sessionmaker_bound_to_a_connection(engine: Engine) -> None:
    with engine.connect() as raw:
        factory = sessionmaker(bind=raw.execution_options(**tmap(B)))
        with pytest.raises(TypeError) as refused:
            queue.worker(factory, install_signal_handlers=False)
    message = str(refused.value)
    assert "not to one connection" in message
    assert "sessionmaker(bind=engine)" in message
    assert "engine.execution_options(schema_translate_map=" in message


def test_a_worker_refuses_a_read_session_factory_bound_to_a_connection(engine: Engine) -> None:
    """Handlers run side by side: one connection to the replica cannot serve them all."""
    with (
        engine.connect() as raw,
        pytest.raises(TypeError, match="read_session_factory bound to an engine"),
    ):
        queue.worker(
            sessionmaker(bind=engine),
            read_session_factory=sessionmaker(bind=raw),
            install_signal_handlers=False,
        )


async def test_an_async_worker_refuses_an_async_sessionmaker_bound_to_a_connection(
    async_engine: AsyncEngine,
) -> None:
    async with async_engine.connect() as raw:
        factory = async_sessionmaker(bind=await raw.execution_options(**tmap(B)))
        with pytest.raises(TypeError) as refused:
            queue.async_worker(factory)
    message = str(refused.value)
    assert "not to one connection" in message
    assert "async_sessionmaker(bind=async_engine)" in message


def test_drain_runs_the_tenant_of_a_sessionmaker_bound_to_a_connection(engine: Engine) -> None:
    """A test that picks its tenant on a connection drains that tenant's jobs; handlers'
    sessions see the same tenant."""
    from sqla_queue.testing.helpers import drain

    job = twin_jobs(engine)
    seen: list[str] = []
    probe = _tenant_queue()

    @probe.task(name="where_am_i", pass_context=True)
    def where_am_i(ctx: Any) -> None:
        jobs = probe.tables.jobs
        rows = ctx.session.execute(select(jobs.c.payload).where(jobs.c.id == job)).all()
        seen.extend(str(row.payload["kwargs"]) for row in rows)

    with engine.connect() as raw:
        b = raw.execution_options(**tmap(B))
        factory = sessionmaker(bind=b)
        with factory() as session:
            probe.enqueue(session, "where_am_i", {})
            session.commit()
        ran = drain(probe, factory, tasks=["double", "where_am_i"])
    assert [(j.id, j.task, j.status) for j in ran.jobs] == [
        (job, "double", "succeeded"),
        (2, "where_am_i", "succeeded"),
    ]
    assert ran.jobs[0].result == 20
    assert seen == ["{'n': 10}"]
    assert job_rows(engine, A)[job][0] == "queued"


def test_eager_runs_the_tenant_of_a_sessionmaker_bound_to_a_connection(engine: Engine) -> None:
    from sqla_queue.testing.helpers import eager

    job = twin_jobs(engine)
    with engine.connect() as raw:
        factory = sessionmaker(bind=raw.execution_options(**tmap(B)))
        with eager(queue, factory) as hook, factory() as session:
            queue.enqueue(session, "double", {"n": 21})
            session.commit()
    assert [(j.id, j.result) for j in hook.jobs] == [(job, 20), (2, 42)]
    assert job_rows(engine, A) == {job: ("queued", {"n": 1})}


# -- periodic schedules: each tenant's worker enqueues and records its own ticks -----------


def _beat_queue() -> Queue:
    """The tenants' queue with a schedule due every second: the same name in both."""
    q = _tenant_queue()

    @q.periodic(every=dt.timedelta(seconds=1), name="beat", kwargs={"n": 1})
    def beat(n: int) -> int:
        return n

    return q


def _beats(engine: Engine, tenant: str) -> tuple[int, list[dt.datetime]]:
    """(succeeded beat jobs, the scheduled times of every beat job) in ``tenant``."""
    jobs = queue.tables.jobs
    with tenant_engine(engine, tenant).connect() as connection:
        rows = connection.execute(
            select(jobs.c.status, jobs.c.scheduled_at).where(jobs.c.task == "beat")
        ).all()
    return sum(row.status == "succeeded" for row in rows), [row.scheduled_at for row in rows]


@pytest.mark.timeout(90)
async def test_each_tenants_worker_runs_its_tenants_schedule(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    """Two workers, a sync one for A and an async one for B, each on its tenant's engine:
    each tenant's schedule row and beat jobs are its own, each tick enqueued once."""
    beats = _beat_queue()
    sync_worker = beats.worker(
        sessionmaker(tenant_engine(engine, A)),
        reclaim_interval=0.5,
        poll_interval=0.1,
        install_signal_handlers=False,
    )
    async_worker = beats.async_worker(
        async_sessionmaker(async_engine.execution_options(**tmap(B))),
        reclaim_interval=0.5,
        poll_interval=0.1,
        install_signal_handlers=False,
    )
    listener = psycopg.connect(libpq_url(engine.url), autocommit=True)
    for tenant in (A, B, PLACEHOLDER):
        listener.execute(f'LISTEN "{tenant}.sqla_queue_wakeup"')
    thread = threading.Thread(target=sync_worker.run)
    thread.start()
    running = asyncio.create_task(async_worker.run())
    try:
        deadline = time.monotonic() + 30
        while min(_beats(engine, A)[0], _beats(engine, B)[0]) < 3:
            assert time.monotonic() < deadline, (_beats(engine, A), _beats(engine, B))
            assert not running.done(), running
            await asyncio.sleep(0.2)
    finally:
        sync_worker.stop()
        async_worker.stop()
        await asyncio.wait_for(running, 30)
        await asyncio.to_thread(thread.join, 30)
        with listener:
            # Each tick's enqueue woke its own tenant's workers, never the placeholder's.
            heard = {n.channel for n in listener.notifies(timeout=1)}
    assert heard == {f"{A}.sqla_queue_wakeup", f"{B}.sqla_queue_wakeup"}
    schedules = beats.tables.schedules
    for tenant in (A, B):
        _, due = _beats(engine, tenant)
        assert len(due) == len(set(due)), f"a tick was enqueued twice in {tenant}"
        with tenant_engine(engine, tenant).connect() as connection:
            names = connection.scalars(select(schedules.c.name)).all()
            state = {s.name: s for s in beats.schedules(connection)}
        assert sorted(names) == ["beat", "hourly"]
        assert state["beat"].last_tick is not None
    with engine.connect() as connection:
        assert connection.scalar(text(f"SELECT to_regnamespace('{PLACEHOLDER}')")) is None


def test_a_workflow_runs_in_its_tenants_schema(engine: Engine) -> None:
    """A chord written and released on tenant B's connection: its rows, its release, its
    callback's parent results and its status are all in B's schema; A sees none of it."""
    double, total = queue.get_task("double"), queue.get_task("total")
    with Session(tenant_engine(engine, B)) as session:
        handle = queue.chord([double.call(n=n) for n in (1, 2, 3)], then=total.call()).enqueue(
            session
        )
        session.commit()
    run_tenant(engine, A)
    assert job_rows(engine, A) == {}
    run_tenant(engine, B)
    status = queue.workflow_status(tenant_engine(engine, B), handle.id)
    assert status.state == "succeeded"
    with tenant_engine(engine, B).connect() as connection:
        result = connection.execute(
            select(queue.tables.jobs.c.result).where(queue.tables.jobs.c.id == handle.jobs["total"])
        ).scalar_one()
    assert result == 12
    with pytest.raises(WorkflowNotFoundError):
        queue.workflow_status(tenant_engine(engine, A), handle.id)
