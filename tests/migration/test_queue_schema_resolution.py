"""Where a queue lives on a host's metadata, and how several queues share one Base.

Issue 12, item 10: a Base with ``MetaData(schema="app")`` put the queue's tables in ``app``
while the Queue recorded no schema, so autogenerate wrote ``op.create_queue(schema=None)``
and ``create_table`` calls for the same tables. Item 9: a second Queue on one Base emitted
``SAWarning`` (an error under this suite's pytest configuration).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import produce_migrations
from alembic.operations import ops
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, ForeignKey, MetaData, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.pool import NullPool

import sqla_queue
from alembic_ext import CreateQueueOp
from alembic_ext.compare import find_queues
from alembic_ext.versions import LATEST_VERSION
from sqla_queue import Queue
from sqla_queue.errors import InvalidIdentifierError
from sqla_queue.models import resolve_schema, translated_schema

pytestmark = pytest.mark.migration

CONVENTION = {"pk": "pk_%(table_name)s", "ix": "ix_%(column_0_label)s"}


def _app_base() -> Any:
    """A host Base whose metadata puts every table in the schema ``app``."""

    class Base(DeclarativeBase):
        metadata = MetaData(schema="app", naming_convention=CONVENTION)

    class Customer(Base):
        __tablename__ = "customers"

        id: Mapped[int] = mapped_column(primary_key=True)
        email: Mapped[str] = mapped_column(String(200))

    return Base


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    """An engine on an empty database."""
    eng = create_engine(empty_db_url, poolclass=NullPool)
    yield eng
    eng.dispose()


# -- item 10: the metadata's schema ----------------------------------------------------------


def test_a_queue_on_a_schema_metadata_records_that_schema() -> None:
    base = _app_base()
    queue = Queue(base)

    assert queue.tables.schema == "app"
    assert {t.schema for t in (queue.tables.jobs, queue.tables.executions)} == {"app"}
    assert queue.tables.limits.schema == "app"
    assert queue.tables.notify_channel == "app.sqla_queue_wakeup"
    assert queue.tables.jobs.info["sqla_queue"]["schema"] == "app"
    [target] = find_queues(base.metadata)
    assert (target.schema, target.prefix) == ("app", "sqla_queue_")
    assert "app.sqla_queue_" in repr(queue)


def test_a_core_metadata_schema_is_taken_too() -> None:
    queue = Queue(metadata=MetaData(schema="reports"), prefix="report_q_")
    assert queue.tables.schema == "reports"
    assert queue.tables.jobs.fullname == "reports.report_q_jobs"


def test_the_same_schema_given_twice_is_accepted() -> None:
    queue = Queue(_app_base(), schema="app")
    assert queue.tables.schema == "app"


def test_conflicting_schemas_are_refused_naming_both_and_adding_nothing() -> None:
    base = _app_base()
    before = set(base.metadata.tables)

    with pytest.raises(InvalidIdentifierError) as caught:
        Queue(base, schema="jobs")

    message = str(caught.value)
    assert "Queue(schema='jobs')" in message
    assert "MetaData(schema='app')" in message
    assert set(base.metadata.tables) == before
    assert "sqla_queue" not in base.metadata.info


def test_an_invalid_metadata_schema_is_refused_as_the_metadatas() -> None:
    with pytest.raises(InvalidIdentifierError, match=r"metadata's schema: invalid schema name"):
        Queue(metadata=MetaData(schema="App"))


@pytest.mark.parametrize(
    ("declared", "given", "expected"),
    [(None, None, None), (None, "jobs", "jobs"), ("app", None, "app"), ("app", "app", "app")],
)
def test_resolve_schema(declared: str | None, given: str | None, expected: str | None) -> None:
    assert resolve_schema(MetaData(schema=declared), given) == expected


@pytest.mark.parametrize(
    ("schema", "translate_map", "expected"),
    [
        ("tenant", None, "tenant"),
        ("tenant", {}, "tenant"),
        ("tenant", {"tenant": "tenant_a"}, "tenant_a"),
        ("other", {"tenant": "tenant_a"}, "other"),
        (None, {None: "tenant_a"}, "tenant_a"),
        ("tenant", {"tenant": None}, None),
    ],
)
def test_translated_schema(
    schema: str | None, translate_map: dict[Any, Any] | None, expected: str | None
) -> None:
    assert translated_schema(schema, translate_map) == expected


def test_autogenerate_creates_a_schema_metadata_queue_once_in_its_schema(engine: Engine) -> None:
    base = _app_base()
    Queue(base)

    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"include_schemas": True, "target_metadata": base.metadata}
        )
        script = produce_migrations(context, base.metadata)

    assert script.upgrade_ops is not None
    created = [op for op in script.upgrade_ops.ops if isinstance(op, CreateQueueOp)]
    assert created == [CreateQueueOp("app", "sqla_queue_", version=LATEST_VERSION)]
    tables = [
        (op.schema, op.table_name)
        for op in script.upgrade_ops.ops
        if isinstance(op, ops.CreateTableOp)
    ]
    assert tables == [("app", "customers")]


# -- item 9: several queues on one Base -------------------------------------------------------


def test_queues_with_other_prefixes_or_schemas_share_a_base_without_warnings() -> None:
    # The suite turns SAWarning into an error, so a warning fails this test.
    class Base(DeclarativeBase):
        pass

    first = Queue(Base)
    second = Queue(Base, prefix="mail_q_")
    third = Queue(Base, schema="other")
    Base.registry.configure()

    classes = {first.Job, second.Job, third.Job, first.JobExecution, second.JobExecution}
    assert len(classes) == 5
    assert all(issubclass(q.Job, sqla_queue.Job) for q in (first, second, third))
    assert first.Job.__name__ == "Job[sqla_queue_]"
    assert third.JobExecution.__name__ == "JobExecution[other.sqla_queue_]"
    assert second.Job.__mapper__.local_table is second.tables.jobs


def test_a_host_model_called_job_keeps_its_name_for_relationships() -> None:
    class Base(DeclarativeBase):
        pass

    class Job(Base):
        __tablename__ = "host_jobs"

        id: Mapped[int] = mapped_column(primary_key=True)

    class Owner(Base):
        __tablename__ = "owners"

        id: Mapped[int] = mapped_column(primary_key=True)
        job_id: Mapped[int] = mapped_column(ForeignKey("host_jobs.id"))
        job = relationship("Job")

    Queue(Base)
    Base.registry.configure()

    assert Owner.job.property.mapper.class_ is Job
