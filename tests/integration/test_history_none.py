"""A queue without history (``Queue(history="none")``): a succeeded job's row is deleted.

Runs on a real PostgreSQL database made with the queue's ``create_all``. The completion
statement is played by hand where a step must happen at a given moment (the fence, a
waiter racing the completion); a burst worker runs the rest.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import produce_migrations
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, MetaData, create_engine, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.schema import CreateIndex, CreateTable

import alembic_ext  # noqa: F401  (registers the operations)
from alembic_ext import CreateQueueOp
from sqla_queue import JobNotFoundError, Queue, statements
from sqla_queue.listing import list_jobs
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.models import build_tables
from sqla_queue.models.vocabulary import SCHEMA_VERSION, check_history
from sqla_queue.statements.lifecycle import await_statement
from sqla_queue.testing.databases import DatabaseFactory
from tests.support.lifecycle import backend_pid, wait_until_blocked
from tests.support.nohistory_app import boom, ok, queue, step, steps, tx_step

pytestmark = pytest.mark.integration

T = queue.tables
QUIET = {"install_signal_handlers": False, "poll_interval": 0.05}
COMPLETE = statements.complete_statement(T)
CLAIM = statements.claim_statement(T)
DIALECT = postgresql.psycopg.dialect()


@pytest.fixture
def nq_engine(db_factory: DatabaseFactory) -> Iterator[Engine]:
    """A fresh database holding only the queue without history (and its tasks' table)."""
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        queue.create_all(connection)
        steps.create(connection)
    yield engine
    engine.dispose()
    db_factory.drop(url)


@pytest.fixture
def nq_sessions(nq_engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(nq_engine)


def run_burst(sessions: sessionmaker[Session]) -> None:
    queue.worker(sessions, **QUIET).run(burst=True)


def rows(engine: Engine) -> dict[int, str]:
    """Every job's status, by id."""
    with engine.connect() as connection:
        return {r.id: r.status for r in connection.execute(select(T.jobs.c.id, T.jobs.c.status))}


def executions(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM nq_job_executions")).scalar_one())


def claim(connection: Connection, worker: uuid.UUID) -> list[Any]:
    params = {"tasks": [ok.name], "batch": 10, "worker": worker, "lease": 30.0, "lease_map": "{}"}
    return [r for r in connection.execute(CLAIM, params).all() if r.id is not None]


def complete(
    connection: Connection,
    worker: uuid.UUID,
    job_id: int,
    attempt: int,
    kind: OutcomeKind = OutcomeKind.SUCCEEDED,
    result: Any = None,
) -> list[int]:
    error = None if kind is OutcomeKind.SUCCEEDED else {"type": "E", "message": "m"}
    outcome = Outcome(job_id, attempt, kind, result=result, error=error).as_row()
    params = {"outcomes": json.dumps([outcome]), "worker": worker}
    return [row[0] for row in connection.execute(COMPLETE, params).all()]


def claimed_one(engine: Engine, **enqueue: Any) -> tuple[int, uuid.UUID]:
    """Enqueue one ``ok`` job and claim it as a fresh worker: (job id, worker id)."""
    worker = uuid.uuid4()
    with engine.begin() as connection:
        job_id = ok.enqueue(connection, **enqueue)
    with engine.begin() as connection:
        (row,) = claim(connection, worker)
    assert row.id == job_id
    return job_id, worker


def test_none_is_a_layout_and_the_error_lists_all_three() -> None:
    assert check_history("none") == "none"
    with pytest.raises(ValueError, match="'plain', 'partitioned', 'none'"):
        check_history("nothing")


def test_only_the_none_completion_deletes_jobs_and_both_carry_the_fence() -> None:
    plain = build_tables(MetaData(), prefix="nq_")
    fence = "nq_job_executions.worker_id = %(worker)s::UUID"
    for tables, deletes in ((plain, False), (T, True)):
        sql = " ".join(str(statements.complete_statement(tables).compile(dialect=DIALECT)).split())
        assert sql.count(fence) == 3
        assert ("DELETE FROM nq_jobs" in sql) is deletes


def test_the_schema_is_plain_s_so_a_queue_switches_without_a_migration(nq_engine: Engine) -> None:
    def ddl(history: str) -> list[str]:
        tables = build_tables(MetaData(), prefix="nq_", history=history)
        out = []
        for table in tables.all:
            out.append(str(CreateTable(table).compile(nq_engine)))
            out += sorted(str(CreateIndex(ix).compile(nq_engine)) for ix in table.indexes)
        return out

    assert ddl("none") == ddl("plain")
    plain = Queue(metadata=MetaData(), prefix="nq_")
    with nq_engine.connect() as connection:
        queue.verify(connection)
        plain.verify(connection)


def test_alembic_creates_it_as_plain_and_autogenerate_sees_no_change(
    db_factory: DatabaseFactory,
) -> None:
    bare = Queue(metadata=MetaData(), prefix="nq_", history="none")
    url = db_factory.clone("template0")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            operations = Operations(MigrationContext.configure(connection))
            operations.invoke(CreateQueueOp(None, "nq_", version=SCHEMA_VERSION, history="none"))
        with engine.connect() as connection:
            bare.verify(connection)
            context = MigrationContext.configure(
                connection, opts={"target_metadata": bare.metadata}
            )
            script = produce_migrations(context, bare.metadata)
            assert script.upgrade_ops is not None
            assert list(script.upgrade_ops.ops) == []
    finally:
        engine.dispose()
        db_factory.drop(url)
    # A new queue's migration names the layout.
    op = CreateQueueOp(None, "nq_", version=SCHEMA_VERSION, history="none")
    assert op.to_diff_tuple()[-1] == "none"


def test_succeeded_jobs_leave_no_row_failed_ones_stay(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        for i in range(3):
            ok.enqueue(session, n=i)
        failed = boom.enqueue(session)
    run_burst(nq_sessions)
    assert rows(nq_engine) == {failed: "failed"}
    assert executions(nq_engine) == 0


def test_the_fence_holds_a_stale_worker_deletes_nothing(nq_engine: Engine) -> None:
    job_id, worker = claimed_one(nq_engine)
    with nq_engine.begin() as connection:
        assert complete(connection, uuid.uuid4(), job_id, 1) == []  # another worker
        assert complete(connection, worker, job_id, 2) == []  # another attempt
    assert rows(nq_engine) == {job_id: "queued"}
    with nq_engine.begin() as connection:
        assert complete(connection, worker, job_id, 1, result=7) == [job_id]
        # Applied once: the same outcome again is fenced off.
        assert complete(connection, worker, job_id, 1, result=7) == []
    assert rows(nq_engine) == {}
    assert executions(nq_engine) == 0


def test_a_retry_keeps_the_row_and_its_error(nq_engine: Engine) -> None:
    job_id, worker = claimed_one(nq_engine)
    with nq_engine.begin() as connection:
        assert complete(connection, worker, job_id, 1, OutcomeKind.RETRY) == [job_id]
        errors = connection.execute(
            select(T.jobs.c.errors).where(T.jobs.c.id == job_id)
        ).scalar_one()
    assert rows(nq_engine) == {job_id: "queued"}
    assert [e["type"] for e in errors] == ["E"]


def test_an_awaited_job_keeps_its_row_and_the_waiter_gets_the_value(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        job_id = ok.enqueue(session, n=41)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(queue.result(nq_engine, job_id)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not awaited(nq_engine, job_id) and time.monotonic() < deadline:
        time.sleep(0.02)
    run_burst(nq_sessions)
    waiter.join(10)
    assert got == [41]
    assert rows(nq_engine) == {job_id: "succeeded"}


def awaited(engine: Engine, job_id: int) -> bool:
    with engine.connect() as connection:
        return bool(
            connection.execute(select(T.jobs.c.awaited).where(T.jobs.c.id == job_id)).scalar()
        )


def test_a_waiter_that_marks_while_the_completion_waits_still_gets_the_row(
    nq_engine: Engine,
) -> None:
    """The race: the completion reads ``awaited`` false in its snapshot, then waits for the
    waiter's mark; it must keep (and record) the row, not drop it undecided."""
    job_id, worker = claimed_one(nq_engine)
    with nq_engine.connect() as waiter:
        tx = waiter.begin()
        assert waiter.execute(await_statement(T), {"job_id": job_id}).all()
        done: list[list[int]] = []
        pid: list[int] = []

        def finish() -> None:
            with nq_engine.begin() as connection:
                pid.append(backend_pid(connection))
                # The snapshot is taken before the mark commits.
                connection.execute(text("SELECT 1"))
                done.append(complete(connection, worker, job_id, 1, result="kept"))

        thread = threading.Thread(target=finish)
        thread.start()
        deadline = time.monotonic() + 10
        while not pid and time.monotonic() < deadline:
            time.sleep(0.01)
        wait_until_blocked(nq_engine, pid[0])
        tx.commit()
        thread.join(10)
    assert done == [[job_id]]
    assert rows(nq_engine) == {job_id: "succeeded"}
    assert queue.result(nq_engine, job_id, timeout=1) == "kept"


def test_a_waiter_that_comes_after_the_row_is_gone_gets_a_clear_error(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        job_id = ok.enqueue(session)
    run_burst(nq_sessions)
    started = time.monotonic()
    with pytest.raises(JobNotFoundError, match="history='none'"):
        queue.result(nq_engine, job_id, timeout=5)
    assert time.monotonic() - started < 2


def test_a_unique_key_with_a_hold_is_kept_and_still_deduplicates(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        held = ok.options(unique_key="k", unique_scope=3600).enqueue(session)
        plain = ok.enqueue(session)
    run_burst(nq_sessions)
    assert rows(nq_engine) == {held: "succeeded"}
    assert plain not in rows(nq_engine)
    with nq_sessions.begin() as session:
        again = ok.options(unique_key="k", unique_scope=3600).enqueue(session)
    assert again == held


def test_jobs_of_one_queue_id_drain_in_order(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        for name in ("a", "b", "c"):
            step.options(queue_id="acct").enqueue(session, name=name)
    run_burst(nq_sessions)
    with nq_engine.connect() as connection:
        ran = connection.execute(select(steps.c.name).order_by(steps.c.id)).scalars().all()
    assert ran == ["a", "b", "c"]
    assert rows(nq_engine) == {}
    assert executions(nq_engine) == 0


def test_a_transactional_success_deletes_the_row_with_its_writes(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        tx_step.enqueue(session, name="tx")
    run_burst(nq_sessions)
    with nq_engine.connect() as connection:
        assert connection.execute(select(steps.c.name)).scalars().all() == ["tx"]
    assert rows(nq_engine) == {}
    assert executions(nq_engine) == 0


def test_status_listing_and_cancel_cope_with_missing_rows(
    nq_engine: Engine, nq_sessions: sessionmaker[Session]
) -> None:
    with nq_sessions.begin() as session:
        gone = ok.enqueue(session)
        failed = boom.enqueue(session)
    run_burst(nq_sessions)
    with nq_sessions() as session:
        status = queue.status(session)
        listed = list_jobs(session, T, limit=10)
    assert [job.id for job in listed] == [failed]
    assert status is not None
    assert queue.cancel(nq_engine, [gone]) == {gone: "not_found"}
