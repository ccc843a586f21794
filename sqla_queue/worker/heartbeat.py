"""The heartbeater: the thread that keeps a worker's running executions alive.

Every ``interval`` seconds while the worker holds executions, it stamps the worker's own row
in the workers table and the held executions that it can lock at once (see
:func:`sqla_queue.statements.liveness.heartbeat_statement`), on a connection of its own, so
a handler that blocks the event loop, a run loop busy with a slow claim, or an application
transaction that locks a job's row never delays a beat (the jobs would be reclaimed). It
runs until the worker has handed back its last job: the worker's stop flag does not end it.
Then it deletes the worker's row, which a burst run has no registry to delete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Engine, Executable

from sqla_queue.logic.quoting import short_error
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
        """Stamps the worker's row and its executions, returning ``(id, cancel_requested)``
        per execution still held."""
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
    """Beats for the held executions every ``interval`` seconds.

    ``farewell`` (a statement and its parameters) runs once after the last beat, when
    some beat was sent: it deletes the worker's row.
    """

    thread_name = "sqla-queue-heartbeat"

    def __init__(
        self,
        source: HeartbeatSource,
        engine: Engine,
        interval: float,
        *,
        farewell: tuple[Executable, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.engine = engine
        self.interval = interval
        self.farewell = farewell
        #: Beats sent (whatever they found).
        self.beats = 0

    def _run(self) -> None:
        """Beat until stopped; a failed beat is logged and the next one tried on time."""
        self.repeat(self._step, first_pause=self.interval)
        if self.farewell is None or not self.beats:
            return
        statement, params = self.farewell
        try:
            with self.engine.begin() as connection:
                connection.execute(statement, dict(params))
        except Exception as exc:
            # The row expires on its own once other workers' beats find it stale.
            log.warning("could not delete this worker's row (%s); it will expire", short_error(exc))

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
            log.warning("heartbeat failed, retrying in %.1fs: %s", self.interval, short_error(exc))
            # A lost privilege or table stops the worker instead of failing every beat.
            source.heartbeat_failed(exc, time.monotonic())
            return
        self.beats += 1
        source.heartbeat_done(params["ids"], rows)
