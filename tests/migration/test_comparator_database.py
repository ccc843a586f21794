"""The autogenerate comparator against a real database, without an env.py in between."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import produce_migrations
from alembic.operations import MigrateOperation, Operations
from alembic.operations.ops import CreateTableOp, DropTableOp, ModifyTableOps
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, Integer, MetaData, Table, func, insert, select, text
from sqlalchemy.engine import Engine

import alembic_ext
from alembic_ext import CreateQueueOp, DropQueueOp, UpgradeQueueOp, _registration, versions
from alembic_ext.compare import QueueSchemaWarning
from sqla_queue.models.tables import QueueTables, build_tables
from sqla_queue.schema.verify import find_missing
from tests.migration.catalog import queue_objects
from tests.migration.conftest import engine_for

pytestmark = pytest.mark.migration


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    """An empty database."""
    eng = engine_for(empty_db_url)
    yield eng
    eng.dispose()


def host_metadata(*queues: tuple[str | None, str]) -> tuple[MetaData, list[QueueTables]]:
    """A host metadata with one table of its own and the given (schema, prefix) queues."""
    metadata = MetaData()
    Table("accounts", metadata, Column("id", Integer, primary_key=True))
    return metadata, [build_tables(metadata, schema=s, prefix=p) for s, p in queues]


def autogenerate(connection: Connection, metadata: MetaData, **opts: Any) -> list[MigrateOperation]:
    """The top-level operations autogenerate proposes."""
    context = MigrationContext.configure(connection, opts={"target_metadata": metadata, **opts})
    script = produce_migrations(context, metadata)
    assert script.upgrade_ops is not None
    return list(script.upgrade_ops.ops)


def apply(connection: Connection, *ops: MigrateOperation) -> None:
    """Run operations as a migration would."""
    operations = Operations(MigrationContext.configure(connection))
    for op in ops:
        operations.invoke(op)


def table_names(ops: list[MigrateOperation]) -> set[str]:
    """Tables that Alembic's own table operations touch."""
    return {
        op.table_name for op in ops if isinstance(op, CreateTableOp | DropTableOp | ModifyTableOps)
    }


def test_empty_database_gets_one_create_queue_first_and_the_host_table(engine: Engine) -> None:
    metadata, _ = host_metadata((None, "sqla_queue_"))
    with engine.connect() as connection:
        ops = autogenerate(connection, metadata)

    assert ops[0] == CreateQueueOp(None, "sqla_queue_", version=versions.LATEST_VERSION)
    assert table_names(ops) == {"accounts"}
    assert sum(isinstance(op, CreateQueueOp) for op in ops) == 1


def test_alembic_never_sees_the_queue_tables(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    metadata, _ = host_metadata(("work", "sqla_queue_"))
    with caplog.at_level(logging.INFO, logger="alembic"), engine.connect() as connection:
        ops = autogenerate(connection, metadata, include_schemas=True)
    assert ops[0] == CreateQueueOp("work", "sqla_queue_", version=versions.LATEST_VERSION)
    alembic_said = [r.getMessage() for r in caplog.records if r.name.startswith("alembic.")]
    assert any("'accounts'" in line for line in alembic_said)
    assert not any("sqla_queue_" in line for line in alembic_said)


def test_proposals_that_get_past_the_hiding_hook_are_still_replaced(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As on Alembic < 1.18 or if Alembic drops its filter lists: the second hook suffices."""
    monkeypatch.setattr(_registration, "hide_queue_tables", lambda *args: None)
    metadata, _ = host_metadata(("work", "sqla_queue_"))
    with caplog.at_level(logging.INFO, logger="alembic"), engine.connect() as connection:
        ops = autogenerate(connection, metadata, include_schemas=True)
    assert any("sqla_queue_jobs" in r.getMessage() for r in caplog.records)  # Alembic saw it
    assert any("sqla_queue_task_limits" in r.getMessage() for r in caplog.records)
    assert any("sqla_queue_unique_keys" in r.getMessage() for r in caplog.records)
    assert any("sqla_queue_daemons" in r.getMessage() for r in caplog.records)
    assert ops[0] == CreateQueueOp("work", "sqla_queue_", version=versions.LATEST_VERSION)
    assert table_names(ops) == {"accounts"}


def test_without_alembic_ext_alembic_would_create_the_queue_tables_itself(
    engine: Engine,
) -> None:
    """The control experiment: the comparator is what keeps create_table away."""
    metadata, _ = host_metadata((None, "sqla_queue_"))
    alembic_ext.uninstall()
    try:
        with engine.connect() as connection:
            ops = autogenerate(connection, metadata)
    finally:
        alembic_ext.install()
    assert {
        "sqla_queue_jobs",
        "sqla_queue_job_executions",
        "sqla_queue_task_limits",
        "sqla_queue_unique_keys",
        "sqla_queue_task_controls",
        "sqla_queue_rate_starts",
        "sqla_queue_schedules",
        "sqla_queue_daemons",
        "sqla_queue_workers",
        "sqla_queue_workflows",
        "sqla_queue_workflow_nodes",
        "sqla_queue_workflow_edges",
        "sqla_queue_job_steps",
        "sqla_queue_job_signals",
    } <= table_names(ops)
    assert not any(isinstance(op, CreateQueueOp) for op in ops)


@pytest.mark.parametrize("schema", [None, "work"])
def test_after_create_queue_nothing_is_proposed(engine: Engine, schema: str | None) -> None:
    metadata, _ = host_metadata((schema, "sqla_queue_"))
    with engine.begin() as connection:
        apply(connection, *autogenerate(connection, metadata, include_schemas=True))
    with engine.connect() as connection:
        assert autogenerate(connection, metadata, include_schemas=True) == []
        assert autogenerate(connection, metadata, include_schemas=False) == []


def test_two_queues_in_one_metadata_and_a_list_of_metadata(engine: Engine) -> None:
    metadata, _ = host_metadata(("work", "a_"), ("work", "b_"))
    other = MetaData()
    Table("ledger", other, Column("id", Integer, primary_key=True))
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"target_metadata": [metadata, other], "include_schemas": True}
        )
        # Alembic accepts a sequence of MetaData here, though its annotation says one.
        script = produce_migrations(context, [metadata, other])  # type: ignore[arg-type]
    assert script.upgrade_ops is not None
    ops = script.upgrade_ops.ops
    assert ops[:2] == [
        CreateQueueOp("work", "a_", version=versions.LATEST_VERSION),
        CreateQueueOp("work", "b_", version=versions.LATEST_VERSION),
    ]
    assert table_names(ops) == {"accounts", "ledger"}


def test_host_filters_decide_for_the_queue_tables(engine: Engine) -> None:
    metadata, _ = host_metadata(("work", "sqla_queue_"))

    def no_queue_objects(obj: Any, name: str | None, type_: str, *_: Any) -> bool:
        return not (type_ == "table" and str(name).startswith("sqla_queue_"))

    def only_default_schema(name: str | None, type_: str, parents: Any) -> bool:
        return type_ != "schema" or name is None

    with engine.connect() as connection:
        by_object = autogenerate(connection, metadata, include_object=no_queue_objects)
        by_name = autogenerate(
            connection, metadata, include_schemas=True, include_name=only_default_schema
        )
    assert not any(isinstance(op, CreateQueueOp) for op in by_object)
    assert table_names(by_object) == {"accounts"}
    assert not any(isinstance(op, CreateQueueOp) for op in by_name)


def test_a_filter_written_for_version_1_leaves_the_whole_queue_alone(engine: Engine) -> None:
    """A filter naming only the two version-1 tables: task_limits must not turn into
    create_table, and no create_queue may touch the tables the filter excludes."""
    metadata, _ = host_metadata(("work", "sqla_queue_"))
    version_1_tables = {"sqla_queue_jobs", "sqla_queue_job_executions"}

    def not_the_queue(obj: Any, name: str | None, type_: str, *_: Any) -> bool:
        return not (type_ == "table" and name in version_1_tables)

    with engine.connect() as connection:
        ops = autogenerate(connection, metadata, include_object=not_the_queue)
    assert not any(isinstance(op, CreateQueueOp) for op in ops)
    assert table_names(ops) == {"accounts"}


@pytest.mark.parametrize(
    ("schema", "include_schemas", "version"),
    [(None, False, 2), ("work", True, 2), ("work", True, versions.LATEST_VERSION)],
)
def test_a_queue_removed_from_the_metadata_is_dropped_by_drop_queue(
    engine: Engine, schema: str | None, include_schemas: bool, version: int
) -> None:
    with engine.begin() as connection:
        apply(connection, CreateQueueOp(schema, "sqla_queue_", version=version))
    metadata, _ = host_metadata()
    with engine.connect() as connection:
        ops = autogenerate(connection, metadata, include_schemas=include_schemas)
    # One drop_queue at the queue's version owns all of its tables: no drop_table of
    # task_limits (version 2), unique_keys (version 4) or the tables of versions 5, 6 and 7
    # is left.
    assert ops[-1] == DropQueueOp(schema, "sqla_queue_", version=version)
    assert table_names(ops) == {"accounts"}
    with engine.begin() as connection:
        apply(connection, ops[-1])
        assert queue_objects(connection, "sqla_queue_") == []


def _seed(connection: Connection, tables: QueueTables) -> None:
    """A finished job, a pending and a running execution."""
    jobs, executions = tables.jobs, tables.executions
    rows = [
        {"task": "t", "payload": {}, "max_attempts": 1, "scheduled_at": func.now()}
        for _ in range(3)
    ]
    ids = [
        connection.execute(insert(jobs).values(**row).returning(jobs.c.id)).scalar_one()
        for row in rows
    ]
    connection.execute(
        jobs.update().where(jobs.c.id == ids[0]).values(status="succeeded", finished_at=func.now())
    )
    for job_id, state in ((ids[1], "pending"), (ids[2], "running")):
        connection.execute(
            insert(executions).values(
                id=job_id, task="t", priority=0, state=state, execute_at=func.now()
            )
        )


def _rows(connection: Connection, tables: QueueTables) -> list[tuple[Any, ...]]:
    jobs, executions = tables.jobs, tables.executions
    query = (
        select(jobs.c.id, jobs.c.status, executions.c.state)
        .outerjoin(executions, executions.c.id == jobs.c.id)
        .order_by(jobs.c.id)
    )
    return [tuple(row) for row in connection.execute(query)]


# What each version adds to the tables that exist before it, as a worker checks at start.
_ADDED_BY_VERSION = {
    2: {
        ("column", "slot"),
        ("index", "sqla_queue_job_executions_slot_uq"),
        ("index", "sqla_queue_job_executions_task_claim_ix"),
        ("index", "sqla_queue_job_executions_seated_ix"),
    },
    3: {
        ("index", "sqla_queue_job_executions_queue_active_ix"),
        ("index", "sqla_queue_job_executions_waiting_ix"),
        ("index", "sqla_queue_job_executions_done_ix"),
    },
    4: {
        ("column", "unique_key"),
        ("column", "about_table"),
        ("column", "about_key"),
        ("column", "awaited"),
        ("index", "sqla_queue_jobs_about_ix"),
        ("index", "sqla_queue_jobs_unique_key_ix"),
        ("column", "cancel_requested"),
    },
    5: {
        ("index", "sqla_queue_job_executions_task_waiting_ix"),
    },
    6: {
        ("column", "workflow"),
    },
    7: {
        ("column", "wait"),
        ("index", "sqla_queue_job_executions_suspended_ix"),
        ("index", "sqla_queue_job_executions_wait_ix"),
    },
}
# The tables each version adds, with all their columns, indexes and constraints.
_TABLES_ADDED_BY_VERSION = {
    2: {"sqla_queue_task_limits"},
    4: {"sqla_queue_unique_keys"},
    5: {
        "sqla_queue_task_controls",
        "sqla_queue_rate_starts",
        "sqla_queue_schedules",
        "sqla_queue_daemons",
        "sqla_queue_workers",
    },
    6: {
        "sqla_queue_workflows",
        "sqla_queue_workflow_nodes",
        "sqla_queue_workflow_edges",
    },
    7: {"sqla_queue_job_steps", "sqla_queue_job_signals"},
}


@pytest.mark.parametrize("old_version", [1, 2, 3, 4, 5, 6])
def test_an_older_database_gets_one_upgrade_queue_to_the_latest_and_keeps_its_rows(
    engine: Engine, old_version: int
) -> None:
    latest = versions.LATEST_VERSION
    metadata, [tables] = host_metadata(("work", "sqla_queue_"))
    with engine.begin() as connection:
        apply(connection, CreateQueueOp("work", "sqla_queue_", version=old_version))
        _seed(connection, tables)
        before = _rows(connection, tables)

    with engine.connect() as connection:
        ops = autogenerate(connection, metadata, include_schemas=True)
    assert ops[0] == UpgradeQueueOp(old_version, latest, "work", "sqla_queue_")
    assert not any(isinstance(op, CreateQueueOp) for op in ops)
    assert table_names(ops) == {"accounts"}

    with engine.begin() as connection:
        missing, version = find_missing(connection, tables)
        assert version == old_version
        newer = range(old_version + 1, latest + 1)
        new_tables = set().union(*(_TABLES_ADDED_BY_VERSION.get(v, set()) for v in newer))
        assert {m.table for m in missing if m.kind == "table"} == new_tables
        added = set().union(*(_ADDED_BY_VERSION[v] for v in newer))
        assert {(m.kind, m.name) for m in missing if m.table not in new_tables} == added
        apply(connection, ops[0])
        assert _rows(connection, tables) == before
        assert find_missing(connection, tables) == ([], latest)
        slots = connection.execute(text("SELECT count(slot) FROM work.sqla_queue_job_executions"))
        assert slots.scalar_one() == 0
    with engine.connect() as connection:
        again = autogenerate(connection, metadata, include_schemas=True)
    assert table_names(again) == {"accounts"}
    assert not any(isinstance(op, UpgradeQueueOp | CreateQueueOp) for op in again)

    with engine.begin() as connection:
        apply(connection, ops[0].reverse())
        assert _rows(connection, tables) == before
        assert find_missing(connection, tables)[1] == old_version


def test_unrecognised_or_newer_versions_are_left_alone_with_a_warning(engine: Engine) -> None:
    metadata, _ = host_metadata((None, "sqla_queue_"))
    with engine.begin() as connection:
        apply(connection, CreateQueueOp(None, "sqla_queue_", version=1))
        connection.execute(text("COMMENT ON TABLE sqla_queue_job_executions IS 'mine'"))
        with pytest.warns(QueueSchemaWarning, match="no schema version comment"):
            assert table_names(autogenerate(connection, metadata)) == {"accounts"}
        connection.execute(
            text("COMMENT ON TABLE sqla_queue_job_executions IS 'sqla_queue schema version 99'")
        )
        with pytest.warns(QueueSchemaWarning, match="newer than this library"):
            ops = autogenerate(connection, metadata)
        assert table_names(ops) == {"accounts"}
        assert not any(isinstance(op, UpgradeQueueOp | CreateQueueOp) for op in ops)
