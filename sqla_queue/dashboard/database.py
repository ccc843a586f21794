"""The dashboard's way to the database: whatever the host app already has.

An ``Engine`` or ``sessionmaker`` runs its statements in Starlette's thread pool (the
event loop never blocks on a query); an ``AsyncEngine`` or ``async_sessionmaker`` runs them
through ``run_sync`` on its own connection. Either way the dashboard's code is written once,
against a sync :class:`~sqlalchemy.engine.Connection`, as the CLI's is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from sqla_queue.dashboard.queue_protocol import DashboardQueue

__all__ = ["DashboardBind", "Database"]

T = TypeVar("T")

#: What :func:`~sqla_queue.dashboard.create_dashboard` accepts as its database.
DashboardBind = Engine | sessionmaker[Session] | AsyncEngine | async_sessionmaker[AsyncSession]


class Database:
    """Runs a function of a sync ``Connection`` on the host's engine or session factory.

    :meth:`read` gives it a transaction that is rolled back (a dashboard page never
    writes); :meth:`write` one that commits when the function returns.
    """

    def __init__(self, bind: Any) -> None:
        if not isinstance(bind, Engine | sessionmaker | AsyncEngine | async_sessionmaker):
            raise TypeError(
                "the dashboard needs an Engine, a sessionmaker, an AsyncEngine or an "
                f"async_sessionmaker, got {type(bind).__name__}"
            )
        self.bind = bind

    @property
    def is_async(self) -> bool:
        """Whether the bind is an ``AsyncEngine`` or an ``async_sessionmaker``."""
        return isinstance(self.bind, AsyncEngine | async_sessionmaker)

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in a transaction that is rolled back afterwards."""
        return await self._run(fn, commit=False)

    async def write(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in a transaction that commits when ``fn`` returns."""
        return await self._run(fn, commit=True)

    async def cancel(self, queue: DashboardQueue, job_ids: list[int]) -> dict[int, str]:
        """``queue.cancel``: it commits in a short transaction of its own, so it gets the
        bind itself (its engine), never a connection of ours."""
        if self.is_async:
            outcomes: dict[int, str] = await queue.cancel(self.bind, job_ids)
            return outcomes
        result: dict[int, str] = await run_in_threadpool(queue.cancel, self.bind, job_ids)
        return result

    async def _run(self, fn: Callable[[Connection], T], *, commit: bool) -> T:
        bind = self.bind
        if isinstance(bind, AsyncEngine):
            async with bind.begin() if commit else bind.connect() as aconn:
                return await aconn.run_sync(fn)
        if isinstance(bind, async_sessionmaker):

            def in_session(session: Session) -> T:
                return fn(session.connection())

            asession: AsyncSession
            if commit:
                async with bind.begin() as asession:
                    return await asession.run_sync(in_session)
            async with bind() as asession:
                return await asession.run_sync(in_session)
        return await run_in_threadpool(self._run_sync, fn, commit)

    def _run_sync(self, fn: Callable[[Connection], T], commit: bool) -> T:
        bind = self.bind
        if isinstance(bind, Engine):
            with bind.begin() if commit else bind.connect() as connection:
                return fn(connection)
        assert isinstance(bind, sessionmaker)
        with bind.begin() if commit else bind() as session:
            return fn(session.connection())
