"""A queue that keeps no history (``Queue(history="none")``), for its tests."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, MetaData, Table, Text, insert
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Queue

metadata = MetaData()
queue = Queue(metadata=metadata, history="none", prefix="nq_")

#: The order in which ``step`` ran, one row per run.
steps = Table(
    "nq_steps",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("name", Text, nullable=False),
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
def step(ctx: JobContext[Session], name: str) -> str:
    """Records that it ran (committed at once), then succeeds with its name."""
    ctx.session.execute(insert(steps).values(name=name))
    ctx.session.commit()
    return name


@queue.task(pass_context=True, transactional=True)
def tx_step(ctx: JobContext[Session], name: str) -> str:
    """Records that it ran in the transaction that commits its success."""
    ctx.session.execute(insert(steps).values(name=name))
    return name
