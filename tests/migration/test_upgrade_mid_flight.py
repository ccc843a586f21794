"""A live install moved from schema version 1 to 2, 3, 4, 5 and 6 with Alembic, mid-flight.

The host app's history up to revision 0002 created the queue at version 1. Workers of the
version-1 release (``tests/migration/v1_worker``: that release's own claim and completion
SQL) are running jobs when the committed revision 0003 steps the queue to version 2
(``alembic upgrade 0003``), and:

* every row survives, and the executions that were running keep ``slot`` NULL;
* the version-1 workers keep going: they claim and complete with their own SQL after it.

Then workers of the version-2 release (``tests/migration/v2_worker``, likewise) run keyed
jobs too, with later jobs of their keys queued behind them as version 2 wrote them
(``pending``), when the committed revision 0004 steps the queue to version 3, and:

* every row survives the step unchanged;
* both old releases keep going with their own SQL, and a version-2 worker still takes its
  keys in order.

The version-3 release then deploys: its producers write a key's later jobs ``waiting``, and
its workers (``tests/migration/v3_worker``) run jobs too. A version-2 worker never claims a
waiting job, even one whose predecessor it finished and that has nothing left ahead. The
committed revision 0005 steps the queue to version 4 while the executions of all three old
releases are still running, and:

* every row survives the step unchanged, and the new columns hold their defaults;
* all three old releases keep going with their own SQL.

The version-4 release then deploys: its producers write the columns version 4 added (a job
awaited by a caller, jobs linked to an invoice, a unique job with its key), and its workers
(``tests/migration/v4_worker``) run jobs too. The committed revision 0006 steps the queue to
version 5 while the executions of all four old releases are still running, and:

* the worker's schema check lists exactly what version 6 adds after the step;
* every row survives the step unchanged (it adds tables and an index, no column), unique
  keys included, and the new tables start empty;
* the old workers keep going: versions 1, 3 and 4 claim and complete with their own SQL
  after it, a version-4 completion still notifies the caller awaiting its job, and a
  version-2 worker still claims nothing out of turn.

The version-5 release then deploys: its producers enqueue urgent mails (one awaited by a
caller), and its workers (``tests/migration/v5_worker``) run them. The library is upgraded
to the version-6 release: autogenerate writes the step from 5 to 6, exactly as committed in
revision 0007, ``alembic upgrade head`` runs it while the executions of all five old
releases are still running, and:

* the worker's schema check lists nothing after the step;
* every row survives the step unchanged but for the new ``workflow`` column, false in every
  execution, unique keys included, and the new tables start empty;
* the old workers keep going: versions 1, 3, 4 and 5 claim and complete with their own SQL
  after it, a version-5 completion still notifies the caller awaiting its job, an
  execution a version-5 producer writes after the step is no workflow node, and a
  version-2 worker still claims nothing out of turn;
* the count gate covers the slot-less executions of the version-1 workers, so a version-6
  worker stays within the task's limit of 2 while they run, and takes capacity slots once
  they are done;
* a version-6 worker never runs a key while a version-2 worker holds it, promotes (by its
  sweep) the waiting job whose predecessor a version-2 worker finished, runs each key's
  jobs one at a time in ``(execute_at, id)`` order, and drains everything else, including
  an execution of a dead version-1 worker and a job the version-4 release enqueued.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from sqlalchemy import Connection, text
from sqlalchemy.orm import sessionmaker

from sqla_queue.logic.payload import make_payload
from sqla_queue.schema.verify import find_missing, inspect_schema
from tests.migration.conftest import HOSTAPP_MIGRATIONS, HostProject, engine_for, libpq_url
from tests.migration.frozen_worker import FrozenWorker
from tests.migration.hostapp.models import REPORT_LIMIT, queue
from tests.migration.v1_worker import V1Worker
from tests.migration.v2_worker import V2Worker
from tests.migration.v3_worker import V3Worker
from tests.migration.v4_worker import V4Worker
from tests.migration.v5_worker import V5Worker

pytestmark = pytest.mark.migration

COMMITTED_0003 = HOSTAPP_MIGRATIONS / "versions" / "0003_upgrade_sqla_queue_to_v2.py"
COMMITTED_0004 = HOSTAPP_MIGRATIONS / "versions" / "0004_upgrade_sqla_queue_to_v3.py"
COMMITTED_0005 = HOSTAPP_MIGRATIONS / "versions" / "0005_upgrade_sqla_queue_to_v4.py"
COMMITTED_0006 = HOSTAPP_MIGRATIONS / "versions" / "0006_upgrade_sqla_queue_to_v5.py"
COMMITTED_0007 = HOSTAPP_MIGRATIONS / "versions" / "0007_upgrade_sqla_queue_to_v6.py"

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
#: The tables version 5 adds, all empty after the step.
VERSION_5_TABLES = ("task_controls", "rate_starts", "schedules", "daemons", "workers")
#: The tables version 6 adds, all empty after the step.
VERSION_6_TABLES = ("workflows", "workflow_nodes", "workflow_edges")
#: The channel on which a version-4 or version-5 completion notifies a caller awaiting the job.
FINISHED_CHANNEL = "work.sqla_queue_finished"
# The columns version 4 adds, with the value every row written before it must hold.
VERSION_4_DEFAULTS: dict[str, dict[str, Any]] = {
    "job": {"unique_key": None, "about_table": None, "about_key": None, "awaited": False},
    "execution": {"cancel_requested": False},
}
#: The column version 6 adds to the executions, false in every row written before it.
VERSION_6_DEFAULTS: dict[str, Any] = {"workflow": False}

# Every column that version 1 has: none of them may change in the step to 2.
_ROWS_V1 = text(
    "SELECT j.id, j.task, j.status, j.attempts, j.payload, e.state, e.priority, e.attempt, "
    "e.reclaims, e.worker_id, e.alive_at, e.lease_seconds, e.execute_at, e.queue_id "
    "FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)
# Every column that version 2 has in both tables: none of them may change in the step to 3.
_ROWS_V2 = text(
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
_MARK_AS_VERSION_4 = text(
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


def _insert(
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


def _enqueue_as_version_1(connection: Connection) -> None:
    """What the version-1 library left: one finished job, six reports and three mails pending.

    Jobs 2 and 3 (priority 5) are the reports an old worker picks first.
    """
    _insert(connection, 1, "mail_invoice", [1], status="succeeded")
    for n in range(2, 8):
        _insert(connection, n, "render_report", [n], priority=5 if n in (2, 3) else 0)
    for n in (8, 9, 10):
        _insert(connection, n, "mail_invoice", [n])
    connection.execute(_ADVANCE_IDS)


def _enqueue_as_version_2(connection: Connection) -> None:
    """What the version-2 library added: keyed jobs, all ``pending`` (it had no other state)."""
    for job_id, (key, ago) in V2_KEYED.items():
        _insert(connection, job_id, "sync_customer", [job_id], queue_id=key, ago=ago)
    connection.execute(_ADVANCE_IDS)


def _enqueue_as_version_3(connection: Connection) -> None:
    """What the version-3 library added: two keyed jobs behind earlier jobs of their keys
    (``waiting``, as it wrote them: 17 behind 16, which a version-2 worker runs, and 18
    behind customer-1's queue), and four mails."""
    _insert(connection, 17, "sync_customer", [17], queue_id="customer-2", ago=0, state="waiting")
    _insert(connection, 18, "sync_customer", [18], queue_id="customer-1", ago=0, state="waiting")
    for n in (19, 20, 21, 22):
        _insert(connection, n, "mail_invoice", [n], ago=30)
    connection.execute(_ADVANCE_IDS)


def _enqueue_as_version_4(connection: Connection) -> None:
    """What the version-4 library added: seven mails, 23 to 29, some with its new options.

    23 and 29 are awaited by a caller, 24 and 29 are linked to their invoice, and 25 is a
    unique job, its key held in the ``unique_keys`` table as that release took it.
    """
    for n in range(23, 30):
        _insert(connection, n, "mail_invoice", [n], ago=20)
    marks = {
        23: {"awaited": True, "about_table": None, "about_key": None, "unique_key": None},
        24: {"awaited": False, "about_table": "invoices", "about_key": "24", "unique_key": None},
        25: {"awaited": False, "about_table": None, "about_key": None, "unique_key": "inv-25"},
        29: {"awaited": True, "about_table": "invoices", "about_key": "29", "unique_key": None},
    }
    for job_id, mark in marks.items():
        connection.execute(_MARK_AS_VERSION_4, {"id": job_id, **mark})
    connection.execute(_TAKE_KEY_AS_VERSION_4, {"task": "mail_invoice", "key": "inv-25", "id": 25})
    connection.execute(_ADVANCE_IDS)


def _beat(connection: Connection, *workers: FrozenWorker) -> None:
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


def _states(connection: Connection) -> dict[int, tuple[Any, ...]]:
    return {row.id: (row.status, row.state, row.slot) for row in connection.execute(_STATES)}


def _missing(connection: Connection) -> tuple[set[str], int | None]:
    """What the worker's check would list, and the version the database records."""
    report = inspect_schema(connection, queue.tables)
    return set(report.problems("work")), report.version


def _rows_by_name(connection: Connection) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    return [(row.job, row.execution) for row in connection.execute(_ROWS_BY_NAME)]


def _without_version_4(
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


def _without_version_6(
    rows: list[tuple[dict[str, Any], dict[str, Any] | None]],
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """``rows`` without the column version 6 added, after checking it holds its default."""
    kept: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for job, execution in rows:
        if execution is not None:
            added = {name: execution.pop(name) for name in VERSION_6_DEFAULTS}
            assert added == VERSION_6_DEFAULTS, execution
        kept.append((job, execution))
    return kept


def _enqueue_as_version_5(connection: Connection, ids: range, *, ago: float) -> None:
    """Urgent mails (priority 1) as the version-5 library wrote them: it added no column,
    so they are what version 4 wrote; ``ids`` are theirs."""
    for n in ids:
        _insert(connection, n, "mail_invoice", [n], priority=1, ago=ago)
    connection.execute(_ADVANCE_IDS)


_WORKFLOW_MARKS = text(
    "SELECT id, workflow FROM work.sqla_queue_job_executions WHERE id = ANY(:ids) ORDER BY id"
)


def _unique_keys(connection: Connection) -> list[dict[str, Any]]:
    return list(connection.execute(_UNIQUE_KEYS).scalars())


def test_a_live_install_upgrades_from_version_1_to_2_to_3_to_4_to_5_to_6_mid_flight(
    v5_history_project: HostProject,
) -> None:
    project = v5_history_project
    revisions = [p.name[:4] for p in project.revision_files()]
    assert revisions == ["0001", "0002", "0003", "0004", "0005", "0006"]
    config = project.config()
    command.upgrade(config, "0002")  # op.create_queue(..., version=1)
    engine = engine_for(project.url)
    reporter, mailer, dead = V1Worker(), V1Worker(), V1Worker()
    with engine.begin() as connection:
        assert find_missing(connection, queue.tables)[1] == 1
        _enqueue_as_version_1(connection)
        running = reporter.claim(connection, ["render_report"], batch=REPORT_LIMIT)
        assert sorted(c.id for c in running) == [2, 3]
        [lost] = dead.claim(connection, ["mail_invoice"], batch=1)
        assert lost.id == 8
        # That worker died: no heartbeat for ten minutes, far beyond its 30 s lease.
        connection.execute(
            text(
                "UPDATE work.sqla_queue_job_executions "
                "SET alive_at = now() - interval '10 minutes' WHERE worker_id = :w"
            ),
            {"w": dead.worker_id},
        )
        before_v2 = connection.execute(_ROWS_V1).all()

    # The step to version 2 is the committed revision, written when the library moved to 2.
    assert op_calls(COMMITTED_0003) == {
        "upgrade": [f"op.upgrade_queue(from_version=1, to_version=2, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=2, to_version=1, {WHERE})"],
    }
    project.alembic("upgrade", "0003")

    syncer = V2Worker()
    with engine.begin() as connection:
        # Version 2, complete but for what versions 3, 4, 5 and 6 add.
        added = ADDED_BY_VERSION_3 | ADDED_BY_VERSION_4 | ADDED_BY_VERSION_5 | ADDED_BY_VERSION_6
        assert _missing(connection) == (added, 2)
        assert connection.execute(_ROWS_V1).all() == before_v2
        slots = connection.execute(text("SELECT slot FROM work.sqla_queue_job_executions"))
        assert set(slots.scalars()) == {None}
        # A version-1 worker keeps going after the step, with its own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 9
        assert mailer.succeed(connection, [mail], result=9) == [9]

        # Version-2 workers run keyed jobs: one head per key, the rest queued behind it.
        _enqueue_as_version_2(connection)
        heads = syncer.claim(connection, ["sync_customer"], batch=10)
        assert sorted((c.id, c.queue_id) for c in heads) == [(11, "customer-1"), (16, "customer-2")]
        states = _states(connection)
        assert [states[n] for n in (12, 13, 14, 15)] == [("queued", "pending", None)] * 4
        before_v3 = connection.execute(_ROWS_V2).all()
    by_id = {c.id: c for c in heads}

    # The step to version 3 is the committed revision, written when the library moved to 3.
    assert op_calls(COMMITTED_0004) == {
        "upgrade": [f"op.upgrade_queue(from_version=2, to_version=3, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=3, to_version=2, {WHERE})"],
    }
    project.alembic("upgrade", "0004")

    sender = V3Worker()
    with engine.begin() as connection:
        later = ADDED_BY_VERSION_4 | ADDED_BY_VERSION_5 | ADDED_BY_VERSION_6
        assert _missing(connection) == (later, 3)
        assert connection.execute(_ROWS_V2).all() == before_v3
        slots = connection.execute(text("SELECT slot FROM work.sqla_queue_job_executions"))
        assert set(slots.scalars()) == {None}
        # Both old releases keep going after the step, with their own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 10
        assert mailer.succeed(connection, [mail], result=10) == [10]
        assert syncer.succeed(connection, [by_id[11]], result="done by version 2") == [11]
        # The next of customer-1 in (execute_at, id) order, and only that one.
        [next_head] = syncer.claim(connection, ["sync_customer"], batch=10)
        assert next_head.id == 13
        assert syncer.succeed(connection, [next_head], result="done by version 2") == [13]

        # The version-3 release deploys: its producers put a key's later jobs in `waiting`.
        _enqueue_as_version_3(connection)
        # A version-2 worker finishes the job that 17 waits for; it knows nothing of
        # waiting jobs, so 17 stays waiting, with nothing left ahead of it.
        assert syncer.succeed(connection, [by_id[16]], result="done by version 2") == [16]
        # It never claims a waiting job: it takes customer-1's head and holds it.
        [held] = syncer.claim(connection, ["sync_customer"], batch=10)
        assert held.id == 15
        # Its workers run the mails.
        sent = sender.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in sent) == [19, 20]
        states = _states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[15] == ("queued", "running", None)
        before_v4 = _rows_by_name(connection)

    # The step to version 4 is the committed revision, written when the library moved to 4.
    assert op_calls(COMMITTED_0005) == {
        "upgrade": [f"op.upgrade_queue(from_version=3, to_version=4, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=4, to_version=3, {WHERE})"],
    }
    project.alembic("upgrade", "0005")

    carrier = V4Worker()
    with engine.begin() as connection:
        assert _missing(connection) == (ADDED_BY_VERSION_5 | ADDED_BY_VERSION_6, 4)
        assert _without_version_4(_rows_by_name(connection)) == before_v4
        keys = connection.execute(text("SELECT count(*) FROM work.sqla_queue_unique_keys"))
        assert keys.scalar_one() == 0
        # All three old releases keep going after the step, with their own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 21
        assert mailer.succeed(connection, [mail], result=21) == [21]
        assert sender.succeed(connection, sent, result="done by version 3") == [19, 20]
        [mail] = sender.claim(connection, ["mail_invoice"], batch=2)
        assert mail.id == 22
        assert sender.succeed(connection, [mail], result="done by version 3") == [22]
        # A version-2 worker still claims nothing out of turn: customer-1 is its own
        # (15 runs) and 17 is waiting, with nothing ahead of it.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = _states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)

        # The version-4 release deploys: its producers write its new columns, and its
        # workers run mails, beside a version-3 worker that has not been replaced yet.
        _enqueue_as_version_4(connection)
        delivered = carrier.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in delivered) == [23, 24]
        [posted] = sender.claim(connection, ["mail_invoice"], batch=1)
        assert posted.id == 25
        before_v5 = _rows_by_name(connection)
        keys_before_v5 = _unique_keys(connection)
        assert [(k["key"], k["job_id"]) for k in keys_before_v5] == [("inv-25", 25)]

    # The step to version 5 is the committed revision, written when the library moved to 5.
    assert op_calls(COMMITTED_0006) == {
        "upgrade": [f"op.upgrade_queue(from_version=4, to_version=5, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=5, to_version=4, {WHERE})"],
    }
    project.alembic("upgrade", "0006")

    with engine.begin() as connection:
        assert _missing(connection) == (ADDED_BY_VERSION_6, 5)
        # Version 5 adds no column: every row is exactly as it was, keys included.
        assert _rows_by_name(connection) == before_v5
        assert _unique_keys(connection) == keys_before_v5
        for name in VERSION_5_TABLES:
            count = connection.execute(text(f"SELECT count(*) FROM work.sqla_queue_{name}"))
            assert count.scalar_one() == 0, name

    # The old workers keep going after the step, with their own SQL; a version-4
    # completion still tells the caller awaiting its job (23) that it finished.
    with psycopg.connect(libpq_url(project.url), autocommit=True) as listener:
        listener.execute(f'LISTEN "{FINISHED_CHANNEL}"')
        with engine.begin() as connection:
            assert carrier.succeed(connection, delivered, result="done by version 4") == [23, 24]
        notes = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert notes == ["23"]
    with engine.begin() as connection:
        assert sender.succeed(connection, [posted], result="done by version 3") == [25]
        [mail] = sender.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 26
        assert sender.succeed(connection, [mail], result="done by version 3") == [26]
        [mail] = carrier.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 27
        assert carrier.succeed(connection, [mail], result="done by version 4") == [27]
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 28
        assert mailer.succeed(connection, [mail], result=28) == [28]
        # A version-2 worker still claims nothing out of turn.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = _states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[29] == ("queued", "pending", None)

    # The version-5 release deploys: its producers enqueue urgent mails, 30 awaited by a
    # caller, and its workers run them beside the older releases not replaced yet.
    courier = V5Worker()
    with engine.begin() as connection:
        _enqueue_as_version_5(connection, range(30, 33), ago=10)
        awaited = {"awaited": True, "about_table": None, "about_key": None, "unique_key": None}
        connection.execute(_MARK_AS_VERSION_4, {"id": 30, **awaited})
        shipped = courier.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in shipped) == [30, 31]
        before_v6 = _rows_by_name(connection)
        keys_before_v6 = _unique_keys(connection)

    # The library is now the version-6 release: autogenerate writes the step, as committed.
    command.revision(config, autogenerate=True, message="upgrade sqla_queue", rev_id="0007")
    [generated] = [p for p in project.revision_files() if p.name.startswith("0007")]
    assert (
        op_calls(generated)
        == op_calls(COMMITTED_0007)
        == {
            "upgrade": [f"op.upgrade_queue(from_version=5, to_version=6, {WHERE})"],
            "downgrade": [f"op.upgrade_queue(from_version=6, to_version=5, {WHERE})"],
        }
    )

    project.alembic("upgrade", "head")

    SessionLocal = sessionmaker(engine)
    with engine.begin() as connection:
        assert _missing(connection) == (set(), 6)
        assert find_missing(connection, queue.tables) == ([], 6)
        # Version 6 adds one column, false in every execution: the rest is as it was.
        assert _without_version_6(_rows_by_name(connection)) == before_v6
        assert _unique_keys(connection) == keys_before_v6
        for name in VERSION_6_TABLES:
            count = connection.execute(text(f"SELECT count(*) FROM work.sqla_queue_{name}"))
            assert count.scalar_one() == 0, name

    # The old workers keep going after the step, with their own SQL; a version-5
    # completion still tells the caller awaiting its job (30) that it finished.
    with psycopg.connect(libpq_url(project.url), autocommit=True) as listener:
        listener.execute(f'LISTEN "{FINISHED_CHANNEL}"')
        with engine.begin() as connection:
            assert courier.succeed(connection, shipped, result="done by version 5") == [30, 31]
        notes = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert notes == ["30"]
    with engine.begin() as connection:
        # The version-5 release's producers keep enqueueing: their executions, which name
        # no workflow column, are no workflow nodes.
        _enqueue_as_version_5(connection, range(33, 36), ago=5)
        marks = connection.execute(_WORKFLOW_MARKS, {"ids": [32, 33, 34, 35]}).all()
        assert [tuple(m) for m in marks] == [(n, False) for n in (32, 33, 34, 35)]
        [mail] = courier.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 32
        assert courier.succeed(connection, [mail], result="done by version 5") == [32]
        [mail] = carrier.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 33
        assert carrier.succeed(connection, [mail], result="done by version 4") == [33]
        [mail] = sender.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 34
        assert sender.succeed(connection, [mail], result="done by version 3") == [34]
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 35
        assert mailer.succeed(connection, [mail], result=35) == [35]
        # A version-2 worker still claims nothing out of turn.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = _states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[29] == ("queued", "pending", None)

    def run_new_worker() -> None:
        # More threads than the limit: only the database's gate can keep reports at 2.
        worker = queue.worker(
            SessionLocal, concurrency=6, install_signal_handlers=False, poll_interval=0.05
        )
        worker.run(burst=True)

    # The version-1 worker's two reports fill the limit, and the version-2 worker holds
    # customer-1: the new worker runs the mail it reclaims and the job it promotes.
    with engine.begin() as connection:
        _beat(connection, reporter, syncer)
    run_new_worker()
    with engine.connect() as connection:
        states = _states(connection)
    assert states[lost.id] == ("succeeded", None, None)  # reclaimed from the dead worker
    assert states[17] == ("succeeded", None, None)  # promoted by the sweep
    assert states[29] == ("succeeded", None, None)  # enqueued by the version-4 release
    assert [states[n] for n in (2, 3)] == [("queued", "running", None)] * 2
    assert [states[n] for n in range(4, 8)] == [("queued", "pending", None)] * 4
    assert states[15] == ("queued", "running", None)
    assert [states[n] for n in (12, 14)] == [("queued", "pending", None)] * 2
    assert states[18] == ("queued", "waiting", None)

    # The old workers finish their jobs; their fenced completions still match their rows.
    with engine.begin() as connection:
        assert reporter.succeed(connection, running, result="done by version 1") == [2, 3]
        assert syncer.succeed(connection, [held], result="done by version 2") == [15]

    run_new_worker()
    with engine.connect() as connection:
        states = _states(connection)
        results: dict[int, Any] = dict(
            connection.execute(text("SELECT id, result FROM work.sqla_queue_jobs")).all()
        )
    engine.dispose()

    assert states == dict.fromkeys(range(1, 36), ("succeeded", None, None)), "a job was lost"
    assert results[2] == results[3] == "done by version 1"
    assert all(results[n] == "done by version 3" for n in (19, 20, 22, 25, 26, 34))
    assert all(results[n] == "done by version 4" for n in (23, 24, 27, 33))
    assert all(results[n] == "done by version 5" for n in (30, 31, 32))
    assert (results[21], results[28], results[29], results[35]) == (21, 28, 29, 35)
    reports = [results[n] for n in range(4, 8)]
    assert sorted(r["report_id"] for r in reports) == [4, 5, 6, 7]
    assert {r["slot"] for r in reports} == set(range(REPORT_LIMIT))
    seen = [slots for r in reports for slots in r["seen"]]
    assert all(None not in slots and len(set(slots)) == len(slots) for slots in seen), seen
    # Never above the limit, and at the limit at some point: the cap, not chance, held it.
    assert max(len(slots) for slots in seen) == REPORT_LIMIT, seen

    # Keys: the version-2 worker ran 11, 13, 16 and 15; the new worker ran the rest, each
    # alone among its key's executions, customer-1's in (execute_at, id) order.
    assert all(results[n] == "done by version 2" for n in (11, 13, 15, 16))
    for n in (12, 14, 17, 18):
        assert results[n]["customer_id"] == n
        assert results[n]["seen"] == [[n], [n]], results[n]
    started = {n: dt.datetime.fromisoformat(results[n]["started"]) for n in (12, 14, 18)}
    assert sorted(started, key=started.__getitem__) == [12, 14, 18]
