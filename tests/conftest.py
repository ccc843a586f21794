"""Shared fixtures: a real PostgreSQL, one fresh database per test cloned from a template.

The server comes from ``$SQLA_QUEUE_TEST_URL``, else the local server on 127.0.0.1:5432,
else an embedded one (pgserver). The template holds the test app's tables and the queue's
schema; cloning it is much faster than running DDL per test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url
from tests.support.app import Base, queue


def _setup_template(engine: Engine) -> None:
    with engine.begin() as connection:
        queue.create_all(connection)
        Base.metadata.create_all(
            connection, tables=[t for t in Base.metadata.sorted_tables if t.schema is None]
        )


@pytest.fixture(scope="session")
def admin_url() -> str:
    """URL of a maintenance database on the test server."""
    return resolve_test_admin_url()


@pytest.fixture(scope="session")
def db_factory(admin_url: str) -> DatabaseFactory:
    """Creates and drops the per-test databases."""
    return DatabaseFactory(admin_url)


@pytest.fixture(scope="session")
def template_db(db_factory: DatabaseFactory) -> Iterator[str]:
    """A template database with the test app's schema, built once per session."""
    name = db_factory.create_template(f"sqlaq_tpl_{os.getpid()}", _setup_template)
    yield name
    db_factory.drop_template(name)


@pytest.fixture
def db_url(db_factory: DatabaseFactory, template_db: str) -> Iterator[str]:
    """A fresh database for this test only, dropped afterwards."""
    url = db_factory.clone(template_db)
    yield url
    db_factory.drop(url)


@pytest.fixture
def empty_db_url(db_factory: DatabaseFactory) -> Iterator[str]:
    """A fresh database with no tables at all."""
    url = db_factory.clone("template0")
    yield url
    db_factory.drop(url)


#: Set to 1 to run the tests as a role that may only read and write the tables (no DDL).
DML_ROLE_ENV = "SQLA_QUEUE_TEST_DML_ROLE"


@pytest.fixture(scope="session")
def dml_role(admin_url: str) -> Iterator[str | None]:
    """With $SQLA_QUEUE_TEST_DML_ROLE=1, a login role for the least-privilege run."""
    if os.environ.get(DML_ROLE_ENV) != "1":
        yield None
        return
    name = f"sqlaq_dml_{os.getpid()}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
        connection.execute(text(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE'))
    yield name
    with admin.connect() as connection:
        connection.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
    admin.dispose()


def _grant_dml(db_url: str, role: str) -> str:
    """Grant ``role`` DML on every table of the test database; return a URL logging in as it."""
    owner = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with owner.connect() as connection:
        for schema in ("public", queue.tables.schema):
            connection.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
            connection.execute(
                text(
                    f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" '
                    f'TO "{role}"'
                )
            )
            connection.execute(
                text(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
            )
        # The role may not create anything: no DDL at runtime.
        connection.execute(text(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"'))
    owner.dispose()
    return make_url(db_url).set(username=role).render_as_string(hide_password=False)


@pytest.fixture
def engine(db_url: str, dml_role: str | None) -> Iterator[Engine]:
    """An engine on this test's database (as the DML-only role in the least-privilege run)."""
    url = _grant_dml(db_url, dml_role) if dml_role else db_url
    eng = create_engine(url, pool_size=5, max_overflow=20)
    yield eng
    eng.dispose()


@pytest.fixture
def owner_engine(db_url: str) -> Iterator[Engine]:
    """An engine as the database's owner, for tests that change the schema on purpose."""
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def SessionLocal(engine: Engine) -> sessionmaker[Session]:
    """The host app's session factory."""
    return sessionmaker(engine)


@pytest.fixture
async def async_engine(db_url: str, dml_role: str | None) -> AsyncIterator[AsyncEngine]:
    """An async engine on this test's database."""
    url = _grant_dml(db_url, dml_role) if dml_role else db_url
    eng = create_async_engine(url, pool_size=5)
    yield eng
    await eng.dispose()


@pytest.fixture
def AsyncSessionLocal(async_engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """The host app's async session factory."""
    return async_sessionmaker(async_engine, expire_on_commit=False)
