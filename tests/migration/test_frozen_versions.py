"""The frozen SQL of the newest schema version builds exactly what the models build.

``queue.create_all`` (and ``Base.metadata.create_all``) use the live models; migrations use
the frozen text in ``alembic_ext.versions``. While a version is the newest, the two must give
PostgreSQL the same schema, whatever the schema, prefix and naming convention.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData

from alembic_ext import CreateQueueOp, DropQueueOp, versions
from sqla_queue.models.tables import SCHEMA_VERSION, build_tables
from sqla_queue.schema.ddl import create_queue_schema
from sqla_queue.schema.verify import inspect_schema
from tests.migration.catalog import differences, queue_objects
from tests.migration.conftest import engine_for, schema_snapshot
from tests.migration.hostapp.models import NAMING_CONVENTION

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
