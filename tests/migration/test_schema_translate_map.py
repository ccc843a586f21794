"""Tenant schemas through ``schema_translate_map``: the models name a placeholder schema.

A multi-tenant host declares its tables (and its Queue) in a placeholder schema, ``tenant``
here, and translates it per connection: ``engine.execution_options(schema_translate_map=
{"tenant": "tenant_a"})``. SQLAlchemy applies the map to every statement it compiles from
the tables. Whatever names the schema in text must apply it too: the queue operations'
frozen DDL, autogenerate's catalog query, the startup check, and the worker's psycopg raw
statements (compiled once, outside SQLAlchemy's execution).

The matrix in ``test_host_conventions.py`` runs the whole story on a host project; these
tests pin each part on its own, in process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, MetaData, create_engine, inspect, select
from sqlalchemy.orm import DeclarativeBase, sessionmaker
from sqlalchemy.pool import NullPool

import alembic_ext  # noqa: F401  (registers the operations)
from alembic_ext.versions import LATEST_VERSION
from sqla_queue import Queue

pytestmark = pytest.mark.migration

PLACEHOLDER = "tenant"
QUEUE_TABLES = {
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
}


def _tenant_queue() -> Queue:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=PLACEHOLDER)

    queue = Queue(Base)

    @queue.task(name="double")
    def double(n: int) -> int:
        return 2 * n

    return queue


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    """An untranslated engine on an empty database."""
    eng = create_engine(empty_db_url, poolclass=NullPool)
    yield eng
    eng.dispose()


def _tenant(engine: Engine, name: str) -> Engine:
    return engine.execution_options(schema_translate_map={PLACEHOLDER: name})


def _operations(connection: Connection) -> Any:
    return Operations(MigrationContext.configure(connection))


def _create_queue(engine: Engine, tenant: str | None) -> None:
    target = engine if tenant is None else _tenant(engine, tenant)
    with target.begin() as connection:
        _operations(connection).create_queue(schema=PLACEHOLDER, version=LATEST_VERSION)


def _tables(engine: Engine, schema: str) -> set[str]:
    with engine.connect() as connection:
        return set(inspect(connection).get_table_names(schema=schema)) & QUEUE_TABLES


def test_queue_operations_follow_the_connections_translate_map(engine: Engine) -> None:
    _create_queue(engine, "tenant_a")

    assert _tables(engine, "tenant_a") == QUEUE_TABLES
    with engine.connect() as connection:
        assert PLACEHOLDER not in inspect(connection).get_schema_names()

    with _tenant(engine, "tenant_a").begin() as connection:
        _operations(connection).drop_queue(schema=PLACEHOLDER, version=LATEST_VERSION)
    assert _tables(engine, "tenant_a") == set()


def test_autogenerate_compares_each_tenants_own_schema(engine: Engine) -> None:
    queue = _tenant_queue()
    _create_queue(engine, "tenant_a")

    def diffs(tenant: str) -> list[Any]:
        with _tenant(engine, tenant).connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={
                    "include_schemas": True,
                    "include_name": lambda name, type_, _: (
                        name in (None, tenant) if type_ == "schema" else name in QUEUE_TABLES
                    ),
                },
            )
            return list(compare_metadata(context, queue.metadata))

    assert diffs("tenant_a") == []
    assert diffs("tenant_b") == [("create_queue", PLACEHOLDER, "sqla_queue_", LATEST_VERSION)]


def test_verify_reads_the_translated_schema(engine: Engine) -> None:
    queue = _tenant_queue()
    _create_queue(engine, "tenant_a")

    with _tenant(engine, "tenant_a").connect() as connection:
        queue.verify(connection)


@pytest.mark.timeout(60)
def test_a_worker_with_raw_statements_claims_from_the_translated_schema(engine: Engine) -> None:
    queue = _tenant_queue()
    # The placeholder schema exists too (an empty queue), as in a development database, so a
    # worker that reads it finds nothing instead of failing.
    _create_queue(engine, None)
    _create_queue(engine, "tenant_a")
    tenant_engine = _tenant(engine, "tenant_a")
    session_factory = sessionmaker(tenant_engine)
    with session_factory() as session:
        ids = [queue.get_task("double").enqueue(session, n) for n in (1, 2)]
        session.commit()

    queue.worker(
        session_factory,
        concurrency=2,
        poll_interval=0.1,
        install_signal_handlers=False,
        verify_schema=False,
    ).run(burst=True)

    with session_factory() as session:
        rows = session.execute(
            select(queue.Job.status, queue.Job.result).where(queue.Job.id.in_(ids))
        ).all()
    assert sorted(rows) == [("succeeded", 2), ("succeeded", 4)]
