"""Helpers to run a worker in a background thread and wait on database conditions."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

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
    thread: :meth:`still_waiting` proves it waits on a lock, :meth:`value` returns what it
    returned once it went on (or raises what it raised).

    The backends ``fn`` sends statements on from its thread are noted as it sends them
    (an engine event), so :meth:`still_waiting` can look each one up in
    ``pg_stat_activity``: a thread that has not started yet, or one busy elsewhere, is not
    taken for a blocked one.
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: list[Any] = []
        self.error: list[BaseException] = []
        #: Backend pids ``fn`` sent statements on, with the URL of their server.
        self.backends: dict[int, URL] = {}

        def run() -> None:
            _BLOCKED[threading.get_ident()] = self
            try:
                self.result.append(fn())
            except BaseException as exc:  # re-raised by value()
                self.error.append(exc)
            finally:
                _BLOCKED.pop(threading.get_ident(), None)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def still_waiting(self, timeout: float = 10.0) -> bool:
        """Whether ``fn`` waits on a lock: True as soon as a backend it sent a statement on
        is seen waiting for a lock in ``pg_stat_activity``; False if ``fn`` ends first, or
        if it is not seen waiting within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        engines: dict[URL, Engine] = {}
        try:
            while time.monotonic() < deadline:
                for pid, url in list(self.backends.items()):
                    engine = engines.get(url)
                    if engine is None:
                        engine = engines[url] = create_engine(
                            url, poolclass=NullPool, isolation_level="AUTOCOMMIT"
                        )
                    if _waits_on_lock(engine, pid):
                        return self.thread.is_alive()
                if not self.thread.is_alive():
                    return False
                time.sleep(0.02)
            return False
        finally:
            for engine in engines.values():
                engine.dispose()

    def value(self) -> Any:
        """What ``fn`` returned; fails the test if it has not finished within 15 s."""
        self.thread.join(15)
        assert not self.thread.is_alive(), "the blocked transaction never went on"
        if self.error:
            raise self.error[0]
        return self.result[0]


#: The running :class:`Blocked`, by the ident of the thread that runs its ``fn``.
_BLOCKED: dict[int, Blocked] = {}


@event.listens_for(Engine, "before_cursor_execute")
def _note_backend(
    connection: Connection,
    cursor: Any,
    statement: str,
    parameters: Any,
    context: Any,
    executemany: bool,
) -> None:
    """Note the backend of a statement sent from a :class:`Blocked` thread."""
    blocked = _BLOCKED.get(threading.get_ident())
    if blocked is None:
        return
    info = getattr(connection.connection.dbapi_connection, "info", None)
    pid = getattr(info, "backend_pid", None)  # psycopg 3
    if isinstance(pid, int):
        blocked.backends[pid] = connection.engine.url


def _waits_on_lock(engine: Engine, pid: int) -> bool:
    """Whether backend ``pid`` waits for a lock (a heavyweight lock: a row's, a table's,
    an advisory one) right now."""
    with engine.connect() as connection:
        kind = connection.execute(
            text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar()
    return kind == "Lock"
