"""The frozen SQL of each schema version, and of each step between versions, is the real thing.

``queue.create_all`` (and ``Base.metadata.create_all``) use the live models; migrations use
the frozen text in ``alembic_ext.versions``. While a version is the newest, the two must give
PostgreSQL the same schema, whatever the schema, prefix and naming convention. Every step
between released versions must take a live install there and back without losing a row.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, MetaData, text
from sqlalchemy.orm import sessionmaker

from alembic_ext import CreateQueueOp, DropQueueOp, UpgradeQueueOp, versions
from sqla_queue.logic.payload import make_payload
from sqla_queue.models.tables import SCHEMA_VERSION, build_tables
from sqla_queue.schema.ddl import create_queue_schema
from sqla_queue.schema.verify import inspect_schema
from tests.migration.catalog import differences, queue_objects, without_column_order
from tests.migration.conftest import engine_for, schema_snapshot
from tests.migration.hostapp.models import NAMING_CONVENTION, queue

pytestmark = pytest.mark.migration


def test_the_newest_frozen_version_is_the_models_version() -> None:
    assert versions.LATEST_VERSION == SCHEMA_VERSION
    assert versions.known_versions() == tuple(range(1, SCHEMA_VERSION + 1))


@pytest.mark.parametrize(
    ("schema", "prefix", "convention"),
    [
        (None, "sqla_queue_", None),
        ("work", "q_", NAMING_CONVENTION),
        # A reserved word: both sides must quote it.
        ("user", "sqla_queue_", None),
    ],
)
def test_create_queue_equals_create_all_through_the_catalog(
    new_db: Callable[[], str],
    schema: str | None,
    prefix: str,
    convention: dict[str, str] | None,
) -> None:
    by_migration, by_model = new_db(), new_db()
    engine = engine_for(by_migration)
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        operations.invoke(CreateQueueOp(schema, prefix, version=versions.LATEST_VERSION))
    engine.dispose()

    metadata = MetaData(naming_convention=convention) if convention else MetaData()
    tables = build_tables(metadata, schema=schema, prefix=prefix)
    engine = engine_for(by_model)
    with engine.begin() as connection:
        create_queue_schema(connection, tables)
    engine.dispose()

    schemas = (schema or "public",)
    migrated = schema_snapshot(by_migration, schemas)
    assert migrated["relations"], "nothing was created"
    assert differences(migrated, schema_snapshot(by_model, schemas)) == []

    engine = engine_for(by_migration)
    with engine.begin() as connection:
        report = inspect_schema(connection, tables)
        assert report.ok, report.problems(schema)
        assert report.version == versions.LATEST_VERSION
        Operations(MigrationContext.configure(connection)).invoke(
            DropQueueOp(schema, prefix, version=versions.LATEST_VERSION)
        )
        assert queue_objects(connection, prefix) == []
    engine.dispose()


def _seed_live_data(connection: Connection) -> None:
    """A finished job, a pending one and a running one, written as the version-1 columns allow."""
    payload = json.dumps(make_payload([5], {}))
    connection.execute(
        text(
            "INSERT INTO work.sqla_queue_jobs (id, task, payload, max_attempts, scheduled_at, "
            "status, finished_at) OVERRIDING SYSTEM VALUE VALUES "
            "(1, 'mail_invoice', CAST(:p AS jsonb), 1, now(), 'succeeded', now()), "
            "(2, 'mail_invoice', CAST(:p AS jsonb), 1, now(), 'queued', NULL), "
            "(3, 'mail_invoice', CAST(:p AS jsonb), 1, now(), 'queued', NULL)"
        ),
        {"p": payload},
    )
    connection.execute(
        text(
            "INSERT INTO work.sqla_queue_job_executions "
            "(id, task, priority, state, execute_at, attempt, worker_id, alive_at) VALUES "
            "(2, 'mail_invoice', 0, 'pending', now(), 0, NULL, NULL), "
            "(3, 'mail_invoice', 0, 'running', now(), 1, gen_random_uuid(), now())"
        )
    )


_ROWS = text(
    "SELECT j.id, j.status, e.state, e.attempt FROM work.sqla_queue_jobs j "
    "LEFT JOIN work.sqla_queue_job_executions e ON e.id = j.id ORDER BY j.id"
)


@pytest.mark.parametrize("from_version", sorted(versions._STEPS))
def test_each_step_keeps_live_data_and_lands_on_the_next_version(
    new_db: Callable[[], str], from_version: int
) -> None:
    """Every released step, on a database with pending, running and finished jobs."""
    check_step(new_db, from_version)


def test_every_released_version_has_a_tested_step() -> None:
    """The parametrization above covers each pair of neighbouring versions: 1-2, 2-3, ..."""
    assert sorted(versions._STEPS) == list(versions.known_versions()[:-1])
    assert 1 in versions._STEPS


@pytest.mark.parametrize(
    "extra",
    [
        "DELETE FROM work.sqla_queue_job_executions WHERE state = 'running'",
        "DROP INDEX work.sqla_queue_job_executions_slot_uq",
    ],
    ids=["loses rows", "leaves an object out"],
)
def test_the_step_check_catches_a_broken_step(
    new_db: Callable[[], str], monkeypatch: pytest.MonkeyPatch, extra: str
) -> None:
    """The check above fails on the real step 1-2 spoiled by one more statement."""
    honest = versions._STEPS[1]
    broken = versions._Step(
        upgrade=lambda schema, prefix: [*honest.upgrade(schema, prefix), extra],
        downgrade=honest.downgrade,
    )
    monkeypatch.setitem(versions._STEPS, 1, broken)
    with pytest.raises(AssertionError):
        check_step(new_db, 1)


def check_step(new_db: Callable[[], str], from_version: int) -> None:
    """Upgrade a live install one step and back; rows survive, each schema is the real one.

    Up: the rows are unchanged and the schema is the next version's, as a fresh
    ``create_queue`` of that version builds it (column order aside: a step appends columns).
    Down: the rows are still there and the schema is exactly the one the step started from.
    """
    to_version = from_version + 1
    upgraded, fresh = new_db(), new_db()
    engine = engine_for(upgraded)
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        operations.invoke(CreateQueueOp("work", "sqla_queue_", version=from_version))
        _seed_live_data(connection)
    engine.dispose()
    before_schema = schema_snapshot(upgraded)
    engine = engine_for(upgraded)
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        before = connection.execute(_ROWS).all()
        operations.invoke(UpgradeQueueOp(from_version, to_version, "work", "sqla_queue_"))
        assert connection.execute(_ROWS).all() == before
    engine.dispose()
    engine = engine_for(fresh)
    with engine.begin() as connection:
        Operations(MigrationContext.configure(connection)).invoke(
            CreateQueueOp("work", "sqla_queue_", version=to_version)
        )
    engine.dispose()

    assert (
        differences(
            without_column_order(schema_snapshot(upgraded)),
            without_column_order(schema_snapshot(fresh)),
        )
        == []
    )
    engine = engine_for(upgraded)
    if to_version == versions.LATEST_VERSION:
        # The newest library's workers carry on with the rows from before the upgrade.
        queue.worker(sessionmaker(engine), install_signal_handlers=False, poll_interval=0.05).run(
            burst=True
        )
        with engine.connect() as connection:
            rows = connection.execute(_ROWS).all()
        assert [tuple(r)[:2] for r in rows] == [(1, "succeeded"), (2, "succeeded"), (3, "queued")]

    with engine.begin() as connection:
        before = connection.execute(_ROWS).all()
        Operations(MigrationContext.configure(connection)).invoke(
            UpgradeQueueOp(to_version, from_version, "work", "sqla_queue_")
        )
        assert connection.execute(_ROWS).all() == before
    engine.dispose()
    assert differences(schema_snapshot(upgraded), before_schema) == []


def test_the_step_down_from_7_makes_suspended_jobs_pending_and_drops_their_steps(
    new_db: Callable[[], str],
) -> None:
    """Version 6 has no ``suspended`` state: its workers must be able to run such a job."""
    engine = engine_for(new_db())
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        operations.invoke(CreateQueueOp("work", "sqla_queue_", version=7))
        _seed_live_data(connection)
        connection.execute(
            text(
                "UPDATE work.sqla_queue_job_executions SET state = 'suspended', "
                "wait = 'signal:approved', execute_at = now() + interval '1 day' WHERE id = 2"
            )
        )
        connection.execute(
            text(
                "INSERT INTO work.sqla_queue_job_steps (job_id, name, kind, attempt) "
                "VALUES (2, 'charge', 'step', 1)"
            )
        )
        connection.execute(
            text("INSERT INTO work.sqla_queue_job_signals (job_id, name) VALUES (2, 'approved')")
        )
        operations.invoke(UpgradeQueueOp(7, 6, "work", "sqla_queue_"))
        due = connection.execute(
            text("SELECT execute_at <= now() FROM work.sqla_queue_job_executions WHERE id = 2")
        ).scalar_one()
        rows = connection.execute(_ROWS).all()
        tables = connection.execute(
            text(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'work' "
                "AND tablename IN ('sqla_queue_job_steps', 'sqla_queue_job_signals')"
            )
        ).scalar_one()
    engine.dispose()
    assert [tuple(r) for r in rows] == [
        (1, "succeeded", None, None),
        (2, "queued", "pending", 0),
        (3, "queued", "running", 1),
    ]
    assert due is True
    assert tables == 0
