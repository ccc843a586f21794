"""Shared fixtures: a real PostgreSQL, one fresh database per test cloned from a template.

The server comes from ``$SQLA_QUEUE_TEST_URL``, else the local server on 127.0.0.1:5432,
else an embedded one (pgserver). The template holds the test app's tables and the queue's
schema; cloning it is much faster than running DDL per test.

Connections (see tests/support/connections.py). The server accepts 100 connections, shared
by every test process (each pytest-xdist worker, or the one process of ``-n 0``), the
worker processes and PgBouncers their tests start, and the samplers. So each test has a
budget of connections its process may hold at once, counting those of the processes it
starts: ``$SQLA_QUEUE_TEST_CONNECTION_BUDGET`` (25 by default; 0: none), ``PROCESSES_BUDGET``
(45) for a test of the "processes" group below (one at a time, on one process), or its
``@pytest.mark.connection_budget(n)``. A test that goes over it fails at teardown, named,
with the peak it reached; and while its process is over it, no engine of that process
opens another connection (``OverBudgetError``), so the test fails by name instead of
starving the other processes' tests ("sorry, too many clients already"). Two processes
(``-n auto`` on two cores) hold at most 25 + 45 = 70; the report header warns when the
budgets of more processes add up to more than 80% of what the server accepts.
``--measure-connections`` (or ``$SQLA_QUEUE_TEST_MEASURE_CONNECTIONS=1``) samples the run's
connections every 100 ms and prints their peak, each process's, and the heaviest tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from sqla_queue.testing.databases import (
    DatabaseFactory,
    resolve_test_admin_url,
    shared_test_server_url,
    url_for_database,
)
from tests.support import connections
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
            "test_workflow_stress.py",
            "test_durable_stress.py",
            "test_multihost.py",
            "test_beside_the_app.py",
            # tests/integration has a test_key_order.py of its own, in one process.
            "acceptance/test_key_order.py",
        ),
        "processes",
    ),
    "test_least_privilege.py": "subsuite",
    # pgserver sets up its data directories and their parents' permissions for the server's
    # own user: two embedded servers starting at once in one pytest tree race on those.
    "test_embedded_postgres.py": "embedded",
    "test_demo.py": "embedded",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--measure-connections``: print the run's peak number of connections at the end."""
    parser.addoption(
        "--measure-connections",
        action="store_true",
        default=False,
        help=(
            "sample the run's connections to the test server every 100 ms and print the "
            f"peak (also ${connections.MEASURE_ENV}=1)"
        ),
    )


#: The budget of a test of the "processes" group (above), which starts several worker
#: processes by design: with ``--dist loadgroup`` one such test runs at a time, so a run of
#: two test processes holds at most this plus one default budget (25): 70 of 100.
PROCESSES_BUDGET = 45


def _budget_of(item: pytest.Item) -> int:
    """The connections ``item``'s process may hold while it runs (0: no budget)."""
    default = connections.budget()
    if default == 0:
        return 0
    marker = item.get_closest_marker("connection_budget")
    if marker is not None:
        return int(marker.args[0])
    if _group_of(item) == "processes":
        return max(default, PROCESSES_BUDGET)
    return default


class _Connections:
    """This process's samplers: the run's (when measuring) and its own budget's."""

    run: connections.ConnectionSampler | None = None
    run_note: str | None = None
    budget: connections.ConnectionSampler | None = None
    current_test: str | None = None
    current_budget: int = 0
    #: Each test process's own peak and heaviest test: (peak, test id, its peak).
    processes: dict[str, tuple[int, str | None, int]] = {}
    #: The peak of each test of this process (of every process, in the xdist controller).
    tests: dict[str, int] = {}


def _measuring(config: pytest.Config) -> bool:
    flag = os.environ.get(connections.MEASURE_ENV, "").strip().lower()
    return bool(config.getoption("--measure-connections")) or flag in ("1", "true", "yes")


def _is_xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.has_plugin("dsession")


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Tag this process's connections, and gate the opening of new ones on its budget."""
    connections.budget()  # a malformed $SQLA_QUEUE_TEST_CONNECTION_BUDGET fails at once
    # Before xdist starts its workers, which inherit both (as do the processes tests start).
    os.environ["PGAPPNAME"] = connections.process_tag()
    if not _is_xdist_controller(config):
        from sqlalchemy import event

        if not event.contains(Engine, "do_connect", _refuse_over_budget):
            event.listen(Engine, "do_connect", _refuse_over_budget)


def _refuse_over_budget(*_: Any) -> None:
    """Before an engine connects: refuse while this process is over its budget."""
    sampler, limit = _Connections.budget, _Connections.current_budget
    if sampler is None or limit == 0 or sampler.last_count() < limit:
        return
    sampler.sample_now()  # the latest count may be up to 100 ms old
    held = sampler.last_count()
    if held >= limit:
        raise connections.OverBudgetError(
            f"{_Connections.current_test or 'this test'} holds {held} connections to the test "
            f"server, its test process's budget (${connections.BUDGET_ENV}={limit}); "
            "it may not open another"
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the run's sampler (measuring: in the xdist controller or the one process)."""
    config = session.config
    if not _measuring(config) or _is_xdist_worker(config):
        return
    url = shared_test_server_url()
    if url is None:
        _Connections.run_note = (
            "not measured: the processes use embedded servers of their own, not one shared"
        )
        return
    _Connections.run = connections.ConnectionSampler.started(url, connections.process_scope())


def pytest_report_header(config: pytest.Config) -> str | None:
    """The connection budgets, and a warning when the run's could exceed the server's."""
    limit = connections.budget()
    if limit == 0 or _is_xdist_worker(config):
        return None
    processes = max(int(getattr(config.option, "numprocesses", 0) or 0), 1)
    worst = limit * (processes - 1) + max(limit, PROCESSES_BUDGET)
    line = (
        f"connection budget: {limit} per test process ({PROCESSES_BUDGET} in a test of the "
        f"processes group), {processes} process(es): at most {worst} at once"
    )
    usable = _usable_connections()
    if usable is not None and worst > usable * 0.8:
        line += (
            f"; WARNING: more than 80% of the {usable} connections the server accepts: use "
            "fewer test processes (-n) or a smaller budget, or tests may fail with 'sorry, "
            "too many clients already'"
        )
    return line


def _usable_connections() -> int | None:
    """``max_connections`` less the superusers' reserve, on a server all processes share."""
    url = shared_test_server_url()
    if url is None:
        return None
    eng = create_engine(url, poolclass=NullPool)
    try:
        with eng.connect() as connection:
            return int(
                connection.scalar(
                    text(
                        "select current_setting('max_connections')::int "
                        "- current_setting('superuser_reserved_connections')::int"
                    )
                )
                or 0
            )
    except Exception:
        return None
    finally:
        eng.dispose()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the samplers; an xdist worker hands its peaks to the controller."""
    budget = _Connections.budget
    if budget is not None:
        peaks = budget.peaks()
        mine = (peaks.own, peaks.worst_test[1], peaks.worst_test[0])
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["sqlaq_connections"] = mine
            workeroutput["sqlaq_test_connections"] = _heaviest(_Connections.tests)
        else:
            _Connections.processes["main"] = mine
    for sampler in (_Connections.run, budget):
        if sampler is not None:
            sampler.stop()


def pytest_testnodedown(node: Any, error: Any) -> None:
    """The xdist controller keeps each worker's connection peaks for the summary."""
    output = getattr(node, "workeroutput", {})
    if output.get("sqlaq_connections") is not None:
        _Connections.processes[node.gateway.id] = tuple(output["sqlaq_connections"])
    _Connections.tests.update(output.get("sqlaq_test_connections", {}))


def _heaviest(peaks: dict[str, int], count: int = 10) -> dict[str, int]:
    """The ``count`` tests with the most connections at once."""
    return dict(sorted(peaks.items(), key=lambda item: -item[1])[:count])


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Measuring: the run's peak connections, the server's, and each process's budget."""
    if not _measuring(config) or _is_xdist_worker(config):
        return
    write = terminalreporter.write_line
    terminalreporter.section("connections to the test server")
    if _Connections.run is None:
        write(_Connections.run_note or "not measured")
        return
    peaks = _Connections.run.peaks()
    processes = max(int(getattr(config.option, "numprocesses", 0) or 0), 1)
    limit = connections.budget()
    write(
        f"this run's peak: {peaks.own} connections at once (all its test processes, the "
        "worker processes and PgBouncers their tests start)"
    )
    for name, (peak, test, test_peak) in sorted(_Connections.processes.items()):
        write(f"  test process {name}: peak {peak}; heaviest test {test} ({test_peak})")
    for test, peak in _heaviest(_Connections.tests).items():
        write(f"  {peak:4d}  {test}")
    write(
        f"the server's peak: {peaks.total} of {peaks.limit} usable (other clients included); "
        f"{peaks.samples} samples every {connections.SAMPLE_INTERVAL * 1000:.0f} ms"
    )
    if limit:
        worst = limit * (processes - 1) + max(limit, PROCESSES_BUDGET)
        write(
            f"budget: {limit} per test process ({PROCESSES_BUDGET} in a test of the processes "
            f"group), {processes} process(es): at most {worst}"
        )
    else:
        write(f"budget: none (${connections.BUDGET_ENV}=0)")
    for error in peaks.errors[:3]:
        write(f"sampling failed: {error}")


def _start_budget(admin_url: str) -> None:
    """Start this process's budget sampler, once, on the server the tests use."""
    if _Connections.budget is None:
        sampler = connections.ConnectionSampler.started(admin_url, connections.process_scope())
        if _Connections.current_test is not None:
            sampler.begin_test(_Connections.current_test)
        _Connections.budget = sampler


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Count each test's connections from its set-up on."""
    _Connections.current_test = item.nodeid
    _Connections.current_budget = _budget_of(item)
    if _Connections.budget is not None:
        _Connections.budget.begin_test(item.nodeid)


def _over_budget(item: pytest.Item) -> str | None:
    """Why ``item`` broke its process's budget, or None (called at its teardown)."""
    sampler = _Connections.budget
    _Connections.current_test = None
    if sampler is None:
        return None
    peak, limit = sampler.end_test(), _budget_of(item)
    _Connections.tests[item.nodeid] = peak
    if limit == 0 or peak <= limit:
        return None
    return (
        f"{item.nodeid} held {peak} connections to the test server at once, over its "
        f"budget of {limit} (${connections.BUDGET_ENV}, PROCESSES_BUDGET and the "
        "connection_budget marker: tests/conftest.py): use "
        "smaller pools (or NullPool), fewer worker processes, or dispose of engines sooner"
    )


def _group_of(item: pytest.Item) -> str | None:
    """``item``'s group in ``_GROUPS``: by ``directory/file`` name, else by file name."""
    path = item.path
    return _GROUPS.get(f"{path.parent.name}/{path.name}", _GROUPS.get(path.name))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put each test in its xdist group (a no-op without ``-n``)."""
    for item in items:
        group = _group_of(item)
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
    """Under CI, turn the skip of a component test into a failure that says why; fail at
    teardown a test that went over its process's connection budget."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if call.when == "teardown":
        why = _over_budget(item)
        if why is not None and report.passed:
            report.outcome = "failed"
            report.longrepr = why
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
    """URL of a maintenance database on the test server (its connection budget starts)."""
    url = resolve_test_admin_url()
    _start_budget(url)
    return url


@pytest.fixture(scope="session")
def db_factory(admin_url: str) -> DatabaseFactory:
    """Creates and drops the per-test databases (named after this process's tag)."""
    return DatabaseFactory(admin_url, name_prefix=connections.database_prefix())


@pytest.fixture(scope="session")
def template_db(db_factory: DatabaseFactory) -> Iterator[str]:
    """A template database with the test app's schema, built once per session."""
    name = db_factory.create_template(f"{connections.database_prefix()}_tpl", _setup_template)
    yield name
    db_factory.drop_template(name)


class _CloneAhead:
    """Clones of the template made ahead, ``_AHEAD`` at once, in background threads.

    ``CREATE DATABASE ... TEMPLATE`` takes about 0.2 s, most of it the server writing and
    syncing files, and three clones made at once take little longer than one: made while
    the tests before run, they no longer add 0.2 s to every test's set-up (a run of
    test_bad_input.py, 94 short tests: 30 s before, 14 s after). Their admin connections
    are named apart (``application_name``), so they do not count against the running
    test's connection budget; a clone that fails in the background (e.g. refused while the
    test was over its budget) is made again in the foreground.
    """

    def __init__(self, admin_url: str, template: str) -> None:
        url = make_url(admin_url).update_query_dict({"application_name": _CLONE_AHEAD_NAME})
        self._factory = DatabaseFactory(
            url.render_as_string(hide_password=False),
            name_prefix=connections.database_prefix(),
        )
        self._admin_url = admin_url
        self._template = template
        self._pool = ThreadPoolExecutor(max_workers=_AHEAD, thread_name_prefix="sqlaq-clone-ahead")
        self._ahead: deque[Future[str]] = deque(
            self._pool.submit(self._clone) for _ in range(_AHEAD)
        )

    def _clone(self) -> str:
        # The clone's URL: the admin URL's (not the named-apart one the clones are made on).
        name = make_url(self._factory.clone(self._template)).database
        return url_for_database(self._admin_url, str(name))

    def take(self) -> str:
        """A fresh clone of the template; the next one starts at once."""
        future = self._ahead.popleft()
        self._ahead.append(self._pool.submit(self._clone))
        try:
            return future.result()
        except Exception:
            return self._clone()

    def close(self) -> None:
        for future in self._ahead:
            future.cancel()
        self._pool.shutdown(wait=True)
        for future in self._ahead:
            if not future.cancelled() and future.exception() is None:
                self._factory.drop(future.result())


_CLONE_AHEAD_NAME = "sqlaq-test-clone-ahead"
#: Clones made ahead at once.
_AHEAD = 3


@pytest.fixture(scope="session")
def _clone_ahead(admin_url: str, template_db: str) -> Iterator[_CloneAhead]:
    clones = _CloneAhead(admin_url, template_db)
    yield clones
    clones.close()


@pytest.fixture
def db_url(db_factory: DatabaseFactory, _clone_ahead: _CloneAhead) -> Iterator[str]:
    """A fresh database for this test only, dropped afterwards."""
    url = _clone_ahead.take()
    yield url
    # At once, not in the background: it also ends the sessions the test left behind,
    # which would count against the next test's connection budget.
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
