"""The table roles, the builder of each table, and how ``build_tables`` composes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import MetaData, Table
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from sqla_queue.models import builders
from sqla_queue.models import durable as durable_tables
from sqla_queue.models.partitioning import (
    DEFAULT_INTERVAL,
    INTERVALS,
    HistoryNames,
    check_interval,
    interval_comment,
    parse_interval_comment,
    structure_statements,
)
from sqla_queue.models.tables import TABLE_ROLES, QueueTables, build_tables

pytestmark = pytest.mark.unit

DIALECT = postgresql.psycopg.dialect()

#: Each role's builder and the suffix of its table's name.
BUILDERS: dict[str, tuple[Callable[[MetaData, str | None, str], Table], str]] = {
    "jobs": (builders.jobs_table, "jobs"),
    "executions": (builders.executions_table, "job_executions"),
    "limits": (builders.limits_table, "task_limits"),
    "unique_keys": (builders.unique_keys_table, "unique_keys"),
    "controls": (builders.controls_table, "task_controls"),
    "rate_starts": (builders.rate_starts_table, "rate_starts"),
    "schedules": (builders.schedules_table, "schedules"),
    "daemons": (builders.daemons_table, "daemons"),
    "workers": (builders.workers_table, "workers"),
    "workflows": (builders.workflows_table, "workflows"),
    "workflow_nodes": (builders.workflow_nodes_table, "workflow_nodes"),
    "workflow_edges": (builders.workflow_edges_table, "workflow_edges"),
    "job_steps": (durable_tables.job_steps_table, "job_steps"),
    "job_signals": (durable_tables.job_signals_table, "job_signals"),
}


def _ddl(table: Table) -> list[str]:
    """The table's CREATE TABLE and CREATE INDEX statements, indexes by name."""
    indexes = sorted(table.indexes, key=lambda index: str(index.name))
    return [str(CreateTable(table).compile(dialect=DIALECT))] + [
        str(CreateIndex(index).compile(dialect=DIALECT)) for index in indexes
    ]


def test_the_roles_are_the_table_fields_of_queue_tables_in_creation_order() -> None:
    assert tuple(BUILDERS) == TABLE_ROLES
    assert len(builders.__all__) + len(durable_tables.__all__) == len(TABLE_ROLES)


@pytest.mark.parametrize("role", TABLE_ROLES)
def test_each_builder_adds_its_own_table_named_by_the_prefix(role: str) -> None:
    builder, suffix = BUILDERS[role]
    metadata = MetaData()

    table = builder(metadata, "app", "q_")

    assert table.name == f"q_{suffix}"
    assert table.schema == "app"
    assert list(metadata.tables) == [f"app.q_{suffix}"]
    assert table.comment is not None and table.comment.startswith("sqla_queue")
    named = [*table.constraints, *table.indexes]
    assert all(str(item.name).startswith(f"q_{suffix}_") for item in named if item.name)


@pytest.mark.parametrize("schema", [None, "app"])
def test_build_tables_is_the_builders_composed(schema: str | None) -> None:
    metadata = MetaData()
    tables = build_tables(metadata, schema=schema, prefix="q_")

    assert tables.all == tuple(getattr(tables, role) for role in TABLE_ROLES)
    assert list(metadata.tables.values()) == list(tables.all)
    for role, table in zip(TABLE_ROLES, tables.all, strict=True):
        builder, _suffix = BUILDERS[role]
        assert _ddl(table) == _ddl(builder(MetaData(), schema, "q_"))
        assert table.info["sqla_queue"] == {
            "schema_version": tables.executions.info["sqla_queue"]["schema_version"],
            "prefix": "q_",
            "schema": schema,
            "history": "plain",
            "role": role,
        }
    assert metadata.info["sqla_queue"] == [tables]


def test_queue_tables_from_roles_takes_each_role_and_nothing_else() -> None:
    tables = build_tables(MetaData(), schema="app", prefix="q_", history="partitioned")
    roles: dict[str, Any] = {role: getattr(tables, role) for role in TABLE_ROLES}

    copy = QueueTables.from_roles(
        {**roles, "stranger": object()}, schema="app", prefix="q_", history="partitioned"
    )

    assert copy == tables
    del roles["workers"]
    with pytest.raises(KeyError, match="workers"):
        QueueTables.from_roles(roles, schema="app", prefix="q_")


class _Recorder:
    """A connection that records the DDL run on it."""

    def __init__(self, translate: dict[str | None, str | None] | None = None) -> None:
        self.options = {"schema_translate_map": translate} if translate else {}
        self.statements: list[str] = []

    def get_execution_options(self) -> dict[str, Any]:
        return self.options

    def exec_driver_sql(self, statement: str) -> None:
        self.statements.append(statement)


def test_a_partitioned_jobs_table_creates_its_partitions_after_itself() -> None:
    tables = build_tables(MetaData(), schema="app", prefix="q_", history="partitioned")
    ddl = str(CreateTable(tables.jobs).compile(dialect=DIALECT))
    assert "PARTITION BY LIST (status)" in ddl
    assert "PRIMARY KEY" not in ddl
    assert tables.jobs.primary_key.name == "q_jobs_pkey"  # kept for the ORM

    plain = _Recorder()
    tables.jobs.dispatch.after_create(tables.jobs, plain)
    tenant = _Recorder({"app": "tenant_1"})
    tables.jobs.dispatch.after_create(tables.jobs, tenant)

    assert plain.statements == structure_statements(HistoryNames.for_jobs("q_jobs", "app"))
    assert tenant.statements == structure_statements(HistoryNames.for_jobs("q_jobs", "tenant_1"))


def test_a_plain_jobs_table_has_its_key_and_no_partitions() -> None:
    tables = build_tables(MetaData(), prefix="q_")
    ddl = str(CreateTable(tables.jobs).compile(dialect=DIALECT))
    assert "CONSTRAINT q_jobs_pkey PRIMARY KEY (id)" in ddl
    assert "PARTITION" not in ddl
    recorder = _Recorder()
    tables.jobs.dispatch.after_create(tables.jobs, recorder)
    assert recorder.statements == []


def test_the_interval_comment_reads_back_and_defaults_to_a_day() -> None:
    for interval in INTERVALS:
        assert parse_interval_comment(interval_comment(interval)) == interval
    assert parse_interval_comment(None) == DEFAULT_INTERVAL == "day"
    assert parse_interval_comment("something else") == DEFAULT_INTERVAL
    with pytest.raises(ValueError, match="hour, day, week, month"):
        check_interval("year")


def test_history_names_follow_the_jobs_table() -> None:
    names = HistoryNames.for_jobs("q_jobs", "App")
    assert (names.live, names.done, names.failed) == ("q_jobs_live", "q_jobs_done", "q_jobs_failed")
    assert names.qualified(names.done) == '"App".q_jobs_done'
    assert HistoryNames.for_jobs("q_jobs", None).qualified("q_jobs") == "q_jobs"
    assert names.default_of(names.failed) == "q_jobs_failed_default"
