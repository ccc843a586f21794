"""A library against a database at another schema version, as in a rolling deploy.

docs/versioning.md says what happens; these tests hold the startup check to it. The later
version is simulated on the current schema: its version comment raised by one, plus what
a later step would do (add an object, or drop one this library needs).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from sqla_queue import SCHEMA_VERSION, SchemaMismatchError
from sqla_queue.models.tables import schema_version_comment
from tests.support.app import queue

pytestmark = pytest.mark.migration

EXECUTIONS = f"{queue.tables.schema}.{queue.tables.executions.name}"
TASK_CLAIM_IX = f"{queue.tables.schema}.{queue.tables.executions.name}_task_claim_ix"


@pytest.fixture
def owner(db_url: str) -> Iterator[Engine]:
    """The test database (the queue at the current version), as its owner."""
    engine = create_engine(db_url)
    yield engine
    engine.dispose()


def _record_version(engine: Engine, version: int) -> None:
    with engine.begin() as connection:
        comment = schema_version_comment(version).replace("'", "''")
        connection.execute(text(f"COMMENT ON TABLE {EXECUTIONS} IS '{comment}'"))


def test_a_newer_schema_that_kept_everything_this_release_needs_is_accepted(
    owner: Engine,
) -> None:
    """An additive step (a new column, a new index) leaves the previous release running."""
    _record_version(owner, SCHEMA_VERSION + 1)
    with owner.begin() as connection:
        connection.execute(text(f"ALTER TABLE {EXECUTIONS} ADD COLUMN later_release TEXT"))
        connection.execute(text(f"CREATE INDEX later_release_ix ON {EXECUTIONS} (later_release)"))
    with owner.connect() as connection:
        queue.verify(connection)


def test_a_newer_schema_without_an_object_this_release_needs_is_refused(
    owner: Engine,
) -> None:
    """The old release refuses, and says to upgrade the library, not to repair the database."""
    newer = SCHEMA_VERSION + 1
    _record_version(owner, newer)
    with owner.begin() as connection:
        connection.execute(text(f"DROP INDEX {TASK_CLAIM_IX}"))
    with owner.connect() as connection, pytest.raises(SchemaMismatchError) as refused:
        queue.verify(connection)
    message = str(refused.value)
    assert (
        f"the database has schema version {newer}, this library needs schema version "
        f"{SCHEMA_VERSION}"
    ) in message
    assert f"index {TASK_CLAIM_IX}" in message
    assert f"Run this process on a release of sqla_queue at schema version {newer}" in message
    assert "recreate them as" not in message


def test_an_older_schema_is_refused_with_the_upgrade_step(owner: Engine) -> None:
    """A database one version behind (simulated: the version recorded lower, an index gone)."""
    older = SCHEMA_VERSION - 1
    _record_version(owner, older)
    with owner.begin() as connection:
        connection.execute(text(f"DROP INDEX {TASK_CLAIM_IX}"))
    with owner.connect() as connection, pytest.raises(SchemaMismatchError) as refused:
        queue.verify(connection)
    message = str(refused.value)
    assert f"the database has schema version {older}" in message
    assert f"op.upgrade_queue(from_version={older}, to_version={SCHEMA_VERSION}, ...)" in message
