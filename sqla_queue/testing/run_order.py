"""The order in which a drain's jobs ran, heard from its worker.

The jobs table says which jobs ran (more attempts than before) but not in which order:
ids follow the enqueues, and a workflow's expansion, written after the nodes that follow
it, runs before them. The drain's worker tells a :class:`RunOrder` observer as each
attempt ends, so :func:`~sqla_queue.testing.helpers.drain` can list its jobs as they ran.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol, TypeVar

from sqla_queue.instrumentation import NoOpObserver
from sqla_queue.logic.outcomes import ClaimedJob, OutcomeKind

__all__ = ["RunOrder"]


class _HasId(Protocol):
    @property
    def id(self) -> int: ...


_Job = TypeVar("_Job", bound=_HasId)


class RunOrder(NoOpObserver):
    """A worker observer that numbers the attempts in the order they end.

    A job's place is that of its last attempt: a job retried within the drain comes
    after the jobs that ran between its attempts, as its final status does.
    """

    def __init__(self) -> None:
        """Start with no attempt heard."""
        self._lock = threading.Lock()  # a worker with concurrency > 1 calls from threads
        self._ended = 0
        self._place: dict[int, int] = {}

    def job_finished(
        self,
        job: ClaimedJob,
        outcome: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """Give ``job`` the next place."""
        with self._lock:
            self._ended += 1
            self._place[job.id] = self._ended

    def sort(self, jobs: Sequence[_Job]) -> list[_Job]:
        """``jobs`` (in id order) in the order their last attempt ended; any the worker
        did not report (none should be) come after, still in id order."""
        with self._lock:
            place = dict(self._place)
            unheard = self._ended + 1
        return sorted(jobs, key=lambda job: (place.get(job.id, unheard), job.id))
