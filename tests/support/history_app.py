"""A queue with partitioned history (``Queue(history="partitioned")``), for its tests."""

from __future__ import annotations

import os

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, func, insert
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Queue

metadata = MetaData()
queue = Queue(metadata=metadata, history="partitioned", prefix="hq_")

#: One row per execution of ``logged``, written in the handler's own committed transaction.
runs = Table(
    "hq_runs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", TIMESTAMP(timezone=True), nullable=False, server_default=func.clock_timestamp()),
)


@queue.task()
def ok(n: int = 0) -> int:
    """Succeeds with its argument."""
    return n


@queue.task()
def boom() -> None:
    """Fails at once (one attempt)."""
    raise RuntimeError("boom")


@queue.task(pass_context=True)
def logged(ctx: JobContext[Session], n: int = 0) -> int:
    """Records its execution in ``hq_runs``, then succeeds with its argument."""
    session = ctx.session
    session.execute(insert(runs).values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid()))
    session.commit()
    return n
