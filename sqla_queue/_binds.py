"""Running a statement on whatever the caller holds: Session, Connection or their async twins.

Every call joins the caller's transaction; nothing here commits. Sync callers get the
result, async callers get a coroutine of it, and both share this one code path.

A conversation of several statements, written once without I/O, is a
:data:`~sqla_queue.conversation.Flow`; :func:`~sqla_queue.conversation.run_flow` runs it
on what the caller holds, with the helpers here.

Some calls cannot run in the caller's transaction (``queue.result`` waits on a connection
of its own, ``queue.cancel`` commits on one): :func:`own_connection` and
:func:`own_async_connection` open it from what the caller holds, carrying the caller's
execution options, a tenant's ``schema_translate_map`` above all. Whatever a statement
derives from the schema by name (a NOTIFY channel, a lock key) comes from
:func:`tables_for`, the tables as the connection at hand sees them.

One exception to "nothing here commits": a connection in AUTOCOMMIT mode has no
transaction to join, and would commit each statement on its own. Several statements that
belong together (the chunks of one bulk enqueue, the statements of a flow) then run in a
transaction of their own, opened and committed (or rolled back) by :func:`one_transaction`
or :func:`one_async_transaction`, so they are written whole or not at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable

from sqla_queue.models.tables import QueueTables

__all__ = [
    "AnyBind",
    "check_async_source",
    "check_source",
    "engine_with_options",
    "in_autocommit",
    "on_connection",
    "one_async_transaction",
    "one_transaction",
    "options_of",
    "own_async_connection",
    "own_connection",
    "scalars_each",
    "tables_for",
]

#: What a library call that joins the caller's transaction accepts.
AnyBind = Session | Connection | AsyncSession | AsyncConnection

T = TypeVar("T")


def in_autocommit(connection: Connection) -> bool:
    """Whether ``connection``'s driver connection commits every statement by itself.

    Read from the driver's ``autocommit`` attribute (psycopg, psycopg2, and SQLAlchemy's
    async adapters all have one), without a round trip; ``False`` for a driver without it.
    """
    return bool(getattr(connection.connection.dbapi_connection, "autocommit", False))


@contextlib.contextmanager
def one_transaction(connection: Connection, *, needed: bool = True) -> Iterator[None]:
    """Run the block's statements in one transaction: the caller's, or one of their own.

    A connection in a transaction (or about to autobegin one) is left alone: the block
    joins it. On an AUTOCOMMIT connection a transaction is begun here and committed when
    the block ends, or rolled back if it raises (see the module's docstring). ``needed``
    false skips that: a single statement is already all or nothing.
    """
    own = needed and in_autocommit(connection)
    if own:
        connection.exec_driver_sql("BEGIN")
    try:
        yield
    except BaseException:
        if own:
            # The block's own error is the one to report; a rollback that fails too
            # (the connection is gone) ends the transaction anyway.
            with contextlib.suppress(Exception):
                connection.exec_driver_sql("ROLLBACK")
        raise
    if own:
        connection.exec_driver_sql("COMMIT")


@contextlib.asynccontextmanager
async def one_async_transaction(
    connection: AsyncConnection, *, needed: bool = True
) -> AsyncIterator[None]:
    """:func:`one_transaction` for an ``AsyncConnection``."""
    sync = connection.sync_connection
    own = needed and sync is not None and in_autocommit(sync)
    if own:
        await connection.exec_driver_sql("BEGIN")
    try:
        yield
    except BaseException:
        if own:
            with contextlib.suppress(Exception):
                await connection.exec_driver_sql("ROLLBACK")
        raise
    if own:
        await connection.exec_driver_sql("COMMIT")


def scalars_each(
    bind: AnyBind, statement: Executable, param_sets: Sequence[Mapping[str, Any]]
) -> list[Any] | Coroutine[Any, Any, list[Any]]:
    """Execute ``statement`` once per parameter set; return all first-column values.

    The executions share the caller's transaction; on an AUTOCOMMIT connection, two or
    more share one of their own (see the module's docstring).
    """
    if isinstance(bind, AsyncSession | AsyncConnection):
        return _scalars_each_async(bind, statement, param_sets)
    connection = bind.connection() if isinstance(bind, Session) else bind
    with one_transaction(connection, needed=len(param_sets) > 1):
        values: list[Any] = []
        for params in param_sets:
            values.extend(connection.execute(statement, dict(params)).scalars())
    return values


async def _scalars_each_async(
    bind: AsyncSession | AsyncConnection,
    statement: Executable,
    param_sets: Sequence[Mapping[str, Any]],
) -> list[Any]:
    connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
    async with one_async_transaction(connection, needed=len(param_sets) > 1):
        values: list[Any] = []
        for params in param_sets:
            result = await connection.execute(statement, dict(params))
            values.extend(result.scalars())
    return values


#: Execution options that shape the caller's own transactions. A connection opened on the
#: caller's behalf runs transactions of the library's kind (a cancel's short one, a wait
#: in AUTOCOMMIT), so it leaves these out and carries every other option.
TRANSACTION_OPTIONS = frozenset({"isolation_level", "postgresql_readonly", "postgresql_deferrable"})


def options_of(connection: Connection | AsyncConnection) -> Mapping[str, Any]:
    """``connection``'s execution options: its engine's, with its own on top."""
    if isinstance(connection, AsyncConnection):
        sync = connection.sync_connection
        return {} if sync is None else sync.get_execution_options()
    return connection.get_execution_options()


def tables_for(tables: QueueTables, connection: Connection | AsyncConnection) -> QueueTables:
    """``tables`` as ``connection`` sees them: moved by its ``schema_translate_map``, if any
    (see :meth:`~sqla_queue.models.tables.QueueTables.translated`)."""
    return tables.translated(options_of(connection).get("schema_translate_map"))


def on_connection(
    bind: AnyBind, use: Callable[[Any], T | Coroutine[Any, Any, T]]
) -> T | Coroutine[Any, Any, T]:
    """``use(connection)`` on the connection ``bind`` runs on (a Session's, in its
    transaction); a coroutine of its value for the async kinds."""
    if isinstance(bind, AsyncSession | AsyncConnection):
        return _on_async_connection(bind, use)
    return use(bind.connection() if isinstance(bind, Session) else bind)


async def _on_async_connection(
    bind: AsyncSession | AsyncConnection, use: Callable[[Any], Any]
) -> Any:
    connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
    return await use(connection)


def _carried(options: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if name not in TRANSACTION_OPTIONS}


def _sync_origin(source: Any, caller: str) -> tuple[Engine, dict[str, Any]]:
    """The engine to open a connection from, and the caller's options to carry on it."""
    if isinstance(source, Engine):
        return source, {}
    if isinstance(source, Connection):
        return source.engine, _carried(source.get_execution_options())
    if isinstance(source, Session):
        # Options given with session.connection(execution_options=...) live on the
        # connection of the session's transaction, not on its bind.
        if source.in_transaction():
            return _sync_origin(source.connection(), caller)
        return _sync_origin(source.get_bind(), caller)
    if isinstance(source, sessionmaker) and source.kw.get("bind") is not None:
        return _sync_origin(source.kw["bind"], caller)
    raise TypeError(
        f"{caller} needs something to open a connection from: an Engine, Connection, "
        f"Session or sessionmaker bound to an engine (or their async twins), got {source!r}"
    )


async def _async_origin(source: Any, caller: str) -> tuple[AsyncEngine, dict[str, Any]]:
    if isinstance(source, AsyncEngine):
        return source, {}
    if isinstance(source, AsyncConnection):
        return source.engine, _carried(options_of(source))
    if isinstance(source, AsyncSession):
        if source.in_transaction():
            return await _async_origin(await source.connection(), caller)
        if source.bind is not None:
            return await _async_origin(source.bind, caller)
    if isinstance(source, async_sessionmaker) and source.kw.get("bind") is not None:
        return await _async_origin(source.kw["bind"], caller)
    raise TypeError(f"{caller}: cannot open a connection from {source!r}")


def check_source(source: Any, caller: str) -> None:
    """Raise :class:`TypeError` (naming ``caller``) unless :func:`own_connection` can open
    a connection from ``source``; opens none."""
    _sync_origin(source, caller)


async def check_async_source(source: Any, caller: str) -> None:
    """:func:`check_source` for :func:`own_async_connection`."""
    await _async_origin(source, caller)


def engine_with_options(source: Any, caller: str) -> Engine:
    """``source``'s engine, carrying ``source``'s execution options as
    :func:`own_connection` does: every connection it opens sees the caller's tenant."""
    engine, options = _sync_origin(source, caller)
    return engine.execution_options(**options) if options else engine


@contextlib.contextmanager
def own_connection(source: Any, caller: str) -> Iterator[Connection]:
    """A new connection of ``source``'s engine, with ``source``'s execution options.

    ``source`` is an ``Engine``, ``Connection``, ``Session`` or ``sessionmaker``; a
    ``Connection``'s (or a Session's current connection's) options are carried, except
    those of its transactions (:data:`TRANSACTION_OPTIONS`). Anything else raises
    :class:`TypeError` naming ``caller``.
    """
    engine, options = _sync_origin(source, caller)
    with engine.connect() as connection:
        yield connection.execution_options(**options) if options else connection


@contextlib.asynccontextmanager
async def own_async_connection(source: Any, caller: str) -> AsyncIterator[AsyncConnection]:
    """:func:`own_connection` for the async kinds of ``source``."""
    engine, options = await _async_origin(source, caller)
    async with engine.connect() as connection:
        yield (await connection.execution_options(**options)) if options else connection
