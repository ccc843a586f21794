"""The worker's background services: work that runs beside the claim loop, not in it.

A service (the periodic scheduler, the daemon supervisor) runs in threads of its own, on
connections of its own, and never takes a handler seat: a worker's capacity for ordinary
jobs is the same whatever its services do. Both worker faces start the same services, on a
synchronous engine (an async worker passes the one its heartbeater uses).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Engine

from sqla_queue.models.tables import QueueTables

__all__ = ["ServiceEnv", "ThreadedService", "WorkerService"]


@dataclass(frozen=True)
class ServiceEnv:
    """What a service may use of its worker."""

    tables: QueueTables
    #: A synchronous engine on the worker's database (with its execution options).
    engine: Engine
    worker_id: uuid.UUID
    #: The worker's own session factory (``sessionmaker`` or ``async_sessionmaker``).
    session_factory: Any
    #: Seconds between the worker's maintenance sweeps: how late a stored change may apply.
    maintenance_interval: float
    #: The queue's lost interval, in seconds.
    lease: float
    #: Seconds a graceful stop gives running work before it is abandoned.
    shutdown_timeout: float
    #: Set when the worker begins a graceful stop (SIGTERM, ``worker.stop()``).
    stop_flag: threading.Event
    #: The tasks the worker claims, sorted (its row in the workers table shows them).
    tasks: tuple[str, ...] = ()
    #: The worker's handler seats.
    concurrency: int = 0
    #: Handlers running now, read at each beat of the worker registry.
    running_count: Callable[[], int] | None = None
    #: The worker's counts so far (``WorkerCore.stats``: claimed, succeeded, failed, ...).
    worker_stats: Callable[[], Mapping[str, int]] | None = None


class WorkerService(Protocol):
    """A background service of a worker: started with it, stopped gracefully with it."""

    def start(self) -> None:
        """Start the service's threads; return at once."""

    def request_stop(self) -> None:
        """Begin a graceful stop: let running work finish, hand back what it holds."""

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the service's threads to end."""


class ThreadedService:
    """A :class:`WorkerService` whose work is one loop on a daemon thread of its own.

    A subclass names its thread (``thread_name``) and writes ``_loop``, which runs until
    ``_halt`` is set (``request_stop``) or the worker's stop flag is, as it decides; it may
    override ``_wanted`` to start no thread when it has nothing to do.
    """

    thread_name = "sqla-queue-service"

    def __init__(self) -> None:
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the service's thread (a daemon thread); return at once."""
        if self._thread is not None or not self._wanted():
            return
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to end after the step under way."""
        self._halt.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _wanted(self) -> bool:
        return True

    def _loop(self) -> None:
        raise NotImplementedError
