"""The generic plans a worker's connection runs: every one uses the queue's indexes.

A worker forces generic plans on its own connection (``WorkerSettings.generic_plans``),
so the plan of each statement is made once, without the parameter values. These tests
record what a real worker sends, seed a backlog, and explain each statement's generic
plan: a sequential scan of the jobs or executions table there would cost every claim a
pass over the whole queue.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import boom, noop, queue
from tests.support.limited import limited3
from tests.support.plans import (
    captured_statements,
    dumps,
    generic_plan,
    rendered_statements,
    scans,
)

pytestmark = pytest.mark.integration

QUEUE_TABLES = {queue.tables.jobs.name, queue.tables.executions.name}


def _worker_statements(seen: list[tuple[str, Any]]) -> dict[str, Any]:
    """The distinct statements on the queue's tables, each with its first parameters."""
    distinct: dict[str, Any] = {}
    for sql, params in seen:
        if queue.tables.executions.name in sql and "pg_catalog" not in sql:
            distinct.setdefault(sql, params)
    return distinct


def _drain(SessionLocal: sessionmaker[Session], tasks: list[str]) -> None:
    worker = queue.worker(SessionLocal, tasks=tasks, concurrency=5, install_signal_handlers=False)
    worker.run(burst=True)


def test_every_worker_statement_has_an_indexed_generic_plan(
    engine: Engine, owner_engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with Session(engine) as session, session.begin():
        queue.enqueue_many(
            session,
            [noop.call() for _ in range(30)]
            + [limited3.call() for _ in range(30)]
            + [boom.call() for _ in range(5)],
        )
    with rendered_statements() as seen:
        _drain(SessionLocal, ["noop", "boom"])  # plain claim
        _drain(SessionLocal, ["limited3"])  # slot-aware claim
    statements = _worker_statements(seen)
    kinds = {
        "plain claim": "candidates AS",
        "limited claim": "seats AS",
        "completion": "finished AS",
        "reclaim": "WITH stale AS",
    }
    for kind, marker in kinds.items():
        assert any(marker in sql for sql in statements), f"the worker never ran the {kind}"

    # A backlog and a history large enough that a scan would be the costly choice.
    with Session(engine) as session, session.begin():
        queue.enqueue_many(
            session, [noop.call() for _ in range(20_000)] + [limited3.call() for _ in range(5_000)]
        )
    with owner_engine.begin() as connection:
        connection.execute(text("ANALYZE"))
    with engine.connect() as connection:
        for sql, params in statements.items():
            with connection.begin():
                plan = generic_plan(connection, sql, params)
            full_scans = [
                relation
                for node, relation, _ in scans(plan)
                if node == "Seq Scan" and relation in QUEUE_TABLES
            ]
            assert not full_scans, f"{sql}\n{dumps(plan)}"
            if "seats AS" in sql:
                # Fresh picks walk the task's own slice, not the 20,000 noop rows ahead.
                task_claim_ix = f"{queue.tables.executions.name}_task_claim_ix"
                used = {index for _, _, index in scans(plan)}
                assert task_claim_ix in used, dumps(plan)


def test_the_claim_batch_is_part_of_the_statement_text(engine: Engine) -> None:
    """Each batch size is its own statement, so its generic plan knows the row count."""
    from sqla_queue import statements

    claim = statements.claim_statement(queue.tables)
    params = {"tasks": ["noop"], "worker": None, "lease": 30.0, "lease_map": "{}"}
    with captured_statements(engine) as seen, engine.connect() as connection:
        for batch in (3, 7):
            connection.execute(claim, {**params, "batch": batch}).all()
            connection.rollback()
    texts = [sql for sql, _ in seen]
    assert "LIMIT 3 FOR NO KEY UPDATE" in texts[0] and "LIMIT 7 FOR NO KEY UPDATE" in texts[1]
    assert all("batch" not in params for _, params in seen)


def test_slot_aware_claim_walks_its_own_task_beside_another_tasks_backlog(
    engine: Engine, owner_engine: Engine
) -> None:
    """Statistics that show a single task must not lead the generic plan to claim_ix.

    Walking claim_ix and filtering by task passes over every row of the other task: at
    20,000 rows that cost 5.9 ms per claim instead of 0.4 ms.
    """
    import json
    import uuid

    from sqlalchemy.dialects import postgresql

    from sqla_queue import statements as builders
    from sqla_queue.worker.raw import RawStatements

    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, [noop.call() for _ in range(20_000)])
    with owner_engine.begin() as connection:
        connection.execute(text("ANALYZE"))
    params = {
        "tasks": ["limited3"],
        "batch": 10,
        "worker": uuid.uuid4(),
        "lease": 30.0,
        "lease_map": "{}",
        "limit_map": json.dumps({"limited3": 3}),
        "seat_offset": 0,
    }
    claim = builders.claim_statement(queue.tables, limited=True)
    rendered = RawStatements(postgresql.psycopg.dialect()).render(claim, params)  # type: ignore[no-untyped-call]
    with engine.connect() as connection, connection.begin():
        plan = generic_plan(connection, rendered.sql, rendered.args)
    used = {index for _, _, index in scans(plan)}
    executions = queue.tables.executions.name
    assert f"{executions}_task_claim_ix" in used, dumps(plan)
    assert f"{executions}_claim_ix" not in used, dumps(plan)


def test_free_seat_search_stops_at_the_seats_it_needs(engine: Engine) -> None:
    """With 500 seats held, a claim of 5 probes a handful of seats, not all 505 it may try.

    The window that numbers the seats streams: the LIMIT above it stops the probes.
    """
    import json
    import uuid

    from sqlalchemy.dialects import postgresql

    from sqla_queue import statements as builders
    from sqla_queue.worker.raw import RawStatements

    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, [limited3.call() for _ in range(600)])
        queue.set_limit(session, "limited3", 5000)
    claim = builders.claim_statement(queue.tables, limited=True)
    raw = RawStatements(postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]

    def params(batch: int, offset: int) -> dict[str, Any]:
        return {
            "tasks": ["limited3"],
            "batch": batch,
            "worker": uuid.uuid4(),
            "lease": 30.0,
            "lease_map": "{}",
            "limit_map": json.dumps({"limited3": 3}),
            "seat_offset": offset,
        }

    with engine.begin() as connection:
        for i in range(50):
            connection.execute(claim, params(10, i * 7919)).all()
    rendered = raw.render(claim, params(5, 12345))
    with engine.connect() as connection, connection.begin():
        explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + rendered.sql.replace("%", "%%")
        numbered = explain
        for n in range(len(rendered.args), 0, -1):
            numbered = numbered.replace(f"${n}", f"%(p{n})s")
        plan = connection.exec_driver_sql(
            numbered, {f"p{n + 1}": value for n, value in enumerate(rendered.args)}
        ).scalar_one()[0]

    probes: list[int] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Alias") == "x":
            probes.append(node["Actual Loops"])
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan["Plan"])
    assert probes, dumps(plan)
    # 500 of 5,000 seats are held: about 6 probes find 5 free ones.
    assert sum(probes) < 50, dumps(plan)


def test_completion_and_heartbeat_reach_executions_by_primary_key(
    engine: Engine, owner_engine: Engine
) -> None:
    """Statistics that saw no running or keyed row must not send the fence elsewhere.

    ANALYZE rarely catches a running execution, so running_ix looks empty to the planner;
    a completion that joined its 100 outcomes to it scanned every running row once per
    outcome (4.7 ms against 1.5 ms through the primary key).
    """
    import json
    import uuid

    from sqlalchemy.dialects import postgresql

    from sqla_queue import statements as builders
    from sqla_queue.worker.raw import RawStatements

    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, [noop.call() for _ in range(5_000)])
    with owner_engine.begin() as connection:
        connection.execute(text("ANALYZE"))  # no execution is running yet
    worker = uuid.uuid4()
    claim = builders.claim_statement(queue.tables)
    claim_params = {"tasks": ["noop"], "worker": worker, "lease": 30.0, "lease_map": "{}"}
    with engine.begin() as connection:
        claimed = connection.execute(claim, {**claim_params, "batch": 100}).all()
    assert len(claimed) == 100
    outcomes = [{"id": row.id, "attempt": row.attempt, "kind": "succeeded"} for row in claimed]
    raw = RawStatements(postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
    cases = {
        "completion": raw.render(
            builders.complete_statement(queue.tables),
            {"outcomes": json.dumps(outcomes), "worker": worker},
        ),
        "heartbeat": raw.render(
            builders.heartbeat_statement(queue.tables),
            {
                "worker": worker,
                "ids": [row.id for row in claimed],
                "attempts": [row.attempt for row in claimed],
                "hostname": "host",
                "pid": 1,
                "tasks": ["noop"],
                "concurrency": 10,
            },
        ),
    }
    executions = queue.tables.executions.name
    for kind, rendered in cases.items():
        with engine.connect() as connection, connection.begin():
            plan = generic_plan(connection, rendered.sql, rendered.args)
        used = {
            index
            for node, relation, index in scans(plan)
            if relation == executions and node != "ModifyTable"
        }
        assert f"{executions}_running_ix" not in used, (kind, dumps(plan))
        # Nor through an index of keyed rows (queue_ix looks empty before any keyed job).
        assert used == {f"{executions}_pkey"}, (kind, dumps(plan))
