"""The worker's raw-cursor path (worker/raw.py) against real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue._sqlstate import is_unique_violation_of
from sqla_queue.worker.core import Work
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


def test_an_atomic_unit_is_one_transaction(engine: Engine) -> None:
    add = _insert_job()
    clash = _insert_job(id=1)
    raw = RawStatements(engine.dialect)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        _execute_raw(connection, raw, _work([(add, {})]))  # id 1
        with pytest.raises(IntegrityError):
            _execute_raw(connection, raw, _work([(add, {}), (clash, {})], atomic=True))
        connection.exec_driver_sql("ROLLBACK")
    with Session(engine) as session:
        assert session.query(queue.Job).count() == 1


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
