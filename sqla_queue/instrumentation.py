"""The worker's instrumentation interface: what metrics and tracing integrations hear.

A :class:`WorkerObserver` hears each job attempt start and finish, and the jobs a
reclaim sweep returned to the queue. Pass observers to a worker with
``queue.worker(SessionLocal, observers=[...])``; without any, the worker makes no call at
all, and neither ``prometheus_client`` nor ``opentelemetry`` is ever imported. The
integrations shipped with the library implement it:
:class:`sqla_queue.metrics.prometheus.PrometheusMetrics` and
:class:`sqla_queue.tracing.otel.Tracing`.

The enqueue side has no observer: enqueues run in the application's own code, not in a
worker. Integrations hear them through the payload hook of
:func:`sqla_queue.logic.payload.add_payload_hook`, which can also add a trace context to the
job's payload.

Guarantees to an observer:

- :meth:`~WorkerObserver.job_started` and :meth:`~WorkerObserver.job_finished` of one
  attempt are called in the same thread (a ``def`` handler) or the same asyncio task (an
  ``async def`` handler) that runs the handler, the handler between them, so per-attempt
  state may live in a :class:`contextvars.ContextVar` (a span made current, say);
- an exception an observer raises is logged and swallowed: observing must never lose a job;
- several observers are called in the order given when an attempt starts, and in reverse
  order when it finishes, as nested ``with`` blocks would be.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from sqla_queue.logic.outcomes import ClaimedJob, OutcomeKind

__all__ = [
    "CompositeObserver",
    "NoOpObserver",
    "WorkerObserver",
    "check_observers",
    "combine_observers",
    "job_log_fields",
    "notify_lost",
]

log = logging.getLogger("sqla_queue.instrumentation")


@runtime_checkable
class WorkerObserver(Protocol):
    """What a worker tells its observers. Subclass :class:`NoOpObserver` to implement a part."""

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        """An attempt of ``job`` starts: its handler is about to be called.

        ``queue_wait`` is how long, in seconds, the job waited to start since it became
        due, when the worker knows it (see :mod:`sqla_queue.worker.handlers`), else ``None``.
        """

    def job_finished(
        self,
        job: ClaimedJob,
        outcome: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """The attempt started by :meth:`job_started` ended with ``outcome``.

        ``duration`` is the handler's run in seconds, including a transactional task's
        commit. ``error`` is the exception the handler raised, if any (a ``Retry``, a
        ``Reschedule`` raised rather than returned, any failure). ``outcome`` is
        :attr:`~sqla_queue.logic.outcomes.OutcomeKind.RELEASE` when the worker's shutdown
        cancelled an ``async def`` handler and handed its job back.
        """

    def jobs_lost(self, tasks: Sequence[str]) -> None:
        """This worker's reclaim sweep returned lost executions (one task name each) to
        the queue: their workers stopped heartbeating. Each loss is reported once, by the
        worker whose sweep found it."""


class NoOpObserver:
    """A :class:`WorkerObserver` that ignores everything: a base for partial observers."""

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        """Ignored."""

    def job_finished(
        self,
        job: ClaimedJob,
        outcome: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """Ignored."""

    def jobs_lost(self, tasks: Sequence[str]) -> None:
        """Ignored."""


class CompositeObserver:
    """Several observers as one, each call guarded so that a failing observer is logged
    and the others (and the job) go on."""

    def __init__(self, observers: Iterable[WorkerObserver]) -> None:
        self.observers: tuple[WorkerObserver, ...] = tuple(observers)
        self._reversed = self.observers[::-1]

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        """Tell each observer, in order."""
        for observer in self.observers:
            try:
                observer.job_started(job, queue_wait)
            except Exception:
                _observer_failed(observer, "job_started", job)

    def job_finished(
        self,
        job: ClaimedJob,
        outcome: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """Tell each observer, in reverse order (the first to start is the last to finish)."""
        for observer in self._reversed:
            try:
                observer.job_finished(job, outcome, duration, error)
            except Exception:
                _observer_failed(observer, "job_finished", job)

    def jobs_lost(self, tasks: Sequence[str]) -> None:
        """Tell each observer, in order."""
        for observer in self.observers:
            try:
                observer.jobs_lost(tasks)
            except Exception:
                _observer_failed(observer, "jobs_lost", None)


def _observer_failed(observer: object, method: str, job: ClaimedJob | None) -> None:
    extra = job_log_fields(job) if job is not None else {}
    log.warning("observer %r failed in %s", observer, method, exc_info=True, extra=extra)


def check_observers(observers: object) -> tuple[WorkerObserver, ...]:
    """``observers`` as a tuple, or ``TypeError`` naming the setting and the rule."""
    if isinstance(observers, str | bytes) or not isinstance(observers, Sequence):
        raise TypeError(f"observers must be a list of observers, got {observers!r}")
    for observer in observers:
        if not isinstance(observer, WorkerObserver):
            raise TypeError(
                "observers must hold objects with job_started, job_finished and jobs_lost "
                f"(see sqla_queue.instrumentation.WorkerObserver), got {observer!r}"
            )
    return tuple(observers)


def combine_observers(observers: Sequence[WorkerObserver]) -> CompositeObserver | None:
    """One guarded observer for ``observers``, or ``None`` when there are none.

    ``None`` lets the worker skip every call (and every clock read they need).
    """
    return CompositeObserver(observers) if observers else None


def notify_lost(observers: Sequence[WorkerObserver], tasks: Iterable[str]) -> None:
    """Tell ``observers`` about lost executions a reclaim returned (no-op without any)."""
    if observers:
        names = list(tasks)
        if names:
            CompositeObserver(observers).jobs_lost(names)


def job_log_fields(job: ClaimedJob) -> dict[str, object]:
    """The ``extra`` of every worker log record about one attempt of ``job``.

    A structured log formatter (JSON, logfmt) finds them as record attributes:
    ``record.job_id``, ``record.task`` and ``record.attempt``.
    """
    return {"job_id": job.id, "task": job.task, "attempt": job.attempt}
