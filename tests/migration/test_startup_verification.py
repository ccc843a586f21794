"""A worker checks the schema in one catalog query and refuses to start on a broken one."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import sessionmaker

from sqla_queue import SchemaMismatchError
from sqla_queue.models.tables import SCHEMA_VERSION
from sqla_queue.schema.verify import inspect_schema
from tests.migration.conftest import HostProject, engine_for, run_cli
from tests.migration.hostapp.models import mail_invoice, queue

pytestmark = pytest.mark.migration

CLAIM_INDEX = "work.sqla_queue_job_executions_task_claim_ix"


@pytest.fixture
def upgraded(history_project: HostProject) -> Iterator[Engine]:
    """The host's database after ``alembic upgrade head``."""
    command.upgrade(history_project.config(), "head")
    engine = engine_for(history_project.url)
    yield engine
    engine.dispose()


def test_worker_refuses_to_start_without_one_index_and_claims_nothing(upgraded: Engine) -> None:
    SessionLocal = sessionmaker(upgraded)
    with SessionLocal.begin() as session:
        job_id = mail_invoice.enqueue(session, 7)
    with upgraded.begin() as connection:
        connection.execute(text(f"DROP INDEX {CLAIM_INDEX}"))

    worker = queue.worker(SessionLocal, install_signal_handlers=False, poll_interval=0.05)
    with pytest.raises(SchemaMismatchError) as refused:
        worker.run(burst=True)

    message = str(refused.value)
    assert f"index {CLAIM_INDEX}" in message
    assert "alembic upgrade head" in message
    assert (
        f"the database has schema version {SCHEMA_VERSION}, "
        f"this library needs schema version {SCHEMA_VERSION}"
    ) in message
    assert refused.value.missing == [f"index {CLAIM_INDEX} (on sqla_queue_job_executions)"]
    executions = queue.tables.executions
    with upgraded.connect() as connection:
        row = connection.execute(
            select(executions.c.state, executions.c.attempt, executions.c.worker_id).where(
                executions.c.id == job_id
            )
        ).one()
    assert tuple(row) == ("pending", 0, None)


def test_cli_verify_names_the_missing_index(upgraded: Engine, history_project: HostProject) -> None:
    argv = [sys.executable, "-m", "sqla_queue", "verify", "tests.migration.hostapp.models:queue"]
    argv += ["--url", history_project.url]
    with upgraded.begin() as connection:
        connection.execute(text(f"DROP INDEX {CLAIM_INDEX}"))
    failed = run_cli(argv, history_project.root, check=False)

    assert failed.returncode == 2
    assert f"index {CLAIM_INDEX}" in failed.stderr
    assert "alembic upgrade head" in failed.stderr


def test_an_index_with_the_right_name_but_another_shape_is_refused(upgraded: Engine) -> None:
    with upgraded.begin() as connection:
        connection.execute(text("DROP INDEX work.sqla_queue_job_executions_queue_running_uq"))
        # Same name, not unique: one queue_id could then run twice at once.
        connection.execute(
            text(
                "CREATE INDEX sqla_queue_job_executions_queue_running_uq "
                "ON work.sqla_queue_job_executions (queue_id) WHERE state = 'running'"
            )
        )
        connection.execute(text("ALTER TABLE work.sqla_queue_jobs ALTER COLUMN task DROP NOT NULL"))
        report = inspect_schema(connection, queue.tables)
        with pytest.raises(SchemaMismatchError) as refused:
            queue.verify(connection)

    assert report.missing == []
    assert sorted((obj.name, found) for obj, found in report.different) == [
        ("sqla_queue_job_executions_queue_running_uq", "queue_id where state = 'running'"),
        ("task", "text null"),
    ]
    message = str(refused.value)
    assert (
        "expected \"unique queue_id where state = 'running' and queue_id is not null\"" in message
    )
    assert "column work.sqla_queue_jobs.task: expected 'text not null'" in message


def test_a_database_without_the_queue_names_every_table_and_the_fix(
    history_project: HostProject,
) -> None:
    command.upgrade(history_project.config(), "0001")  # the host's tables, no queue yet
    engine = engine_for(history_project.url)
    with engine.connect() as connection, pytest.raises(SchemaMismatchError) as refused:
        queue.verify(connection)
    engine.dispose()

    message = str(refused.value)
    assert "the database has no queue tables" in message
    assert "table work.sqla_queue_jobs" in message
    assert "table work.sqla_queue_job_executions" in message
    assert "table work.sqla_queue_task_limits" in message
    assert "table work.sqla_queue_unique_keys" in message
    assert "table work.sqla_queue_task_controls" in message
    assert "table work.sqla_queue_rate_starts" in message
    assert "table work.sqla_queue_schedules" in message
    assert "table work.sqla_queue_daemons" in message
    assert "table work.sqla_queue_workers" in message
    assert "table work.sqla_queue_workflows" in message
    assert "table work.sqla_queue_workflow_nodes" in message
    assert "table work.sqla_queue_workflow_edges" in message
    assert "table work.sqla_queue_job_steps" in message
    assert "table work.sqla_queue_job_signals" in message
    assert "alembic upgrade head" in message
    assert len(refused.value.missing) == 14  # one line per table, not one per column


# A job as every release up to version 6 wrote it (the columns they all have).
_OLD_RELEASE_ENQUEUE = text(
    "WITH job AS (INSERT INTO work.sqla_queue_jobs (task, payload, max_attempts, scheduled_at) "
    """VALUES ('mail_invoice', '{"args": [7], "kwargs": {}}', 1, now()) RETURNING id, task) """
    "INSERT INTO work.sqla_queue_job_executions (id, task, priority, execute_at) "
    "SELECT id, task, 0, now() FROM job RETURNING id"
)
_ADDED_BY_VERSION_7 = [
    "column work.sqla_queue_job_executions.wait",
    "index work.sqla_queue_job_executions_suspended_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_wait_ix (on sqla_queue_job_executions)",
    "table work.sqla_queue_job_signals (with its columns, indexes and constraints)",
    "table work.sqla_queue_job_steps (with its columns, indexes and constraints)",
]
_ADDED_BY_VERSION_6 = [
    "column work.sqla_queue_job_executions.workflow",
    "table work.sqla_queue_workflow_edges (with its columns, indexes and constraints)",
    "table work.sqla_queue_workflow_nodes (with its columns, indexes and constraints)",
    "table work.sqla_queue_workflows (with its columns, indexes and constraints)",
]
_ADDED_BY_VERSION_5 = [
    "index work.sqla_queue_job_executions_task_waiting_ix (on sqla_queue_job_executions)",
    "table work.sqla_queue_daemons (with its columns, indexes and constraints)",
    "table work.sqla_queue_rate_starts (with its columns, indexes and constraints)",
    "table work.sqla_queue_schedules (with its columns, indexes and constraints)",
    "table work.sqla_queue_task_controls (with its columns, indexes and constraints)",
    "table work.sqla_queue_workers (with its columns, indexes and constraints)",
]
_ADDED_BY_VERSION_4 = [
    "column work.sqla_queue_job_executions.cancel_requested",
    "column work.sqla_queue_jobs.about_key",
    "column work.sqla_queue_jobs.about_table",
    "column work.sqla_queue_jobs.awaited",
    "column work.sqla_queue_jobs.unique_key",
    "index work.sqla_queue_jobs_about_ix (on sqla_queue_jobs)",
    "index work.sqla_queue_jobs_unique_key_ix (on sqla_queue_jobs)",
    "table work.sqla_queue_unique_keys (with its columns, indexes and constraints)",
]
_ADDED_BY_VERSION_3 = [
    "index work.sqla_queue_job_executions_done_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_queue_active_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_waiting_ix (on sqla_queue_job_executions)",
]
_ADDED_BY_VERSION_2 = [
    "column work.sqla_queue_job_executions.slot",
    "index work.sqla_queue_job_executions_seated_ix (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_slot_uq (on sqla_queue_job_executions)",
    "index work.sqla_queue_job_executions_task_claim_ix (on sqla_queue_job_executions)",
    "table work.sqla_queue_task_limits (with its columns, indexes and constraints)",
]


@pytest.mark.parametrize(
    ("revision", "old_version", "missing"),
    [
        (
            "0002",
            1,
            sorted(
                _ADDED_BY_VERSION_2
                + _ADDED_BY_VERSION_3
                + _ADDED_BY_VERSION_4
                + _ADDED_BY_VERSION_5
                + _ADDED_BY_VERSION_6
                + _ADDED_BY_VERSION_7
            ),
        ),
        (
            "0003",
            2,
            sorted(
                _ADDED_BY_VERSION_3
                + _ADDED_BY_VERSION_4
                + _ADDED_BY_VERSION_5
                + _ADDED_BY_VERSION_6
                + _ADDED_BY_VERSION_7
            ),
        ),
        (
            "0004",
            3,
            sorted(
                _ADDED_BY_VERSION_4
                + _ADDED_BY_VERSION_5
                + _ADDED_BY_VERSION_6
                + _ADDED_BY_VERSION_7
            ),
        ),
        ("0005", 4, sorted(_ADDED_BY_VERSION_5 + _ADDED_BY_VERSION_6 + _ADDED_BY_VERSION_7)),
        ("0006", 5, sorted(_ADDED_BY_VERSION_6 + _ADDED_BY_VERSION_7)),
        ("0007", 6, _ADDED_BY_VERSION_7),
    ],
    ids=["version-1", "version-2", "version-3", "version-4", "version-5", "version-6"],
)
def test_a_worker_refuses_an_older_database_and_names_the_step(
    history_project: HostProject, revision: str, old_version: int, missing: list[str]
) -> None:
    """Started before the migration: it names what the newer versions add, claims nothing."""
    command.upgrade(history_project.config(), revision)  # the queue as that release left it
    engine = engine_for(history_project.url)
    SessionLocal = sessionmaker(engine)
    # Enqueued by that release's producer: this library's enqueue writes what later
    # versions added, so it cannot run before the migration either.
    with engine.begin() as connection:
        job_id = connection.execute(_OLD_RELEASE_ENQUEUE).scalar_one()

    worker = queue.worker(SessionLocal, install_signal_handlers=False, poll_interval=0.05)
    with pytest.raises(SchemaMismatchError) as refused:
        worker.run(burst=True)

    assert sorted(refused.value.missing) == missing
    message = str(refused.value)
    assert (
        f"the database has schema version {old_version}, "
        f"this library needs schema version {SCHEMA_VERSION}"
    ) in message
    assert "run `alembic upgrade head`" in message
    assert f"op.upgrade_queue(from_version={old_version}, to_version={SCHEMA_VERSION}, ...)" in (
        message
    )
    # create_all skips tables that exist, so it cannot add their columns or indexes: it must
    # not be offered as the fix.
    assert "create_all" not in message
    with engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT state, attempt, worker_id FROM work.sqla_queue_job_executions "
                "WHERE id = :id"
            ),
            {"id": job_id},
        ).one()
    engine.dispose()
    assert tuple(row) == ("pending", 0, None)


def test_verify_is_one_catalog_round_trip(upgraded: Engine) -> None:
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(upgraded, "before_cursor_execute", count)
    try:
        with upgraded.connect() as connection:
            queue.verify(connection)
    finally:
        event.remove(upgraded, "before_cursor_execute", count)
    assert len([s for s in statements if "pg_catalog" in s]) == 1
