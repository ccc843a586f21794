"""Durable tasks for the edge tests of issue 36 (tests/integration/test_durable_edges_36.py),
on the test app's queue: a saga that fails until told otherwise (requeue after its
compensations ran), nested and repeated steps and cursors, a timed-out wait re-raised,
and waits on conditions with typed keys."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from sqlalchemy import Numeric, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext
from tests.support.app import QUICK_RETRY, Shipment, StepWrite, queue

__all__ = ["Crate", "EdgeBase", "Invoice", "Parcel", "queue"]


class EdgeBase(DeclarativeBase):
    """The tables of these tests only, created by the tests that use them."""


class Parcel(EdgeBase):
    """A row keyed by a UUID, which a condition waits on."""

    __tablename__ = "edge_parcels"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(20), default="new")


class Invoice(EdgeBase):
    """A row keyed by a ``numeric(10,2)``, which a condition waits on."""

    __tablename__ = "edge_invoices"

    id: Mapped[Decimal] = mapped_column(Numeric(10, 2), primary_key=True)
    status: Mapped[str] = mapped_column(String(20), default="open")


class Crate(EdgeBase):
    """A row keyed by an integer, which a condition waits on (the tests hold it locked)."""

    __tablename__ = "edge_crates"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(20), default="new")


parcel_delivered = queue.condition(Parcel, Parcel.status == "delivered", name="edge_parcel")
invoice_paid = queue.condition(Invoice, Invoice.status == "paid", name="edge_invoice")
crate_shipped = queue.condition(Crate, Crate.status == "shipped", name="edge_crate")


def _count(session: Session, job_id: int, prefix: str) -> int:
    return int(
        session.execute(
            select(func.count())
            .select_from(StepWrite)
            .where(StepWrite.job_id == job_id, StepWrite.step.like(f"{prefix}@%"))
        ).scalar_one()
    )


def _write(session: Session, job_id: int, prefix: str) -> int:
    """One more row for ``prefix``; how many there are now."""
    number = _count(session, job_id, prefix) + 1
    session.add(StepWrite(job_id=job_id, step=f"{prefix}@{number}"))
    return number


@queue.task(name="edge_undo", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def edge_undo(ctx: JobContext[Session], job_id: int, what: str) -> None:
    """A compensation: one ``undo:<what>`` row for the job it undoes."""
    _write(ctx.session, job_id, f"undo:{what}")
    ctx.session.commit()


@queue.task(name="edge_saga", pass_context=True, max_attempts=1)
def edge_saga(ctx: JobContext[Session], shipment_id: int) -> list[str]:
    """A compensated step (``charge``), a plain one (``log``), then a failure unless
    shipment ``shipment_id`` is ``ok``; each step's result names its run."""
    results = []
    with ctx.step("charge") as step:
        if not step.done:
            step.result = f"charge {_write(ctx.session, ctx.job_id, 'charge')}"
            step.compensate_with(edge_undo.call(ctx.job_id, "charge"))
    results.append(step.result)
    results.append(ctx.run_step("log", lambda: f"log {_write(ctx.session, ctx.job_id, 'log')}"))
    status = ctx.session.execute(
        select(Shipment.status).where(Shipment.id == shipment_id)
    ).scalar_one()
    ctx.session.rollback()
    if status != "ok":
        raise RuntimeError("the saga fails")
    return results


@queue.task(name="edge_nested", pass_context=True, max_attempts=1)
def edge_nested(ctx: JobContext[Session], inner: str) -> str:
    """A step with a step (``inner="step"``) or a cursor (``"cursor"``) inside it, or a
    cursor with a step inside a batch (``"in-batch"``): refused; the error's text."""
    try:
        if inner == "in-batch":
            for batch in ctx.cursor("outer", start=0):
                _write(ctx.session, ctx.job_id, "batch")
                ctx.run_step("inner", lambda: 1)
                batch.advance(1)
            return "no error"
        with ctx.step("outer") as step:
            if not step.done:
                _write(ctx.session, ctx.job_id, "outer")
                if inner == "step":
                    ctx.run_step("inner", lambda: 1)
                else:
                    for batch in ctx.cursor("inner", start=0):
                        batch.advance(None)
                step.result = 1
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@queue.task(name="edge_async_nested", pass_context=True, max_attempts=1)
async def edge_async_nested(ctx: JobContext[Any], inner: str) -> str:
    """``edge_nested`` in an async handler (``"step"`` or ``"in-batch"``)."""
    try:
        if inner == "in-batch":
            async for batch in ctx.cursor("outer", start=0):
                await ctx.run_step("inner", lambda: 1)
                batch.advance(1)
            return "no error"
        async with ctx.step("outer") as step:
            if not step.done:
                await ctx.run_step("inner", lambda: 1)
                step.result = 1
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@queue.task(name="edge_after_break", pass_context=True, max_attempts=1)
async def edge_after_break(ctx: JobContext[Any]) -> list[int]:
    """An async cursor left with ``break``, then a step: allowed."""
    async for batch in ctx.cursor("loop", start=0):
        if batch.position >= 2:
            break
        batch.advance(batch.position + 1)
    return [await ctx.run_step("after", lambda: 7)]


@queue.task(name="edge_repeated", pass_context=True, max_attempts=1)
def edge_repeated(ctx: JobContext[Session], kind: str) -> str:
    """A step (or cursor, or ``run_step``) name used twice in one run: the error's text.
    ``"retry"``: a step that raised runs again under its name (allowed)."""
    try:
        if kind == "step":
            for item in (1, 2, 3):
                with ctx.step("charge") as step:
                    if not step.done:
                        step.result = item
        elif kind == "run_step":
            [ctx.run_step("charge", lambda item=item: item) for item in (1, 2, 3)]
        elif kind == "cursor":
            for _ in range(2):
                for batch in ctx.cursor("import", start=0):
                    batch.advance(None) if batch.position is not None else None
        elif kind == "retry":
            for item in (1, 2):
                try:
                    with ctx.step("flaky") as step:
                        if item == 1:
                            raise KeyError("first try")
                        step.result = item
                except KeyError:
                    continue
            return f"retried {step.result}"
    except ValueError as exc:
        return str(exc)
    return "no error"


@queue.task(name="edge_timeout_reraised", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def edge_timeout_reraised(ctx: JobContext[Session], timeout: float) -> Any:
    """Wait for signal ``go`` at most ``timeout``; a timeout goes up (the attempt fails)."""
    _write(ctx.session, ctx.job_id, f"start{ctx.attempt}")
    ctx.session.commit()
    return ctx.wait_for_signal("go", timeout=timeout)


@queue.task(name="edge_wait_parcel", pass_context=True)
def edge_wait_parcel(ctx: JobContext[Session], key: str) -> str:
    """Wait until the parcel ``key`` (a UUID's text, any case) is delivered."""
    ctx.wait_until(parcel_delivered, key)
    return "delivered"


@queue.task(name="edge_wait_invoice", pass_context=True)
def edge_wait_invoice(ctx: JobContext[Session], key: Any) -> str:
    """Wait until the invoice ``key`` (a number) is paid."""
    ctx.wait_until(invoice_paid, key)
    return "paid"


@queue.task(name="edge_wait_crate", pass_context=True)
def edge_wait_crate(ctx: JobContext[Session], crate_id: int) -> str:
    """Wait until crate ``crate_id`` is shipped."""
    ctx.wait_until(crate_shipped, crate_id)
    return "shipped"


@queue.task(name="edge_plain", pass_context=False)
def edge_plain(value: int) -> int:
    """A job beside the waiters."""
    return value


__all__ += [
    "edge_after_break",
    "edge_async_nested",
    "edge_nested",
    "edge_plain",
    "edge_repeated",
    "edge_saga",
    "edge_timeout_reraised",
    "edge_undo",
    "edge_wait_crate",
    "edge_wait_invoice",
    "edge_wait_parcel",
]


@queue.task(name="edge_def_touches_session", pass_context=True, max_attempts=1)
def edge_def_touches_session(ctx: JobContext[Any], durable: bool) -> str:
    """A ``def`` handler (run by an async worker too): it touches ``ctx.session`` (adds
    a row, never flushed), or begins a step there (refused: a def handler of an async
    worker cannot commit an ``AsyncSession``); what happened."""
    if durable:
        try:
            with ctx.step("refused"):
                pass
        except TypeError as exc:
            return f"refused: {exc}"
        return "no error"
    ctx.session.add(StepWrite(job_id=ctx.job_id, step="never flushed"))
    return type(ctx.session).__name__


@queue.task(name="edge_bad_wait", pass_context=True, max_attempts=1)
def edge_bad_wait(ctx: JobContext[Session], kind: str, value: Any) -> str:
    """``ctx.sleep(value)`` (``kind="sleep"``; ``"inf"``/``"nan"`` as floats), a signal
    wait with that timeout (``"timeout"``), or a wait for a signal named ``value``
    (``"signal"``): the error's type and text."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        value = float(value)
    if kind == "signal":  # names a job's arguments could not carry
        value = {"nul": "go\x00", "surrogate": "go\ud800"}.get(value, value)
    try:
        if kind == "sleep":
            ctx.sleep(value)
        elif kind == "timeout":
            ctx.wait_for_signal("go", timeout=value)
        else:
            ctx.wait_for_signal(value)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@queue.task(name="edge_bad_compensation", pass_context=True, max_attempts=1)
def edge_bad_compensation(ctx: JobContext[Session], bad: str) -> str:
    """A step whose compensation's arguments cannot be stored: the error's type and text
    (the step's write must not commit)."""
    argument: Any = {"nan": float("nan"), "nul": "a\x00b", "object": {1, 2}}[bad]
    try:
        with ctx.step("charge") as step:
            _write(ctx.session, ctx.job_id, "charge")
            step.result = "ch_1"
            step.compensate_with(edge_undo.call(ctx.job_id, argument))
    except TypeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"
