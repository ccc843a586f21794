"""The claim statement against real PostgreSQL, with separate connections per worker."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import statements
from tests.support.app import boom, keyed, noop, queue, record
from tests.support.plans import captured_statements, dumps, generic_plan, scans

pytestmark = pytest.mark.integration

CLAIM = statements.claim_statement(queue.tables)
PROMOTE = statements.promote_statement(queue.tables)


def claim_params(tasks: list[str], batch: int, worker: uuid.UUID | None = None) -> dict[str, Any]:
    return {
        "tasks": tasks,
        "batch": batch,
        "worker": worker or uuid.uuid4(),
        "lease": 30.0,
        "lease_map": json.dumps({}),
    }


def claim(connection: Connection, tasks: list[str], batch: int) -> list[Any]:
    return [
        r for r in connection.execute(CLAIM, claim_params(tasks, batch)).all() if r.id is not None
    ]


def enqueue(engine: Engine, specs: list[Any]) -> list[int]:
    with Session(engine) as session, session.begin():
        return queue.enqueue_many(session, specs)


def test_two_open_claims_never_share_an_execution(engine: Engine) -> None:
    enqueue(engine, [noop.call() for _ in range(30)])
    with engine.connect() as a, engine.connect() as b, engine.connect() as c:
        # A and B hold their claims in open transactions while the next one claims.
        got_a = {r.id for r in claim(a, ["noop"], 10)}
        got_b = {r.id for r in claim(b, ["noop"], 10)}
        got_c = {r.id for r in claim(c, ["noop"], 50)}
        assert len(got_a) == len(got_b) == 10
        assert len(got_c) == 10
        assert not (got_a & got_b) and not (got_a & got_c) and not (got_b & got_c)
        a.rollback()
        # A's rollback hands its rows back; they are claimable again, and only they.
        with engine.connect() as d:
            assert {r.id for r in claim(d, ["noop"], 50)} == got_a
            d.commit()


def test_only_registered_tasks_are_claimed(engine: Engine) -> None:
    enqueue(engine, [noop.call(), boom.call(), noop.call()])
    with engine.begin() as connection:
        rows = claim(connection, ["boom"], 10)
    assert [r.task for r in rows] == ["boom"]
    with Session(engine) as session:
        left = session.scalars(
            select(queue.JobExecution.task).where(queue.JobExecution.state == "pending")
        )
        assert sorted(left) == ["noop", "noop"]


def test_claim_order_is_priority_then_time_then_id(engine: Engine) -> None:
    ids = enqueue(
        engine,
        [
            noop.options(priority=0).call(),
            noop.options(priority=5).call(),
            noop.options(priority=0).call(),
            noop.options(priority=5).call(),
        ],
    )
    with engine.begin() as connection:
        rows = claim(connection, ["noop"], 4)
    # The final SELECT's row order is not guaranteed; claim one at a time to see the order.
    assert {r.id for r in rows} == set(ids)
    enqueue(engine, [noop.options(priority=p).call() for p in (1, 3, 3, 2)])
    order = []
    for _ in range(4):
        with engine.begin() as connection:
            order.append(claim(connection, ["noop"], 1)[0].id)
    base = ids[-1]
    assert order == [base + 2, base + 3, base + 4, base + 1]


def test_claim_marks_running_and_counts_the_attempt(engine: Engine) -> None:
    (job_id,) = enqueue(engine, [record.call(value="x")])
    worker = uuid.uuid4()
    with engine.begin() as connection:
        (row,) = [r for r in connection.execute(CLAIM, claim_params(["record"], 5, worker)) if r.id]
    assert (row.id, row.attempt, row.task, row.max_attempts) == (job_id, 1, "record", 1)
    assert row.payload == {"args": [], "kwargs": {"value": "x"}}
    with Session(engine) as session:
        execution = session.get(queue.JobExecution, job_id)
        assert execution is not None
        assert (execution.state, execution.worker_id, execution.attempt) == ("running", worker, 1)
        assert execution.alive_at is not None and execution.lease_seconds == 30.0


def test_empty_claim_reports_the_next_due_time(engine: Engine) -> None:
    with engine.begin() as connection:
        rows = connection.execute(CLAIM, claim_params(["noop"], 10)).all()
        assert [(r.id, r.next_due) for r in rows] == [(None, None)]
    with Session(engine) as session, session.begin():
        noop.options(delay=3600).enqueue(session)
        due = session.scalar(select(queue.JobExecution.execute_at))
    with engine.begin() as connection:
        rows = connection.execute(CLAIM, claim_params(["noop"], 10)).all()
    assert [(r.id, r.next_due) for r in rows] == [(None, due)]


def test_queue_id_runs_only_its_head_in_order(engine: Engine) -> None:
    at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    ids = enqueue(
        engine,
        [keyed.options(queue_id="acct", run_at=at).call(key="acct", seq=i) for i in range(3)]
        + [keyed.options(queue_id="other", run_at=at).call(key="other", seq=0)],
    )
    with engine.connect() as a, engine.connect() as b:
        first = claim(a, ["keyed"], 10)
        # Same execute_at: the id breaks the tie, so only the first of "acct" is a head.
        assert sorted(r.id for r in first) == [ids[0], ids[3]]
        # While A holds the head in an open transaction, B sees no other head of "acct".
        assert claim(b, ["keyed"], 10) == []
        a.commit()
        assert claim(b, ["keyed"], 10) == []  # the head is running now
        b.commit()
    # Behind the head, the key's later jobs wait outside the claim's indexes.
    ex = queue.tables.executions
    with engine.connect() as connection:
        states = dict(connection.execute(select(ex.c.id, ex.c.state)).all())
    assert [states[i] for i in ids] == ["running", "waiting", "waiting", "running"]
    # Finishing the head and promoting its key makes the next one the head.
    with engine.begin() as connection:
        connection.execute(ex.delete().where(ex.c.id == ids[0]))
        promoted = connection.execute(PROMOTE, {"keys": ["acct"]}).scalars().all()
        assert promoted == [ids[1]]
        assert [r.id for r in claim(connection, ["keyed"], 10)] == [ids[1]]


def test_database_refuses_two_running_rows_of_one_queue_id(engine: Engine) -> None:
    from sqlalchemy.exc import IntegrityError

    ids = enqueue(engine, [keyed.options(queue_id="k").call(key="k", seq=i) for i in range(2)])
    ex = queue.tables.executions
    with engine.begin() as connection, pytest.raises(IntegrityError, match="queue_running_uq"):
        connection.execute(update(ex).where(ex.c.id.in_(ids)).values(state="running"))


def test_claim_compiles_once_and_is_cached(engine: Engine) -> None:
    enqueue(engine, [noop.call() for _ in range(5)])
    compiled: list[object] = []

    @event.listens_for(engine, "before_cursor_execute")
    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        compiled.append(context.compiled)

    for batch in (1, 2, 7):
        with engine.begin() as connection:
            claim(connection, ["noop"], batch)
    assert len(compiled) == 3
    assert compiled[0] is compiled[1] is compiled[2]


def test_claim_plan_uses_the_partial_index(engine: Engine, owner_engine: Engine) -> None:
    """Query-plan regression: with a seeded backlog, no sequential scan of either table.

    Both plans the claim can get: planned for its values, and the generic plan of the
    prepared statement a worker's connection runs.
    """
    enqueue(engine, [noop.call() for _ in range(20_000)] + [boom.call() for _ in range(500)])
    with owner_engine.begin() as connection:
        connection.execute(text("ANALYZE"))
    with captured_statements(engine) as seen, engine.connect() as connection:
        claim(connection, ["noop"], 10)
        connection.rollback()
    sql, params = seen[-1]
    with engine.begin() as connection:
        custom = connection.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql, params).scalar_one()
        generic = generic_plan(connection, sql, params)
    for plan in (custom[0], generic):
        assert [s for s in scans(plan) if s[0] == "Seq Scan"] == [], dumps(plan)
        walk = (
            "Index Scan",
            queue.tables.executions.name,
            "sqla_queue_job_executions_task_claim_ix",
        )
        assert walk in scans(plan), dumps(plan)
