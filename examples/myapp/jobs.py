"""The application's jobs: ``sqla-queue worker myapp.jobs:queue`` runs them."""

from __future__ import annotations

from sqlalchemy.orm import Session

from myapp.models import Base, Order
from sqla_queue import JobContext, Queue, RetryPolicy

queue = Queue(Base, schema="example_jobs")


@queue.task(
    name="send_confirmation",
    pass_context=True,
    max_attempts=3,
    retry=RetryPolicy(min_delay=1, max_delay=30),
)
def send_confirmation(ctx: JobContext[Session], order_id: int) -> str:
    """Mark the order confirmed (a real app would send an email first).

    It may run twice if its worker dies after the work, so it is idempotent.
    """
    order = ctx.session.get(Order, order_id)
    if order is None:
        return "order gone"
    order.confirmed = True
    ctx.session.commit()
    return f"confirmed {order.email}"


@queue.task(name="rebuild_stats", concurrency_limit=1)
async def rebuild_stats(reason: str) -> str:
    """An ``async def`` handler; at most one runs at a time across all workers."""
    return f"stats rebuilt ({reason})"
