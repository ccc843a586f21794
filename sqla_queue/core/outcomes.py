"""What happens to a job after an attempt: the I/O-free half of the worker.

A handler's return value or exception becomes an :class:`Outcome`. The completer writes a
batch of outcomes in one fenced statement; nothing here touches the database.
"""

from __future__ import annotations

import datetime as dt
import enum
import traceback
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypedDict

from sqla_queue.core.backoff import RetryPolicy
from sqla_queue.core.payload import encode_json

__all__ = [
    "ClaimedJob",
    "Outcome",
    "OutcomeKind",
    "OutcomeRow",
    "Reschedule",
    "Retry",
    "error_entry",
    "outcome_for_error",
    "outcome_for_return",
    "outcome_lost_too_often",
    "outcome_refused",
    "outcomes_json",
]

_MAX_TRACEBACK = 16_000


class OutcomeKind(enum.StrEnum):
    """How an attempt ended, as the completion statement understands it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: Failed, but attempts remain: back to pending after a delay, the attempt counted.
    RETRY = "retry"
    #: Asked to run later: back to pending, the attempt not counted.
    RESCHEDULE = "reschedule"
    #: Unfinished at shutdown: back to pending now, the attempt not counted.
    RELEASE = "release"

    @classmethod
    def final(cls) -> tuple[OutcomeKind, ...]:
        """Kinds that end the job: the execution goes, the job keeps its final status."""
        return (cls.SUCCEEDED, cls.FAILED)

    @classmethod
    def back_to_pending(cls) -> tuple[OutcomeKind, ...]:
        """Kinds that put the execution back in the queue for another run."""
        return (cls.RETRY, cls.RESCHEDULE, cls.RELEASE)

    @classmethod
    def recorded(cls) -> tuple[OutcomeKind, ...]:
        """Kinds written to the job's row (status, result, error history, attempts)."""
        return (cls.SUCCEEDED, cls.FAILED, cls.RETRY)


class OutcomeRow(TypedDict):
    """One element of the completion statement's ``outcomes`` JSON array.

    Its keys are the columns that :func:`~sqla_queue.statements.complete_statement` reads
    with ``jsonb_to_recordset`` (``OUTCOME_COLUMNS``); a unit test holds the two together.
    """

    id: int
    attempt: int
    kind: str
    result: Any
    error: dict[str, Any] | None
    execute_at: str | None
    delay: float | None


def _seconds(value: float | dt.timedelta | None) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds < 0:
        raise ValueError("a delay cannot be negative")
    return seconds


class Retry(Exception):
    """Raise from a handler to retry the job, sooner or later than the backoff would.

    The attempt counts towards ``max_attempts``. ``after`` is a delay (seconds or a
    ``timedelta``), ``at`` an absolute time; with neither, the task's backoff decides.
    """

    def __init__(
        self,
        reason: str = "retry requested",
        *,
        after: float | dt.timedelta | None = None,
        at: dt.datetime | None = None,
    ) -> None:
        super().__init__(reason)
        self.delay = _seconds(after)
        self.at = at


class Reschedule(Exception):
    """Return or raise from a handler to run the job again later without using an attempt.

    Give either ``at`` (an aware datetime) or ``in_`` (seconds or a ``timedelta``).
    """

    def __init__(
        self, *, at: dt.datetime | None = None, in_: float | dt.timedelta | None = None
    ) -> None:
        if (at is None) == (in_ is None):
            raise ValueError("Reschedule needs exactly one of at= or in_=")
        if at is not None and at.tzinfo is None:
            raise ValueError("Reschedule(at=...) needs a timezone-aware datetime")
        super().__init__(f"reschedule at={at} in={in_}")
        self.at = at
        self.delay = _seconds(in_)


@dataclass(frozen=True)
class ClaimedJob:
    """One execution this worker holds: the fence (id, attempt) plus what to run."""

    id: int
    task: str
    attempt: int
    max_attempts: int
    reclaims: int
    queue_id: str | None
    payload: Any


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt, ready for the completion statement."""

    job_id: int
    attempt: int
    kind: OutcomeKind
    result: Any = None
    error: dict[str, Any] | None = None
    #: Absolute time of the next run, when the handler named one.
    execute_at: dt.datetime | None = None
    #: Delay of the next run in seconds, measured on the database clock.
    delay: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_row(self) -> OutcomeRow:
        """The JSON object this outcome contributes to the completion batch."""
        return OutcomeRow(
            id=self.job_id,
            attempt=self.attempt,
            kind=self.kind.value,
            result=self.result,
            error=self.error,
            execute_at=self.execute_at.isoformat() if self.execute_at else None,
            delay=self.delay,
        )

    @cached_property
    def encoded(self) -> str:
        """:meth:`as_row` as JSON text, encoded once (by the handler's thread).

        Raises ``TypeError``/``ValueError`` for a result JSON cannot hold; the worker
        stores a stand-in for such a result instead (see :mod:`sqla_queue.worker.handlers`).
        """
        return encode_json(self.as_row())


def outcomes_json(outcomes: list[Outcome]) -> str:
    """The completion's ``outcomes`` parameter: each outcome's :attr:`~Outcome.encoded` row."""
    return "[" + ",".join(o.encoded for o in outcomes) + "]"


def error_entry(
    job: ClaimedJob, exc: BaseException, worker_id: uuid.UUID, now: dt.datetime
) -> dict[str, Any]:
    """The error-history record kept on the job for one failed attempt."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "attempt": job.attempt,
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": tb[-_MAX_TRACEBACK:],
        "worker": str(worker_id),
        "at": now.isoformat(),
    }


def outcome_for_return(job: ClaimedJob, value: Any) -> Outcome:
    """The outcome of a handler that returned ``value``."""
    if isinstance(value, Reschedule):
        return Outcome(
            job.id, job.attempt, OutcomeKind.RESCHEDULE, execute_at=value.at, delay=value.delay
        )
    return Outcome(job.id, job.attempt, OutcomeKind.SUCCEEDED, result=value)


def outcome_for_error(
    job: ClaimedJob,
    exc: BaseException,
    *,
    policy: RetryPolicy,
    worker_id: uuid.UUID,
    now: dt.datetime,
) -> Outcome:
    """The outcome of a handler that raised ``exc`` on ``job``'s current attempt."""
    if isinstance(exc, Reschedule):
        return Outcome(
            job.id, job.attempt, OutcomeKind.RESCHEDULE, execute_at=exc.at, delay=exc.delay
        )
    error = error_entry(job, exc, worker_id, now)
    if job.attempt >= job.max_attempts:
        return Outcome(job.id, job.attempt, OutcomeKind.FAILED, error=error)
    if isinstance(exc, Retry) and (exc.at is not None or exc.delay is not None):
        return Outcome(
            job.id, job.attempt, OutcomeKind.RETRY, error=error, execute_at=exc.at, delay=exc.delay
        )
    return Outcome(
        job.id, job.attempt, OutcomeKind.RETRY, error=error, delay=policy.delay(job.attempt)
    )


def outcome_refused(
    job: ClaimedJob, exc: BaseException, *, worker_id: uuid.UUID, now: dt.datetime
) -> Outcome:
    """A final failure for a claimed row that cannot be run at all (no retry).

    For rows no handler can take: a job row deleted by hand, an unknown task, a payload
    of the wrong shape. Running them again would fail the same way.
    """
    return Outcome(
        job.id, job.attempt, OutcomeKind.FAILED, error=error_entry(job, exc, worker_id, now)
    )


def outcome_lost_too_often(
    job: ClaimedJob, *, max_reclaims: int, worker_id: uuid.UUID, now: dt.datetime
) -> Outcome | None:
    """Fail a job instead of running it when its workers keep dying under it.

    A job that crashes its worker every time would otherwise loop forever between the
    reclaimer and the next claim. Returns ``None`` when the job may run.
    """
    # Only losses decide here. A loss also counts as an attempt, which max_attempts
    # weighs when the next run fails; a first loss must still run the job again, even
    # with max_attempts=1, or a SIGKILLed worker would lose its jobs.
    if job.reclaims <= max_reclaims:
        return None
    reason = f"lost {job.reclaims} times (max_reclaims={max_reclaims})"
    error = {
        "attempt": job.attempt,
        "type": "sqla_queue.JobLost",
        "message": f"{reason}: its worker stopped heartbeating while running it, "
        "for example because the handler crashed the process",
        "traceback": None,
        "worker": str(worker_id),
        "at": now.isoformat(),
    }
    return Outcome(job.id, job.attempt, OutcomeKind.FAILED, error=error)
