"""The demo's shop: orders, an outbox of confirmation emails, and a queue beside them.

It is laid out the way a host application would use sqla_queue:

* the shop's own declarative ``Base``, with the queue's tables attached to it
  (``Queue(Base, ...)``), so one ``MetaData`` describes everything;
* :func:`place_order` inserts an order and enqueues its confirmation in the *same*
  transaction, then charges the card; a declined card rolls back both;
* :func:`send_confirmation` is the task a worker runs, with a session from the worker's
  own ``sessionmaker`` (``pass_context=True``).

Workers load it as ``sqla_queue.demo.shop:queue``. Everything lives in the PostgreSQL
schema :data:`DEMO_SCHEMA`, so the demo never touches other tables of the database.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    DateTime,
    ForeignKey,
    Identity,
    Integer,
    MetaData,
    String,
    Text,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.schema import CreateSchema

from sqla_queue import JobContext, Queue

__all__ = [
    "DECLINED_CARD",
    "DEMO_SCHEMA",
    "SCHEMA_COMMENT",
    "SEND_LATENCY",
    "Base",
    "Confirmation",
    "Order",
    "PaymentDeclinedError",
    "charge_card",
    "create_tables",
    "place_order",
    "queue",
    "send_confirmation",
]

#: The PostgreSQL schema holding the shop's tables and its queue's tables.
DEMO_SCHEMA = "sqla_queue_demo"
#: Marks the schema as the demo's own, so a rerun may drop it and nothing else.
SCHEMA_COMMENT = "created by `sqla-queue demo`; dropped and recreated by each run"
#: A card number the payment provider always declines (a well-known test card number).
DECLINED_CARD = "4000000000000002"
#: Seconds a confirmation takes to "send", standing in for a call to a mail server.
SEND_LATENCY = 0.002


class Base(DeclarativeBase):
    """The shop's declarative base: every table in :data:`DEMO_SCHEMA`."""

    metadata = MetaData(schema=DEMO_SCHEMA)


class Order(Base):
    """An order. Its confirmation email, once sent, is a row in :class:`Confirmation`."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    customer_email: Mapped[str] = mapped_column(String(200))
    total_cents: Mapped[int] = mapped_column(Integer)
    placed_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class Confirmation(Base):
    """The outbox: one row per confirmation email sent, and which job and process sent it.

    ``order_id`` is deliberately not unique. Jobs run at least once, so a production
    handler would make this write idempotent (a unique key and ``ON CONFLICT DO NOTHING``);
    the demo keeps a plain insert so that a job executed twice would show up as a duplicate
    in its final check.
    """

    __tablename__ = "confirmations"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey(Order.id), index=True)
    job_id: Mapped[int] = mapped_column(BigInteger)
    recipient: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text)
    worker_pid: Mapped[int] = mapped_column(Integer)
    sent_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.clock_timestamp()
    )


# The queue's tables join the shop's metadata (and schema): Alembic would see them too.
queue = Queue(Base, schema=DEMO_SCHEMA)


class PaymentDeclinedError(Exception):
    """The card was declined; the order's transaction is rolled back."""

    def __init__(self, order_id: int) -> None:
        """Remember which order (an id that will never be committed) was declined."""
        super().__init__(f"payment declined for order {order_id}")
        self.order_id = order_id


@queue.task(name="shop.send_confirmation", pass_context=True)
def send_confirmation(ctx: JobContext[Session], order_id: int) -> dict[str, Any]:
    """Send the order's confirmation email, recording it in the outbox.

    Runs in a worker. ``ctx.session`` comes from the worker's ``sessionmaker``; nothing is
    kept unless it is committed.
    """
    session = ctx.session
    order = session.get(Order, order_id)
    if order is None:
        # Cannot happen when the job was enqueued in the order's own transaction: a job
        # exists only if its order was committed. Failing loudly would reveal a leak.
        raise LookupError(f"order {order_id} does not exist")
    time.sleep(SEND_LATENCY)
    confirmation = Confirmation(
        order_id=order.id,
        job_id=ctx.job_id,
        recipient=order.customer_email,
        body=f"Thank you! Order #{order.id} ({order.total_cents / 100:.2f} EUR) is confirmed.",
        worker_pid=os.getpid(),
    )
    session.add(confirmation)
    session.flush()
    sent = {"confirmation_id": confirmation.id, "recipient": confirmation.recipient}
    session.commit()
    return sent


def charge_card(order: Order, card_number: str) -> None:
    """A stand-in payment provider: :data:`DECLINED_CARD` is declined, the rest pass."""
    if card_number == DECLINED_CARD:
        raise PaymentDeclinedError(order.id)


def place_order(
    session_factory: sessionmaker[Session],
    *,
    customer_email: str,
    total_cents: int,
    card_number: str,
) -> int:
    """Place an order in one transaction and return its id.

    The order row and its confirmation job are written first, then the card is charged.
    When the charge fails, the transaction rolls back and takes the job with it: no worker
    will ever see a confirmation for an order that does not exist.

    Raises:
        PaymentDeclinedError: the card was declined; nothing was committed.
    """
    with session_factory() as session, session.begin():
        order = Order(customer_email=customer_email, total_cents=total_cents)
        session.add(order)
        session.flush()  # the order gets its id, which the job refers to
        send_confirmation.enqueue(session, order_id=order.id)
        charge_card(order, card_number)
        # Read before the block ends: the commit on exit expires the order's attributes.
        return order.id


def create_tables(connection: Connection) -> None:
    """Create :data:`DEMO_SCHEMA` with the queue's tables and the shop's tables."""
    connection.execute(CreateSchema(DEMO_SCHEMA, if_not_exists=True))
    queue.create_all(connection)
    shop_tables = [Order.__table__, Confirmation.__table__]
    Base.metadata.create_all(connection, tables=shop_tables)  # type: ignore[arg-type]
