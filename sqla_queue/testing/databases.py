"""Finding a PostgreSQL server and provisioning throwaway databases on it.

Two entry points pick a server:

* :func:`resolve_test_admin_url` for test suites
  (``$SQLA_QUEUE_TEST_URL`` → local server on 127.0.0.1:5432 → embedded server);
* :func:`resolve_app_url` for the demo and the CLI (explicit URL → ``$DATABASE_URL`` →
  embedded server).

:class:`DatabaseFactory` then creates template databases once and clones them cheaply, one
fresh database per test.
"""

from __future__ import annotations

import atexit
import itertools
import os
import secrets
import threading
import time
from collections.abc import Callable

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from sqla_queue.testing.embedded import EmbeddedPostgres, start_embedded_postgres

__all__ = [
    "DATABASE_URL_ENV",
    "LOCAL_ADMIN_URL",
    "TEST_URL_ENV",
    "DatabaseFactory",
    "normalize_url",
    "resolve_app_url",
    "resolve_test_admin_url",
    "shared_test_server_url",
    "url_for_database",
]

#: Environment variable naming the admin database URL for the test suite.
TEST_URL_ENV = "SQLA_QUEUE_TEST_URL"
#: Environment variable naming the application database for the demo and the CLI.
DATABASE_URL_ENV = "DATABASE_URL"
#: A local server with trust authentication, as on CI and many developer machines.
LOCAL_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

_DRIVER_PREFIX = "postgresql+psycopg://"
# Databases a factory must never drop: they are needed to create or administer the others.
_PROTECTED = frozenset({"postgres", "template0", "template1"})
_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1; PostgreSQL silently truncates longer names
_OBJECT_IN_USE = "55006"
_CLONE_ATTEMPTS = 5

_names = itertools.count(1)


class _ProcessState:
    """Servers chosen for this process, so every caller gets the same one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.embedded: EmbeddedPostgres | None = None
        self.test_admin_url: str | None = None


_state = _ProcessState()


def normalize_url(url: str) -> str:
    """Make libpq-style URLs (``postgresql://``, ``postgres://``) use the psycopg 3 driver.

    Other URLs, including ones that already name a driver, are returned unchanged.
    """
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return _DRIVER_PREFIX + url[len(prefix) :]
    return url


def url_for_database(admin_url: str, dbname: str) -> str:
    """Return ``admin_url`` with its database replaced by ``dbname``.

    Credentials, host and query parameters (such as a unix socket ``host``) are kept.
    """
    url = make_url(normalize_url(admin_url)).set(database=dbname)
    return url.render_as_string(hide_password=False)


def _shared_embedded() -> EmbeddedPostgres:
    # One embedded server per process, shared by the test and application resolvers; callers
    # hold _state.lock.
    if _state.embedded is None or _state.embedded.stopped:
        _state.embedded = start_embedded_postgres()
        atexit.register(_state.embedded.stop)
    return _state.embedded


def _can_connect(url: str, timeout: int = 2) -> bool:
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": timeout})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError):
        return False
    finally:
        engine.dispose()
    return True


def resolve_test_admin_url() -> str:
    """Return the URL of a maintenance database the test suite may create databases from.

    In order of preference:

    1. ``$SQLA_QUEUE_TEST_URL`` if set (used as given, after :func:`normalize_url`);
    2. :data:`LOCAL_ADMIN_URL` (``postgres`` on 127.0.0.1:5432) if a connection succeeds
       within a couple of seconds;
    3. an embedded server (see :mod:`sqla_queue.testing.embedded`), started on first use, kept
       for the life of the process and stopped at exit.

    The choice between 2 and 3 is made once per process, so every call returns the same URL.

    Raises:
        RuntimeError: if no server is reachable and the embedded server cannot start.
    """
    explicit = os.environ.get(TEST_URL_ENV)
    if explicit:
        return normalize_url(explicit)
    with _state.lock:
        cached = _state.test_admin_url
        if cached is not None and (_state.embedded is None or not _state.embedded.stopped):
            return cached
        if _can_connect(LOCAL_ADMIN_URL):
            _state.test_admin_url = LOCAL_ADMIN_URL
            return LOCAL_ADMIN_URL
        try:
            url = _shared_embedded().url
        except RuntimeError as exc:
            raise RuntimeError(
                f"No PostgreSQL available for the tests: {TEST_URL_ENV} is not set, nothing "
                f"accepted a connection at {LOCAL_ADMIN_URL}, and the embedded fallback "
                f"failed: {exc}"
            ) from exc
        _state.test_admin_url = url
        return url


def shared_test_server_url() -> str | None:
    """The test server's admin URL when every process of a run shares it, else None.

    ``$SQLA_QUEUE_TEST_URL``, or :data:`LOCAL_ADMIN_URL` if it accepts a connection. Never
    starts an embedded server: each process would get one of its own.
    """
    explicit = os.environ.get(TEST_URL_ENV)
    if explicit:
        return normalize_url(explicit)
    return LOCAL_ADMIN_URL if _can_connect(LOCAL_ADMIN_URL) else None


def resolve_app_url(explicit: str | None, *, announce: Callable[[str], None] = print) -> str:
    """Return the database URL for the demo and the CLI.

    Args:
        explicit: A URL given by the user (e.g. a ``--database-url`` option); wins if set.
        announce: Called with a one-line message when the embedded server is used, so the
            user knows where their data lives.

    Returns:
        ``explicit``, else ``$DATABASE_URL``, else the URL of an embedded server started for
        this process (stopped at exit). ``postgresql://`` and ``postgres://`` URLs are
        rewritten to ``postgresql+psycopg://``.

    Raises:
        RuntimeError: if no URL is given and the embedded server cannot start (e.g. pgserver
            is not installed).
    """
    if explicit:
        return normalize_url(explicit)
    from_env = os.environ.get(DATABASE_URL_ENV)
    if from_env:
        return normalize_url(from_env)
    with _state.lock:
        try:
            server = _shared_embedded()
        except RuntimeError as exc:
            raise RuntimeError(
                f"No database URL given and {DATABASE_URL_ENV} is not set, so an embedded "
                f"PostgreSQL was needed, but it could not start: {exc}"
            ) from exc
    announce(
        "No database URL given; started an embedded PostgreSQL (pgserver) at "
        f"{server.url} (data directory: {server.data_dir})"
    )
    return server.url


def _sqlstate(exc: DBAPIError) -> str | None:
    state = getattr(exc.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


class DatabaseFactory:
    """Creates template databases and throwaway clones of them on one PostgreSQL server.

    Cloning a template with ``CREATE DATABASE ... TEMPLATE`` copies files and is much faster
    than running migrations for every test. Templates are created with connections disallowed,
    so stray sessions (including autovacuum) cannot block cloning.

    The admin URL's role needs ``CREATEDB`` and, to remove sessions left behind by tests,
    either superuser or ``pg_signal_backend``. Each operation opens its own short-lived
    connection, so the factory holds no connection between calls and needs no closing.
    """

    def __init__(self, admin_url: str, *, name_prefix: str | None = None) -> None:
        """Use the server and credentials of ``admin_url`` (any database on it will do).

        ``name_prefix`` starts the names :meth:`clone` makes up (``<prefix>_<n>_<random>``;
        by default ``sqlaq_t_<pid>``), so that a test suite can tell its own databases,
        and their connections, from another run's on a shared server.
        """
        if name_prefix is not None:
            self._check_name(f"{name_prefix}_{'9' * 6}_{'f' * 6}")
        self._name_prefix = name_prefix
        self.admin_url = normalize_url(admin_url)
        admin_db = make_url(self.admin_url).database
        self._admin_db = admin_db
        # CREATE/DROP DATABASE cannot run inside a transaction block.
        self._engine = create_engine(
            self.admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool
        )
        self._quote = self._engine.dialect.identifier_preparer.quote_identifier

    def __repr__(self) -> str:
        """Show the admin URL without its password."""
        return f"DatabaseFactory({make_url(self.admin_url)!r})"

    def create_template(self, name: str, setup: Callable[[Engine], None]) -> str:
        """(Re)create the template database ``name`` and return its name.

        A database left over from an earlier run under that name is dropped first. ``setup``
        receives an engine connected to the new, empty database and should create the schema
        (e.g. ``metadata.create_all(engine)`` or an Alembic upgrade). Afterwards the engine is
        disposed, remaining sessions are terminated and the database is marked as a template
        that accepts no connections. If ``setup`` raises, the half-built database is dropped.
        """
        self._check_name(name)
        self._drop(name)
        with self._engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {self._quote(name)}"))
        engine = create_engine(url_for_database(self.admin_url, name))
        try:
            setup(engine)
        except BaseException:
            engine.dispose()
            self._drop(name)
            raise
        engine.dispose()
        with self._engine.connect() as conn:
            quoted = self._quote(name)
            conn.execute(text(f"ALTER DATABASE {quoted} WITH ALLOW_CONNECTIONS false"))
            # Sessions leaked by setup() would make every clone fail with "source database is
            # being accessed by other users".
            self._terminate(conn, name)
            conn.execute(text(f"ALTER DATABASE {quoted} WITH IS_TEMPLATE true"))
        return name

    def clone(self, template: str, name: str | None = None) -> str:
        """Create a new database from ``template`` and return a SQLAlchemy URL for it.

        Sessions connected to ``template`` are terminated, since PostgreSQL cannot copy a
        database that is in use; this is retried a few times if sessions keep reappearing.

        Args:
            template: Name of a database created by :meth:`create_template` (any database
                nobody is connected to also works).
            name: Name of the new database; by default a unique
                ``<name_prefix>_<counter>_<random>`` (``sqlaq_t_<pid>`` for the prefix by
                default).

        Raises:
            sqlalchemy.exc.DBAPIError: if the database cannot be created, e.g. because the
                template does not exist or the name is taken.
        """
        if name is None:
            prefix = self._name_prefix or f"sqlaq_t_{os.getpid()}"
            name = f"{prefix}_{next(_names)}_{secrets.token_hex(3)}"
        self._check_name(name)
        statement = text(f"CREATE DATABASE {self._quote(name)} TEMPLATE {self._quote(template)}")
        for attempt in range(_CLONE_ATTEMPTS):
            try:
                with self._engine.connect() as conn:
                    # PostgreSQL refuses to copy a database that has sessions, and only says so
                    # after waiting 5 seconds for them to go away. Templates from
                    # create_template() accept no connections, but a plain database may have
                    # some, and a session can slip in between this and CREATE DATABASE.
                    self._terminate(conn, template)
                    conn.execute(statement)
            except DBAPIError as exc:
                if _sqlstate(exc) != _OBJECT_IN_USE or attempt == _CLONE_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * 2**attempt)
            else:
                break
        return url_for_database(self.admin_url, name)

    def drop(self, name_or_url: str) -> None:
        """Drop a database, given its name or a URL to it; missing databases are ignored.

        Sessions still connected to it are terminated first.

        Raises:
            ValueError: for ``postgres``, ``template0``, ``template1`` and the admin database.
        """
        name = make_url(name_or_url).database if "://" in name_or_url else name_or_url
        if not name:
            raise ValueError(f"No database name in {name_or_url!r}")
        self._drop(name)

    def drop_template(self, name: str) -> None:
        """Drop a template database created by :meth:`create_template`, if it exists.

        Raises:
            ValueError: for ``postgres``, ``template0``, ``template1`` and the admin database.
        """
        self._drop(name)

    def _check_name(self, name: str) -> None:
        if not name or "\x00" in name:
            raise ValueError(f"Invalid database name {name!r}")
        if len(name.encode()) > _MAX_IDENTIFIER_BYTES:
            raise ValueError(
                f"Database name {name!r} is longer than {_MAX_IDENTIFIER_BYTES} bytes; "
                "PostgreSQL would silently truncate it"
            )

    def _terminate(self, conn: Connection, name: str) -> None:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )

    def _drop(self, name: str) -> None:
        self._check_name(name)
        if name in _PROTECTED or name == self._admin_db:
            raise ValueError(f"Refusing to drop the database {name!r}")
        quoted = self._quote(name)
        with self._engine.connect() as conn:
            is_template = conn.execute(
                text("SELECT datistemplate FROM pg_database WHERE datname = :name"),
                {"name": name},
            ).scalar_one_or_none()
            if is_template is None:
                return
            if is_template:
                # PostgreSQL refuses to drop a database marked as a template.
                conn.execute(text(f"ALTER DATABASE {quoted} WITH IS_TEMPLATE false"))
            self._terminate(conn, name)
            version = conn.dialect.server_version_info or (0,)
            # FORCE (PostgreSQL 13+) also ends sessions that connect between the terminate
            # above and the drop.
            force = " WITH (FORCE)" if version >= (13,) else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}{force}"))
