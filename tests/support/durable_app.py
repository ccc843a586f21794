"""Durable tasks on the test app's queue (tests/support/app.py).

Worker subprocesses import ``tests.support.durable_app:queue``: the same queue, with these
tasks registered on it too. Every step writes one ``StepWrite`` row, whose primary key
catches a step whose writes would commit twice.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue import JobContext
from tests.support.app import QUICK_RETRY, Shipment, StepWrite, queue

__all__ = ["queue", "shipped"]

#: The condition ``dj_until`` waits for.
shipped = queue.condition(Shipment, Shipment.status == "shipped")

#: Set in a test's process: the first attempt of ``dj_crashy`` fails after this many steps.
CRASH_AFTER = "SQLA_QUEUE_TEST_CRASH_AFTER"


def _write(session: Session, job_id: int, step: str, value: Any = None) -> None:
    session.add(StepWrite(job_id=job_id, step=step, value=None if value is None else str(value)))


@queue.task(name="dj_steps", pass_context=True, transactional=True)
def dj_steps(ctx: JobContext[Session], count: int) -> int:
    """``count`` steps, each writing one row; the sum of their results."""
    total = 0
    for i in range(count):
        with ctx.step(f"s{i}") as step:
            if not step.done:
                _write(ctx.session, ctx.job_id, f"s{i}", i)
                step.result = i
        total += step.result
    return total


@queue.task(name="dj_crashy", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def dj_crashy(ctx: JobContext[Session], count: int, crash_after: int) -> list[int]:
    """``count`` steps; the first attempt raises after ``crash_after`` of them."""
    values = []
    for i in range(count):
        if ctx.attempt == 1 and i == crash_after:
            raise RuntimeError("crash mid-job")
        values.append(ctx.run_step(f"s{i}", _step_value, ctx, i))
    return values


def _step_value(ctx: JobContext[Session], i: int) -> int:
    _write(ctx.session, ctx.job_id, f"s{i}", ctx.attempt)
    return i * 10


@queue.task(name="dj_async_steps", pass_context=True, transactional=True)
async def dj_async_steps(ctx: JobContext[AsyncSession], count: int) -> int:
    """``dj_steps`` for an async handler (``async with``, ``await ctx.run_step``)."""
    total = 0
    for i in range(count):
        async with ctx.step(f"s{i}") as step:
            if not step.done:
                ctx.session.add(StepWrite(job_id=ctx.job_id, step=f"s{i}", value=str(i)))
                step.result = i
        total += step.result
    total += int(await ctx.run_step("last", _async_value, 100))
    return total


async def _async_value(value: int) -> int:
    return value


@queue.task(name="dj_sleepy", pass_context=True)
def dj_sleepy(ctx: JobContext[Session], seconds: float) -> int:
    """A step, a sleep, a step: how many times the handler started (one row per start)."""
    ctx.run_step("before", lambda: _write(ctx.session, ctx.job_id, "before"))
    ctx.sleep(seconds)
    ctx.run_step("after", lambda: _write(ctx.session, ctx.job_id, "after"))
    return ctx.attempt


@queue.task(name="dj_signal", pass_context=True)
def dj_signal(ctx: JobContext[Session], timeout: float | None = None) -> Any:
    """Wait for signal ``approved``; its payload (or ``"timed out"``)."""
    from sqla_queue.errors import SignalTimeoutError

    try:
        return ctx.wait_for_signal("approved", timeout=timeout)
    except SignalTimeoutError:
        return "timed out"


@queue.task(name="dj_async_signal", pass_context=True)
async def dj_async_signal(ctx: JobContext[AsyncSession]) -> Any:
    """``dj_signal`` in an async handler, after an async sleep."""
    await ctx.sleep(0.2)
    return await ctx.wait_for_signal("approved")


@queue.task(name="dj_until", pass_context=True)
def dj_until(ctx: JobContext[Session], shipment_id: int) -> str:
    """Wait until shipment ``shipment_id`` is shipped."""
    ctx.wait_until(shipped, shipment_id)
    status = ctx.session.execute(
        select(Shipment.status).where(Shipment.id == shipment_id)
    ).scalar_one()
    return str(status)


@queue.task(name="dj_refund", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def dj_refund(ctx: JobContext[Session], charge: Any) -> None:
    """A compensation: one row per compensated step."""
    _write(ctx.session, ctx.job_id, f"refund:{charge}", os.getpid())
    ctx.session.commit()


@queue.task(name="dj_saga", pass_context=True, max_attempts=1)
def dj_saga(ctx: JobContext[Session], fail: bool, wait: bool = False) -> str:
    """Three compensated steps, then a failure (or a wait for a signal that never comes)."""
    for name in ("reserve", "charge", "ship"):
        ctx.run_step(name, _saga_step, ctx, name, compensate=dj_refund)
    if wait:
        ctx.wait_for_signal("never")
    if fail:
        raise RuntimeError("saga failed")
    return "done"


def _saga_step(ctx: JobContext[Session], name: str) -> str:
    _write(ctx.session, ctx.job_id, name)
    return name


@queue.task(name="dj_import", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def dj_import(ctx: JobContext[Session], total: int, batch: int, fail_at: int | None) -> int:
    """A cursor over ``total`` items, ``batch`` a time; the first attempt fails at ``fail_at``."""
    for part in ctx.cursor("import", start=0):
        start = part.position
        if start >= total:
            break
        if ctx.attempt == 1 and fail_at is not None and start >= fail_at:
            raise RuntimeError("import interrupted")
        for i in range(start, min(start + batch, total)):
            _write(ctx.session, ctx.job_id, f"item{i}", ctx.attempt)
        part.advance(start + batch)
    count = ctx.session.execute(
        select(func.count()).select_from(StepWrite).where(StepWrite.job_id == ctx.job_id)
    ).scalar_one()
    return int(count)


@queue.task(name="dj_versioned", pass_context=True)
def dj_versioned(ctx: JobContext[Session], version: int) -> Any:
    """One step at ``version``, then a wait for signal ``go``."""
    with ctx.step("reserve", version=version) as step:
        if not step.done:
            step.result = {"by": version}
    ctx.wait_for_signal("go")
    return step.result


@queue.task(name="dj_until_then_sleep", pass_context=True)
def dj_until_then_sleep(ctx: JobContext[Session], shipment_id: int) -> str:
    """Wait until shipped, mark the shipment delivered (the condition no longer holds),
    then sleep: the replay after the sleep must not wait for the condition again."""
    ctx.wait_until(shipped, shipment_id)

    def deliver() -> None:
        shipment = ctx.session.get(Shipment, shipment_id)
        assert shipment is not None
        shipment.status = "delivered"

    ctx.run_step("deliver", deliver)
    ctx.sleep(3600)
    return "done"


@queue.task(name="dj_async_import", pass_context=True, transactional=True)
async def dj_async_import(ctx: JobContext[AsyncSession], shipment_id: int, total: int) -> int:
    """An async cursor over ``total`` items, then an async wait for shipment ``shipment_id``
    to be shipped; the number of items written."""
    async for part in ctx.cursor("import", start=0):
        if part.position >= total:
            break
        ctx.session.add(StepWrite(job_id=ctx.job_id, step=f"item{part.position}"))
        part.advance(part.position + 1)
    await ctx.wait_until(shipped, shipment_id)
    return total


@queue.task(name="dj_signal_then_sleep", pass_context=True)
def dj_signal_then_sleep(ctx: JobContext[Session]) -> str:
    """Wait an hour at most for signal ``approved``, then sleep: the branch the wait took."""
    from sqla_queue.errors import SignalTimeoutError

    try:
        branch = f"signalled {ctx.wait_for_signal('approved', timeout=3600)}"
    except SignalTimeoutError:
        branch = "timed out"
    ctx.sleep(3600)
    return branch


@queue.task(name="dj_bad_result", pass_context=True, transactional=True)
def dj_bad_result(ctx: JobContext[Session]) -> None:
    """A step whose result PostgreSQL cannot store (NaN): its write must not commit."""
    with ctx.step("bad") as step:
        if not step.done:
            _write(ctx.session, ctx.job_id, "bad")
            step.result = {"ratio": float("nan")}
