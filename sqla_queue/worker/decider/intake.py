"""Claimed rows on their way in: decoded once, and refused when they must not run."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any

from sqla_queue.errors import UnknownTaskError
from sqla_queue.instrumentation import job_log_fields
from sqla_queue.logic.outcomes import (
    ClaimedJob,
    Outcome,
    outcome_lost_too_often,
    outcome_refused,
)
from sqla_queue.logic.payload import decode_arguments
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.handlers import RunningJob
from sqla_queue.worker.plan import WorkerPlan

__all__ = ["ContextFactory", "Intake"]

log = logging.getLogger("sqla_queue.worker")

#: Builds a handler's context for a claimed job (None when the task takes none).
ContextFactory = Callable[[ClaimedJob], JobContext[Any] | None]


class Intake:
    """Turns each claimed row into a handler to run, or into the failure of its job.

    Rows that must not run (lost too often, malformed, of an unknown task, without a job
    row) fail at once: they were committed as running and must end, not linger. Errors are
    stamped by the injected wall ``clock``.
    """

    def __init__(
        self, plan: WorkerPlan, worker_id: uuid.UUID, clock: Callable[[], dt.datetime]
    ) -> None:
        self._plan = plan
        self._worker_id = worker_id
        self._clock = clock

    @staticmethod
    def job_of(row: Any) -> ClaimedJob:
        """The claimed job a claim's row (with an ``id``) describes."""
        return ClaimedJob(
            id=row.id,
            task=row.task,
            attempt=row.attempt,
            # None only for an orphan (see _admit), which fails at this attempt.
            max_attempts=row.attempt if row.max_attempts is None else row.max_attempts,
            reclaims=row.reclaims,
            queue_id=row.queue_id,
            payload=row.payload,
            execute_at=getattr(row, "execute_at", None),
            priority=getattr(row, "priority", None) or 0,
            workflow=bool(getattr(row, "workflow", False)),
        )

    def accept(self, job: ClaimedJob, make_context: ContextFactory) -> RunningJob | Outcome:
        """The handler to run for ``job``, with its payload decoded; or its failure."""
        try:
            admitted = self._admit(job)
            if not isinstance(admitted, Outcome):
                args, kwargs = admitted
                context = make_context(job)
        except Exception as exc:  # committed as running: it must end, not linger
            log.exception(
                "job %s (%s) could not be prepared to run",
                job.id,
                job.task,
                extra=job_log_fields(job),
            )
            admitted = self._refused(job, exc)
        if isinstance(admitted, Outcome):
            return admitted
        return RunningJob(job, self._plan.tasks[job.task], args, kwargs, context)

    def _admit(self, job: ClaimedJob) -> Outcome | tuple[list[Any], dict[str, Any]]:
        """The decoded arguments of a row that may run, or the failure of one that may not."""
        if job.payload is None:
            # The jobs table has no row for it (deleted by hand: there is no foreign key).
            log.error(
                "execution %s (%s) has no job row; removing it",
                job.id,
                job.task,
                extra=job_log_fields(job),
            )
            return self._refused(job, LookupError(f"job {job.id} has no row in the jobs table"))
        runtime = self._plan.tasks.get(job.task)
        if runtime is None:  # the claim filters by task; this guards a hand-edited row
            return self._refused(job, UnknownTaskError(f"no handler for task {job.task!r}"))
        lost = outcome_lost_too_often(
            job, max_reclaims=runtime.max_reclaims, worker_id=self._worker_id, now=self._clock()
        )
        if lost is not None:
            log.error(
                "job %s (%s) failed: %s", job.id, job.task, lost.error, extra=job_log_fields(job)
            )
            return lost
        try:
            return decode_arguments(job.payload)
        except ValueError as exc:
            return self._refused(job, exc)

    def _refused(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        return outcome_refused(job, exc, worker_id=self._worker_id, now=self._clock())
