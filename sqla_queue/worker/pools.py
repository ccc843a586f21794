"""The worker's own connection pool, apart from the one its handlers' sessions use.

A worker sends its own statements (claims, acks, heartbeats, reclaims, the services' beats)
on connections of a small pool of its own, never on the pool of the engine its session
factory is bound to: a handler that holds a session (or several) cannot make a heartbeat
wait for a connection, and the worker's connections do not count against the pool size the
application chose for its own work.

That pool belongs to an engine derived from the handlers' engine by
:func:`own_pool_engine`: the same dialect, URL and ``create_engine`` arguments
(``connect_args`` included: its connections come from the same creator), the same engine
and pool events (a ``connect`` listener that sets ``search_path`` holds for both) and the
same execution options (a tenant's ``schema_translate_map``); only the pool differs.
``WorkerSettings.pool_size`` of its connections stay open; when more of the worker's
threads need one at the same moment, more are opened and closed again (no limit: those
threads are few and fixed, and a heartbeat must never wait for a connection).

An async worker's run loop uses an async engine derived the same way (one connection
kept); its heartbeater and services, which run in threads, use a synchronous psycopg engine
that connects as the async one does
(:func:`~sqla_queue.worker.background.background_engine`) and keeps the rest of
``pool_size``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.engine.base import OptionEngine
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import Pool, QueuePool

__all__ = [
    "OwnPoolEngine",
    "own_pool",
    "own_pool_engine",
    "refuse_connection_bind",
    "split_pool_size",
]


def refuse_connection_bind(bind: object, role: str = "session factory") -> None:
    """Raise :class:`TypeError` if ``bind`` (a worker's session factory's) is a connection.

    ``role`` names the factory in the message (the read replica's has handlers share it).

    A worker opens connections of its own, several at once (claims, heartbeats, services,
    LISTEN), and its handlers run in threads at the same time: one ``Connection`` (or
    ``AsyncConnection``) can serve none of that, and has no pool to derive the worker's
    from. The message names what to pass instead, a tenant's engine included.
    """
    if not isinstance(bind, Connection | AsyncConnection):
        return
    if isinstance(bind, AsyncConnection):
        maker, engine, tests = "async_sessionmaker", "async_engine", ""
    else:
        maker, engine = "sessionmaker", "engine"
        tests = (
            " To run the jobs of a test on a connection's tenant, use drain() or eager() of "
            "sqla_queue.testing.helpers: they accept a sessionmaker bound to a connection."
        )
    raise TypeError(
        f"the worker needs a {role} bound to an engine, not to one connection "
        f"(got {maker}(bind={type(bind).__name__})): it opens connections of its own, several "
        f"at once, and runs handlers side by side. Pass {maker}(bind={engine}); for a tenant "
        f"chosen by schema_translate_map, bind it to {engine}.execution_options("
        f"schema_translate_map={{...}}) (the map on the engine, not on a connection).{tests}"
    )


def own_pool(pool: Pool, size: int) -> Pool:
    """A new, empty pool making its connections as ``pool`` does, keeping ``size`` of them.

    A :class:`~sqlalchemy.pool.QueuePool` (``AsyncAdaptedQueuePool`` for an async driver)
    gives one of the same class, with the same creator, recycle, pre-ping, reset and
    events (as :meth:`Pool.recreate` does), ``size`` connections kept and no limit on
    more. Any other pool (``NullPool``, which keeps none) is recreated as it is: it never
    makes anyone wait.
    """
    if not isinstance(pool, QueuePool):
        return pool.recreate()
    # The arguments Pool.recreate() passes, with our own size and overflow.
    source: Any = pool
    return type(pool)(
        source._creator,
        pool_size=size,
        max_overflow=-1,
        pre_ping=source._pre_ping,
        recycle=source._recycle,
        echo=source.echo,
        logging_name=source._orig_logging_name,
        reset_on_return=source._reset_on_return,
        _dispatch=source.dispatch,
        dialect=source._dialect,
    )


class OwnPoolEngine(OptionEngine):
    """An engine that is ``proxied`` in all but its pool (see :func:`own_pool_engine`).

    Like the engine ``proxied.execution_options(...)`` returns, it shares its parent's
    dialect, URL, compiled cache, events and execution options; unlike it, its
    connections come from a pool of its own.
    """

    def __init__(self, proxied: Engine, pool: Pool) -> None:
        self._own_pool = pool
        super().__init__(proxied, {})

    @property
    def pool(self) -> Pool:
        """This engine's own pool (never the parent's)."""
        return self._own_pool

    @pool.setter
    def pool(self, pool: Pool) -> None:
        self._own_pool = pool

    def dispose(self, close: bool = True) -> None:
        """Close this engine's pooled connections (``close``) and start a fresh pool.

        The parent's pool is left alone, and its ``engine_disposed`` listeners do not hear
        of it: only the worker's own pool is disposed.
        """
        if close:
            self._own_pool.dispose()
        self._own_pool = self._own_pool.recreate()


def own_pool_engine(engine: Engine, size: int) -> Engine:
    """``engine`` with a pool of its own that keeps ``size`` connections (see module doc).

    Close it with ``.dispose()`` when done: that closes its pooled connections and leaves
    ``engine``'s alone.
    """
    return OwnPoolEngine(engine, own_pool(engine.pool, size))


def split_pool_size(pool_size: int, *, asynchronous: bool) -> tuple[int, int]:
    """How many of ``pool_size`` connections the run loop's and the threads' pools keep.

    A sync worker has one pool for both (the run loop's engine is the threads' one); an
    async worker keeps one connection on its event loop for the run loop and the rest
    (at least one) in the synchronous pool of its heartbeater and services.
    """
    if not asynchronous:
        return pool_size, pool_size
    return 1, max(pool_size - 1, 1)
