"""Running a statement on whatever the caller holds: Session, Connection or their async twins.

Every call joins the caller's transaction; nothing here commits. Sync callers get the
result, async callers get a coroutine of it, and both share this one code path.

One exception to "nothing here commits": a connection in AUTOCOMMIT mode has no
transaction to join, and would commit each statement on its own. Several statements that
belong together (the chunks of one bulk enqueue) then run in a transaction of their own,
opened and committed (or rolled back) here, so they are written whole or not at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

__all__ = ["AnyBind", "in_autocommit", "scalars_each"]

AnyBind = Session | Connection | AsyncSession | AsyncConnection


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
