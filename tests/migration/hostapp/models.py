"""A host application with its own models, naming convention and a queue in its own schema.

It stands in for a real project that adopts sqla_queue: the queue's tables must come out of
its own Alembic environment exactly as ``queue.create_all`` would build them, and its own
tables must autogenerate as they always did.
"""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    MetaData,
    Numeric,
    String,
    Text,
    func,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext, Queue

QUEUE_SCHEMA = "work"

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """The host's declarative base, with the host's naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Customer(Base):
    """A business table."""

    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


queue = Queue(Base, schema=QUEUE_SCHEMA)


class Invoice(Base):
    """A business table that points at the job which mailed it (a host-to-queue reference)."""

    __tablename__ = "invoices"
    __table_args__ = (CheckConstraint("total >= 0", name="total_positive"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), index=True)
    total: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    note: Mapped[str | None] = mapped_column(Text)
    mail_job_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey(queue.tables.jobs.c.id, ondelete="SET NULL")
    )


@queue.task(name="mail_invoice")
def mail_invoice(invoice_id: int) -> int:
    """Pretend to mail an invoice."""
    return invoice_id


#: At most this many ``render_report`` jobs run at once, across all workers.
REPORT_LIMIT = 2


@queue.task(name="render_report", concurrency_limit=REPORT_LIMIT, pass_context=True)
def render_report(ctx: JobContext[Session], report_id: int) -> dict[str, Any]:
    """Pretend to render a report, slowly enough that runs overlap.

    It returns what it saw in the database, for the tests to check the limit with: its own
    capacity slot, and the slots of every running ``render_report`` execution, looked at
    when it starts and again when it ends.
    """
    executions = queue.tables.executions
    running = select(executions.c.slot).where(
        executions.c.task == "render_report", executions.c.state == "running"
    )
    own = select(executions.c.slot).where(executions.c.id == ctx.job_id)
    seen = [sorted(ctx.session.scalars(running), key=str)]
    slot = ctx.session.scalar(own)
    time.sleep(0.2)
    seen.append(sorted(ctx.session.scalars(running), key=str))
    return {"report_id": report_id, "slot": slot, "seen": seen}


@queue.task(name="sync_customer", pass_context=True)
def sync_customer(ctx: JobContext[Session], customer_id: int) -> dict[str, Any]:
    """Pretend to sync a customer's account; a customer's jobs share one ``queue_id``.

    It returns what it saw, for the tests to check that a key runs one job at a time and in
    order: the running executions of its key when it starts and again when it ends, and the
    database's clock when it starts.
    """
    executions = queue.tables.executions
    running = select(executions.c.id).where(
        executions.c.queue_id == ctx.queue_id, executions.c.state == "running"
    )
    seen = [sorted(ctx.session.scalars(running))]
    started = ctx.session.execute(select(func.clock_timestamp())).scalar_one()
    time.sleep(0.05)
    seen.append(sorted(ctx.session.scalars(running)))
    return {"customer_id": customer_id, "started": started.isoformat(), "seen": seen}
