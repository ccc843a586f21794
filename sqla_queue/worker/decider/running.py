"""The executions whose handlers run in this process."""

from __future__ import annotations

import logging
from typing import Any

from sqla_queue.instrumentation import job_log_fields
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.handlers import RunningJob

__all__ = ["RunningJobs"]

log = logging.getLogger("sqla_queue.worker")


class RunningJobs:
    """The running handlers, by job id. Not thread-safe: the decider holds its lock."""

    def __init__(self) -> None:
        self._jobs: dict[int, RunningJob] = {}

    def add(self, running: RunningJob) -> None:
        """``running``'s handler is about to run."""
        self._jobs[running.job.id] = running

    def get(self, job_id: int) -> RunningJob | None:
        """The running handler of ``job_id``, if any."""
        return self._jobs.get(job_id)

    def remove(self, running: RunningJob) -> bool:
        """Forget ``running``, whose handler finished; False when it was released at
        shutdown or replaced (the database has it back: its outcome must be dropped)."""
        current = self._jobs.get(running.job.id)
        if current is not running or running.released:
            return False
        del self._jobs[running.job.id]
        return True

    def count(self) -> int:
        """Handlers running now (a released one no longer counts)."""
        return sum(1 for r in self._jobs.values() if not r.released)

    def contexts(self) -> list[JobContext[Any]]:
        """The contexts of the running handlers that take one."""
        return [r.context for r in self._jobs.values() if r.context is not None]

    def release_all(self) -> list[RunningJob]:
        """Hand every running job back (at the shutdown timeout): mark its handler released
        and forget it; return those."""
        released = [r for r in self._jobs.values() if not r.released]
        for running in released:
            running.released = True
            log.warning(
                "job %s (%s) did not finish within shutdown_timeout; returned to the queue",
                running.job.id,
                running.job.task,
                extra=job_log_fields(running.job),
            )
        self._jobs = {k: v for k, v in self._jobs.items() if not v.released}
        return released

    def pairs(self) -> list[tuple[int, int]]:
        """``(job id, attempt)`` of every running handler."""
        return [(r.job.id, r.job.attempt) for r in self._jobs.values()]

    def job_ids(self) -> set[int]:
        """The jobs of the running handlers."""
        return set(self._jobs)
