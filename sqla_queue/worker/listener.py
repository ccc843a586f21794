"""The listener: the thread that hears the queue's enqueue notifications.

It LISTENs on the queue's channel on a connection of its own and tells the worker at each
notification, so the worker polls at once instead of at its next poll interval. A
notification is only a hint: polling covers whatever is missed while disconnected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from sqla_queue.worker.background import libpq_url
from sqla_queue.worker.pools import own_pool_engine
from sqla_queue.worker.threads import WorkerThread, backoff

__all__ = ["ListenConnector", "Listener", "listen_connector"]

log = logging.getLogger("sqla_queue.worker")

#: Seconds before the first reconnect after a lost LISTEN connection (doubled each time).
FIRST_RECONNECT_DELAY = 0.1
#: The longest wait between two reconnects.
MAX_RECONNECT_DELAY = 5.0
#: Seconds a wait for notifications lasts before looking whether to stop. Short, because a
#: worker's stop waits for this thread (a burst run ended 0.4 s later on average at 0.5 s),
#: and a wait that ends empty sends nothing to the server: ten a second cost nothing.
NOTIFY_TIMEOUT = 0.1

ListenConnector = Callable[[], AbstractContextManager["psycopg.Connection[Any]"]]


def listen_connector(engine: Engine, listen_url: str | None) -> ListenConnector:
    """How the worker opens its LISTEN connection: like ``engine``'s, or to ``listen_url``.

    ``engine`` is the synchronous engine of the worker's threads. With psycopg, the LISTEN
    connection is one of its connections, from a pool of its own, so ``connect_args``,
    a creator and ``connect`` listeners hold for it too; it is closed, never pooled, when
    done. ``listen_url`` (``WorkerSettings.listen_url``, a direct connection past a
    pooler) is connected to as it says, with the keywords its query string holds.
    """
    if listen_url is None and engine.dialect.driver == "psycopg":
        listen_engine = own_pool_engine(engine, 1)
        return lambda: _pooled_autocommit(listen_engine)
    dsn = libpq_url(make_url(listen_url) if listen_url is not None else engine.url)
    return lambda: psycopg.connect(dsn, autocommit=True, connect_timeout=10)


@contextmanager
def _pooled_autocommit(engine: Engine) -> Iterator[psycopg.Connection[Any]]:
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.Connection), "a psycopg engine's connection"
        if driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            driver.commit()  # keep what a connect listener SET outside autocommit
        driver.autocommit = True
        yield driver
    finally:
        raw.invalidate()  # LISTENing, autocommit: never back to a pool
        raw.close()


class Listener(WorkerThread):
    """LISTENs on the queue's channel and calls ``on_notify`` for each wake-up.

    A notification is only a hint: after every (re)connect it calls ``on_notify`` once,
    since anything sent while disconnected was missed, and polling covers the rest.
    """

    thread_name = "sqla-queue-listener"

    def __init__(
        self, connect: ListenConnector, channel: str, on_notify: Callable[[], None]
    ) -> None:
        super().__init__()
        self.connect = connect
        self.channel = channel
        self.on_notify = on_notify
        #: Set while the LISTEN connection is up.
        self.connected = threading.Event()

    def _run(self) -> None:
        """Listen until stopped, reconnecting with backoff."""
        lost = 0  # connections lost in a row
        while not self.stopping():
            try:
                with self.connect() as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.connected.set()
                    lost = 0
                    self.on_notify()
                    while not self.stopping():
                        for _ in conn.notifies(timeout=NOTIFY_TIMEOUT, stop_after=1):
                            self.on_notify()
            except Exception as exc:  # a driver's error, or a connect listener's
                self.connected.clear()
                if self.stopping():
                    return
                delay = backoff(FIRST_RECONNECT_DELAY, lost, cap=MAX_RECONNECT_DELAY)
                lost += 1
                log.warning("LISTEN connection lost, reconnecting in %.1fs: %s", delay, exc)
                self.pause(delay)
