"""The worker's background threads: heartbeater and listener, one of each per worker.

Both run in their own threads on their own connections, for the sync and the async face
alike: a handler that blocks the event loop, or a run loop busy with a slow claim, must not
delay a heartbeat (the job would be reclaimed) or a wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

from sqla_queue.statements.liveness import HeartbeatParams
from sqla_queue.worker.core import WorkerCore
from sqla_queue.worker.pools import own_pool_engine

__all__ = [
    "Heartbeater",
    "Listener",
    "background_engine",
    "capturing_connect_keywords",
    "libpq_url",
    "listen_connector",
]

log = logging.getLogger("sqla_queue.worker")


def libpq_url(url: URL) -> str:
    """A libpq connection URI (``postgresql://...``) for a SQLAlchemy URL of any driver."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


#: Keywords of psycopg's connect() that belong to one dialect object, not to the connection.
DIALECT_KEYWORDS = frozenset({"context"})


#: Per dialect, the records of the workers making their first connection (one per worker).
_recording: weakref.WeakKeyDictionary[Any, list[dict[str, Any]]] = weakref.WeakKeyDictionary()
#: Dialects whose ``do_connect`` listener is in place (it stays: see below).
_recorded_dialects: weakref.WeakSet[Any] = weakref.WeakSet()
_recording_lock = threading.Lock()


def _record(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
    if cargs:  # a conninfo string a do_connect listener put first
        cparams = {"conninfo": cargs[0], **cparams}
    with _recording_lock:
        for seen in _recording.get(dialect, ()):
            if not seen:
                seen.update(cparams)


@contextmanager
def capturing_connect_keywords(engine: Engine) -> Iterator[dict[str, Any]]:
    """Record the keywords ``engine`` passes to its driver's ``connect()`` meanwhile.

    They are the URL's merged with ``connect_args`` and whatever the ``do_connect``
    listeners changed, as SQLAlchemy's ``do_connect`` event sees them, for the first new
    connection made inside the block. Nothing is recorded when a ``creator`` (an
    ``async_creator``) or a ``do_connect`` listener makes the connection itself.
    """
    dialect = engine.dialect
    with _recording_lock:
        # Put in once per dialect and left there, idle: adding or removing a listener
        # while another thread runs the dialect's listeners (connecting) would break
        # that thread's loop over them.
        if dialect not in _recorded_dialects:
            event.listen(engine, "do_connect", _record)
            _recorded_dialects.add(dialect)
        seen: dict[str, Any] = {}
        _recording.setdefault(dialect, []).append(seen)
    try:
        yield seen
    finally:
        with _recording_lock:
            records = _recording[dialect]  # by identity: two empty records are equal
            records[:] = [other for other in records if other is not seen]


def background_engine(
    async_engine: Engine,
    keywords: Mapping[str, Any],
    *,
    given: Engine | None,
    pool_size: int,
) -> Engine:
    """The synchronous engine of an async worker's heartbeater, services and LISTEN.

    ``async_engine`` is the worker's own (``AsyncEngine.sync_engine``), ``keywords`` what
    it passed its driver on a first connection (empty when a creator made it; see
    :func:`capturing_connect_keywords`). ``given`` (``WorkerSettings.background_engine``)
    is used as it is, with a pool of the worker's own. Otherwise, with psycopg, the new
    engine connects with the same keywords (``connect_args``, SSL settings, ``options``,
    ``application_name``) and runs the same ``connect`` listeners (a ``SET search_path``)
    on its connections. With asyncpg, whose keywords and connections psycopg cannot take,
    it is built from the URL only if the URL says all there is; with a creator nothing is
    known. Those cases raise :class:`TypeError` naming the setting to use,
    rather than connect somewhere else, or otherwise, in silence.
    """
    options = async_engine.get_execution_options()
    if given is not None:
        engine = own_pool_engine(given, pool_size)
        if options:  # a tenant's schema_translate_map holds for the threads too
            engine.update_execution_options(**options)
        return engine
    listeners = _user_connect_listeners(async_engine)
    problem = _why_not_carried(async_engine, keywords, listeners)
    if problem:
        raise TypeError(
            f"the async worker's heartbeater, services and LISTEN run in threads on a "
            f"synchronous psycopg engine, and {problem}. Pass one on the same database, "
            f"connecting as yours does: WorkerSettings(background_engine=create_engine("
            f'"postgresql+psycopg://...", connect_args={{...}})) (or '
            f"queue.async_worker(..., background_engine=...))."
        )
    # Only psycopg's keywords are psycopg's; asyncpg got here with the URL's alone.
    psycopg_driver = async_engine.dialect.driver == "psycopg"
    carried = {k: v for k, v in keywords.items() if psycopg_driver and k not in DIALECT_KEYWORDS}
    # Never prepared: behind a pooler in transaction mode a prepared heartbeat would fail
    # on the next server connection, and statements every few seconds gain nothing.
    connect_args = {**carried, "prepare_threshold": None}
    sync_url = async_engine.url.set(drivername="postgresql+psycopg")
    engine = create_engine(
        sync_url, pool_size=pool_size, max_overflow=-1, connect_args=connect_args
    )
    for listener in listeners:
        event.listen(engine, "connect", listener)
    return engine.execution_options(**options) if options else engine


def _why_not_carried(
    async_engine: Engine, keywords: Mapping[str, Any], listeners: list[Any]
) -> str:
    """Why ``async_engine``'s way of connecting cannot be repeated with psycopg, or ''."""
    if not keywords:
        return (
            "your engine's connections are made by an async_creator (or a do_connect "
            "listener), which a synchronous engine cannot call"
        )
    if async_engine.dialect.driver == "psycopg":
        return ""
    _, from_url = async_engine.dialect.create_connect_args(async_engine.url)
    if dict(keywords) != dict(from_url):
        extra = sorted(set(keywords) - set(from_url)) or sorted(keywords)
        return (
            f"your {async_engine.dialect.driver} engine connects with arguments its URL does "
            f"not hold ({', '.join(extra)}), which psycopg cannot take"
        )
    if listeners:
        return (
            f"your {async_engine.dialect.driver} engine has 'connect' listeners, written for "
            f"its own connections, not psycopg's"
        )
    return ""


def _user_connect_listeners(engine: Engine) -> list[Any]:
    """The ``connect`` listeners the application put on ``engine`` (its pool).

    SQLAlchemy's own ones (the dialect's set-up of each connection) belong to the async
    dialect and are left out; the sync engine's dialect adds its own. Listeners put on
    the ``Engine`` or ``Pool`` class hold for every engine already.
    """
    collection: Any = engine.pool.dispatch.connect
    own: list[Any] = list(getattr(collection, "listeners", ()))
    return [fn for fn in own if not getattr(fn, "__module__", "").startswith("sqlalchemy.")]


ListenConnector = Callable[[], AbstractContextManager["psycopg.Connection[Any]"]]


def listen_connector(engine: Engine, listen_url: str | None) -> ListenConnector:
    """How the worker opens its LISTEN connection: like ``engine``'s, or to ``listen_url``.

    ``engine`` is the synchronous engine of the worker's threads. With psycopg, the LISTEN
    connection is one of its connections, from a pool of its own, so ``connect_args``,
    a creator and ``connect`` listeners hold for it too; it is closed, never pooled, when
    done. ``listen_url`` (``WorkerSettings.listen_url``, a direct connection past a
    pooler) is connected to as it says, with the keywords its query string holds.
    """
    if listen_url is None and engine.dialect.driver == "psycopg":
        listen_engine = own_pool_engine(engine, 1)
        return lambda: _pooled_autocommit(listen_engine)
    dsn = libpq_url(make_url(listen_url) if listen_url is not None else engine.url)
    return lambda: psycopg.connect(dsn, autocommit=True, connect_timeout=10)


@contextmanager
def _pooled_autocommit(engine: Engine) -> Iterator[psycopg.Connection[Any]]:
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.Connection), "a psycopg engine's connection"
        if driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            driver.commit()  # keep what a connect listener SET outside autocommit
        driver.autocommit = True
        yield driver
    finally:
        raw.invalidate()  # LISTENing, autocommit: never back to a pool
        raw.close()


class Heartbeater(threading.Thread):
    """Refreshes ``alive_at`` of held executions every ``interval`` seconds."""

    def __init__(self, core: WorkerCore, engine: Engine, interval: float) -> None:
        super().__init__(name="sqla-queue-heartbeat", daemon=True)
        self.core = core
        self.engine = engine
        self.interval = interval
        self.halt = threading.Event()

    def run(self) -> None:
        """Beat until halted; a failed beat is logged and the next one tried on time."""
        while not self.halt.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        """Send one heartbeat for everything this worker holds."""
        params: HeartbeatParams | None = self.core.heartbeat_params()
        if params is None:
            return
        try:
            with self.engine.begin() as connection:
                connection.execute(self.core.guard)
                rows = connection.execute(self.core.heartbeat_statement, params).all()
        except Exception as exc:
            log.warning("heartbeat failed, retrying in %.1fs: %s", self.interval, exc)
            # A lost privilege or table stops the worker instead of failing every beat.
            self.core.heartbeat_failed(exc, time.monotonic())
            return
        self.core.heartbeat_done(params["ids"], rows)


class Listener(threading.Thread):
    """LISTENs on the queue's channel and calls ``on_notify`` for each wake-up.

    A notification is only a hint: after every (re)connect it calls ``on_notify`` once,
    since anything sent while disconnected was missed, and polling covers the rest.
    """

    def __init__(
        self, connect: ListenConnector, channel: str, on_notify: Callable[[], None]
    ) -> None:
        super().__init__(name="sqla-queue-listener", daemon=True)
        self.connect = connect
        self.channel = channel
        self.on_notify = on_notify
        self.halt = threading.Event()
        self.connected = threading.Event()

    def run(self) -> None:
        """Listen until halted, reconnecting with backoff."""
        delay = 0.1
        while not self.halt.is_set():
            try:
                with self.connect() as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.connected.set()
                    delay = 0.1
                    self.on_notify()
                    while not self.halt.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.on_notify()
            except Exception as exc:  # a driver's error, or a connect listener's
                self.connected.clear()
                if self.halt.is_set():
                    return
                log.warning("LISTEN connection lost, reconnecting in %.1fs: %s", delay, exc)
                self.halt.wait(delay)
                delay = min(delay * 2, 5.0)
