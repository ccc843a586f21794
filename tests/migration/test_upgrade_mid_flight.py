"""A live install moved from schema version 1 to 2 and then to 3 with Alembic, mid-flight.

The host app's history up to revision 0002 created the queue at version 1. Workers of the
version-1 release (``tests/migration/v1_worker``: that release's own claim and completion
SQL) are running jobs when the committed revision 0003 steps the queue to version 2
(``alembic upgrade 0003``), and:

* every row survives, and the executions that were running keep ``slot`` NULL;
* the version-1 workers keep going: they claim and complete with their own SQL after it.

Then workers of the version-2 release (``tests/migration/v2_worker``, likewise) run keyed
jobs too, with later jobs of their keys queued behind them as version 2 wrote them
(``pending``). The library is upgraded to the version-3 release: autogenerate writes the
step from 2 to 3, exactly as committed in revision 0004, ``alembic upgrade head`` runs it
while the executions of both old releases are still running, and:

* every row survives the step unchanged;
* the old workers keep going: both claim and complete with their own SQL after the step, a
  version-2 worker still takes its keys in order, and it never claims a job that the
  version-3 library enqueued as ``waiting``, even one with nothing left ahead of it;
* the count gate covers the slot-less executions of the version-1 workers, so a version-3
  worker stays within the task's limit of 2 while they run, and takes capacity slots once
  they are done;
* a version-3 worker never runs a key while a version-2 worker holds it, promotes (by its
  sweep) the waiting job whose predecessor a version-2 worker finished, runs each key's
  jobs one at a time in ``(execute_at, id)`` order, and drains everything else, including
  an execution of a dead version-1 worker.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, text
from sqlalchemy.orm import sessionmaker

from sqla_queue.core.payload import make_payload
from sqla_queue.schema.verify import find_missing
from tests.migration.conftest import HOSTAPP_MIGRATIONS, HostProject, engine_for
from tests.migration.hostapp.models import REPORT_LIMIT, queue, sync_customer
from tests.migration.v1_worker import V1Worker
from tests.migration.v2_worker import V2Worker

pytestmark = pytest.mark.migration

COMMITTED_0003 = HOSTAPP_MIGRATIONS / "versions" / "0003_upgrade_sqla_queue_to_v2.py"
COMMITTED_0004 = HOSTAPP_MIGRATIONS / "versions" / "0004_upgrade_sqla_queue_to_v3.py"

WHERE = "schema='work', prefix='sqla_queue_'"

# What a version-2 database lacks that version 3 needs (the worker checks for these).
ADDED_BY_VERSION_3 = {
    "sqla_queue_job_executions_queue_active_ix",
    "sqla_queue_job_executions_waiting_ix",
    "sqla_queue_job_executions_done_ix",
}

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
    "INSERT INTO work.sqla_queue_job_executions (id, task, priority, queue_id, execute_at) "
    "VALUES (:id, :task, :priority, :queue_id, now() - make_interval(secs => :ago))"
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
) -> None:
    """One job as the old library wrote it, and its pending execution unless it finished."""
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
            {"id": job_id, "task": task, "priority": priority, "queue_id": queue_id, "ago": ago},
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


def _states(connection: Connection) -> dict[int, tuple[Any, ...]]:
    return {row.id: (row.status, row.state, row.slot) for row in connection.execute(_STATES)}


def _missing_names(connection: Connection) -> tuple[set[str], int | None]:
    missing, version = find_missing(connection, queue.tables)
    return {m.name for m in missing}, version


def test_a_live_install_upgrades_from_version_1_to_2_to_3_mid_flight(
    v2_history_project: HostProject,
) -> None:
    project = v2_history_project
    assert [p.name[:4] for p in project.revision_files()] == ["0001", "0002", "0003"]
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
        # Version 2, complete but for what version 3 adds.
        assert _missing_names(connection) == (ADDED_BY_VERSION_3, 2)
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

    # The library is now the version-3 release: autogenerate writes the step, as committed.
    command.revision(config, autogenerate=True, message="upgrade sqla_queue", rev_id="0004")
    [generated] = [p for p in project.revision_files() if p.name.startswith("0004")]
    assert (
        op_calls(generated)
        == op_calls(COMMITTED_0004)
        == {
            "upgrade": [f"op.upgrade_queue(from_version=2, to_version=3, {WHERE})"],
            "downgrade": [f"op.upgrade_queue(from_version=3, to_version=2, {WHERE})"],
        }
    )

    project.alembic("upgrade", "head")

    SessionLocal = sessionmaker(engine)
    with engine.begin() as connection:
        assert find_missing(connection, queue.tables) == ([], 3)
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

    # The version-3 code is deploying: its enqueues put a key's later jobs in `waiting`.
    with SessionLocal.begin() as session:
        behind_a_version_2_worker = sync_customer.options(queue_id="customer-2").enqueue(
            session, 17
        )
        behind_pending_jobs = sync_customer.options(queue_id="customer-1").enqueue(session, 18)
    assert (behind_a_version_2_worker, behind_pending_jobs) == (17, 18)

    with engine.begin() as connection:
        states = _states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        # A version-2 worker finishes the job that 17 waits for; it knows nothing of
        # waiting jobs, so 17 stays waiting, with nothing left ahead of it.
        assert syncer.succeed(connection, [by_id[16]], result="done by version 2") == [16]
        # It never claims a waiting job: it takes customer-1's head and holds it.
        [held] = syncer.claim(connection, ["sync_customer"], batch=10)
        assert held.id == 15
        states = _states(connection)
        assert states[17] == ("queued", "waiting", None)
        assert states[15] == ("queued", "running", None)

    def run_new_worker() -> None:
        # More threads than the limit: only the database's gate can keep reports at 2.
        worker = queue.worker(
            SessionLocal, concurrency=6, install_signal_handlers=False, poll_interval=0.05
        )
        worker.run(burst=True)

    # The version-1 worker's two reports fill the limit, and the version-2 worker holds
    # customer-1: the new worker runs the mail it reclaims and the job it promotes.
    run_new_worker()
    with engine.connect() as connection:
        states = _states(connection)
    assert states[lost.id] == ("succeeded", None, None)  # reclaimed from the dead worker
    assert states[17] == ("succeeded", None, None)  # promoted by the sweep
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
            connection.execute(
                text(
                    "SELECT id, result FROM work.sqla_queue_jobs "
                    "WHERE task IN ('render_report', 'sync_customer')"
                )
            ).all()
        )
    engine.dispose()

    assert states == dict.fromkeys(range(1, 19), ("succeeded", None, None)), "a job was lost"
    assert results[2] == results[3] == "done by version 1"
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
