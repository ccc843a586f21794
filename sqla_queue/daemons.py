"""Daemons: long-running loops that a queue's workers keep alive, beside its jobs.

A daemon is a function registered with ``@queue.daemon(name=...)``. Every worker of the
queue supervises it (:class:`sqla_queue.worker.daemons.DaemonSupervisor`), and the
``daemons`` table lets exactly one worker run each of its instances at a time. A daemon
never takes a handler seat: it runs in a thread of its own (``def``) or on an event loop of
its own (``async def``), so a worker's ``concurrency`` stays whole for ordinary jobs.

This module holds the pure parts: the frozen :class:`DaemonSpec`, the
:class:`DaemonContext` a running instance receives, the restart policy
(:class:`DaemonBackoff`), and :class:`DaemonStatus`, one instance's row as
:meth:`Queue.daemon_status <sqla_queue.Queue.daemon_status>` reports it. Only
:func:`read_daemon_status`, the reading behind that report, touches the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import math
import numbers
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sqla_queue._identifiers import validate_task_name
from sqla_queue.checks import check_seconds
from sqla_queue.logic.times import MAX_LOST_INTERVAL
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.daemons import daemon_status_statement

__all__ = [
    "MAX_INSTANCES",
    "MIN_DAEMON_LEASE",
    "MIN_RESTART_DELAY",
    "DaemonBackoff",
    "DaemonContext",
    "DaemonSpec",
    "DaemonStatus",
    "read_daemon_status",
]

#: Most instances one daemon may ask for (each is a thread and a row).
MAX_INSTANCES = 1000
#: Shortest wait before a crashed (or returned) daemon instance runs again, in seconds: the
#: floor of ``DaemonBackoff.min_delay``. Each restart writes to the database, so a daemon
#: that fails at once restarts at most ten times a second.
MIN_RESTART_DELAY = 0.1
#: Shortest lost interval of a daemon, in seconds: the supervisor renews at a quarter of
#: it, and a lease shorter than a few round trips would fence healthy daemons.
MIN_DAEMON_LEASE = 1.0


@dataclass(frozen=True)
class DaemonBackoff:
    """How long a crashed daemon instance waits before it runs again.

    The wait after the ``n``-th crash in a row is ``min_delay * factor ** (n - 1)``, capped
    at ``max_delay``: 1 s, 2 s, 4 s, ... 60 s by default. A run that lasted at least
    ``reset_after`` seconds before it crashed starts the count again, so a daemon that
    fails once a day always restarts after ``min_delay``. A daemon that returns (instead
    of raising) is restarted after ``min_delay``, and its count starts again too.

    Every value is checked here: ``min_delay`` is at least :data:`MIN_RESTART_DELAY`
    (0.1 s), ``max_delay`` at least ``min_delay``, ``factor`` at least 1 (1: the same wait
    every time), and all of them finite; the delays and ``reset_after`` are seconds, at
    most a year. ``TypeError`` or ``ValueError`` names the field and the rule.
    """

    min_delay: float = 1.0
    max_delay: float = 60.0
    factor: float = 2.0
    reset_after: float = 60.0

    def __post_init__(self) -> None:
        for name in ("min_delay", "max_delay", "reset_after"):
            seconds = check_seconds(
                f"DaemonBackoff.{name}", getattr(self, name), maximum=MAX_LOST_INTERVAL
            )
            object.__setattr__(self, name, seconds)
        object.__setattr__(self, "factor", _check_factor(self.factor))
        if self.min_delay < MIN_RESTART_DELAY:
            # Each restart writes the crash to the database: a daemon that fails at once
            # would otherwise restart hundreds of times a second, on every worker.
            raise ValueError(
                f"DaemonBackoff.min_delay must be at least {MIN_RESTART_DELAY} s (the "
                f"shortest wait before a crashed daemon runs again), got {self.min_delay!r}"
            )
        if self.max_delay < self.min_delay:
            raise ValueError(
                f"DaemonBackoff.max_delay ({self.max_delay!r}) must be at least "
                f"min_delay ({self.min_delay!r})"
            )

    def delay(self, crashes: int) -> float:
        """Seconds to wait after the ``crashes``-th crash in a row (1 for the first)."""
        exponent = min(max(crashes - 1, 0), 64)
        try:
            raw = self.min_delay * self.factor**exponent
        except OverflowError:  # a huge factor: the cap applies
            return float(self.max_delay)
        return float(min(raw, self.max_delay))

    def crashes_after(self, previous: int, ran_for: float) -> int:
        """The crash count after a crash of a run that lasted ``ran_for`` seconds."""
        return 1 if ran_for >= self.reset_after else previous + 1


def _check_factor(value: object) -> float:
    """``value`` as a float if it is a finite number of at least 1, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"DaemonBackoff.factor must be a number, got {value!r} ({type(value).__name__})"
        )
    try:
        factor = float(value)
    except OverflowError:
        factor = math.inf
    if not math.isfinite(factor):
        raise ValueError(f"DaemonBackoff.factor must be finite, got {value!r}")
    if factor < 1:
        # Below 1 each wait would be shorter than the one before, down to nothing.
        raise ValueError(f"DaemonBackoff.factor must be at least 1, got {value!r}")
    return factor


@dataclass(frozen=True)
class DaemonSpec:
    """A registered daemon: what to run, how many copies, and how to keep them alive.

    Build it with :meth:`Queue.daemon <sqla_queue.Queue.daemon>`; every argument is
    checked here, so a bad one fails at the decorator's line.

    Attributes:
        name: the daemon's name, unique among the queue's daemons and tasks; its rows in
            the ``daemons`` table carry it.
        function: a ``def`` or ``async def`` function taking one :class:`DaemonContext`.
        instances: how many copies run at once across every worker (each one exactly once).
        lost_interval: seconds after which an instance whose worker stopped renewing its
            lease (it died) may start on another worker. ``None``: the queue's own.
        backoff: the restart policy after a crash.
    """

    name: str
    function: Callable[[DaemonContext], Any]
    instances: int = 1
    lost_interval: float | None = None
    backoff: DaemonBackoff = field(default_factory=DaemonBackoff)
    #: Set from ``function``: whether it is a coroutine function.
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        validate_task_name(self.name)
        if not callable(self.function):
            raise TypeError(f"daemon {self.name!r}: {self.function!r} is not callable")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int):
            raise TypeError(
                f"daemon {self.name!r}: instances must be a whole number, got {self.instances!r}"
            )
        if not 1 <= self.instances <= MAX_INSTANCES:
            raise ValueError(
                f"daemon {self.name!r}: instances must be from 1 to {MAX_INSTANCES}, "
                f"got {self.instances}"
            )
        if self.lost_interval is not None:
            lease = check_seconds(
                "lost_interval", self.lost_interval, maximum=MAX_LOST_INTERVAL, positive=True
            )
            if lease < MIN_DAEMON_LEASE:
                raise ValueError(
                    f"daemon {self.name!r}: lost_interval must be at least "
                    f"{MIN_DAEMON_LEASE} s, got {self.lost_interval!r}"
                )
            object.__setattr__(self, "lost_interval", lease)
        if not isinstance(self.backoff, DaemonBackoff):
            raise TypeError(
                f"daemon {self.name!r}: backoff must be a DaemonBackoff, got {self.backoff!r}"
            )
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.function))

    def lease(self, default: float) -> float:
        """The lost interval in force: the daemon's own, else ``default`` (the queue's),
        never below :data:`MIN_DAEMON_LEASE`."""
        value = default if self.lost_interval is None else self.lost_interval
        return max(float(value), MIN_DAEMON_LEASE)


class DaemonContext:
    """What a running daemon instance may know and use. Its one argument.

    Loop until :attr:`shutdown_requested`, and wait with :meth:`wait` (``def``) or
    ``await`` :meth:`async_wait` / :attr:`shutdown_event` (``async def``), so the instance
    stops at once when asked. It is asked to stop when its worker stops gracefully
    (SIGTERM), and when its worker lost the instance's lease (another worker may then start
    it): stop promptly, or two copies run at once.

    ``session`` opens a session from the worker's factory on first use and closes it when
    the run ends; a daemon runs for a long time, so commit (or roll back) often, and prefer
    a ``with ctx.session_factory() as session:`` block per unit of work.
    """

    def __init__(
        self,
        *,
        name: str,
        instance: int,
        worker_id: uuid.UUID,
        session_factory: Any,
        is_async: bool,
        stop: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.instance = instance
        self.worker_id = worker_id
        #: The worker's session factory (for an ``async def`` daemon of an async worker,
        #: one on an engine of the daemon's own event loop).
        self.session_factory = session_factory
        self.is_async = is_async
        self._stop = stop if stop is not None else threading.Event()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<DaemonContext {self.name}[{self.instance}] worker={self.worker_id}>"

    @property
    def shutdown_requested(self) -> bool:
        """True once this instance was asked to stop: return soon."""
        return self._stop.is_set()

    @property
    def shutdown_event(self) -> Any:
        """The stop request as an event to wait on.

        A ``threading.Event`` for a ``def`` daemon (``ctx.shutdown_event.wait(5)`` sleeps
        five seconds or until asked to stop); an ``asyncio.Event`` for an ``async def`` one
        (only valid inside the loop that runs it).
        """
        if not self.is_async:
            return self._stop
        with self._lock:
            if self._event is None:
                self._event = asyncio.Event()
                self._loop = asyncio.get_running_loop()
                if self._stop.is_set():
                    self._event.set()
            return self._event

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less if asked to stop; True when asked to stop."""
        return self._stop.wait(seconds)

    async def async_wait(self, seconds: float) -> bool:
        """``await`` up to ``seconds``, less if asked to stop; True when asked to stop."""
        event = self.shutdown_event
        if not isinstance(event, asyncio.Event):
            raise TypeError("async_wait() is for async def daemons; use wait()")
        try:
            await asyncio.wait_for(event.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    @property
    def session(self) -> Any:
        """A session from :attr:`session_factory`, opened on first use, closed at the end."""
        if self._session is None:
            self._session = self.session_factory()
        return self._session

    def request_stop(self) -> None:
        """Ask the instance to stop. Called by its supervisor, from any thread."""
        self._stop.set()
        with self._lock:
            event, loop = self._event, self._loop
        if event is None or loop is None:
            return
        # A loop that has closed already has nobody waiting on the event.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)

    def _take_session(self) -> Any:
        session, self._session = self._session, None
        return session


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon instance as the ``daemons`` table records it.

    ``running`` is whether a worker holds it under an unexpired lease (by the database's
    clock when read). ``restarts`` counts its crashes; ``last_error`` is the latest one.
    """

    name: str
    instance: int
    worker_id: uuid.UUID | None
    lease_until: dt.datetime | None
    started_at: dt.datetime | None
    restarts: int
    last_error: str | None
    running: bool

    def as_dict(self) -> dict[str, Any]:
        """The status as JSON-ready values (for the CLI's ``--json``)."""
        return {
            "name": self.name,
            "instance": self.instance,
            "worker_id": str(self.worker_id) if self.worker_id else None,
            "lease_until": self.lease_until.isoformat() if self.lease_until else None,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "running": self.running,
        }


def read_daemon_status(session: Session | Connection, tables: QueueTables) -> list[DaemonStatus]:
    """Every daemon instance the ``daemons`` table records, in (name, instance) order.

    Reads on ``session``'s transaction; writes nothing.
    """
    rows = session.execute(daemon_status_statement(tables)).all()
    return [
        DaemonStatus(
            name=row.name,
            instance=row.instance,
            worker_id=row.worker_id,
            lease_until=row.lease_until,
            started_at=row.started_at,
            restarts=row.restarts,
            last_error=row.last_error,
            running=bool(row.running),
        )
        for row in rows
    ]
