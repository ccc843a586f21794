"""Bulk enqueue by COPY (sqla_queue.copying): the same rows as the statement, or the statement.

A batch of at least ``COPY_MIN_ROWS`` plain jobs on a psycopg connection is written by
COPY; every other batch, and every connection that cannot take it, by the enqueue
statement. Which road a batch took shows in the statements SQLAlchemy sent: the COPY road
sends the id reservation and never the statement's ``jsonb_to_recordset``.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, func, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from sqla_queue import JobSpec, PayloadNotSerializableError, Queue
from sqla_queue.copying import COPY_MIN_ROWS, COPY_OPTION
from tests.support.app import Order, echo, noop, queue
from tests.support.grants import GuideRoles, grant_test_roles

pytestmark = [
    pytest.mark.integration,
    # The roads asserted here are the owner's; the guide's role has its own test below.
    pytest.mark.skipif(
        os.environ.get("SQLA_QUEUE_TEST_DML_ROLE") is not None, reason="a restricted run"
    ),
]

N = COPY_MIN_ROWS + 100


class Roads:
    """The roads the bulk enqueues on an engine took, from the statements it sent."""

    def __init__(self, engine: Engine) -> None:
        self.statements: list[str] = []
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        self.statements.append(statement)

    def taken(self) -> list[str]:
        """Each bulk write since the last call: "copy", "statement", or "copy refused"
        (reserved no ids, wrote by the statement). Call it after each enqueue: a refused
        COPY and a batch by the statement after it look alike."""
        roads = []
        for statement in self.statements:
            if "string_agg(nextval" in statement:
                roads.append("copy")
            elif "jsonb_to_recordset" in statement:
                if roads and roads[-1] == "copy":
                    roads[-1] = "copy refused"  # reserved nothing: wrote by the statement
                else:
                    roads.append("statement")
        self.statements.clear()
        return roads


def _specs(n: int = N) -> list[JobSpec]:
    """Plain jobs with every option a plain job may take, and awkward text."""
    paris = ZoneInfo("Europe/Paris")
    specs: list[JobSpec] = []
    for i in range(n):
        kind = i % 6
        if kind == 0:
            specs.append(noop.call())
        elif kind == 1:
            specs.append(echo.options(priority=i, max_attempts=3).call({"n": i, "s": "a\\b\tc\n"}))
        elif kind == 2:
            # A fraction of a microsecond: rounded as PostgreSQL rounds an interval.
            specs.append(echo.options(delay=0.0000015 + i).call("é \u2603 \U0001f600"))
        elif kind == 3:
            at = dt.datetime(2030, 3, 31, 2, 30, 0, 123457, tzinfo=paris)
            specs.append(echo.options(run_at=at).call(['"quoted"', "\\N", None, 1.5]))
        elif kind == 4:
            specs.append(echo.options(about=("orders", f"k\t{i}\\x")).call(i))
        else:
            specs.append(echo.options(delay=dt.timedelta(days=200), priority=-5).call())
    return specs


_JOB_COLUMNS = (
    "task, payload, priority, queue_id, status, attempts, max_attempts, errors, result, "
    "created_at, scheduled_at, finished_at, unique_key, about_table, about_key, awaited"
)
_EXECUTION_COLUMNS = (
    "task, priority, queue_id, state, execute_at, attempt, reclaims, worker_id, alive_at, "
    "lease_seconds, slot, cancel_requested"
)


def _rows(connection: Connection, ids: list[int]) -> tuple[list[Any], list[Any]]:
    jobs = connection.execute(
        text(
            f"SELECT {_JOB_COLUMNS} FROM app_jobs.sqla_queue_jobs WHERE id = ANY(:ids) ORDER BY id"
        ),
        {"ids": ids},
    ).all()
    executions = connection.execute(
        text(
            f"SELECT {_EXECUTION_COLUMNS} FROM app_jobs.sqla_queue_job_executions "
            "WHERE id = ANY(:ids) ORDER BY id"
        ),
        {"ids": ids},
    ).all()
    return jobs, executions


def test_copy_writes_the_rows_the_statement_writes(engine: Engine) -> None:
    roads = Roads(engine)
    specs = _specs()
    with engine.connect() as connection:
        # Not UTC, with a daylight-saving change inside the delays: the due times must not
        # move with the session's zone.
        connection.exec_driver_sql("SET TIME ZONE 'America/New_York'")
        by_copy = queue.enqueue_many(connection, specs)
        assert roads.taken() == ["copy"]
        connection.execution_options(**{COPY_OPTION: False})
        by_statement = queue.enqueue_many(connection, specs)
        assert roads.taken() == ["statement"]
        assert len(by_copy) == len(by_statement) == N
        assert by_copy == sorted(by_copy) and len(set(by_copy)) == N
        assert max(by_copy) < min(by_statement)
        copied, stated = _rows(connection, by_copy), _rows(connection, by_statement)
        connection.commit()
    assert copied[0] == stated[0]
    assert copied[1] == stated[1]
    assert len(copied[0]) == len(copied[1]) == N


def test_rollback_leaves_nothing_and_commit_notifies_once(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    roads = Roads(engine)
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.tables.notify_channel}"')
        with SessionLocal() as session:
            queue.enqueue_many(session, [noop.call() for _ in range(N)])
            session.rollback()
        assert not list(listener.notifies(timeout=0.3))
        with SessionLocal.begin() as session:
            ids = queue.enqueue_many(session, [noop.call() for _ in range(N)])
        heard = list(listener.notifies(timeout=0.5))
    assert roads.taken() == ["copy", "copy"]
    assert len(heard) == 1
    with SessionLocal() as session:
        assert session.scalar(select(func.count()).select_from(queue.Job)) == N
        assert session.scalar(select(func.count()).select_from(queue.JobExecution)) == N
        assert sorted(session.scalars(select(queue.Job.id))) == ids


def test_other_batches_take_the_statement(engine: Engine) -> None:
    roads = Roads(engine)
    with engine.begin() as connection:
        queue.enqueue_many(connection, [noop.call() for _ in range(COPY_MIN_ROWS - 1)])
        keyed = [noop.call() for _ in range(N)]
        keyed[7] = noop.options(queue_id="k").call()
        queue.enqueue_many(connection, keyed)
        unique = [noop.call() for _ in range(N)]
        unique[3] = noop.options(unique_key="u").call()
        queue.enqueue_many(connection, unique)
        queue.enqueue_many(
            connection.execution_options(**{COPY_OPTION: False}),
            [noop.call() for _ in range(N)],
        )
    taken = roads.taken()
    # A unique batch takes several statements of its own; none of them copies.
    assert set(taken) == {"statement"} and len(taken) >= 4


def test_an_autocommit_connection_writes_the_batch_whole(engine: Engine) -> None:
    roads = Roads(engine)
    with engine.connect() as connection:
        auto = connection.execution_options(isolation_level="AUTOCOMMIT")
        ids = queue.enqueue_many(auto, [noop.call() for _ in range(N)])
        with pytest.raises(PayloadNotSerializableError, match="NUL"):
            queue.enqueue_many(auto, [*(noop.call() for _ in range(N)), echo.call("\x00")])
    assert roads.taken() == ["copy", "copy"]
    with engine.connect() as connection:
        count = connection.execute(text("SELECT count(*) FROM app_jobs.sqla_queue_jobs")).scalar()
        assert count == len(ids) == N


def test_bad_arguments_undo_the_batch_and_keep_the_transaction(
    SessionLocal: sessionmaker[Session],
) -> None:
    # Arguments are checked block by block while the rows stream: the last block's bad
    # one must undo every row already sent, and leave the caller's transaction usable.
    with SessionLocal() as session:
        session.add(Order(email="before@example.com"))
        session.flush()
        with pytest.raises(PayloadNotSerializableError, match="not JSON-serializable"):
            queue.enqueue_many(session, [*(noop.call() for _ in range(N)), echo.call(object())])
        session.add(Order(email="after@example.com"))
        session.commit()
    with SessionLocal() as session:
        assert session.scalar(select(func.count()).select_from(queue.Job)) == 0
        assert session.scalar(select(func.count()).select_from(queue.JobExecution)) == 0
        emails = set(session.scalars(select(Order.email)))
        assert emails == {"before@example.com", "after@example.com"}


async def test_an_async_session_copies(
    AsyncSessionLocal: async_sessionmaker[Any], async_engine: AsyncEngine
) -> None:
    roads = Roads(async_engine.sync_engine)
    async with AsyncSessionLocal() as session:
        await queue.enqueue_many(session, [noop.call() for _ in range(N)])
        await session.rollback()
    async with AsyncSessionLocal.begin() as session:
        ids = await queue.enqueue_many(session, _specs())
    assert roads.taken() == ["copy", "copy"]
    async with AsyncSessionLocal() as session:
        stored = list(await session.scalars(select(queue.Job.id).order_by(queue.Job.id)))
    assert stored == ids and len(ids) == N


async def test_asyncpg_takes_the_statement(db_url: str) -> None:
    url = make_url(db_url).set(drivername="postgresql+asyncpg")
    engine = create_async_engine(url)
    roads = Roads(engine.sync_engine)
    try:
        async with async_sessionmaker(engine).begin() as session:
            ids = await queue.enqueue_many(session, [noop.call() for _ in range(N)])
    finally:
        await engine.dispose()
    assert roads.taken() == ["statement"]
    assert ids == sorted(ids) and len(ids) == N


def test_a_prefixed_queue_in_a_translated_schema(empty_db_url: str) -> None:
    class Base(DeclarativeBase):
        metadata = MetaData(schema="placeholder")

    tenant_queue = Queue(Base, prefix="cq_")

    @tenant_queue.task(name="t")
    def t(n: int) -> None:
        return None

    engine = create_engine(empty_db_url).execution_options(
        schema_translate_map={"placeholder": "Tenant One"}
    )
    roads = Roads(engine)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql('CREATE SCHEMA "Tenant One"')
            tenant_queue.create_all(connection)
        url = make_url(empty_db_url).set(drivername="postgresql")
        with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as ear:
            ear.execute('LISTEN "Tenant One.cq_wakeup"')
            with engine.begin() as connection:
                ids = tenant_queue.enqueue_many(connection, [t.call(n) for n in range(N)])
            heard = list(ear.notifies(timeout=0.5))
        with engine.connect() as connection:
            stored = connection.exec_driver_sql(
                'SELECT j.id, j.payload FROM "Tenant One"."cq_jobs" j '
                'JOIN "Tenant One"."cq_job_executions" e USING (id) ORDER BY j.id'
            ).all()
    finally:
        engine.dispose()
    assert roads.taken() == ["copy"]
    assert [row[0] for row in stored] == ids
    assert [row[1] for row in stored] == [{"args": [n], "kwargs": {}} for n in range(N)]
    assert len(heard) == 1


@pytest.fixture
def guide_role(db_url: str, admin_url: str) -> Iterator[tuple[str, GuideRoles]]:
    """A login with exactly the deployment guide's application grants (no sequence grant)."""
    app = f"sqlaq_copy_{os.getpid()}"
    roles = GuideRoles(app=app, admin=f"{app}_admin", login=app)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for name in (roles.admin, roles.app):
            connection.exec_driver_sql(f'DROP ROLE IF EXISTS "{name}"')
            connection.exec_driver_sql(f'CREATE ROLE "{name}" LOGIN')
    url = grant_test_roles(
        db_url, roles, schema=str(queue.tables.schema), prefix=queue.tables.prefix
    )
    yield url, roles
    drop = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with drop.connect() as connection:
        for name in (roles.admin, roles.app):
            connection.exec_driver_sql(f'DROP OWNED BY "{name}"')
    drop.dispose()
    with admin.connect() as connection:
        for name in (roles.admin, roles.app):
            connection.exec_driver_sql(f'DROP ROLE IF EXISTS "{name}"')
    admin.dispose()


def test_the_guide_role_without_a_sequence_grant_falls_back(
    guide_role: tuple[str, GuideRoles], db_url: str
) -> None:
    url, roles = guide_role
    engine = create_engine(url)
    owner = create_engine(db_url, isolation_level="AUTOCOMMIT")
    roads = Roads(engine)
    try:
        with engine.begin() as connection:
            before = queue.enqueue_many(connection, [noop.call() for _ in range(N)])
        assert roads.taken() == ["copy refused"]
        with owner.connect() as connection:
            connection.exec_driver_sql(
                f'GRANT USAGE ON SEQUENCE app_jobs.sqla_queue_jobs_id_seq TO "{roles.app}"'
            )
        with engine.begin() as connection:
            after = queue.enqueue_many(connection, [noop.call() for _ in range(N)])
        assert roads.taken() == ["copy"]
        # A COPY that fails (here the second, for want of INSERT) fails the whole batch,
        # with SQLAlchemy's error for the driver's, and leaves nothing behind.
        with owner.connect() as connection:
            connection.exec_driver_sql(
                f'REVOKE INSERT ON app_jobs.sqla_queue_job_executions FROM "{roles.app}"'
            )
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            engine.begin() as connection,
        ):
            queue.enqueue_many(connection, [noop.call() for _ in range(N)])
        with engine.connect() as connection:
            count = connection.execute(
                text("SELECT count(*) FROM app_jobs.sqla_queue_job_executions")
            ).scalar()
            jobs = connection.execute(
                text("SELECT count(*) FROM app_jobs.sqla_queue_jobs")
            ).scalar()
    finally:
        engine.dispose()
        owner.dispose()
    assert roads.taken() == ["copy"]
    assert before == sorted(before) and after == sorted(after) and max(before) < min(after)
    assert count == jobs == 2 * N
