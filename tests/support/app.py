"""A small host application for the test suite: its own models, and a queue beside them.

Worker subprocesses import it as ``tests.support.app:queue``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import threading
import time
from typing import Any

from sqlalchemy import BigInteger, DateTime, Integer, String, Text, func, insert, text, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext, Queue, Reschedule, RetryPolicy

QUEUE_SCHEMA = "app_jobs"


class Base(DeclarativeBase):
    """The host's declarative base."""


class Order(Base):
    """A business table that enqueues happen next to."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


class Result(Base):
    """One row per job that ran to completion: the unique key catches a second execution."""

    __tablename__ = "results"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[str | None] = mapped_column(Text)


class ExecutionLog(Base):
    """One row per execution (not unique): start and end as the database saw them."""

    __tablename__ = "execution_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    key: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.clock_timestamp()
    )
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class Shipment(Base):
    """A row durable jobs wait on (``queue.condition``)."""

    __tablename__ = "shipments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(20), default="new")


class StepWrite(Base):
    """One row per durable step's write: the primary key catches a step written twice."""

    __tablename__ = "step_writes"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    step: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str | None] = mapped_column(Text)


queue = Queue(Base, schema=QUEUE_SCHEMA, lost_interval=30.0)


def _log_start(session: Session, ctx: JobContext[Any], key: str | None = None) -> int:
    row_id = session.execute(
        insert(ExecutionLog)
        .values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid(), key=key)
        .returning(ExecutionLog.id)
    ).scalar_one()
    session.commit()
    return row_id


def _log_end(session: Session, row_id: int) -> None:
    session.execute(
        update(ExecutionLog)
        .where(ExecutionLog.id == row_id)
        .values(finished_at=func.clock_timestamp())
    )
    session.commit()


@queue.task(name="record", pass_context=True)
def record(ctx: JobContext[Session], value: str | None = None, pause: float = 0.0) -> str | None:
    """Log the execution and insert the job's unique result row."""
    session = ctx.session
    row_id = _log_start(session, ctx)
    if pause:
        time.sleep(pause)
    session.add(Result(job_id=ctx.job_id, value=value))
    session.commit()
    _log_end(session, row_id)
    return value


@queue.task(name="record_async", pass_context=True)
async def record_async(ctx: JobContext[AsyncSession], value: str | None = None) -> str | None:
    """The async twin of :func:`record`, for async workers."""
    session = ctx.session
    await session.execute(
        insert(ExecutionLog).values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )
    session.add(Result(job_id=ctx.job_id, value=value))
    await session.commit()
    await asyncio.sleep(0)
    return value


@queue.task(name="noop")
def noop() -> None:
    """Do nothing."""


@queue.task(name="boom")
def boom(message: str = "kaboom") -> None:
    """Always fail."""
    raise ValueError(message)


@queue.task(
    name="flaky",
    pass_context=True,
    max_attempts=4,
    retry=RetryPolicy(min_delay=0.2, max_delay=0.8, factor=2.0, jitter=0.25),
)
def flaky(ctx: JobContext[Session], failures: int) -> int:
    """Fail the first ``failures`` attempts, then succeed."""
    _log_end(ctx.session, _log_start(ctx.session, ctx))
    if ctx.attempt <= failures:
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    return ctx.attempt


def log_interval(
    session: Session, ctx: JobContext[Any], started: float, key: str | None = None
) -> None:
    """Record one execution, start to end, in one insert after the fact.

    The times come from this machine's clock, shared by every worker process. The
    handler's own bookkeeping commits asynchronously: its durability is not under test,
    and a synchronous commit per job would make the queue tests measure the disk.
    """
    session.execute(text("SET LOCAL synchronous_commit = off"))
    session.execute(
        insert(ExecutionLog).values(
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            pid=os.getpid(),
            key=key,
            started_at=dt.datetime.fromtimestamp(started, dt.UTC),
            finished_at=func.clock_timestamp(),
        )
    )
    session.commit()


@queue.task(name="keyed", pass_context=True)
def keyed(ctx: JobContext[Session], key: str, seq: int, pause: float = 0.0) -> None:
    """Log start and end under ``key``, to check per-key serialization and order."""
    started = time.time()
    if pause:
        time.sleep(pause)
    log_interval(ctx.session, ctx, started, key=f"{key}:{seq}")


@queue.task(name="sleepy", pass_context=True)
def sleepy(ctx: JobContext[Session], seconds: float, cooperative: bool = True) -> str:
    """Sleep; a cooperative one returns early when shutdown is requested."""
    row_id = _log_start(ctx.session, ctx)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cooperative and ctx.shutdown_requested:
            break
        time.sleep(0.05)
    _log_end(ctx.session, row_id)
    return "done"


@queue.task(name="crash", max_reclaims=2, lost_interval=1.0)
def crash() -> None:
    """Kill the worker process outright, every time."""
    os._exit(3)


@queue.task(name="tally", pass_context=True)
def tally(ctx: JobContext[Session], n: int) -> None:
    """One statement, one transaction: log the execution and insert the unique result row.

    A second execution of the same job violates the unique key, so it shows up as a
    failed job instead of passing unnoticed.
    """
    session = ctx.session
    session.execute(
        text(
            "WITH r AS (INSERT INTO results (job_id, value) VALUES (:job, :value)) "
            "INSERT INTO execution_log (job_id, attempt, pid) VALUES (:job, :attempt, :pid)"
        ),
        {"job": ctx.job_id, "value": str(n), "attempt": ctx.attempt, "pid": os.getpid()},
    )
    session.commit()


@queue.task(name="slow_first", pass_context=True, lost_interval=1.0)
def slow_first(ctx: JobContext[Session], seconds: float = 3.0) -> str:
    """The first attempt outlives its lease; later attempts return at once."""
    row_id = _log_start(ctx.session, ctx)
    if ctx.attempt == 1:
        time.sleep(seconds)
    _log_end(ctx.session, row_id)
    return f"attempt {ctx.attempt}"


@queue.task(
    name="chaos",
    pass_context=True,
    lost_interval=2.0,
    # Chaos loses jobs on purpose (SIGKILL) and kills their connections (which fails an
    # attempt): both count attempts, so leave room for several before giving up.
    max_attempts=10,
    max_reclaims=8,
    retry=RetryPolicy(min_delay=0.1, max_delay=0.5, factor=2.0, jitter=0.25),
)
def chaos(ctx: JobContext[Session], n: int, pause: float = 0.05) -> int:
    """Log the execution, pause (so kills land mid-job), then record the result.

    The result row and the execution's finished mark commit together; a later execution
    of the same job keeps the first result (the handler is idempotent, as the docs ask).
    """
    session = ctx.session
    row_id = session.execute(
        text(
            "INSERT INTO execution_log (job_id, attempt, pid) "
            "VALUES (:job, :attempt, :pid) RETURNING id"
        ),
        {"job": ctx.job_id, "attempt": ctx.attempt, "pid": os.getpid()},
    ).scalar_one()
    session.commit()
    if pause:
        time.sleep(pause)
    session.execute(
        text(
            "WITH r AS (INSERT INTO results (job_id, value) VALUES (:job, :value) "
            "ON CONFLICT (job_id) DO NOTHING) "
            "UPDATE execution_log SET finished_at = clock_timestamp() WHERE id = :row"
        ),
        {"job": ctx.job_id, "value": str(n), "row": row_id},
    )
    session.commit()
    return n


@queue.task(name="sleepy_async", pass_context=True)
async def sleepy_async(
    ctx: JobContext[AsyncSession], seconds: float, cooperative: bool = True
) -> str:
    """The async twin of :func:`sleepy`: a cooperative one wakes on the shutdown event."""
    session = ctx.session
    row_id = (
        await session.execute(
            insert(ExecutionLog)
            .values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
            .returning(ExecutionLog.id)
        )
    ).scalar_one()
    await session.commit()
    if cooperative:
        waiter = asyncio.ensure_future(ctx.shutdown_event.wait())
        await asyncio.wait({waiter}, timeout=seconds)
        waiter.cancel()
    else:
        await asyncio.sleep(seconds)
    await session.execute(
        update(ExecutionLog)
        .where(ExecutionLog.id == row_id)
        .values(finished_at=func.clock_timestamp())
    )
    await session.commit()
    return "done"


# -- issue 14: unique jobs, cancel, results, transactional handlers, linked rows -------------
#
# The lifecycle tests run their workers in threads of the test process, so a handler and its
# test can meet on a :class:`Gate`: the handler says it entered, then waits until the test
# opens the gate (or until its job is cancelled, or a bound passes: a test never hangs).

#: How long a gated handler waits at most before it gives up (and its test fails).
GATE_TIMEOUT = 15.0


class Gate:
    """Where a handler and its test meet: ``entered`` by the handler, ``opened`` by the test."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        #: What the handler saw of its job's cancel request when it stopped waiting.
        self.saw_cancel: bool | None = None

    def open(self) -> None:
        self.opened.set()


_GATES: dict[str, Gate] = {}
_GATES_LOCK = threading.Lock()


def gate(name: str) -> Gate:
    """The gate called ``name`` (made on first use, shared by the test and the handler)."""
    with _GATES_LOCK:
        return _GATES.setdefault(name, Gate())


def reset_gates() -> None:
    """Open every gate (so no handler stays parked) and forget them all."""
    with _GATES_LOCK:
        gates = list(_GATES.values())
        _GATES.clear()
    for each in gates:
        each.open()


class OrderLine(Base):
    """A business row with a composite primary key, for jobs linked to such rows."""

    __tablename__ = "order_lines"

    order_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    sku: Mapped[str] = mapped_column(String(50))


#: ``order.jobs``: the jobs enqueued with ``about=order`` (a read-only relationship).
Order.jobs = queue.about_relationship(Order, order_by=queue.Job.id)


@queue.task(name="echo")
def echo(value: Any = None) -> Any:
    """Return the argument: the job's result is its payload, for unique and result tests."""
    return value


#: Quick retries for the lifecycle tasks: a retried attempt shows at once.
QUICK_RETRY = RetryPolicy(min_delay=0.05, max_delay=0.05, jitter=0.0)


@queue.task(name="gated", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def gated(
    ctx: JobContext[Session],
    name: str,
    until: str = "gate",
    then: str = "return",
    value: Any = None,
) -> Any:
    """Enter ``gate(name)``, wait, then return ``value`` (``then="return"``) or raise.

    ``until="gate"`` waits for the test to open the gate and ignores any cancel request;
    ``until="cancel"`` waits for the worker to deliver the job's cancel request (a
    cooperative handler polling ``ctx.cancel_requested``). Three attempts: a job that ends
    after a raise without being retried was not retried on purpose.
    """
    here = gate(name)
    here.entered.set()
    deadline = time.monotonic() + GATE_TIMEOUT
    while time.monotonic() < deadline:
        if until == "cancel" and ctx.cancel_requested:
            break
        if until == "gate" and here.opened.wait(0.01):
            break
        time.sleep(0.01)
    else:
        return "gate timed out"
    here.saw_cancel = ctx.cancel_requested
    if then == "raise":
        raise RuntimeError(f"{name}: raised on purpose")
    return value


@queue.task(name="gated_async", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
async def gated_async(
    ctx: JobContext[AsyncSession],
    name: str,
    until: str = "gate",
    then: str = "return",
    value: Any = None,
) -> Any:
    """The async twin of :func:`gated`.

    ``until="sleep"`` just awaits a long sleep: only the cancellation of the handler's task
    (the job's cancel request) ends it early. ``until="event"`` shields itself from that
    cancellation and awaits ``ctx.cancel_event`` instead.
    """
    here = gate(name)
    here.entered.set()
    if until == "sleep":
        await asyncio.sleep(GATE_TIMEOUT)
        return "slept through"
    if until == "event":
        try:
            await asyncio.wait_for(asyncio.shield(ctx.cancel_event.wait()), GATE_TIMEOUT)
        except asyncio.CancelledError:
            await asyncio.wait_for(ctx.cancel_event.wait(), GATE_TIMEOUT)
    else:
        deadline = time.monotonic() + GATE_TIMEOUT
        while not here.opened.is_set():
            if time.monotonic() > deadline:
                return "gate timed out"
            await asyncio.sleep(0.01)
    here.saw_cancel = ctx.cancel_requested
    if then == "raise":
        raise RuntimeError(f"{name}: raised on purpose")
    return value


@queue.task(
    name="tx_write",
    pass_context=True,
    transactional=True,
    max_attempts=2,
    retry=QUICK_RETRY,
)
def tx_write(
    ctx: JobContext[Session],
    value: str,
    fail_attempts: int = 0,
    child: bool = False,
    gate_name: str | None = None,
    reschedule: bool = False,
) -> Any:
    """Write the job's ``results`` row (and maybe a child job) through ``ctx.session``,
    uncommitted: the worker commits it with the job's completion, or rolls it back.

    Fails its first ``fail_attempts`` attempts after writing; with ``gate_name``, waits at
    that gate after writing, before returning; with ``reschedule``, returns a
    ``Reschedule`` an hour away (committed with the write, as a success is).
    """
    session = ctx.session
    session.add(Result(job_id=ctx.job_id, value=f"{value}@{ctx.attempt}"))
    session.flush()
    if child:
        echo.enqueue(session, value=f"child of {ctx.job_id}")
    if gate_name is not None:
        here = gate(gate_name)
        here.entered.set()
        deadline = time.monotonic() + GATE_TIMEOUT
        while not here.opened.wait(0.01) and time.monotonic() < deadline:
            here.saw_cancel = ctx.cancel_requested
    if ctx.attempt <= fail_attempts:
        raise RuntimeError(f"attempt {ctx.attempt} fails after writing")
    if reschedule:
        return Reschedule(in_=3600)
    return value


@queue.task(
    name="tx_write_async",
    pass_context=True,
    transactional=True,
    max_attempts=2,
    retry=QUICK_RETRY,
)
async def tx_write_async(
    ctx: JobContext[AsyncSession],
    value: str,
    fail_attempts: int = 0,
    child: bool = False,
    gate_name: str | None = None,
    reschedule: bool = False,
) -> Any:
    """The async twin of :func:`tx_write`, through an ``AsyncSession``."""
    session = ctx.session
    session.add(Result(job_id=ctx.job_id, value=f"{value}@{ctx.attempt}"))
    await session.flush()
    if child:
        await echo.enqueue(session, value=f"child of {ctx.job_id}")
    if gate_name is not None:
        here = gate(gate_name)
        here.entered.set()
        deadline = time.monotonic() + GATE_TIMEOUT
        while not here.opened.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    if ctx.attempt <= fail_attempts:
        raise RuntimeError(f"attempt {ctx.attempt} fails after writing")
    if reschedule:
        return Reschedule(in_=3600)
    return value
