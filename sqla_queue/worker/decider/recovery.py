"""What a failed unit or heartbeat leads to: a retry, an isolated outcome, or a stop."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Callable

from sqla_queue.errors import WorkerStoppedError
from sqla_queue.logic.outcomes import outcome_unwritable
from sqla_queue.logic.quoting import short_error
from sqla_queue.models.tables import QueueTables
from sqla_queue.worker.actions import Action, Flush, claims
from sqla_queue.worker.decider.acks import OutcomeBuffer
from sqla_queue.worker.decider.pacing import ClaimPacer
from sqla_queue.worker.decider.shutdown import Shutdown
from sqla_queue.worker.failures import Fault, classify, database_message, explain

__all__ = ["MAX_ERROR_BACKOFF", "STOP_FLUSH_TRIES", "Recovery"]

log = logging.getLogger("sqla_queue.worker")

#: Longest pause after a database error before trying again, in seconds.
MAX_ERROR_BACKOFF = 10.0
#: Failed tries of the last flush, once the shutdown timeout has passed, before a stopping
#: worker gives up on writing its outcomes (the lost interval then returns those jobs).
STOP_FLUSH_TRIES = 3


class Recovery:
    """Decides, from a database error, how the run goes on (see
    :mod:`sqla_queue.worker.failures` for how errors are told apart)."""

    def __init__(
        self,
        tables: QueueTables,
        worker_id: uuid.UUID,
        clock: Callable[[], dt.datetime],
        *,
        lock: threading.Lock,
        buffer: OutcomeBuffer,
        pacer: ClaimPacer,
        shutdown: Shutdown,
    ) -> None:
        self._tables = tables
        self._worker_id = worker_id
        self._clock = clock
        self._lock = lock
        self._buffer = buffer
        self._pacer = pacer
        self._shutdown = shutdown
        # Unique indexes whose violation by a claim means another worker won a race.
        self._race_indexes = {str(ix.name) for ix in tables.executions.indexes if ix.unique}
        #: Units that failed since the last one that reached the database.
        self.errors_in_row = 0

    def reset(self) -> None:
        """A unit reached the database: the next error backs off from the start."""
        self.errors_in_row = 0

    def database_error(self, action: Action, exc: BaseException, now: float) -> float:
        """Handle a failed unit of ``action``; return how long to back off before the next.

        A claim that lost a uniqueness race retries at once. An error retrying cannot fix
        either isolates the outcomes of a failed completion or stops the worker with a
        :class:`WorkerStoppedError`; anything else is logged and retried after an
        exponential backoff.
        """
        fault = classify(exc, self._race_indexes)
        doing = type(action).__name__.lower()
        if fault is Fault.RACE and claims(action):
            # Another worker won: an empty batch, retry at once.
            self._pacer.next_poll = now
            return 0.0
        if fault is Fault.DATA and isinstance(action, Flush) and self._buffer.last_flush:
            self._isolate(exc, now)
            return 0.0
        if fault in (Fault.DATA, Fault.PRIVILEGE, Fault.MISSING, Fault.POOLER):
            self._shutdown.fail(WorkerStoppedError(explain(fault, exc, self._tables, doing)), now)
            return 0.0
        self.errors_in_row += 1
        shutdown = self._shutdown
        if shutdown.deadline is not None and (
            shutdown.fatal is not None
            or (now >= shutdown.deadline and self.errors_in_row >= STOP_FLUSH_TRIES)
        ):
            log.error(
                "database error during %s while stopping (%s); giving up: the jobs this "
                "worker still holds return to the queue after their lost interval",
                doing,
                short_error(exc),
            )
            shutdown.give_up = True
            return 0.0
        delay = min(MAX_ERROR_BACKOFF, 0.1 * 2.0 ** min(self.errors_in_row - 1, 10))
        log.warning(
            "database error during %s (retrying in %.1fs): %s", doing, delay, short_error(exc)
        )
        self._pacer.next_poll = now + delay
        return delay

    def heartbeat_failed(self, exc: BaseException, now: float) -> None:
        """A heartbeat failed: stop when retrying cannot help, else the next beat retries."""
        fault = classify(exc, self._race_indexes)
        if fault in (Fault.PRIVILEGE, Fault.MISSING, Fault.POOLER):
            self._shutdown.fail(
                WorkerStoppedError(explain(fault, exc, self._tables, "heartbeat")), now
            )

    def _isolate(self, exc: BaseException, now: float) -> None:
        """A completion failed with a data error: find the outcome at fault and fail it.

        A batch is written again one outcome per statement. A single outcome that still
        fails is replaced by a plain failure of its job that names the database's reason;
        if even that is refused, the worker stops.
        """
        reason = database_message(exc)
        buffer = self._buffer
        with self._lock:
            failed = buffer.take_failed()
            if len(failed) > 1:
                buffer.isolate(len(failed))
                log.warning(
                    "a completion of %d outcomes failed (%s); writing them one by one to "
                    "find the one at fault",
                    len(failed),
                    reason,
                )
                return
            (outcome,) = failed
            replace = not outcome.extra.get("stand_in")
            if replace and buffer.is_head(outcome):
                buffer.outcomes[0] = outcome_unwritable(
                    outcome, reason, worker_id=self._worker_id, now=self._clock()
                )
            buffer.isolate(1)
        if replace:
            log.error(
                "job %s attempt %s: the database refused its %s outcome (%s); failing the "
                "job with that reason instead",
                outcome.job_id,
                outcome.attempt,
                outcome.kind.value,
                reason,
            )
            return
        self._shutdown.fail(
            WorkerStoppedError(
                f"the worker stopped: the database refused even a plain failure of job "
                f"{outcome.job_id} attempt {outcome.attempt} ({reason}); check that job's "
                "row and the queue's tables, then start the worker again"
            ),
            now,
        )
