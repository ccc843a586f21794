"""Tasks that run beside an application's own long transactions (issue 36, section 1).

Worker subprocesses import ``tests.support.beside_app:queue``: the test app's queue, with
these tasks and the durable ones registered on it. Each task here has a lease of
:data:`LEASE` seconds, so a worker that held its jobs only by their own rows would lose
them within the test's holds, which last three leases.
"""

from __future__ import annotations

import time

from sqlalchemy import update
from sqlalchemy.orm import Session

from sqla_queue import JobContext
from tests.support.app import Order, _log_end, _log_start, queue
from tests.support.durable_app import dj_until, shipped

__all__ = ["LEASE", "bs_hold", "bs_idle", "bs_linked", "dj_until", "queue", "shipped"]

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
