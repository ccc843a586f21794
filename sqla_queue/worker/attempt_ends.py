"""How an attempt ends when the ordinary path cannot say: a plain failure, a durable
job's suspension, and the small helpers the handler runner reports them with."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any

from sqla_queue.instrumentation import WorkerObserver, combine_observers, job_log_fields
from sqla_queue.logic.outcomes import (
    ClaimedJob,
    Outcome,
    OutcomeKind,
    check_outcome,
    outcome_refused,
    plain_error_entry,
    sanitize_text,
)

__all__ = ["describe", "observer_of", "plain_failure", "suspended_outcome"]

log = logging.getLogger("sqla_queue.worker")


def suspended_outcome(job: ClaimedJob, until: dt.datetime | None) -> Outcome:
    """The handler's durable wait suspended ``job`` (committed already) until ``until``
    (``None``: no deadline): the worker only forgets it, as it forgets a job whose
    transactional completion committed, and comes back to wake it when it is due."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "job %s (%s) attempt %s suspended",
            job.id,
            job.task,
            job.attempt,
            extra=job_log_fields(job),
        )
    return Outcome(job.id, job.attempt, OutcomeKind.SUSPENDED, execute_at=until)


def plain_failure(
    job: ClaimedJob, reason: Exception, *, worker_id: uuid.UUID, now: dt.datetime
) -> Outcome:
    """The job's final failure for ``reason``; as plain as it gets if even that fails."""
    try:
        outcome = outcome_refused(job, reason, worker_id=worker_id, now=now)
        check_outcome(outcome, now)
    except Exception:
        error = plain_error_entry(
            job.attempt,
            "sqla_queue.logic.outcomes.InvalidOutcomeError",
            "the outcome of this attempt could not be built or stored",
            worker_id,
            now,
        )
        outcome = Outcome(job.id, job.attempt, OutcomeKind.FAILED, error=error)
    return outcome


def observer_of(record: Callable[..., Any]) -> WorkerObserver | None:
    """The observers of the settings of the worker decider ``record`` is a method of.

    How a runner built without ``observer=`` finds the worker's ``observers`` setting.
    """
    settings = getattr(getattr(record, "__self__", None), "settings", None)
    observers = getattr(settings, "observers", ())
    return combine_observers(observers) if observers else None


def describe(exc: BaseException) -> str:
    """``exc`` in one line for an error entry: its type, and its text if it has one."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    text, _ = sanitize_text(text[:500])
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
