"""Helpers to run a worker in a background thread and wait on database conditions."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import RunStats
from tests.support.app import queue


@contextmanager
def worker_thread(worker: Any, *, join_timeout: float = 30.0) -> Iterator[list[RunStats]]:
    """Run ``worker.run()`` in a thread for the ``with`` block, then stop it gracefully."""
    stats: list[RunStats] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            stats.append(worker.run())
        except BaseException as exc:  # surfaced in the test thread below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        worker.stop()
        thread.join(join_timeout)
    assert not thread.is_alive(), "worker did not stop"
    if errors:
        raise errors[0]


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def pretend_claimed(
    connection: Any,
    job_id: int,
    *,
    worker: uuid.UUID | None = None,
    attempt: int = 1,
    alive_for: dt.timedelta = dt.timedelta(0),
    lease_seconds: float | None = 30.0,
) -> uuid.UUID:
    """Mark an execution running, as a claim by ``worker`` would have, last alive ``alive_for`` ago.

    Returns the worker id, a fresh one unless given. Lets a test stage a dead, slow or
    pre-upgrade worker without running one.
    """
    owner = worker or uuid.uuid4()
    ex = queue.tables.executions
    connection.execute(
        update(ex)
        .where(ex.c.id == job_id)
        .values(
            state="running",
            worker_id=owner,
            attempt=attempt,
            lease_seconds=lease_seconds,
            alive_at=func.now() - alive_for,
        )
    )
    return owner


def states(SessionLocal: sessionmaker[Session], ids: list[int]) -> dict[str, int]:
    """How many of the jobs ``ids`` are in each status, by status name."""
    jobs = queue.tables.jobs
    with SessionLocal() as session:
        rows = session.execute(
            select(jobs.c.status, func.count()).where(jobs.c.id.in_(ids)).group_by(jobs.c.status)
        ).all()
    return {str(status): int(count) for status, count in rows}


class Blocked:
    """Run ``fn`` (a statement that should wait for another transaction's lock) in a
    thread: :meth:`still_waiting` proves it waits, :meth:`value` returns what it returned
    once it went on (or raises what it raised)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: list[Any] = []
        self.error: list[BaseException] = []

        def run() -> None:
            try:
                self.result.append(fn())
            except BaseException as exc:  # re-raised by value()
                self.error.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def still_waiting(self, seconds: float = 0.5) -> bool:
        """Whether ``fn`` is still running after ``seconds``."""
        self.thread.join(seconds)
        return self.thread.is_alive()

    def value(self) -> Any:
        """What ``fn`` returned; fails the test if it has not finished within 15 s."""
        self.thread.join(15)
        assert not self.thread.is_alive(), "the blocked transaction never went on"
        if self.error:
            raise self.error[0]
        return self.result[0]
