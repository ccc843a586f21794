"""The worker's background threads: heartbeater and listener, one of each per worker.

Both run in their own threads on their own connections, for the sync and the async face
alike: a handler that blocks the event loop, or a run loop busy with a slow claim, must not
delay a heartbeat (the job would be reclaimed) or a wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from sqla_queue.statements.liveness import HeartbeatParams
from sqla_queue.worker.core import WorkerCore

__all__ = ["Heartbeater", "Listener", "libpq_url", "sync_engine_from_url"]

log = logging.getLogger("sqla_queue.worker")


def libpq_url(url: URL) -> str:
    """A libpq connection URI (``postgresql://...``) for a SQLAlchemy URL of any driver."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def sync_engine_from_url(
    url: URL, execution_options: Mapping[str, Any] | None = None, *, pool_size: int | None = None
) -> Engine:
    """A small synchronous psycopg engine on the same database as ``url``.

    An async worker's engine cannot be used from another thread; its heartbeater and
    services use this one instead. ``execution_options`` are the async engine's, so a
    ``schema_translate_map`` (a tenant's) holds for the heartbeats too. With ``pool_size``
    it keeps that many connections open and opens (and closes) more when more threads need
    one at once, never making one wait (see :mod:`sqla_queue.worker.pools`); without it,
    it keeps none (``NullPool``).

    Its connections never prepare statements (``prepare_threshold=None``): the async
    engine's own connect arguments cannot be read back, and behind a pooler in transaction
    mode a prepared heartbeat would fail on the next server connection. Heartbeats and the
    services' statements run every few seconds, where preparing saves nothing measurable.
    """
    sync_url = url.set(drivername="postgresql+psycopg")
    no_prepare = {"prepare_threshold": None}
    if pool_size is None:
        engine = create_engine(sync_url, poolclass=NullPool, connect_args=no_prepare)
    else:
        engine = create_engine(
            sync_url, pool_size=pool_size, max_overflow=-1, connect_args=no_prepare
        )
    return engine.execution_options(**execution_options) if execution_options else engine


class Heartbeater(threading.Thread):
    """Refreshes ``alive_at`` of held executions every ``interval`` seconds."""

    def __init__(self, core: WorkerCore, engine: Engine, interval: float) -> None:
        super().__init__(name="sqla-queue-heartbeat", daemon=True)
        self.core = core
        self.engine = engine
        self.interval = interval
        self.halt = threading.Event()

    def run(self) -> None:
        """Beat until halted; a failed beat is logged and the next one tried on time."""
        while not self.halt.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        """Send one heartbeat for everything this worker holds."""
        params: HeartbeatParams | None = self.core.heartbeat_params()
        if params is None:
            return
        try:
            with self.engine.begin() as connection:
                connection.execute(self.core.guard)
                rows = connection.execute(self.core.heartbeat_statement, params).all()
        except Exception as exc:
            log.warning("heartbeat failed, retrying in %.1fs: %s", self.interval, exc)
            # A lost privilege or table stops the worker instead of failing every beat.
            self.core.heartbeat_failed(exc, time.monotonic())
            return
        self.core.heartbeat_done(params["ids"], rows)


class Listener(threading.Thread):
    """LISTENs on the queue's channel and calls ``on_notify`` for each wake-up.

    A notification is only a hint: after every (re)connect it calls ``on_notify`` once,
    since anything sent while disconnected was missed, and polling covers the rest.
    """

    def __init__(self, dsn: str, channel: str, on_notify: Callable[[], None]) -> None:
        super().__init__(name="sqla-queue-listener", daemon=True)
        self.dsn = dsn
        self.channel = channel
        self.on_notify = on_notify
        self.halt = threading.Event()
        self.connected = threading.Event()

    def run(self) -> None:
        """Listen until halted, reconnecting with backoff."""
        delay = 0.1
        while not self.halt.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.connected.set()
                    delay = 0.1
                    self.on_notify()
                    while not self.halt.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.on_notify()
            except psycopg.Error as exc:
                self.connected.clear()
                if self.halt.is_set():
                    return
                log.warning("LISTEN connection lost, reconnecting in %.1fs: %s", delay, exc)
                self.halt.wait(delay)
                delay = min(delay * 2, 5.0)
