"""The application's jobs: ``sqla-queue worker myapp.jobs:queue`` runs them."""

from __future__ import annotations

from sqlalchemy.orm import Session

from myapp.models import Base, Order
from sqla_queue import JobContext, Queue, RetryPolicy

queue = Queue(Base, schema="example_jobs")

#: ``order.jobs``: the jobs enqueued with ``about=order``, oldest first. A read-only
#: relationship to the queue's ``Job``: what the order page shows next to the order.
Order.jobs = queue.about_relationship(Order, order_by=queue.Job.id)


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


def confirm(session: Session, order: Order) -> int:
    """Enqueue the order's confirmation, once: linked to the order, with a unique key.

    A second call for the same order while its confirmation is queued or running (a
    double-submitted form) returns the same job instead of sending a second email.
    """
    return send_confirmation.options(about=order, unique_key=f"order-{order.id}").enqueue(
        session, order.id
    )


@queue.task(name="rebuild_stats", concurrency_limit=1)
async def rebuild_stats(reason: str) -> str:
    """An ``async def`` handler; at most one runs at a time across all workers."""
    return f"stats rebuilt ({reason})"
