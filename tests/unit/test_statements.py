"""Compiled-SQL tests of the statement builders: PostgreSQL dialect, no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue import statements
from sqla_queue.models import build_tables

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent / "snapshots"
#: sha256 of claim.sql as first recorded (schema version 1, before capacity slots).
CLAIM_V1_SHA256 = "0ff9c625a16e0e1fb16166f178439078b2d45f7814820234a49cbc11b532ecbf"
DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def compiled(stmt: object) -> str:
    return str(stmt.compile(dialect=DIALECT))  # type: ignore[attr-defined]


@pytest.fixture
def tables():
    return build_tables(MetaData(), schema="app", prefix="q_")


BUILDERS = {
    "claim": statements.claim_statement,
    "claim_limited": lambda t: statements.claim_statement(t, limited=True),
    "complete": statements.complete_statement,
    "heartbeat": statements.heartbeat_statement,
    "reclaim": statements.reclaim_statement,
    "requeue": statements.requeue_statement,
    "enqueue_notify": lambda t: statements.enqueue_statement(t, notify=True),
    "enqueue_quiet": lambda t: statements.enqueue_statement(t, notify=False),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_statement_matches_snapshot(tables, name: str) -> None:
    """Any change to a statement's SQL shows up here as a diff to review.

    Regenerate with SQLA_QUEUE_UPDATE_SNAPSHOTS=1 after checking the change is intended.
    """
    import os

    sql = compiled(BUILDERS[name](tables)) + "\n"
    path = SNAPSHOTS / f"{name}.sql"
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(sql)
    assert sql == path.read_text()


def test_claim_shape(tables) -> None:
    sql = " ".join(compiled(statements.claim_statement(tables)).split())
    assert "FOR UPDATE OF e SKIP LOCKED" in sql
    assert "ORDER BY e.priority DESC, e.execute_at, e.id" in sql
    assert "LIMIT __[POSTCOMPILE_batch]" in sql
    assert "e.task = ANY (%(tasks)s::TEXT[])" in sql
    # The partial index predicate must appear literally for the planner to use the index.
    assert "e.state = 'pending'" in sql
    # Head-of-queue rule: a keyed row needs no earlier active row of its key.
    assert "(p.execute_at, p.id) < (e.execute_at, e.id)" in sql
    assert sql.count("UPDATE app.q_job_executions SET state='running'") == 1
    assert "LEFT OUTER JOIN (claimed JOIN app.q_jobs" in sql


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_no_values_baked_in(tables, name: str) -> None:
    """Only fixed state names appear as literals; everything a caller passes is bound."""
    sql = compiled(BUILDERS[name](tables))
    literals = set(re.findall(r"'([^']*)'", sql))
    allowed = {
        "pending",
        "running",
        "queued",
        "succeeded",
        "failed",
        "cancelled",
        "retry",
        "reschedule",
        "release",
        "1 second",
        "{}",  # the empty integer[] of a task that holds no slot yet
        "",  # coalesce(state, '') = 'running': see statements._common.still_running
    }
    assert literals <= allowed, literals - allowed


def test_unlimited_claim_is_byte_identical_to_schema_version_1() -> None:
    """Capacity slots must not touch workers without limited tasks.

    ``CLAIM_V1_SHA256`` is the claim as recorded before version 2 existed. One change has
    been made since, unrelated to limits: the batch size is rendered into the text (for
    generic plans; see ``statements.claim._batch_size``). Undoing exactly that change must
    give the version-1 bytes back, so a change to anything else cannot pass as a routine
    re-snapshot.
    """
    import hashlib

    sql = compiled(statements.claim_statement(build_tables(MetaData(), schema="app", prefix="q_")))
    assert sql.count("__[POSTCOMPILE_batch]") == 1
    as_in_v1 = sql.replace("__[POSTCOMPILE_batch]", "%(batch)s::INTEGER")
    assert hashlib.sha256((as_in_v1 + "\n").encode()).hexdigest() == CLAIM_V1_SHA256
    assert "slot" not in sql and "task_limits" not in sql


def test_compiles_identically_for_two_schemas() -> None:
    """Statements depend on the table names only, not on object identity."""
    a = build_tables(MetaData(), schema="one")
    b = build_tables(MetaData(), schema="one")
    assert compiled(statements.claim_statement(a)) == compiled(statements.claim_statement(b))


def test_fences_in_complete(tables) -> None:
    sql = " ".join(compiled(statements.complete_statement(tables)).split())
    fence = (
        "app.q_job_executions.id = o.id AND app.q_job_executions.attempt = o.attempt "
        "AND app.q_job_executions.worker_id = %(worker)s::UUID "
        "AND coalesce(app.q_job_executions.state, '') = 'running'"
    )
    # Both the delete (final outcomes) and the update (requeues) carry the full fence.
    assert sql.count(fence) == 2


def test_heartbeat_is_fenced(tables) -> None:
    sql = " ".join(compiled(statements.heartbeat_statement(tables)).split())
    assert "(app.q_job_executions.id, app.q_job_executions.attempt) IN" in sql
    assert "worker_id = %(worker)s::UUID" in sql
    assert "coalesce(app.q_job_executions.state, '') = 'running'" in sql


def test_reclaim_locks_in_stable_order(tables) -> None:
    sql = " ".join(compiled(statements.reclaim_statement(tables)).split())
    assert "ORDER BY app.q_job_executions.id FOR UPDATE SKIP LOCKED" in sql
    assert "app.q_job_executions.id != ALL (%(held)s::BIGINT[])" in sql
