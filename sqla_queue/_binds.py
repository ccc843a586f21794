"""Running a statement on whatever the caller holds: Session, Connection or their async twins.

Every call joins the caller's transaction; nothing here commits. Sync callers get the
result, async callers get a coroutine of it, and both share this one code path.

A :data:`Flow` is a conversation with the database written once, without I/O: it yields
statements (and, while it waits for something only time can bring, :class:`Sleep`), and
:func:`run_flow` does the I/O the sync or the async way.

One exception to "nothing here commits": a connection in AUTOCOMMIT mode has no
transaction to join, and would commit each statement on its own. Several statements that
belong together (the chunks of one bulk enqueue) then run in a transaction of their own,
opened and committed (or rolled back) here, so they are written whole or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

__all__ = ["AnyBind", "Flow", "Sleep", "in_autocommit", "run_flow", "scalars_each"]

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
