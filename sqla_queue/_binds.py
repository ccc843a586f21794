"""Running a statement on whatever the caller holds: Session, Connection or their async twins.

Every call joins the caller's transaction; nothing here commits. Sync callers get the
result, async callers get a coroutine of it, and both share this one code path.

A :data:`Flow` is a conversation with the database written once, without I/O: it yields
statements (and, while it waits for something only time can bring, :class:`Sleep`), and
:func:`run_flow` does the I/O the sync or the async way.

Some calls cannot run in the caller's transaction (``queue.result`` waits on a connection
of its own, ``queue.cancel`` commits on one): :func:`own_connection` and
:func:`own_async_connection` open it from what the caller holds, carrying the caller's
execution options, a tenant's ``schema_translate_map`` above all. Whatever a statement
derives from the schema by name (a NOTIFY channel, a lock key) comes from
:func:`tables_for`, the tables as the connection at hand sees them.

One exception to "nothing here commits": a connection in AUTOCOMMIT mode has no
transaction to join, and would commit each statement on its own. Several statements that
belong together (the chunks of one bulk enqueue) then run in a transaction of their own,
opened and committed (or rolled back) here, so they are written whole or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable

from sqla_queue.models.tables import QueueTables

__all__ = [
    "AnyBind",
    "Flow",
    "Sleep",
    "check_async_source",
    "check_source",
    "engine_with_options",
    "in_autocommit",
    "on_connection",
    "options_of",
    "own_async_connection",
    "own_connection",
    "run_flow",
    "scalars_each",
    "tables_for",
]

AnyBind = Session | Connection | AsyncSession | AsyncConnection

T = TypeVar("T")


@dataclass(frozen=True)
class Sleep:
    """A flow's request to pause ``seconds`` before its next statement (it is sent ``()``).

    The sync driver blocks its thread (``time.sleep``); the async one awaits
    ``asyncio.sleep``, so the event loop keeps serving other tasks meanwhile. The caller's
    transaction stays open across the pause, with every lock it holds.
    """

    seconds: float


#: A conversation with the database written once for both faces: the generator yields
#: ``(statement, params)`` and is sent back the statement's rows, or yields a
#: :class:`Sleep` and is sent ``()`` after it, until it returns its value.
#: :func:`run_flow` drives it on a sync or an async bind.
Flow = Generator[tuple[Executable, Mapping[str, Any]] | Sleep, Sequence[Any], T]


def in_autocommit(connection: Connection) -> bool:
    """Whether ``connection``'s driver connection commits every statement by itself.

    Read from the driver's ``autocommit`` attribute (psycopg, psycopg2, and SQLAlchemy's
    async adapters all have one), without a round trip; ``False`` for a driver without it.
    """
    return bool(getattr(connection.connection.dbapi_connection, "autocommit", False))


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
    if len(param_sets) < 2 or not in_autocommit(connection):
        return _execute_each(connection, statement, param_sets)
    connection.exec_driver_sql("BEGIN")
    try:
        values = _execute_each(connection, statement, param_sets)
    except BaseException:
        # The statement's own error is the one to report; a rollback that fails too
        # (the connection is gone) ends the transaction anyway.
        with contextlib.suppress(Exception):
            connection.exec_driver_sql("ROLLBACK")
        raise
    connection.exec_driver_sql("COMMIT")
    return values


def _execute_each(
    connection: Connection, statement: Executable, param_sets: Sequence[Mapping[str, Any]]
) -> list[Any]:
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
    sync = connection.sync_connection
    own_transaction = len(param_sets) > 1 and sync is not None and in_autocommit(sync)
    if own_transaction:
        await connection.exec_driver_sql("BEGIN")
    values: list[Any] = []
    try:
        for params in param_sets:
            result = await connection.execute(statement, dict(params))
            values.extend(result.scalars())
    except BaseException:
        if own_transaction:
            with contextlib.suppress(Exception):
                await connection.exec_driver_sql("ROLLBACK")
        raise
    if own_transaction:
        await connection.exec_driver_sql("COMMIT")
    return values


def run_flow(bind: AnyBind, flow: Flow[T]) -> T | Coroutine[Any, Any, T]:
    """Run ``flow``'s statements on ``bind``, in its transaction; its value (or a coroutine).

    On an AUTOCOMMIT connection the statements share a transaction of their own, as the
    chunks of a bulk enqueue do (see the module's docstring): a flow is written whole or
    not at all.
    """
    if isinstance(bind, AsyncSession | AsyncConnection):
        return _run_flow_async(bind, flow)
    connection = bind.connection() if isinstance(bind, Session) else bind
    own = in_autocommit(connection)
    if own:
        connection.exec_driver_sql("BEGIN")
    try:
        rows: Sequence[Any] | None = None
        while True:
            try:
                step = flow.send(rows) if rows is not None else next(flow)
            except StopIteration as done:
                value: T = done.value
                break
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                rows = ()
                continue
            statement, params = step
            result = connection.execute(statement, dict(params))
            # A statement without rows (DDL, SET LOCAL) is sent back no rows.
            rows = result.all() if result.returns_rows else ()
    except BaseException:
        if own:
            with contextlib.suppress(Exception):
                connection.exec_driver_sql("ROLLBACK")
        raise
    if own:
        connection.exec_driver_sql("COMMIT")
    return value


async def _run_flow_async(bind: AsyncSession | AsyncConnection, flow: Flow[T]) -> T:
    connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
    sync = connection.sync_connection
    own = sync is not None and in_autocommit(sync)
    if own:
        await connection.exec_driver_sql("BEGIN")
    try:
        rows: Sequence[Any] | None = None
        while True:
            try:
                step = flow.send(rows) if rows is not None else next(flow)
            except StopIteration as done:
                value: T = done.value
                break
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                rows = ()
                continue
            statement, params = step
            result = await connection.execute(statement, dict(params))
            rows = result.all() if result.returns_rows else ()
    except BaseException:
        if own:
            with contextlib.suppress(Exception):
                await connection.exec_driver_sql("ROLLBACK")
        raise
    if own:
        await connection.exec_driver_sql("COMMIT")
    return value


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
