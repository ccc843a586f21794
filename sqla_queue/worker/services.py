"""The worker's background services: work that runs beside the claim loop, not in it.

A service (the workers registry, the periodic scheduler, the daemon supervisor, the history
maintainer) is a :class:`~sqla_queue.worker.threads.WorkerThread`: it runs in a thread of
its own, on connections of its own, and never takes a handler seat, so a worker's capacity
for ordinary jobs is the same whatever its services do. Both worker faces start the same
services, on a synchronous engine (an async worker passes the one its heartbeater uses),
and give each the :class:`ServiceEnv` below.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from sqla_queue.models.tables import QueueTables

__all__ = ["ServiceEnv"]


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
    #: The worker's counts so far (``Decider.stats``: claimed, succeeded, failed, ...).
    worker_stats: Callable[[], Mapping[str, int]] | None = None
