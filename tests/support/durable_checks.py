"""What the durable-job tests read and run: a burst drain, a job's outcome, and a set of
jobs left suspended (tests/support/durable_app.py's tasks)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.durable_app import dj_signal, dj_sleepy, dj_steps, queue

__all__ = ["drain", "outcome", "suspend_three"]

JOBS = queue.tables.jobs


def drain(factory: sessionmaker[Session], **settings: Any) -> None:
    """Run a sync worker until nothing is claimable (suspended jobs are not waited for)."""
    queue.worker(factory, concurrency=2, **settings).run(burst=True)


def outcome(engine: Engine, job_id: int) -> tuple[str, Any]:
    """Job ``job_id``'s ``(status, result)``."""
    with engine.connect() as connection:
        row = connection.execute(
            select(JOBS.c.status, JOBS.c.result).where(JOBS.c.id == job_id)
        ).one()
    return row.status, row.result


def suspend_three(factory: sessionmaker[Session]) -> dict[str, int]:
    """After a burst: one job waits for signal ``approved`` (``signal``), one sleeps an
    hour (``sleepy``), one succeeded with two steps (``steps``); their ids."""
    with factory.begin() as session:
        ids = {
            "signal": dj_signal.enqueue(session),
            "sleepy": dj_sleepy.enqueue(session, 3600),
            "steps": dj_steps.enqueue(session, 2),
        }
    drain(factory)
    return ids
