"""A live version-1 install moved to schema version 2 with ``alembic upgrade head``, mid-flight.

The host app's history up to revision 0002 created the queue at version 1. Workers of the
previous release (``tests/migration/v1_worker``: that release's own claim and completion SQL)
are running jobs when the library is upgraded. Autogenerate then writes the step, the
migration runs while their executions are still running, and:

* every row survives, and the executions that were running keep ``slot`` NULL;
* the old workers keep going: they claim and complete with their own SQL after the step;
* the count gate covers their slot-less executions, so a version-2 worker stays within the
  task's limit of 2 while they run, and takes capacity slots once they are done;
* a version-2 worker drains everything else, including an execution of a dead old worker.
"""

from __future__ import annotations

import ast
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
from tests.migration.hostapp.models import REPORT_LIMIT, queue
from tests.migration.v1_worker import V1Worker

pytestmark = pytest.mark.migration

COMMITTED_0003 = HOSTAPP_MIGRATIONS / "versions" / "0003_upgrade_sqla_queue_to_v2.py"

# Every column that version 1 has: none of them may change in the step.
_ROWS = text(
    "SELECT j.id, j.task, j.status, j.attempts, j.payload, e.state, e.priority, e.attempt, "
    "e.reclaims, e.worker_id, e.alive_at, e.lease_seconds, e.execute_at "
    "FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)
_STATES = text(
    "SELECT j.id, j.status, e.state, e.slot FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)


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


def _enqueue_as_version_1(connection: Connection) -> None:
    """What the version-1 library left: one finished job, six reports and three mails pending.

    Jobs 2 and 3 (priority 5) are the reports an old worker picks first.
    """
    jobs = [
        (1, "mail_invoice", [1], 0, "succeeded"),
        *((n, "render_report", [n], 5 if n in (2, 3) else 0, "queued") for n in range(2, 8)),
        *((n, "mail_invoice", [n], 0, "queued") for n in (8, 9, 10)),
    ]
    for job_id, task, args, priority, status in jobs:
        connection.execute(
            text(
                "INSERT INTO work.sqla_queue_jobs (id, task, payload, priority, status, "
                "max_attempts, scheduled_at, finished_at) OVERRIDING SYSTEM VALUE VALUES "
                "(:id, :task, CAST(:payload AS jsonb), :priority, :status, 1, now(), "
                "CASE WHEN :status = 'succeeded' THEN now() END)"
            ),
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
                text(
                    "INSERT INTO work.sqla_queue_job_executions (id, task, priority, execute_at) "
                    "VALUES (:id, :task, :priority, now() - interval '1 minute')"
                ),
                {"id": job_id, "task": task, "priority": priority},
            )


def _states(connection: Connection) -> dict[int, tuple[Any, ...]]:
    return {row.id: (row.status, row.state, row.slot) for row in connection.execute(_STATES)}


def test_a_live_version_1_install_upgrades_mid_flight_and_keeps_within_the_limit(
    v1_history_project: HostProject,
) -> None:
    project = v1_history_project
    config = project.config()
    command.upgrade(config, "head")  # 0002: op.create_queue(..., version=1)
    engine = engine_for(project.url)
    reporter, mailer, dead = V1Worker(), V1Worker(), V1Worker()
    with engine.begin() as connection:
        assert find_missing(connection, queue.tables)[1] == 1
        _enqueue_as_version_1(connection)
        running = reporter.claim(connection, ["render_report"], batch=REPORT_LIMIT)
        assert sorted(c.id for c in running) == [2, 3]
        [lost] = dead.claim(connection, ["mail_invoice"], batch=1)
        # That worker died: no heartbeat for ten minutes, far beyond its 30 s lease.
        connection.execute(
            text(
                "UPDATE work.sqla_queue_job_executions "
                "SET alive_at = now() - interval '10 minutes' WHERE worker_id = :w"
            ),
            {"w": dead.worker_id},
        )
        before = connection.execute(_ROWS).all()

    # The library is now the version-2 release: autogenerate writes the step, as committed.
    command.revision(config, autogenerate=True, message="upgrade sqla_queue", rev_id="0003")
    [generated] = [p for p in project.revision_files() if p.name.startswith("0003")]
    where = "schema='work', prefix='sqla_queue_'"
    assert (
        op_calls(generated)
        == op_calls(COMMITTED_0003)
        == {
            "upgrade": [f"op.upgrade_queue(from_version=1, to_version=2, {where})"],
            "downgrade": [f"op.upgrade_queue(from_version=2, to_version=1, {where})"],
        }
    )

    project.alembic("upgrade", "head")

    with engine.begin() as connection:
        assert find_missing(connection, queue.tables) == ([], 2)
        assert connection.execute(_ROWS).all() == before
        slots = connection.execute(text("SELECT slot FROM work.sqla_queue_job_executions"))
        assert set(slots.scalars()) == {None}
        # An old worker keeps going after the step, with its own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 9
        assert mailer.succeed(connection, [mail], result=9) == [9]

    SessionLocal = sessionmaker(engine)

    def run_new_worker() -> None:
        # More threads than the limit: only the database's gate can keep reports at 2.
        worker = queue.worker(
            SessionLocal, concurrency=6, install_signal_handlers=False, poll_interval=0.05
        )
        worker.run(burst=True)

    # The old worker's two reports fill the limit: the new worker runs mail, no reports.
    run_new_worker()
    with engine.connect() as connection:
        states = _states(connection)
    assert states[lost.id] == ("succeeded", None, None)  # reclaimed from the dead worker
    assert states[10] == ("succeeded", None, None)
    assert [states[n] for n in (2, 3)] == [("queued", "running", None)] * 2
    assert [states[n] for n in range(4, 8)] == [("queued", "pending", None)] * 4

    # The old worker finishes its reports; its fenced completion still matches its rows.
    with engine.begin() as connection:
        assert reporter.succeed(connection, running, result="done by version 1") == [2, 3]

    run_new_worker()
    with engine.connect() as connection:
        states = _states(connection)
        results: dict[int, Any] = dict(
            connection.execute(
                text("SELECT id, result FROM work.sqla_queue_jobs WHERE task = 'render_report'")
            ).all()
        )
    engine.dispose()

    assert states == dict.fromkeys(range(1, 11), ("succeeded", None, None)), "a job was lost"
    assert results[2] == results[3] == "done by version 1"
    reports = [results[n] for n in range(4, 8)]
    assert sorted(r["report_id"] for r in reports) == [4, 5, 6, 7]
    assert {r["slot"] for r in reports} == set(range(REPORT_LIMIT))
    seen = [slots for r in reports for slots in r["seen"]]
    assert all(None not in slots and len(set(slots)) == len(slots) for slots in seen), seen
    # Never above the limit, and at the limit at some point: the cap, not chance, held it.
    assert max(len(slots) for slots in seen) == REPORT_LIMIT, seen
