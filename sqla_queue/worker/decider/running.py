"""The executions this process holds: handlers running, and prefetched jobs waiting."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Collection
from typing import Any

from sqla_queue.instrumentation import job_log_fields
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.handlers import RunningJob

__all__ = ["RunningJobs"]

log = logging.getLogger("sqla_queue.worker")


class RunningJobs:
    """The held executions, by job id: those whose handlers run, and the prefetched ones
    that wait for a seat. Not thread-safe: the decider holds its lock.

    A prefetched job is held like a running one (heartbeats, cancels, release at shutdown
    all see it); it only waits. Waiting jobs start highest priority first, then in the
    order they were claimed: a later claim's more urgent job overtakes them.
    """

    def __init__(self) -> None:
        self._jobs: dict[int, RunningJob] = {}
        self._waiting: list[tuple[int, int, RunningJob]] = []
        self._order = itertools.count()

    def add(self, running: RunningJob) -> None:
        """``running``'s handler is about to run."""
        self._jobs[running.job.id] = running

    def hold(self, running: RunningJob) -> None:
        """Hold prefetched ``running`` until a seat frees (:meth:`take_waiting`)."""
        self._jobs[running.job.id] = running
        heapq.heappush(self._waiting, (-running.job.priority, next(self._order), running))

    def waiting(self) -> int:
        """Prefetched jobs that wait for a seat."""
        return len(self._waiting)

    def take_waiting(self, count: int) -> list[RunningJob]:
        """Up to ``count`` prefetched jobs to start now, the most urgent first."""
        taken: list[RunningJob] = []
        while self._waiting and len(taken) < count:
            running = heapq.heappop(self._waiting)[2]
            if self._jobs.get(running.job.id) is running and not running.released:
                taken.append(running)
        return taken

    def next_waiting(self, is_async: bool) -> RunningJob | None:
        """The most urgent prefetched job, taken only if its handler is ``async def`` as
        ``is_async`` says (a thread runs one kind, an event loop the other)."""
        while self._waiting:
            running = self._waiting[0][2]
            if self._jobs.get(running.job.id) is not running or running.released:
                heapq.heappop(self._waiting)  # handed back or replaced meanwhile
                continue
            if running.runtime.is_async != is_async:
                return None
            heapq.heappop(self._waiting)
            return running
        return None

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
        self._waiting.clear()
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

    def release_waiting(
        self, claimed_before: float | None = None, paused: Collection[str] = ()
    ) -> list[RunningJob]:
        """Hand prefetched jobs back; return those. All of them (a stop began: none will
        start), or those claimed before ``claimed_before`` (monotonic) and those of a
        ``paused`` task.

        A prefetched job must not wait long: it holds its ``queue_id``'s head, so the
        key's next job waits too, and another worker's seat may be free. Nor may a job of
        a task paused since its claim start.
        """
        keep: list[tuple[int, int, RunningJob]] = []
        released: list[RunningJob] = []
        for entry in self._waiting:
            running = entry[2]
            stale = claimed_before is None or running.claimed_at < claimed_before
            if stale or running.job.task in paused:
                released.append(running)
            else:
                keep.append(entry)
        if released:
            heapq.heapify(keep)
            self._waiting = keep
        for running in released:
            running.released = True
            self._jobs.pop(running.job.id, None)
        return released

    def pairs(self) -> list[tuple[int, int]]:
        """``(job id, attempt)`` of every running handler."""
        return [(r.job.id, r.job.attempt) for r in self._jobs.values()]

    def job_ids(self) -> set[int]:
        """The jobs of the running handlers."""
        return set(self._jobs)
