"""The synchronous engine of the threads beside an async worker's loop.

The worker's threads (heartbeater, listener, services: see
:mod:`sqla_queue.worker.threads`) run on synchronous connections, for the sync and the
async face alike. An async worker derives their engine from its own async one, connecting
as that one does: :func:`background_engine`, fed by :func:`capturing_connect_keywords`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL

from sqla_queue.worker.pools import own_pool_engine

__all__ = [
    "background_engine",
    "capturing_connect_keywords",
    "libpq_url",
]


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
