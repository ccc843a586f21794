"""The story's cast for ``test_upgrade_mid_flight``: what each release wrote, and how to read it.

The rows are written by hand, as each old release's producers wrote them (the columns of
that release only), and read back by name, so that a step's effect on every column shows.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text

from sqla_queue.logic.payload import make_payload
from sqla_queue.schema.verify import inspect_schema
from tests.migration.conftest import HOSTAPP_MIGRATIONS
from tests.migration.frozen_worker import FrozenWorker
from tests.migration.hostapp.models import queue

COMMITTED_0003 = HOSTAPP_MIGRATIONS / "versions" / "0003_upgrade_sqla_queue_to_v2.py"
COMMITTED_0004 = HOSTAPP_MIGRATIONS / "versions" / "0004_upgrade_sqla_queue_to_v3.py"
COMMITTED_0005 = HOSTAPP_MIGRATIONS / "versions" / "0005_upgrade_sqla_queue_to_v4.py"
COMMITTED_0006 = HOSTAPP_MIGRATIONS / "versions" / "0006_upgrade_sqla_queue_to_v5.py"
COMMITTED_0007 = HOSTAPP_MIGRATIONS / "versions" / "0007_upgrade_sqla_queue_to_v6.py"
COMMITTED_0008 = HOSTAPP_MIGRATIONS / "versions" / "0008_upgrade_sqla_queue_to_v7.py"

WHERE = "schema='work', prefix='sqla_queue_'"

# What an older database lacks that each version needs, as the worker's check lists it.
ADDED_BY_VERSION_3 = {
    "index work.sqla_queue_job_executions_queue_active_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_waiting_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_done_ix (on sqla_queue_job_executions)",
}
ADDED_BY_VERSION_4 = {
    "column work.sqla_queue_jobs.unique_key",
    "column work.sqla_queue_jobs.about_table",
    "column work.sqla_queue_jobs.about_key",
    "column work.sqla_queue_jobs.awaited",
    "column work.sqla_queue_job_executions.cancel_requested",
    "index work.sqla_queue_jobs_about_ix (on sqla_queue_jobs)",
    "index work.sqla_queue_jobs_unique_key_ix (on sqla_queue_jobs)",
    "table work.sqla_queue_unique_keys (with its columns, indexes and constraints)",
}
ADDED_BY_VERSION_5 = {
    "index work.sqla_queue_job_executions_task_waiting_ix (on sqla_queue_job_executions)",
    "table work.sqla_queue_task_controls (with its columns, indexes and constraints)",
    "table work.sqla_queue_rate_starts (with its columns, indexes and constraints)",
    "table work.sqla_queue_schedules (with its columns, indexes and constraints)",
    "table work.sqla_queue_daemons (with its columns, indexes and constraints)",
    "table work.sqla_queue_workers (with its columns, indexes and constraints)",
}
ADDED_BY_VERSION_6 = {
    "column work.sqla_queue_job_executions.workflow",
    "table work.sqla_queue_workflows (with its columns, indexes and constraints)",
    "table work.sqla_queue_workflow_nodes (with its columns, indexes and constraints)",
    "table work.sqla_queue_workflow_edges (with its columns, indexes and constraints)",
}
ADDED_BY_VERSION_7 = {
    "column work.sqla_queue_job_executions.wait",
    "index work.sqla_queue_job_executions_suspended_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_wait_ix (on sqla_queue_job_executions)",
    "table work.sqla_queue_job_steps (with its columns, indexes and constraints)",
    "table work.sqla_queue_job_signals (with its columns, indexes and constraints)",
}
#: The tables version 5 adds, all empty after the step.
VERSION_5_TABLES = ("task_controls", "rate_starts", "schedules", "daemons", "workers")
#: The tables version 6 adds, all empty after the step.
VERSION_6_TABLES = ("workflows", "workflow_nodes", "workflow_edges")
#: The tables version 7 adds, all empty after the step.
VERSION_7_TABLES = ("job_steps", "job_signals")
#: The channel on which a completion of version 4 or later notifies a caller awaiting the job.
FINISHED_CHANNEL = "work.sqla_queue_finished"
# The columns version 4 adds, with the value every row written before it must hold.
VERSION_4_DEFAULTS: dict[str, dict[str, Any]] = {
    "job": {"unique_key": None, "about_table": None, "about_key": None, "awaited": False},
    "execution": {"cancel_requested": False},
}
#: The column version 6 adds to the executions, false in every row written before it.
VERSION_6_DEFAULTS: dict[str, Any] = {"workflow": False}
#: The column version 7 adds to the executions, NULL in every row written before it.
VERSION_7_DEFAULTS: dict[str, Any] = {"wait": None}

# Every column that version 1 has: none of them may change in the step to 2.
ROWS_V1 = text(
    "SELECT j.id, j.task, j.status, j.attempts, j.payload, e.state, e.priority, e.attempt, "
    "e.reclaims, e.worker_id, e.alive_at, e.lease_seconds, e.execute_at, e.queue_id "
    "FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)
# Every column that version 2 has in both tables: none of them may change in the step to 3.
ROWS_V2 = text(
    "SELECT j.*, e.* FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)
# Every column of both tables, by name (version 4 adds columns to both).
_ROWS_BY_NAME = text(
    "SELECT to_jsonb(j) AS job, to_jsonb(e) AS execution FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)
_UNIQUE_KEYS = text("SELECT to_jsonb(k) FROM work.sqla_queue_unique_keys k ORDER BY task, key")
# What the version-4 release's producers wrote beyond the columns every release has (and
# the version-5 release's: it added no column).
MARK_AS_VERSION_4 = text(
    "UPDATE work.sqla_queue_jobs SET awaited = :awaited, about_table = :about_table, "
    "about_key = :about_key, unique_key = :unique_key WHERE id = :id"
)
_TAKE_KEY_AS_VERSION_4 = text(
    "INSERT INTO work.sqla_queue_unique_keys (task, key, job_id, scope, hold_seconds) "
    "VALUES (:task, :key, :id, 'queued', NULL)"
)
_STATES = text(
    "SELECT j.id, j.status, e.state, e.slot FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)
_INSERT_JOB = text(
    "INSERT INTO work.sqla_queue_jobs (id, task, payload, priority, status, "
    "max_attempts, scheduled_at, finished_at) OVERRIDING SYSTEM VALUE VALUES "
    "(:id, :task, CAST(:payload AS jsonb), :priority, :status, 1, now(), "
    "CASE WHEN :status = 'succeeded' THEN now() END)"
)
_INSERT_EXECUTION = text(
    "INSERT INTO work.sqla_queue_job_executions (id, task, priority, queue_id, state, "
    "execute_at) VALUES (:id, :task, :priority, :queue_id, :state, "
    "now() - make_interval(secs => :ago))"
)
# The library's enqueue takes ids from the identity; the rows written by hand above gave
# theirs explicitly, so move the identity past them, as the library's own enqueues had.
_ADVANCE_IDS = text(
    "SELECT setval(pg_get_serial_sequence('work.sqla_queue_jobs', 'id'), "
    "(SELECT max(id) FROM work.sqla_queue_jobs))"
)

#: The keyed jobs that version 2 left (id: key and how many seconds ago each became due).
#: 11 and 16 are the heads that a version-2 worker runs; the rest are queued behind 11, in
#: ``(execute_at, id)`` order 13, 15, 12, 14 (12 and 14 are due at the same moment).
V2_KEYED = {
    11: ("customer-1", 60),
    12: ("customer-1", 40),
    13: ("customer-1", 50),
    14: ("customer-1", 40),
    15: ("customer-1", 45),
    16: ("customer-2", 60),
}


def op_calls(path: Path) -> dict[str, list[str]]:
    """The calls in a revision's ``upgrade()`` and ``downgrade()``, spelled one way."""
    tree = ast.parse(path.read_text())
    calls: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("upgrade", "downgrade"):
            calls[node.name] = [
                ast.unparse(statement)
                for statement in node.body
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
            ]
    return calls


def insert_job(
    connection: Connection,
    job_id: int,
    task: str,
    args: list[Any],
    *,
    priority: int = 0,
    status: str = "queued",
    queue_id: str | None = None,
    ago: float = 60.0,
    state: str = "pending",
) -> None:
    """One job as the old library wrote it, and its execution (``state``) unless it finished."""
    connection.execute(
        _INSERT_JOB,
        {
            "id": job_id,
            "task": task,
            "payload": json.dumps(make_payload(args, {})),
            "priority": priority,
            "status": status,
        },
    )
    if status == "queued":
        connection.execute(
            _INSERT_EXECUTION,
            {
                "id": job_id,
                "task": task,
                "priority": priority,
                "queue_id": queue_id,
                "state": state,
                "ago": ago,
            },
        )


def enqueue_as_version_1(connection: Connection) -> None:
    """What the version-1 library left: one finished job, six reports and three mails pending.

    Jobs 2 and 3 (priority 5) are the reports an old worker picks first.
    """
    insert_job(connection, 1, "mail_invoice", [1], status="succeeded")
    for n in range(2, 8):
        insert_job(connection, n, "render_report", [n], priority=5 if n in (2, 3) else 0)
    for n in (8, 9, 10):
        insert_job(connection, n, "mail_invoice", [n])
    connection.execute(_ADVANCE_IDS)


def enqueue_as_version_2(connection: Connection) -> None:
    """What the version-2 library added: keyed jobs, all ``pending`` (it had no other state)."""
    for job_id, (key, ago) in V2_KEYED.items():
        insert_job(connection, job_id, "sync_customer", [job_id], queue_id=key, ago=ago)
    connection.execute(_ADVANCE_IDS)


def enqueue_as_version_3(connection: Connection) -> None:
    """What the version-3 library added: two keyed jobs behind earlier jobs of their keys
    (``waiting``, as it wrote them: 17 behind 16, which a version-2 worker runs, and 18
    behind customer-1's queue), and four mails."""
    insert_job(connection, 17, "sync_customer", [17], queue_id="customer-2", ago=0, state="waiting")
    insert_job(connection, 18, "sync_customer", [18], queue_id="customer-1", ago=0, state="waiting")
    for n in (19, 20, 21, 22):
        insert_job(connection, n, "mail_invoice", [n], ago=30)
    connection.execute(_ADVANCE_IDS)


def enqueue_as_version_4(connection: Connection) -> None:
    """What the version-4 library added: seven mails, 23 to 29, some with its new options.

    23 and 29 are awaited by a caller, 24 and 29 are linked to their invoice, and 25 is a
    unique job, its key held in the ``unique_keys`` table as that release took it.
    """
    for n in range(23, 30):
        insert_job(connection, n, "mail_invoice", [n], ago=20)
    marks: dict[int, dict[str, Any]] = {
        23: {"awaited": True, "about_table": None, "about_key": None, "unique_key": None},
        24: {"awaited": False, "about_table": "invoices", "about_key": "24", "unique_key": None},
        25: {"awaited": False, "about_table": None, "about_key": None, "unique_key": "inv-25"},
        29: {"awaited": True, "about_table": "invoices", "about_key": "29", "unique_key": None},
    }
    for job_id, mark in marks.items():
        connection.execute(MARK_AS_VERSION_4, {"id": job_id, **mark})
    connection.execute(_TAKE_KEY_AS_VERSION_4, {"task": "mail_invoice", "key": "inv-25", "id": 25})
    connection.execute(_ADVANCE_IDS)


def beat(connection: Connection, *workers: FrozenWorker) -> None:
    """The heartbeat of live old workers: their running executions were alive just now.

    Each release's worker beats every few seconds; the frozen reductions leave that out, so
    the story beats for them before a new worker runs its reclaim sweep. Without it, a slow
    run (a loaded machine) would take their executions, claimed more than a lease ago, for
    lost, like the dead worker's.
    """
    connection.execute(
        text(
            "UPDATE work.sqla_queue_job_executions SET alive_at = now() "
            "WHERE state = 'running' AND worker_id = ANY(:workers)"
        ),
        {"workers": [w.worker_id for w in workers]},
    )


def read_states(connection: Connection) -> dict[int, tuple[Any, ...]]:
    """Each job's status, with its execution's state and slot (NULL without one), by id."""
    return {row.id: (row.status, row.state, row.slot) for row in connection.execute(_STATES)}


def schema_missing(connection: Connection) -> tuple[set[str], int | None]:
    """What the worker's check would list, and the version the database records."""
    report = inspect_schema(connection, queue.tables)
    return set(report.problems("work")), report.version


def rows_by_name(connection: Connection) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Every job and its execution (None without one), each by column name."""
    return [(row.job, row.execution) for row in connection.execute(_ROWS_BY_NAME)]


def without_version_4(
    rows: list[tuple[dict[str, Any], dict[str, Any] | None]],
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """``rows`` without the columns version 4 added, after checking they hold defaults."""
    kept: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for job, execution in rows:
        added = {name: job.pop(name) for name in VERSION_4_DEFAULTS["job"]}
        assert added == VERSION_4_DEFAULTS["job"], job
        if execution is not None:
            added = {name: execution.pop(name) for name in VERSION_4_DEFAULTS["execution"]}
            assert added == VERSION_4_DEFAULTS["execution"], execution
        kept.append((job, execution))
    return kept


def without_execution_columns(
    rows: list[tuple[dict[str, Any], dict[str, Any] | None]], defaults: dict[str, Any]
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """``rows`` without the executions' columns a version added (``defaults``, by name),
    after checking that every execution holds their defaults."""
    kept: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for job, execution in rows:
        if execution is not None:
            added = {name: execution.pop(name) for name in defaults}
            assert added == defaults, execution
        kept.append((job, execution))
    return kept


def enqueue_urgent_mails(connection: Connection, ids: range, *, ago: float) -> None:
    """Urgent mails (priority 1) as the version-5 and version-6 libraries wrote them: the
    first added no column and the second one its plain jobs leave at its default, so they
    are what version 4 wrote; ``ids`` are theirs."""
    for n in ids:
        insert_job(connection, n, "mail_invoice", [n], priority=1, ago=ago)
    connection.execute(_ADVANCE_IDS)


def suspend_as_version_7(connection: Connection, job_id: int, wait: str) -> None:
    """A durable mail of the version-7 release, suspended until a signal: overdue and of the
    highest priority, so that a claim which did not look at the state would take it first."""
    insert_job(connection, job_id, "mail_invoice", [job_id], priority=9, ago=90, state="suspended")
    connection.execute(_SET_WAIT, {"id": job_id, "wait": wait})
    connection.execute(_ADVANCE_IDS)


_SET_WAIT = text("UPDATE work.sqla_queue_job_executions SET wait = :wait WHERE id = :id")
#: What the version-7 release's signal does to the suspended job it wakes.
WAKE_AS_VERSION_7 = text(
    "UPDATE work.sqla_queue_job_executions SET state = 'pending', wait = NULL, "
    "execute_at = now() WHERE id = :id AND state = 'suspended'"
)


WORKFLOW_MARKS = text(
    "SELECT id, workflow FROM work.sqla_queue_job_executions WHERE id = ANY(:ids) ORDER BY id"
)
WAIT_MARKS = text(
    "SELECT id, wait FROM work.sqla_queue_job_executions WHERE id = ANY(:ids) ORDER BY id"
)


def unique_keys(connection: Connection) -> list[dict[str, Any]]:
    """Every unique key, as a JSON object by column name."""
    return list(connection.execute(_UNIQUE_KEYS).scalars())
