"""Helpers of the issue-14 integration tests: worker statements run by hand, lock waits.

A test plays a worker's part with the worker's own statements (claim, completion) on a
connection of its own, so that each step happens exactly when the test says, and proves
that a statement blocks by finding its backend waiting on a lock in ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sqla_queue import statements
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from tests.support.app import queue
from tests.support.running import wait_for

JOBS = queue.tables.jobs
EX = queue.tables.executions
KEYS = queue.tables.unique_keys
CLAIM = statements.claim_statement(queue.tables)
COMPLETE = statements.complete_statement(queue.tables)


def claim(
    connection: Connection, worker: uuid.UUID, tasks: Iterable[str], batch: int = 10
) -> list[Any]:
    """Claim due jobs of ``tasks`` as worker ``worker`` would: the claimed rows."""
    params = {
        "tasks": list(tasks),
        "batch": batch,
        "worker": worker,
        "lease": 30.0,
        "lease_map": "{}",
    }
    return [r for r in connection.execute(CLAIM, params).all() if r.id is not None]


def complete(
    connection: Connection,
    worker: uuid.UUID,
    job_id: int,
    attempt: int,
    kind: OutcomeKind = OutcomeKind.SUCCEEDED,
    result: Any = None,
    error: dict[str, Any] | None = None,
) -> list[int]:
    """Write one outcome with the worker's completion statement; the ids it applied."""
    outcome = Outcome(job_id, attempt, kind, result=result, error=error).as_row()
    params = {"outcomes": json.dumps([outcome]), "worker": worker}
    return [row[0] for row in connection.execute(COMPLETE, params).all()]


def backend_pid(connection: Any) -> int:
    """The server process id of a sync Connection or Session."""
    return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def waits_on_lock(engine: Engine, pid: int) -> bool:
    """Whether backend ``pid`` is waiting for a lock right now."""
    with engine.connect() as connection:
        kind = connection.execute(
            text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar()
    return kind == "Lock"


def wait_until_blocked(engine: Engine, pid: int, timeout: float = 10.0) -> None:
    """Wait until backend ``pid`` waits for a lock (fail the test after ``timeout``)."""
    wait_for(lambda: waits_on_lock(engine, pid), timeout=timeout, interval=0.02)


async def wait_until_blocked_async(engine: AsyncEngine, pid: int, timeout: float = 10.0) -> None:
    """:func:`wait_until_blocked` without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with engine.connect() as connection:
            kind = (
                await connection.execute(
                    text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": pid},
                )
            ).scalar()
        if kind == "Lock":
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"backend {pid} did not block within {timeout}s")


def job_row(engine: Engine, job_id: int) -> Any:
    """The job's row (``None`` if there is none)."""
    with engine.connect() as connection:
        return connection.execute(select(JOBS).where(JOBS.c.id == job_id)).one_or_none()


def execution_row(engine: Engine, job_id: int) -> Any:
    """The job's execution row (``None`` if there is none)."""
    with engine.connect() as connection:
        return connection.execute(select(EX).where(EX.c.id == job_id)).one_or_none()


def status_of(engine: Engine, job_id: int) -> str | None:
    """The job's status (``None`` if there is no such job)."""
    row = job_row(engine, job_id)
    return None if row is None else str(row.status)
