"""The heartbeater: the thread that keeps a worker's running executions alive.

Every ``interval`` seconds it refreshes ``alive_at`` of the executions the worker holds, on
a connection of its own, so a handler that blocks the event loop, or a run loop busy with a
slow claim, never delays a heartbeat (the job would be reclaimed). It runs until the worker
has handed back its last job: the worker's stop flag does not end it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from sqlalchemy import Engine, Executable

from sqla_queue.statements.liveness import HeartbeatParams
from sqla_queue.worker.threads import WorkerThread

__all__ = ["HeartbeatSource", "Heartbeater"]

log = logging.getLogger("sqla_queue.worker")


class HeartbeatSource(Protocol):
    """What the heartbeater needs of its worker (the worker's ``Decider``)."""

    @property
    def guard(self) -> Executable:
        """The statement that opens every worker transaction (the planner guard)."""
        ...

    @property
    def heartbeat_statement(self) -> Executable:
        """Refreshes ``alive_at``, returning ``(id, cancel_requested)`` per row refreshed."""
        ...

    def heartbeat_params(self) -> HeartbeatParams | None:
        """Parameters of the next heartbeat, or None when nothing is held."""
        ...

    def heartbeat_done(self, sent: Iterable[int], rows: Sequence[Any]) -> None:
        """A heartbeat returned its rows."""
        ...

    def heartbeat_failed(self, exc: BaseException, now: float) -> None:
        """A heartbeat failed: the worker may stop (a lost privilege or table)."""
        ...


class Heartbeater(WorkerThread):
    """Refreshes ``alive_at`` of held executions every ``interval`` seconds."""

    thread_name = "sqla-queue-heartbeat"

    def __init__(self, source: HeartbeatSource, engine: Engine, interval: float) -> None:
        super().__init__()
        self.source = source
        self.engine = engine
        self.interval = interval

    def _run(self) -> None:
        """Beat until stopped; a failed beat is logged and the next one tried on time."""
        self.repeat(self._step, first_pause=self.interval)

    def _step(self) -> float:
        self.beat()
        return self.interval

    def beat(self) -> None:
        """Send one heartbeat for everything this worker holds."""
        source = self.source
        params = source.heartbeat_params()
        if params is None:
            return
        try:
            with self.engine.begin() as connection:
                connection.execute(source.guard)
                rows = connection.execute(source.heartbeat_statement, params).all()
        except Exception as exc:
            log.warning("heartbeat failed, retrying in %.1fs: %s", self.interval, exc)
            # A lost privilege or table stops the worker instead of failing every beat.
            source.heartbeat_failed(exc, time.monotonic())
            return
        source.heartbeat_done(params["ids"], rows)
