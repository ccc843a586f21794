"""Compiled-SQL tests of the statement builders: PostgreSQL dialect, no database."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue import statements
from sqla_queue.models import build_tables

pytestmark = pytest.mark.unit

from sqla_queue.statements import (  # noqa: E402
    compensations,
    durable,
    durable_admin,
    release,
    signals,
    workflow_admin,
    workflow_listing,
)
from sqla_queue.statements import workflows as workflow_statements  # noqa: E402
from sqla_queue.statements.controls import (  # noqa: E402
    controlled_tasks_statement,
    rate_backlog_statement,
    rate_lock_statement,
)
from sqla_queue.statements.dashboard import (  # noqa: E402
    job_detail_statement,
    job_page_statement,
    throughput_statement,
)
from sqla_queue.statements.listing import JOB_STATES  # noqa: E402
from sqla_queue.statements.metrics import (  # noqa: E402
    queue_stats_statement,
    statement_timeout_statement,
)
from sqla_queue.statements.status import clock_statement  # noqa: E402
from sqla_queue.statements.unique import bind_keys_statement  # noqa: E402

SNAPSHOTS = Path(__file__).parent / "snapshots"
DIALECT = postgresql.psycopg.dialect()  # the driver sqla_queue runs on: it casts binds


def compiled(stmt: object) -> str:
    return str(stmt.compile(dialect=DIALECT))  # type: ignore[attr-defined]


@pytest.fixture
def tables():
    return build_tables(MetaData(), schema="app", prefix="q_")


BUILDERS = {
    "claim": statements.claim_statement,
    "claim_limited": lambda t: statements.claim_statement(t, limited=True),
    "claim_rated": lambda t: statements.claim_statement(t, rated=True),
    "claim_rated_limited": lambda t: statements.claim_statement(t, limited=True, rated=True),
    "rate_lock": rate_lock_statement,
    "rate_backlog": rate_backlog_statement,
    "controlled_tasks": controlled_tasks_statement,
    "complete": statements.complete_statement,
    # history="none": a succeeded job's row is deleted (unless awaited or unique-keyed).
    "complete_no_history": lambda t: statements.complete_statement(
        build_tables(MetaData(), schema="app", prefix="q_", history="none")
    ),
    "heartbeat": statements.heartbeat_statement,
    "reclaim": statements.reclaim_statement,
    "promote": statements.promote_statement,
    "cleanup": statements.cleanup_statement,
    "clear_done": statements.clear_done_statement,
    "orphan_sweep": statements.orphan_sweep_statement,
    "requeue": statements.requeue_statement,
    "requeue_keys": statements.requeue_keys_statement,
    "bind_keys": bind_keys_statement,
    "enqueue_notify": lambda t: statements.enqueue_statement(t, notify=True),
    "enqueue_quiet": lambda t: statements.enqueue_statement(t, notify=False),
    "enqueue_unkeyed": lambda t: statements.enqueue_statement(t, notify=True, keyed=False),
    "status_clock": lambda t: clock_statement(),
    "dashboard_throughput": throughput_statement,
    "metrics_queue_stats": queue_stats_statement,
    "metrics_statement_timeout": lambda t: statement_timeout_statement(2500),
    # Workflows (schema version 6).
    "workflow_write_new": lambda t: workflow_statements.write_nodes_statement(
        t, new=True, notify=True
    ),
    "workflow_write_into": lambda t: workflow_statements.write_nodes_statement(
        t, new=False, notify=True
    ),
    "workflow_hand_over": workflow_statements.hand_over_statement,
    "workflow_live": workflow_statements.live_workflow_statement,
    "workflow_parent_results": workflow_statements.parent_results_statement,
    "release_advance": lambda t: release.advance_statement(t, notify=True),
    "release_lock": release.lock_nodes_statement,
    "release_decide": lambda t: release.decide_statement(t, notify=True),
    "workflow_cancel": workflow_admin.cancel_workflow_statement,
    "workflow_cancel_undecided": workflow_admin.cancel_undecided_statement,
    "workflow_cancel_nodes": workflow_admin.cancel_nodes_statement,
    "workflow_resume": workflow_admin.resume_statement,
    "workflow_lock_of": workflow_admin.lock_workflows_of_statement,
    "workflow_lock_undecided": workflow_admin.lock_undecided_statement,
    "workflow_unique_keys_of": workflow_admin.unique_keys_of_statement,
    "workflow_rivals": workflow_admin.rival_workflows_statement,
    "workflow_listing": workflow_listing.workflow_listing_statement,
    "workflow_listing_before": lambda t: workflow_listing.workflow_listing_statement(
        t, before=True
    ),
    "workflow_of_node": workflow_listing.node_workflow_statement,
    # Durable jobs (schema version 7).
    "durable_steps": durable.steps_statement,
    "durable_checkpoint": durable.checkpoint_statement,
    "durable_advance_cursor": durable.advance_cursor_statement,
    "durable_lock_execution": durable.lock_execution_statement,
    "durable_record_wait": durable.record_wait_statement,
    "durable_restart_wait": durable.restart_wait_statement,
    "durable_suspend": durable.suspend_statement,
    "durable_execution_state": durable.execution_state_statement,
    "signal_lock": signals.lock_for_signal_statement,
    "signal_send": signals.signal_statement,
    "signal_payload": signals.signal_payload_statement,
    "wake_due": signals.wake_due_statement,
    "wake_waiting": signals.wake_waiting_statement,
    # A condition on a host table stands in for queue.condition(Order, Order.status == ...).
    "wake_condition": lambda t: signals.condition_wake_statement(
        t, t.jobs.c.id, t.jobs.c.status == t.jobs.c.task
    ),
    "compensations_due": compensations.compensations_due_statement,
    "compensations_mark": compensations.mark_compensated_statement,
    "compensations_reopen": compensations.reopen_compensated_statement,
    "durable_suspended": durable_admin.suspended_statement,
    "durable_job_steps": durable_admin.job_steps_statement,
    "durable_step_versions": durable_admin.step_versions_statement,
    "durable_migrate_steps": durable_admin.migrate_steps_statement,
    "durable_wake_jobs": durable_admin.wake_jobs_statement,
    "durable_fire": durable_admin.fire_statement,
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


#: Statements over the job listing: their ``state`` column names every job state in its text.
LISTING_BUILDERS = {
    "dashboard_job_page": job_page_statement,
    "dashboard_job_page_filtered": lambda t: job_page_statement(
        t, state="failed", task=True, key=True, about=True, about_key=True, before=True
    ),
    "dashboard_job_detail": job_detail_statement,
}


#: A JSONB array element, ``errors[-1]``: SQLAlchemy 2.0.39 (the oldest supported) renders
#: it ``errors -> %(p)s::INT``, newer releases ``errors[%(p)s::INT]``, the same element on
#: PostgreSQL 14 and later. The snapshots hold the newer form.
_JSON_ELEMENT = re.compile(r" -> (%\(\w+\)s::INT)")


def subscripted(sql: str) -> str:
    """``sql`` with every JSONB array element written as a subscript."""
    return _JSON_ELEMENT.sub(r"[\1]", sql)


def test_subscripted_rewrites_only_the_array_element() -> None:
    assert subscripted("x.errors -> %(errors_1)s::INT AS e") == "x.errors[%(errors_1)s::INT] AS e"
    assert subscripted("x.args ->> %(k)s::VARCHAR") == "x.args ->> %(k)s::VARCHAR"


@pytest.mark.parametrize("name", sorted(LISTING_BUILDERS))
def test_listing_statement_matches_snapshot(tables, name: str) -> None:
    """As :func:`test_statement_matches_snapshot`; only job state words are literals."""
    sql = subscripted(compiled(LISTING_BUILDERS[name](tables))) + "\n"
    path = SNAPSHOTS / f"{name}.sql"
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        path.write_text(sql)
    assert sql == path.read_text()
    assert set(re.findall(r"'([^']*)'", sql)) <= {*JOB_STATES, "done"}


@pytest.mark.parametrize("limited", [False, True])
def test_claim_shape(tables, limited: bool) -> None:
    sql = " ".join(compiled(statements.claim_statement(tables, limited=limited)).split())
    # Each (task, priority) slice is walked by equality on both, in (execute_at, id) order,
    # with the due time as the walk's bound.
    walk = (
        "WHERE e.task = levels.task AND e.priority = levels.priority AND "
        "e.state = 'pending' AND e.slot IS NULL AND e.execute_at <= now()"
    )
    assert walk in sql
    assert "ORDER BY e.execute_at, e.id LIMIT" in sql
    assert "FOR NO KEY UPDATE OF e SKIP LOCKED" in sql
    assert "FOR NO KEY UPDATE OF g SKIP LOCKED" in sql
    assert sql.startswith("WITH RECURSIVE levels(task, priority)")
    assert "lv.priority < l.priority ORDER BY lv.priority DESC LIMIT 1" in sql
    # No walk ever matches the task list as an array: that walks every task's rows.
    assert "ANY (%(tasks)s" not in sql
    # Head-of-queue rule: no running row of its key at all, and no earlier queued one
    # (waiting rows are behind one by construction, and not in the indexes probed).
    assert "r_key.queue_id = e.queue_id AND r_key.state = 'running'" in sql
    assert (
        "p.queue_id = e.queue_id AND (p.state = 'pending' OR p.state = 'running') AND "
        "(p.execute_at, p.id) < (e.execute_at, e.id)"
    ) in sql
    # The next due time is probed per slice, never by walking rows scheduled for later.
    assert "n.task = levels.task AND n.priority = levels.priority" in sql
    assert sql.count("UPDATE app.q_job_executions SET state='running'") == 1
    # Outer on both sides: an empty claim still reports next_due, an orphan still comes back.
    assert "LEFT OUTER JOIN (claimed LEFT OUTER JOIN app.q_jobs" in sql
    assert ("task_limits" in sql) is limited


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_no_values_baked_in(tables, name: str) -> None:
    """Only fixed state names appear as literals; everything a caller passes is bound."""
    sql = compiled(BUILDERS[name](tables))
    literals = set(re.findall(r"'([^']*)'", sql))
    allowed = {
        "pending",
        "running",
        "waiting",
        "done",
        "queued",
        "succeeded",
        "failed",
        "cancelled",
        "retry",
        "reschedule",
        "release",
        "1 second",
        "1 day",  # the cap of the claim's next due time
        "60 seconds",  # how long a rate-limited task's recorded start outlives its window
        "{}",  # the empty integer[] of a task that holds no slot yet
        "",  # coalesce(state, '') = 'running': see statements._common.still_running
        # Workflows: node states, policies, and the verdicts of the release statements.
        "blocked",
        "held",
        "released",
        "all_succeeded",
        "all_finished",
        "quorum",
        "cancel",
        "hold",
        "candidate",
        "workflow",
        "ended",
        "pruned",  # a node whose job left the history, in the workflows listing
        # Durable jobs: the suspended state, and "no deadline" (see FOREVER_SQL).
        "suspended",
        "9999-12-31 00:00:00+00",
        "until",  # the key of a wait's deadline in its step's JSON
    }
    assert literals <= allowed, literals - allowed


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
    # The delete (final outcomes), the update (requeues) and the marking of a keyed final
    # outcome as done all carry the full fence.
    assert sql.count(fence) == 3
    # A keyed execution is never deleted by the completion (an enqueue may hold it), and a
    # done row gives its seat up.
    assert (
        "o.kind IN ('succeeded', 'failed', 'cancelled') AND app.q_job_executions.queue_id IS NULL"
        in sql
    )
    # A cancel request never sends an attempt back to pending: the requeue parks it instead,
    # reading the flag from the row it locked (the branches split by kind, not by the flag).
    assert "state=CASE WHEN app.q_job_executions.cancel_requested THEN 'done' ELSE 'pending'" in sql
    assert "SET state='done', worker_id=NULL, alive_at=NULL, slot=NULL" in sql
    assert "FOR UPDATE" not in sql


def test_clear_done_skips_what_an_enqueue_holds_and_names_it(tables) -> None:
    sql = " ".join(compiled(statements.clear_done_statement(tables)).split())
    assert (
        "d.queue_id = ANY (%(keys)s::TEXT[]) AND d.state = 'done' FOR UPDATE OF d SKIP LOCKED"
        in sql
    )
    assert "(left_.id NOT IN (SELECT gone.id FROM gone))" in sql


def test_heartbeat_is_fenced(tables) -> None:
    sql = " ".join(compiled(statements.heartbeat_statement(tables)).split())
    assert "(app.q_job_executions.id, app.q_job_executions.attempt) IN" in sql
    assert "worker_id = %(worker)s::UUID" in sql
    assert "coalesce(app.q_job_executions.state, '') = 'running'" in sql


def test_reclaim_never_waits_and_never_blocks_an_enqueue(tables) -> None:
    sql = " ".join(compiled(statements.reclaim_statement(tables)).split())
    assert "FOR NO KEY UPDATE SKIP LOCKED" in sql
    assert "ORDER BY" not in sql
    assert "app.q_job_executions.id != ALL (%(held)s::BIGINT[])" in sql
