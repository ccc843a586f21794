"""Running a statement on whatever the caller holds: Session, Connection or their async twins.

Every call joins the caller's transaction; nothing here commits. Sync callers get the
result, async callers get a coroutine of it, and both share this one code path.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

__all__ = ["AnyBind", "scalars_each"]

AnyBind = Session | Connection | AsyncSession | AsyncConnection


def scalars_each(
    bind: AnyBind, statement: Executable, param_sets: Sequence[Mapping[str, Any]]
) -> list[Any] | Coroutine[Any, Any, list[Any]]:
    """Execute ``statement`` once per parameter set; return all first-column values."""
    if isinstance(bind, AsyncSession | AsyncConnection):
        return _scalars_each_async(bind, statement, param_sets)
    connection = bind.connection() if isinstance(bind, Session) else bind
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
    values: list[Any] = []
    for params in param_sets:
        result = await connection.execute(statement, dict(params))
        values.extend(result.scalars())
    return values
