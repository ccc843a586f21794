"""Shared fixtures: a real PostgreSQL, one fresh database per test cloned from a template.

The server comes from ``$SQLA_QUEUE_TEST_URL``, else the local server on 127.0.0.1:5432,
else an embedded one (pgserver). The template holds the test app's tables and the queue's
schema; cloning it is much faster than running DDL per test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url
from tests.support.app import Base, queue
from tests.support.grants import GuideRoles, grant_test_roles
from tests.support.pgbouncer import ENGINE_OPTIONS, PgBouncer, pgbouncer_or_skip, through_pgbouncer

#: xdist groups (``--dist loadgroup``, see pyproject.toml) keep the tests of one group in
#: one test process, one after another: the acceptance tests below run several worker
#: processes each and measure progress against deadlines, so two of them at once on two
#: cores starve each other (a chaos drain that takes 90 s alone took 250 s beside another);
#: the least-privilege test runs a pytest of its own; pgserver prepares shared directory
#: permissions for its server's user. xdist 3.8 names a group by suffixing ``item._nodeid``,
#: which pytest 9 no longer reads (its node ids are structured), so on pytest 9 the groups
#: are silently ignored: the test extra pins pytest below 9 until xdist follows.
_GROUPS = {
    **dict.fromkeys(
        (
            "test_chaos.py",
            "test_exactly_once.py",
            "test_limit_stress.py",
            "test_multiprocess.py",
            "test_poison.py",
            "test_serialization.py",
            "test_shutdown.py",
            "test_unique_stress.py",
            "test_periodic_stress.py",
            "test_daemons_stress.py",
            "test_bounded_stress.py",
            "test_rate_limit_stress.py",
            "test_history_stress.py",
            "test_multihost.py",
        ),
        "processes",
    ),
    "test_least_privilege.py": "subsuite",
    # pgserver sets up its data directories and their parents' permissions for the server's
    # own user: two embedded servers starting at once in one pytest tree race on those.
    "test_embedded_postgres.py": "embedded",
    "test_demo.py": "embedded",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put each test in its xdist group (a no-op without ``-n``)."""
    for item in items:
        group = _GROUPS.get(item.path.name)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


#: Tests of real components that CI installs (.ci/run): PgBouncer, a streaming replica and
#: throwaway clusters, network namespaces, a headless browser. Elsewhere they skip, saying
#: why; under CI (``CI=true``) a skip of theirs is a failure, so that CI is never where they
#: quietly skip.
_COMPONENT_MODULES = frozenset(
    {
        "test_multihost.py",
        "test_replica.py",
        "test_pgbouncer.py",
        "test_dashboard_browser.py",
    }
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI, turn the skip of a component test into a failure that says why."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and _in_ci() and item.path.name in _COMPONENT_MODULES:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where its component must be there: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under CI, a component test module skipped as a whole fails its collection."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    name = getattr(collector, "path", None)
    if report.skipped and _in_ci() and name is not None and name.name in _COMPONENT_MODULES:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where its component must be there: {report.longrepr}"


@pytest.fixture
def server_tmp_path() -> Iterator[Path]:
    """A fresh directory for a database server that runs as another OS user, removed after.

    Not under ``tmp_path``: pytest keeps its ``pytest-of-<user>`` directory at mode 0700,
    and puts it back so whenever a pytest starts (the suites that run a pytest of their
    own), so a server user that could traverse it a moment ago no longer can.
    """
    path = Path(tempfile.mkdtemp(prefix="sqlaq-server-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


#: Set to 1 (or ``app``) to run the tests as the deployment guide's application role, with
#: exactly its grants; ``admin`` for its operator role (the application role, plus writing
#: stored limits). See tests/support/grants.py.
DML_ROLE_ENV = "SQLA_QUEUE_TEST_DML_ROLE"


@pytest.fixture(scope="session")
def dml_role(admin_url: str) -> Iterator[GuideRoles | None]:
    """In a least-privilege run ($SQLA_QUEUE_TEST_DML_ROLE), the guide's two login roles."""
    mode = os.environ.get(DML_ROLE_ENV)
    if mode not in ("1", "app", "admin"):
        yield None
        return
    app, admin_role = f"sqlaq_dml_{os.getpid()}", f"sqlaq_dml_{os.getpid()}_admin"
    roles = GuideRoles(app=app, admin=admin_role, login=admin_role if mode == "admin" else app)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for name in (admin_role, app):
            connection.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
        for name in (app, admin_role):
            connection.execute(
                text(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
            )
    yield roles
    with admin.connect() as connection:
        for name in (admin_role, app):
            connection.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
    admin.dispose()


def _grant_dml(db_url: str, roles: GuideRoles) -> str:
    """Give ``roles`` the deployment guide's grants; return a URL logging in as ``login``."""
    return grant_test_roles(
        db_url, roles, schema=str(queue.tables.schema), prefix=queue.tables.prefix
    )


@pytest.fixture(scope="session")
def pgbouncer(admin_url: str) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the test server (skips without one)."""
    yield from pgbouncer_or_skip(admin_url)


@pytest.fixture
def through(request: pytest.FixtureRequest) -> PgBouncer | None:
    """The PgBouncer the engines go through in a ``$SQLA_QUEUE_TEST_THROUGH`` run, else None."""
    return request.getfixturevalue("pgbouncer") if through_pgbouncer() else None


def _engine_url(url: str, through: PgBouncer | None) -> tuple[str, dict[str, Any]]:
    """``url`` and ``create_engine`` options, through ``through`` if it is a PgBouncer."""
    return (url, {}) if through is None else (through.url(url), dict(ENGINE_OPTIONS))


@pytest.fixture
def engine(db_url: str, dml_role: GuideRoles | None, through: PgBouncer | None) -> Iterator[Engine]:
    """An engine on this test's database (as the DML-only role in the least-privilege run)."""
    url, options = _engine_url(_grant_dml(db_url, dml_role) if dml_role else db_url, through)
    eng = create_engine(url, pool_size=5, max_overflow=20, **options)
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
async def async_engine(
    db_url: str, dml_role: GuideRoles | None, through: PgBouncer | None
) -> AsyncIterator[AsyncEngine]:
    """An async engine on this test's database."""
    url, options = _engine_url(_grant_dml(db_url, dml_role) if dml_role else db_url, through)
    eng = create_async_engine(url, pool_size=5, **options)
    yield eng
    await eng.dispose()


@pytest.fixture
def AsyncSessionLocal(async_engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """The host app's async session factory."""
    return async_sessionmaker(async_engine, expire_on_commit=False)
