"""A shop's durable and plain tasks, for the operator surfaces at 80 columns (issue 36, §7).

Names as a newcomer writes them: long task names, a step named after what it does, a
signal named after the event it waits for, an error whose message says what went wrong.
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Queue

metadata = MetaData()
queue = Queue(metadata=metadata, prefix="op36_")


@queue.task(name="refund_payment")
def refund_payment(order: int) -> None:
    """The compensation of ``collect_payment``'s charge."""


@queue.task(name="collect_payment", pass_context=True)
def collect_payment(ctx: JobContext[Session], order: int) -> int:
    """Reserves the stock and charges (undone by a refund), then waits for the payment."""
    ctx.run_step("reserve_stock_for_order", lambda: {"reserved": order})
    ctx.run_step("charge_customer_card", lambda: order, compensate=refund_payment)
    ctx.wait_for_signal("payment_received")
    return order


@queue.task(name="print_shipping_label")
def print_shipping_label() -> None:
    """Fails with a message worth reading."""
    raise RuntimeError("out of paper in tray 2 of the label printer at the north dock")


@queue.task(name="plain_task")
def plain_task() -> int:
    """An ordinary job: no steps."""
    return 1
