"""The worker's raw-cursor path (worker/raw.py) against real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, Integer, func, insert, literal, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue._sqlstate import is_unique_violation_of
from sqla_queue.worker.actions import Work
from sqla_queue.worker.raw import RawStatements
from sqla_queue.worker.sync import _execute_raw
from tests.support.app import noop, queue
from tests.support.plans import captured_statements

pytestmark = pytest.mark.integration


def _work(steps: list[tuple[object, dict[str, object]]], *, atomic: bool = False) -> Work:
    return Work(steps, atomic, lambda results: [], lambda: None)  # type: ignore[arg-type]


def _insert_job(**values: object) -> Any:
    """An INSERT of one queued noop job row (``id=`` to force a key)."""
    return insert(queue.tables.jobs).values(
        task="noop",
        payload={},
        priority=0,
        max_attempts=1,
        status="queued",
        scheduled_at=func.now(),
        **values,
    )


def test_raw_claim_returns_what_connection_execute_returns(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, [noop.call() for _ in range(6)])
    claim = statements.claim_statement(queue.tables)
    params = {
        "tasks": ["noop"],
        "batch": 3,
        "worker": uuid.uuid4(),
        "lease": 30.0,
        "lease_map": json.dumps({}),
    }
    raw = RawStatements(engine.dialect)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        (via_raw,) = _execute_raw(connection, raw, _work([(claim, params)]))
        via_sqlalchemy = connection.execute(claim, params).all()
    assert [r.id for r in via_raw] == [1, 2, 3]
    assert [r.id for r in via_sqlalchemy] == [4, 5, 6]
    # Same columns, same Python types, same values apart from the rows themselves.
    assert via_raw[0]._fields == tuple(via_sqlalchemy[0]._fields)
    for a, b in zip(via_raw, via_sqlalchemy, strict=True):
        assert (a.task, a.payload, a.attempt, a.max_attempts) == (
            b.task,
            b.payload,
            b.attempt,
            b.max_attempts,
        )
        assert type(a.next_due) is type(b.next_due)


def test_a_driver_error_surfaces_as_sqlalchemy_error_with_its_sqlstate(engine: Engine) -> None:
    jobs = queue.tables.jobs
    duplicate = _insert_job(id=1)
    raw = RawStatements(engine.dialect)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        _execute_raw(connection, raw, _work([(duplicate, {})]))
        with pytest.raises(IntegrityError) as caught:
            _execute_raw(connection, raw, _work([(duplicate, {})]))
    assert isinstance(caught.value, DBAPIError)
    assert is_unique_violation_of(caught.value, {f"{jobs.name}_pkey"})


@pytest.mark.parametrize(("atomic", "kept"), [(True, 1), (False, 2)])
def test_a_failing_unit_keeps_what_its_transactions_allow(
    engine: Engine, atomic: bool, kept: int
) -> None:
    """An atomic unit is one transaction; elsewhere a failure keeps what came before it.

    Only atomic units are pipelined, and either way the error still names its SQLSTATE and
    constraint, which is how a worker tells a lost slot race from a real failure.
    """
    add = _insert_job()
    clash = _insert_job(id=1)
    raw = RawStatements(engine.dialect)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        _execute_raw(connection, raw, _work([(add, {})]))  # id 1
        with pytest.raises(IntegrityError) as caught:
            _execute_raw(connection, raw, _work([(add, {}), (clash, {})], atomic=atomic))
        connection.exec_driver_sql("ROLLBACK")  # ends the aborted unit; a no-op otherwise
    with Session(engine) as session:
        assert session.query(queue.Job).count() == kept
    assert is_unique_violation_of(caught.value, {f"{queue.tables.jobs.name}_pkey"})
    assert "INSERT INTO" in str(caught.value)


@contextmanager
def _sent_messages(driver: Any, trace: Path) -> Iterator[list[str]]:
    """Names of the protocol messages the client sends inside the block, filled at its end."""
    messages: list[str] = []
    with trace.open("w") as out:
        driver.pgconn.trace(out.fileno())
        driver.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield messages
        finally:
            driver.pgconn.untrace()
    for line in trace.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) > 2 and fields[0] == "F":
            messages.append(fields[2].split()[0])


def test_an_atomic_unit_is_one_round_trip(engine: Engine, tmp_path: Path) -> None:
    """BEGIN, the statements and COMMIT reach the server together: one Sync, in order."""
    first = select(literal(1, Integer).label("n"))
    second = select(literal(2, Integer).label("n"))
    raw = RawStatements(engine.dialect)
    trace = tmp_path / "libpq.trace"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        with _sent_messages(driver, trace) as messages:
            results = _execute_raw(connection, raw, _work([(first, {}), (second, {})], atomic=True))
    assert [[row.n for row in rows] for rows in results] == [[1], [2]]
    assert messages.count("Sync") == 1, messages
    assert messages.count("Execute") == 4, messages  # BEGIN, both selects, COMMIT


async def test_an_async_atomic_unit_is_one_round_trip_and_keeps_its_sqlstate(
    async_engine: AsyncEngine, tmp_path: Path
) -> None:
    """The asyncio face pipelines a unit too, and its errors read like the sync face's."""
    from sqla_queue.worker.aio import _execute_raw as execute_async

    raw = RawStatements(async_engine.dialect)
    first = select(literal(1, Integer).label("n"))
    clash = _insert_job(id=1)
    trace = tmp_path / "libpq.trace"
    async with async_engine.connect() as opened:
        connection = await opened.execution_options(isolation_level="AUTOCOMMIT")
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None
        await execute_async(connection, raw, _work([(clash, {})]))
        with _sent_messages(driver, trace) as messages:
            results = await execute_async(
                connection, raw, _work([(first, {}), (first, {})], atomic=True)
            )
        with pytest.raises(IntegrityError) as caught:
            await execute_async(connection, raw, _work([(first, {}), (clash, {})], atomic=True))
        await connection.exec_driver_sql("ROLLBACK")
    assert [[row.n for row in rows] for rows in results] == [[1], [1]]
    assert messages.count("Sync") == 1, messages
    assert is_unique_violation_of(caught.value, {f"{queue.tables.jobs.name}_pkey"})


def test_raw_statements_bypass_engine_events_and_the_setting_restores_them(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """Documented trade-off of ``WorkerSettings.raw_statements``: tracers on engine events."""
    for raw_statements, claims_seen in ((True, False), (False, True)):
        with SessionLocal.begin() as session:
            noop.enqueue(session)
        with captured_statements(engine) as seen:
            worker = queue.worker(SessionLocal, tasks=["noop"], raw_statements=raw_statements)
            worker.run(burst=True)
        assert any("candidates AS" in sql for sql, _ in seen) is claims_seen
