"""The two faces of a durable operation: run its flow in a session, then commit.

A flow from :class:`~sqla_queue.durable.run.DurableRun` holds the decisions; these two
functions only drive it on the session's connection, commit, and turn a
:class:`~sqla_queue.durable.run.Suspension` into :class:`~sqla_queue.durable.run.JobSuspended`
once it is committed. If the flow (or the commit) fails, the session is rolled back, and
the step's writes with it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue.conversation import Flow, drive, drive_async
from sqla_queue.durable.run import JobSuspended, Suspension

__all__ = ["commit_flow", "commit_flow_async", "read_flow", "read_flow_async"]

T = TypeVar("T")


def _settled(value: Any) -> Any:
    if isinstance(value, Suspension):
        raise JobSuspended(value)
    return value


def commit_flow(session: Session, flow: Flow[T]) -> T:
    """Run ``flow`` in ``session``'s transaction and commit it; its value.

    A :class:`Suspension` is raised as :class:`JobSuspended` after the commit.
    """
    try:
        value = drive(session.connection(), flow)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return _settled(value)  # type: ignore[no-any-return]


async def commit_flow_async(session: AsyncSession, flow: Flow[T]) -> T:
    """:func:`commit_flow` for an ``AsyncSession``."""
    try:
        value = await drive_async(await session.connection(), flow)
        await session.commit()
    except BaseException:
        await session.rollback()
        raise
    return _settled(value)  # type: ignore[no-any-return]


def read_flow(session: Session, flow: Flow[T]) -> T:
    """Run ``flow`` (reads only) in ``session``'s transaction, committing nothing."""
    return drive(session.connection(), flow)


async def read_flow_async(session: AsyncSession, flow: Flow[T]) -> T:
    """:func:`read_flow` for an ``AsyncSession``."""
    return await drive_async(await session.connection(), flow)
