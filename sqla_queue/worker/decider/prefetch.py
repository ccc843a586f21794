"""Prefetched jobs: which go back to the queue unstarted, and which start in a freed seat."""

from __future__ import annotations

import threading

from sqla_queue.worker.decider.maintenance import Maintenance
from sqla_queue.worker.decider.pacing import ClaimPacer
from sqla_queue.worker.decider.running import RunningJobs
from sqla_queue.worker.decider.shutdown import Shutdown
from sqla_queue.worker.handlers import RunningJob

__all__ = ["PREFETCH_HOLD", "Prefetch"]

#: Seconds a prefetched job may wait for a seat before it goes back to the queue.
PREFETCH_HOLD = 1.0


class Prefetch:
    """The decider's part for jobs claimed ahead of need (``WorkerSettings.prefetch``).

    It shares the decider's lock; :meth:`hand_back` runs under it, :meth:`follow_on` takes it.
    """

    def __init__(
        self,
        lock: threading.Lock,
        jobs: RunningJobs,
        seats: int,
        prefetch: int,
        *,
        pacer: ClaimPacer,
        shutdown: Shutdown,
        maintenance: Maintenance,
    ) -> None:
        self._lock = lock
        self._jobs = jobs
        self._seats = seats
        self._prefetch = prefetch
        # No prefetch before this time (monotonic): held jobs went back unstarted, and
        # claiming them again at once would hold them (and their keys) again.
        self._prefetch_after = 0.0
        self._pacer = pacer
        self._shutdown = shutdown
        self._maintenance = maintenance

    def capacity(self, now: float) -> int:
        """Jobs the worker may hold: its seats, plus the prefetch unless a served task has
        a concurrency limit (a prefetched job would hold one of its slots idle) or
        prefetched jobs went back lately for want of a seat (see :meth:`hand_back`)."""
        if self._pacer.limited or now < self._prefetch_after:
            return self._seats
        return self._seats + self._prefetch

    def free_seats(self) -> int:
        """Seats no started handler takes (the caller holds the lock)."""
        return self._seats - (self._jobs.count() - self._jobs.waiting())

    def hand_back(self, now: float) -> list[RunningJob]:
        """The prefetched jobs to hand back now (the caller holds the lock): all of them
        once a stop began, else those held over :data:`PREFETCH_HOLD` seconds (every seat
        stays busy: their keys and another worker's free seat wait for them) and those of
        a task paused since their claim. After such a hand-back the worker prefetches
        nothing for :data:`PREFETCH_HOLD` seconds, or it would claim them straight back."""
        if not self._jobs.waiting():
            return []
        stop = self._shutdown.deadline is not None
        back = self._jobs.release_waiting(
            None if stop else now - PREFETCH_HOLD, self._maintenance.paused
        )
        if back:
            self._prefetch_after = now + PREFETCH_HOLD
        return back

    def follow_on(self, finished: RunningJob) -> RunningJob | None:
        """The prefetched job that the seat ``finished`` left may start at once, in the
        same thread or task (no trip through the run loop); None if there is none, if
        the seat is taken, or if the worker is stopping. Any thread may call."""
        with self._lock:
            if self._shutdown.deadline is not None or self.free_seats() <= 0:
                return None
            return self._jobs.next_waiting(finished.runtime.is_async)
