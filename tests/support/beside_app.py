"""Tasks that run beside an application's own long transactions (issue 36, section 1).

Worker subprocesses import ``tests.support.beside_app:queue``: the test app's queue, with
these tasks and the durable ones registered on it. Each task here has a lease of
:data:`LEASE` seconds, so a worker that held its jobs only by their own rows would lose
them within the test's holds, which last three leases.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sqlalchemy import func, insert, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue import JobContext
from tests.support.app import ExecutionLog, Order, _log_end, _log_start, queue
from tests.support.durable_app import shipped

__all__ = [
    "LEASE",
    "bs_hold",
    "bs_hold_async",
    "bs_idle",
    "bs_linked",
    "bs_linked_async",
    "bs_until",
    "bs_until_async",
    "queue",
    "shipped",
]

#: The lease of these tasks: a worker not heard of for this long loses its jobs.
LEASE = 2.0


@queue.task(name="bs_hold", pass_context=True, lost_interval=LEASE)
def bs_hold(ctx: JobContext[Session], seconds: float) -> str:
    """Log the execution, then sleep ``seconds`` whatever the worker asks (a job that is
    running while the application's transactions are held)."""
    row_id = _log_start(ctx.session, ctx)
    time.sleep(seconds)
    _log_end(ctx.session, row_id)
    return "held"


@queue.task(name="bs_linked", pass_context=True, lost_interval=LEASE)
def bs_linked(ctx: JobContext[Session], order_id: int) -> str:
    """Log the execution, then write the order the job is about: it waits for whatever
    application transaction holds that row."""
    row_id = _log_start(ctx.session, ctx)
    ctx.session.execute(update(Order).where(Order.id == order_id).values(email="sent@example.com"))
    ctx.session.commit()
    _log_end(ctx.session, row_id)
    return "written"


@queue.task(name="bs_idle", lost_interval=LEASE)
def bs_idle() -> None:
    """Never enqueued: a worker of this task alone claims nothing, and sweeps for lost
    jobs every half lease (its reclaim interval follows its shortest lease)."""


@queue.task(name="bs_until", pass_context=True, lost_interval=LEASE)
def bs_until(ctx: JobContext[Session], shipment_id: int) -> str:
    """A durable job that waits until shipment ``shipment_id`` is shipped."""
    ctx.wait_until(shipped, shipment_id)
    return "shipped"


async def _log_start_async(session: AsyncSession, ctx: JobContext[Any]) -> int:
    inserted = insert(ExecutionLog).values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    row_id = (await session.execute(inserted.returning(ExecutionLog.id))).scalar_one()
    await session.commit()
    return int(row_id)


async def _log_end_async(session: AsyncSession, row_id: int) -> None:
    ended = update(ExecutionLog).where(ExecutionLog.id == row_id)
    await session.execute(ended.values(finished_at=func.clock_timestamp()))
    await session.commit()


@queue.task(name="bs_hold_async", pass_context=True, lost_interval=LEASE)
async def bs_hold_async(ctx: JobContext[AsyncSession], seconds: float) -> str:
    """:func:`bs_hold` for the async worker."""
    row_id = await _log_start_async(ctx.session, ctx)
    await asyncio.sleep(seconds)
    await _log_end_async(ctx.session, row_id)
    return "held"


@queue.task(name="bs_linked_async", pass_context=True, lost_interval=LEASE)
async def bs_linked_async(ctx: JobContext[AsyncSession], order_id: int) -> str:
    """:func:`bs_linked` for the async worker."""
    row_id = await _log_start_async(ctx.session, ctx)
    written = update(Order).where(Order.id == order_id).values(email="sent@example.com")
    await ctx.session.execute(written)
    await ctx.session.commit()
    await _log_end_async(ctx.session, row_id)
    return "written"


@queue.task(name="bs_until_async", pass_context=True, lost_interval=LEASE)
async def bs_until_async(ctx: JobContext[AsyncSession], shipment_id: int) -> str:
    """:func:`bs_until` for the async worker."""
    await ctx.wait_until(shipped, shipment_id)
    return "shipped"
