"""Every hot-path statement does work bounded by its batch, in every statistics state.

The states are the ones a production queue goes through (issue 11): never analyzed;
analyzed while empty, then bursts of 10k, 100k and 1M; analyzed full; and after 1M rows of
churn with autovacuum off (dead tuples, bloated indexes). The backlog mixes the shapes that
used to make claims walk it (tests/support/robustness.py): another task's backlog, a hot
``queue_id``, rows scheduled for later at a higher priority, many small keys.

Each statement runs exactly as a worker sends it, after the planner guard, both as the
generic plan of a prepared statement (``generic_plans=True``) and as a plan made for its
values (``generic_plans=False``); nothing is set on the session, which is what a pooler in
transaction mode leaves. Each is explained with ANALYZE in a transaction that is rolled
back, and fails on any sequential or bitmap scan of the executions table, any node of it
that returns or filters more than a few hundred rows, and any sort of more than that.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, insert, select, text
from sqlalchemy.dialects import postgresql

from sqla_queue import statements
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.enqueue import prepare_rows
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.statements import release
from sqla_queue.statements.controls import rate_lock_statement
from sqla_queue.testing.databases import DatabaseFactory
from sqla_queue.worker.raw import RawStatements
from tests.support.app import keyed, queue
from tests.support.robustness import (
    WIDE_CHORD,
    explain_analyze,
    grow,
    seed_fixtures,
    seed_workflow,
    violations,
)

pytestmark = pytest.mark.integration

#: The largest burst; SQLA_QUEUE_ROBUSTNESS_MAX=100000 shortens a local run.
LARGEST = int(os.environ.get("SQLA_QUEUE_ROBUSTNESS_MAX", "1000000"))
BATCH = 10
TABLES = queue.tables
EXECUTIONS = TABLES.executions.name
RAW = RawStatements(postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
ENQUEUE = statements.enqueue_statement(TABLES, notify=True)
ADVANCE = release.advance_statement(TABLES, notify=True)
DECIDE = release.decide_statement(TABLES, notify=True)
DURABLE = DurableStatements.of(TABLES)
#: The tables whose plans must stay bounded by the batch.
WATCHED = (
    EXECUTIONS,
    TABLES.workflow_edges.name,
    TABLES.workflow_nodes.name,
    TABLES.job_steps.name,
    TABLES.job_signals.name,
)


def _wide_chord(conn: Connection) -> tuple[int, int]:
    """The seeded wide chord's open child in the middle, and its callback."""
    nodes = TABLES.workflow_nodes
    found = dict(
        conn.execute(
            select(nodes.c.name, nodes.c.job_id).where(
                nodes.c.name.in_([f"c{WIDE_CHORD // 2}", "callback"])
            )
        ).all()
    )
    return found[f"c{WIDE_CHORD // 2}"], found["callback"]


STATEMENTS = (
    "plain claim",
    "limited claim",
    "rated claim",
    "completion",
    "heartbeat",
    "promotion",
    "reclaim sweep",
    "cleanup sweep",
    "orphan sweep",
    "keyed enqueue",
    "workflow release",
    "workflow decision",
    "step checkpoint",
    "suspension",
    "signal",
    "wake sweep",
    "compensation sweep",
)
STATES = (
    "never analyzed, 100k",
    "analyzed empty, burst of 10k",
    "analyzed empty, burst of 100k",
    f"analyzed empty, burst of {LARGEST // 1000}k",
    f"analyzed full, {LARGEST // 1000}k",
    "after churn with autovacuum off",
)


def _claim_params(tasks: list[str], worker: uuid.UUID) -> dict[str, Any]:
    return {
        "tasks": tasks,
        "batch": BATCH,
        "worker": worker,
        "lease": 30.0,
        "lease_map": "{}",
        "limit_map": json.dumps({"limited3": 3}),
        "seat_offset": 12345,
    }


def _measure(engine: Engine) -> dict[tuple[str, bool], list[str]]:
    """Violations of every hot statement in the database's current state, both plan kinds."""
    found: dict[tuple[str, bool], list[str]] = {}
    plain = statements.claim_statement(TABLES)
    limited = statements.claim_statement(TABLES, limited=True)
    rated = statements.claim_statement(TABLES, rated=True)
    for generic in (True, False):
        guard = RAW.render(statements.planner_guard(generic_plans=generic), {})
        worker = uuid.uuid4()

        def run(
            name: str,
            statement: Any,
            params: dict[str, Any],
            conn: Connection,
            generic: bool = generic,
        ) -> None:
            rendered = RAW.render(statement, params)
            plan = explain_analyze(conn, rendered.sql, rendered.args, generic=generic)
            # The workflow tables too: a release must not walk a wide fan-in.
            found[(name, generic)] = [
                problem for table in WATCHED for problem in violations(plan, table)
            ]

        with engine.connect() as conn:
            conn.exec_driver_sql(guard.sql)
            run("plain claim", plain, _claim_params(["noop"], worker), conn)
            conn.rollback()
            conn.exec_driver_sql(guard.sql)
            run("limited claim", limited, _claim_params(["noop", "limited3"], worker), conn)
            conn.rollback()
            # A rate-limited task's claim: its control row locked first, as a worker does.
            conn.exec_driver_sql(guard.sql)
            conn.execute(
                insert(TABLES.controls).values(task="noop", rate_max=1000, rate_seconds=1.0)
            )
            conn.execute(rate_lock_statement(TABLES), {"rate_task": "noop"})
            rated_params = {**_claim_params(["noop"], worker), "rate_task": "noop"}
            run("rated claim", rated, rated_params, conn)
            conn.rollback()
            # The statements that follow a claim need executions this worker runs: claim a
            # batch for real, then explain what a worker sends next.
            conn.exec_driver_sql(guard.sql)
            claimed = [
                row
                for row in conn.execute(plain, _claim_params(["noop"], worker)).all()
                if row.id is not None
            ]
            assert claimed, "the seeded backlog has due noop jobs"
            kinds = (OutcomeKind.SUCCEEDED, OutcomeKind.RETRY)
            outcomes = [
                Outcome(row.id, row.attempt, kinds[i % 2], delay=5.0).as_row()
                for i, row in enumerate(claimed)
            ]
            run(
                "heartbeat",
                statements.heartbeat_statement(TABLES),
                {
                    "worker": worker,
                    "ids": [row.id for row in claimed],
                    "attempts": [row.attempt for row in claimed],
                    "hostname": "host",
                    "pid": 1,
                    "tasks": ["noop"],
                    "concurrency": 10,
                },
                conn,
            )
            run(
                "completion",
                statements.complete_statement(TABLES),
                {
                    "outcomes": json.dumps(outcomes),
                    "worker": worker,
                },
                conn,
            )
            # A durable step of a claimed job, then its suspension (schema version 7).
            fence = {"job": claimed[0].id, "held_attempt": claimed[0].attempt, "worker": worker}
            run(
                "step checkpoint",
                DURABLE.checkpoint,
                {
                    **fence,
                    "step": "s1",
                    "step_kind": "step",
                    "step_version": 1,
                    "step_result": "1",
                    "step_compensate": None,
                },
                conn,
            )
            conn.execute(DURABLE.lock_execution, fence)
            run("suspension", DURABLE.suspend, {**fence, "waits_for": "sleep", "step": None}, conn)
            keys = sorted({row.queue_id for row in claimed if row.queue_id} | {"hot", "k1"})
            run("promotion", statements.promote_statement(TABLES), {"keys": keys}, conn)
            conn.rollback()
            conn.exec_driver_sql(guard.sql)
            run("reclaim sweep", statements.reclaim_statement(TABLES), {"held": []}, conn)
            run("cleanup sweep", statements.cleanup_statement(TABLES), {"limit": 100}, conn)
            run(
                "orphan sweep",
                statements.orphan_sweep_statement(TABLES),
                {"after": "", "limit": 100},
                conn,
            )
            run("wake sweep", DURABLE.wake_due, {"limit": 1000}, conn)
            run("compensation sweep", DURABLE.compensations_due, {"limit": 100}, conn)
            conn.rollback()
            # A signal to a job that waits for it, as queue.signal sends it.
            waiting = conn.execute(
                text(
                    f"SELECT id FROM {TABLES.executions.fullname}"
                    " WHERE state = 'suspended' AND wait = 'signal:go' LIMIT 1"
                )
            ).scalar_one()
            conn.execute(DURABLE.lock_for_signal, {"job": waiting})
            run(
                "signal",
                DURABLE.signal,
                {"job": waiting, "signal": "go", "payload": "null", "waits_for": "signal:go"},
                conn,
            )
            conn.rollback()
            # A workflow's release, as a completion sends it: one child of the wide chord
            # ended (its edge marked, its callback probed), then the callback decided.
            child, callback = _wide_chord(conn)
            conn.exec_driver_sql(guard.sql)
            conn.execute(
                text(f"UPDATE {TABLES.jobs.fullname} SET status = 'succeeded' WHERE id = :id"),
                {"id": child},
            )
            run("workflow release", ADVANCE, {"ids": [child]}, conn)
            conn.execute(release.lock_nodes_statement(TABLES), {"ids": [callback]})
            run("workflow decision", DECIDE, {"ids": [callback]}, conn)
            conn.rollback()
            # The enqueue runs in the application's own transaction, without the guard: a
            # job for the hot key finds the key's first active row by an ordered walk.
            spec = keyed.options(queue_id="hot").call(key="hot", seq=0)
            rows = prepare_rows([spec], queue._registry.known.lookup)
            run("keyed enqueue", ENQUEUE, {"rows": rows[0]}, conn)
            conn.rollback()
    return found


def _fresh(db_factory: DatabaseFactory, template_db: str) -> tuple[str, Engine]:
    url = db_factory.clone(template_db)
    engine = create_engine(url)
    with engine.begin() as conn:
        for table in (TABLES.jobs, TABLES.executions, TABLES.workflow_edges, TABLES.workflow_nodes):
            # Nothing may analyze behind the test's back.
            conn.execute(text(f"ALTER TABLE {table.fullname} SET (autovacuum_enabled = off)"))
            # Millions of rows without WAL: the plans are the same, and the server is not
            # left flushing gigabytes under the tests that come next.
            conn.execute(text(f"ALTER TABLE {table.fullname} SET UNLOGGED"))
    return url, engine


def _analyze(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text(f"ANALYZE {TABLES.jobs.fullname}"))
        conn.execute(text(f"ANALYZE {TABLES.executions.fullname}"))
        conn.execute(text(f"ANALYZE {TABLES.workflow_edges.fullname}"))
        conn.execute(text(f"ANALYZE {TABLES.workflow_nodes.fullname}"))


@pytest.fixture(scope="module")
def results(
    db_factory: DatabaseFactory, template_db: str
) -> Iterator[dict[str, dict[tuple[str, bool], list[str]]]]:
    """Each state's violations, measured once: the states build on each other."""
    measured: dict[str, dict[tuple[str, bool], list[str]]] = {}
    urls: list[str] = []
    try:
        url, engine = _fresh(db_factory, template_db)
        urls.append(url)
        with engine.begin() as conn:
            seed_fixtures(conn, TABLES)
            seed_workflow(conn, TABLES)
            grow(conn, TABLES, 100_000)
        measured[STATES[0]] = _measure(engine)
        engine.dispose()

        url, engine = _fresh(db_factory, template_db)
        urls.append(url)
        _analyze(engine)  # while empty, as autovacuum does to an idle queue
        total = 0
        for state, size in zip(STATES[1:4], (10_000, 100_000, LARGEST), strict=True):
            with engine.begin() as conn:
                if total == 0:
                    seed_fixtures(conn, TABLES)
                    seed_workflow(conn, TABLES)
                grow(conn, TABLES, size - total)
            total = size
            measured[state] = _measure(engine)
        _analyze(engine)
        measured[STATES[4]] = _measure(engine)
        with engine.begin() as conn:
            # Churn: what finishing most of the backlog leaves behind without a vacuum
            # (dead rows, index entries pointing at them), then a new burst of the same size.
            ex = TABLES.executions.fullname
            conn.execute(text(f"DELETE FROM {ex} WHERE task IN ('other', 'limited3')"))
            conn.execute(
                text(
                    f"UPDATE {ex} SET execute_at = execute_at"
                    " WHERE task = 'noop' AND queue_id IS NULL"
                )
            )
            grow(conn, TABLES, LARGEST)
        measured[STATES[5]] = _measure(engine)
        engine.dispose()
        yield measured
    finally:
        for url in urls:
            db_factory.drop(url)


@pytest.mark.parametrize("state", STATES)
def test_every_hot_statement_is_bounded_by_its_batch(
    results: dict[str, dict[tuple[str, bool], list[str]]], state: str
) -> None:
    measured = results[state]
    assert {name for name, _ in measured} == set(STATEMENTS)
    report = [
        f"{name} ({'generic' if generic else 'custom'} plan): {problem}"
        for (name, generic), problems in sorted(measured.items())
        for problem in problems
    ]
    assert not report, f"{state}:\n" + "\n".join(report)
