"""Liveness and cancellation: what the heartbeat sends, and what its answer means."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqla_queue.instrumentation import job_log_fields
from sqla_queue.statements.liveness import HeartbeatParams
from sqla_queue.worker.decider.acks import OutcomeBuffer
from sqla_queue.worker.decider.running import RunningJobs

__all__ = ["Liveness"]

log = logging.getLogger("sqla_queue.worker")


class Liveness:
    """The executions this process holds (running, or finished and not yet acked), as the
    heartbeat thread sees them. Thread-safe: it takes the decider's ``lock``."""

    def __init__(
        self,
        lock: threading.Lock,
        jobs: RunningJobs,
        buffer: OutcomeBuffer,
        worker_id: uuid.UUID,
        *,
        tasks: Sequence[str] = (),
        concurrency: int = 1,
    ) -> None:
        self._lock = lock
        self._jobs = jobs
        self._buffer = buffer
        self._worker_id = worker_id
        # What the worker's row holds when the first beat inserts it.
        self._tasks = list(tasks)
        self._concurrency = concurrency
        self._hostname = socket.gethostname()

    def held(self) -> tuple[list[int], list[int]]:
        """(ids, attempts) of the executions this process runs or has yet to ack."""
        with self._lock:
            pairs = self._jobs.pairs() + self._buffer.pairs()
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def heartbeat_params(self) -> HeartbeatParams | None:
        """Parameters of the next heartbeat, or None when nothing is held."""
        ids, attempts = self.held()
        if not ids:
            return None
        return HeartbeatParams(
            worker=self._worker_id,
            hostname=self._hostname,
            pid=os.getpid(),
            tasks=self._tasks,
            concurrency=self._concurrency,
            ids=ids,
            attempts=attempts,
        )

    def mark_lost(self, sent: Iterable[int], still_held: Iterable[int]) -> None:
        """A heartbeat found some executions no longer ours: they were reclaimed."""
        lost = set(sent) - set(still_held)
        if not lost:
            return
        with self._lock:
            # Executions acked meanwhile are gone from the table but were not lost.
            lost &= self._jobs.job_ids() | self._buffer.job_ids()
            for job_id in lost:
                running = self._jobs.get(job_id)
                if running is not None and running.context is not None:
                    running.context.notify_lost()
        if lost:
            log.warning(
                "executions %s were reclaimed by another worker while held here", sorted(lost)
            )

    def heartbeat_done(self, sent: Iterable[int], rows: Sequence[Any]) -> None:
        """A heartbeat returned ``(id, cancel_requested)`` rows: note the lost and the
        cancelled executions. Called by the heartbeat thread."""
        sent = list(sent)
        self.mark_lost(sent, [row[0] for row in rows])
        cancelled = [row[0] for row in rows if row[1]]
        if cancelled:
            self.deliver_cancels(cancelled)

    def deliver_cancels(self, job_ids: Iterable[int]) -> None:
        """Tell the handlers of ``job_ids`` that their jobs were cancelled (once each)."""
        with self._lock:
            targets = [self._jobs.get(job_id) for job_id in job_ids]
        for running in targets:
            if running is not None and not running.released and not running.cancel_requested:
                log.info(
                    "job %s (%s) was cancelled while running",
                    running.job.id,
                    running.job.task,
                    extra=job_log_fields(running.job),
                )
                running.request_cancel()
