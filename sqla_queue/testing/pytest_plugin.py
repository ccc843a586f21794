"""A pytest plugin for the test suites of applications that use sqla_queue.

Installing sqla_queue registers this module as the pytest plugin ``sqla_queue`` (the
``pytest11`` entry point), and it is inert until used: it adds two ini options and a
command-line option, and fixtures whose names all start with ``sqla_queue_``. It has no
hooks that touch collection, running or reporting, so a suite that requests none of the
fixtures runs exactly as before, and a suite's own fixture of the same name wins over the
plugin's. ``-p no:sqla_queue`` turns it off altogether.

The fixtures need to know the application's queue. Name it in the ini file::

    [pytest]
    sqla_queue_app = myapp.jobs:queue

or with ``--sqla-queue-app myapp.jobs:queue``, or override the ``sqla_queue_app`` fixture
in a ``conftest.py`` to return the :class:`~sqla_queue.Queue` itself.

Fixtures (see each one's docstring):

* ``sqla_queue_database_url``: a fresh database for one test, cloned from a template that
  holds the queue's tables and the rest of the queue's metadata (the application's tables);
* ``sqla_queue_engine`` and ``sqla_queue_session_factory`` on that database;
* ``sqla_queue_drain``: run the due jobs inline (:func:`~sqla_queue.testing.helpers.drain`);
* ``sqla_queue_eager``: run the due jobs after every commit, for this test only
  (:func:`~sqla_queue.testing.helpers.eager`);
* ``sqla_queue_assert_enqueued``: :func:`~sqla_queue.testing.helpers.assert_enqueued`
  with the queue filled in;
* ``sqla_queue_fire_timers`` and ``sqla_queue_signal``: end a suspended durable job's
  sleep now, or send it a signal, committed
  (:func:`~sqla_queue.testing.helpers.fire_timers`, :func:`~sqla_queue.testing.helpers.signal`).

The server comes from :func:`~sqla_queue.testing.databases.resolve_test_admin_url`:
``$SQLA_QUEUE_TEST_URL``, else PostgreSQL on 127.0.0.1:5432, else an embedded server.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session, sessionmaker

    from sqla_queue.durable import Signalled
    from sqla_queue.queue import Queue
    from sqla_queue.testing.databases import DatabaseFactory
    from sqla_queue.testing.helpers import DrainResult, Eager, EnqueuedJobs

__all__ = [
    "SetupDatabase",
    "TemplateCache",
    "create_queue_and_app_tables",
    "pytest_addoption",
    "sqla_queue_admin_url",
    "sqla_queue_app",
    "sqla_queue_assert_enqueued",
    "sqla_queue_database_url",
    "sqla_queue_drain",
    "sqla_queue_eager",
    "sqla_queue_engine",
    "sqla_queue_fire_timers",
    "sqla_queue_session_factory",
    "sqla_queue_setup_database",
    "sqla_queue_signal",
    "sqla_queue_templates",
]

#: Builds the schema of a template database, given an engine on it.
SetupDatabase = Callable[["Engine"], None]

_APP_OPTION = "sqla_queue_app"
_TABLES_OPTION = "sqla_queue_create_app_tables"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--sqla-queue-app`` and the ini options; nothing else happens at start."""
    group = parser.getgroup("sqla_queue", "sqla_queue fixtures (inert unless requested)")
    group.addoption(
        "--sqla-queue-app",
        dest=_APP_OPTION,
        default=None,
        metavar="MODULE:ATTRIBUTE",
        help="the Queue the sqla_queue_* fixtures use, e.g. myapp.jobs:queue "
        "(overrides the sqla_queue_app ini option)",
    )
    parser.addini(
        _APP_OPTION,
        "MODULE:ATTRIBUTE of the Queue the sqla_queue_* fixtures use, e.g. myapp.jobs:queue",
        default="",
    )
    parser.addini(
        _TABLES_OPTION,
        "create the other tables of the queue's metadata (the application's) in the test "
        "databases too, not only the queue's (default: true)",
        type="bool",
        default=True,
    )


@pytest.fixture(scope="session")
def sqla_queue_app(pytestconfig: pytest.Config) -> Queue:
    """The application's :class:`~sqla_queue.Queue`, from ``--sqla-queue-app`` or the ini.

    Override this fixture (any scope) in a ``conftest.py`` to return the queue directly.
    """
    path = pytestconfig.getoption(_APP_OPTION) or str(pytestconfig.getini(_APP_OPTION))
    if not path:
        pytest.fail(
            "the sqla_queue_* fixtures need the application's queue: set "
            "`sqla_queue_app = myapp.jobs:queue` in the pytest ini file, pass "
            "--sqla-queue-app myapp.jobs:queue, or define a `sqla_queue_app` fixture "
            "returning the Queue",
            pytrace=False,
        )
    from sqla_queue.cli.loading import CliError, load_queue

    try:
        return load_queue(path)
    except CliError as exc:
        pytest.fail(f"sqla_queue_app = {path}: {exc}", pytrace=False)


def create_queue_and_app_tables(queue: Queue, *, app_tables: bool = True) -> SetupDatabase:
    """A template setup that creates the queue's tables and, optionally, the others of its
    metadata (the application's own, since ``Queue(Base)`` shares ``Base.metadata``).

    The queue's tables come from ``queue.create_all`` (which also creates its schema); the
    other tables are created with ``metadata.create_all``, skipping the queue's.
    """

    def setup(engine: Engine) -> None:
        with engine.begin() as connection:
            queue.create_all(connection)
            if app_tables:
                _create_other_tables(queue, connection)

    return setup


def _create_other_tables(queue: Queue, connection: Connection) -> None:
    own = set(queue.tables.all)
    others = [table for table in queue.metadata.sorted_tables if table not in own]
    if others:
        queue.metadata.create_all(connection, tables=others)


@functools.cache
def _default_setup(queue: Queue, app_tables: bool) -> SetupDatabase:
    # One function per queue, so that every test of that queue finds its template again.
    return create_queue_and_app_tables(queue, app_tables=app_tables)


@pytest.fixture
def sqla_queue_setup_database(pytestconfig: pytest.Config, sqla_queue_app: Queue) -> SetupDatabase:
    """How a template database gets its schema: a function of an engine on it.

    By default the queue's tables and the rest of its metadata (unless the ini option
    ``sqla_queue_create_app_tables = false``). Override it to run your Alembic migrations
    instead. A template is built once per distinct function, so return the same one every
    time (define the fixture with ``scope="session"``).
    """
    return _default_setup(sqla_queue_app, bool(pytestconfig.getini(_TABLES_OPTION)))


@pytest.fixture(scope="session")
def sqla_queue_admin_url() -> str:
    """URL of a database on the test server from which test databases are created.

    ``$SQLA_QUEUE_TEST_URL``, else ``postgres`` on 127.0.0.1:5432 if it accepts a
    connection, else an embedded server (the ``embedded`` extra). The role needs
    ``CREATEDB``.
    """
    from sqla_queue.testing.databases import resolve_test_admin_url

    return resolve_test_admin_url()


class TemplateCache:
    """Template databases of this test session, one per (queue, setup) pair, made on first use.

    Keyed by the objects themselves, so a module that overrides ``sqla_queue_app`` with
    another queue gets a template of its own. All of them are dropped at the end.
    """

    _numbers = itertools.count(1)

    def __init__(self, factory: DatabaseFactory) -> None:
        """Create templates with ``factory``."""
        self.factory = factory
        self._templates: dict[tuple[int, int], str] = {}
        # The keys are ids: keep their objects alive so an id is never reused.
        self._keep: list[object] = []

    def template_for(self, queue: Queue, setup: SetupDatabase) -> str:
        """The name of the template for ``queue`` built by ``setup``; built the first time."""
        key = (id(queue), id(setup))
        name = self._templates.get(key)
        if name is None:
            name = f"sqlaq_user_tpl_{os.getpid()}_{next(self._numbers)}"
            self.factory.create_template(name, setup)
            self._templates[key] = name
            self._keep.extend((queue, setup))
        return name

    def drop_all(self) -> None:
        """Drop every template made here."""
        for name in self._templates.values():
            self.factory.drop_template(name)
        self._templates.clear()
        self._keep.clear()


@pytest.fixture(scope="session")
def sqla_queue_templates(sqla_queue_admin_url: str) -> Iterator[TemplateCache]:
    """The session's template databases; dropped when the session ends."""
    from sqla_queue.testing.databases import DatabaseFactory

    cache = TemplateCache(DatabaseFactory(sqla_queue_admin_url))
    yield cache
    cache.drop_all()


@pytest.fixture
def sqla_queue_database_url(
    sqla_queue_templates: TemplateCache,
    sqla_queue_app: Queue,
    sqla_queue_setup_database: SetupDatabase,
) -> Iterator[str]:
    """A fresh database for this test, with the queue's (and the app's) tables.

    It is cloned from a template built once per session, which takes a fraction of the
    time of creating the tables, and dropped after the test.
    """
    template = sqla_queue_templates.template_for(sqla_queue_app, sqla_queue_setup_database)
    url = sqla_queue_templates.factory.clone(template)
    yield url
    sqla_queue_templates.factory.drop(url)


@pytest.fixture
def sqla_queue_engine(sqla_queue_database_url: str) -> Iterator[Engine]:
    """An engine on this test's database, disposed after the test."""
    from sqlalchemy import create_engine

    engine = create_engine(sqla_queue_database_url, pool_size=5, max_overflow=5)
    yield engine
    engine.dispose()


@pytest.fixture
def sqla_queue_session_factory(sqla_queue_engine: Engine) -> sessionmaker[Session]:
    """A ``sessionmaker`` on this test's database."""
    from sqlalchemy.orm import sessionmaker

    return sessionmaker(sqla_queue_engine)


@pytest.fixture
def sqla_queue_drain(
    sqla_queue_app: Queue, sqla_queue_session_factory: sessionmaker[Session]
) -> Callable[..., DrainResult]:
    """Run every due job inline: ``result = sqla_queue_drain()``.

    :func:`~sqla_queue.testing.helpers.drain` on the app's queue and this test's session
    factory; keyword arguments go to it (``tasks=[...]``, ``fire_timers=True`` to run
    durable jobs through their sleeps, worker settings).
    """
    from sqla_queue.testing.helpers import drain

    def run(**options: Any) -> DrainResult:
        return drain(sqla_queue_app, sqla_queue_session_factory, **options)

    return run


@pytest.fixture
def sqla_queue_eager(
    sqla_queue_app: Queue, sqla_queue_session_factory: sessionmaker[Session]
) -> Iterator[Eager]:
    """Run the due jobs after each commit of ``sqla_queue_session_factory``'s sessions.

    Only for this test: the hook is removed at teardown, which also fails the test if a
    job's attempt failed (see :func:`~sqla_queue.testing.helpers.eager`).
    """
    from sqla_queue.testing.helpers import eager

    with eager(sqla_queue_app, sqla_queue_session_factory) as hook:
        yield hook


@pytest.fixture
def sqla_queue_assert_enqueued(
    sqla_queue_app: Queue,
) -> Callable[..., contextlib.AbstractContextManager[EnqueuedJobs]]:
    """:func:`~sqla_queue.testing.helpers.assert_enqueued` with the app's queue filled in.

    ``with sqla_queue_assert_enqueued(session, task="send_welcome", count=1): ...``
    """
    from sqla_queue.testing.helpers import assert_enqueued

    def check(
        session: Session | Connection, **expected: Any
    ) -> contextlib.AbstractContextManager[EnqueuedJobs]:
        return assert_enqueued(sqla_queue_app, session, **expected)

    return check


@pytest.fixture
def sqla_queue_fire_timers(
    sqla_queue_app: Queue, sqla_queue_session_factory: sessionmaker[Session]
) -> Callable[..., list[int]]:
    """End suspended durable jobs' sleeps and wait deadlines now, committed:
    ``sqla_queue_fire_timers()`` (every suspended job) or ``sqla_queue_fire_timers([job_id])``.

    :func:`~sqla_queue.testing.helpers.fire_timers` on the app's queue and this test's
    session factory; returns the woken jobs' ids. ``sqla_queue_drain()`` then runs them.
    """
    from sqla_queue.testing.helpers import fire_timers

    def fire(job_ids: Sequence[int] | None = None) -> list[int]:
        return fire_timers(sqla_queue_app, sqla_queue_session_factory, job_ids)

    return fire


@pytest.fixture
def sqla_queue_signal(
    sqla_queue_app: Queue, sqla_queue_session_factory: sessionmaker[Session]
) -> Callable[..., Signalled]:
    """Send a durable job a signal, committed: ``sqla_queue_signal(job_id, "approved",
    {"by": "ada"})``.

    :func:`~sqla_queue.testing.helpers.signal` on the app's queue and this test's session
    factory; returns what :meth:`Queue.signal <sqla_queue.Queue.signal>` did.
    """
    from sqla_queue.testing.helpers import signal

    def send(job_id: int, name: str, payload: Any = None) -> Signalled:
        return signal(sqla_queue_app, sqla_queue_session_factory, job_id, name, payload)

    return send
