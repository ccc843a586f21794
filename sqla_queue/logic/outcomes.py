"""What happens to a job after an attempt: the I/O-free half of the worker.

A handler's return value or exception becomes an :class:`Outcome`. The completer writes a
batch of outcomes in one fenced statement; nothing here touches the database.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import re
import sys
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from sqla_queue.checks import check_seconds
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.logic.payload import encode_json, text_problem, text_suspect
from sqla_queue.logic.times import check_due, check_due_time

__all__ = [
    "ClaimedJob",
    "InvalidOutcomeError",
    "Outcome",
    "OutcomeKind",
    "OutcomeRow",
    "Reschedule",
    "Retry",
    "check_outcome",
    "error_entry",
    "find_unstorable",
    "outcome_for_error",
    "outcome_for_return",
    "outcome_lost_too_often",
    "outcome_refused",
    "outcome_unwritable",
    "outcomes_json",
    "plain_error_entry",
    "sanitize_text",
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
    #: The handler returned after its worker told it the job was cancelled.
    CANCELLED = "cancelled"
    #: A durable job began to wait: its suspension was committed by the handler itself
    #: (the attempt not counted). Never written by the completion statement.
    SUSPENDED = "suspended"

    @classmethod
    def final(cls) -> tuple[OutcomeKind, ...]:
        """Kinds that end the job: the execution goes, the job keeps its final status."""
        return (cls.SUCCEEDED, cls.FAILED, cls.CANCELLED)

    @classmethod
    def back_to_pending(cls) -> tuple[OutcomeKind, ...]:
        """Kinds that put the execution back in the queue for another run."""
        return (cls.RETRY, cls.RESCHEDULE, cls.RELEASE)

    @classmethod
    def settled_by_handler(cls) -> tuple[OutcomeKind, ...]:
        """Kinds the handler's own transaction wrote: the completion never sees them."""
        return (cls.SUSPENDED,)

    @classmethod
    def recorded(cls) -> tuple[OutcomeKind, ...]:
        """Kinds written to the job's row (status, result, error history, attempts)."""
        return (cls.SUCCEEDED, cls.FAILED, cls.RETRY, cls.CANCELLED)


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


def _handler_delay(option: str, value: object) -> float:
    """A handler's delay: finite and not negative. How far it may reach is checked when the
    outcome is recorded (:func:`~sqla_queue.logic.times.check_due`), so that a delay past the
    latest due time fails the attempt with its reason instead of the handler's own code."""
    return check_seconds(option, value, maximum=math.inf, timedelta=True)


class Retry(Exception):
    """Raise from a handler to retry the job, sooner or later than the backoff would.

    The attempt counts towards ``max_attempts``. Give at most one of ``after`` (a delay:
    seconds or a ``timedelta``, finite, not negative) and ``at`` (a timezone-aware
    datetime); with neither, the task's backoff decides. A value of the wrong type, a NaN,
    a negative delay or a naive datetime raises at once; a next run after
    :data:`~sqla_queue.logic.times.LATEST_DUE` is refused when the outcome is recorded, and the
    attempt then fails with that reason.
    """

    def __init__(
        self,
        reason: str = "retry requested",
        *,
        after: float | dt.timedelta | None = None,
        at: dt.datetime | None = None,
    ) -> None:
        if after is not None and at is not None:
            raise ValueError("Retry takes at most one of after= and at=")
        super().__init__(reason)
        self.delay = None if after is None else _handler_delay("Retry(after=...)", after)
        self.at = None if at is None else check_due_time("Retry(at=...)", at)


class Reschedule(Exception):
    """Return or raise from a handler to run the job again later without using an attempt.

    Give exactly one of ``at`` (a timezone-aware datetime) or ``in_`` (seconds or a
    ``timedelta``, finite, not negative). The same rules as :class:`Retry`'s apply.
    """

    def __init__(
        self, *, at: dt.datetime | None = None, in_: float | dt.timedelta | None = None
    ) -> None:
        if (at is None) == (in_ is None):
            raise ValueError("Reschedule needs exactly one of at= or in_=")
        self.at = None if at is None else check_due_time("Reschedule(at=...)", at)
        self.delay = None if in_ is None else _handler_delay("Reschedule(in_=...)", in_)
        super().__init__(f"reschedule at={at} in={in_}")


class InvalidOutcomeError(ValueError):
    """The outcome a handler produced cannot be stored; the attempt fails with this reason.

    Examples: a result holding a NUL character or a lone surrogate (PostgreSQL's ``jsonb``
    refuses both), a result nested too deep to encode, a retry or reschedule due after
    :data:`~sqla_queue.logic.times.LATEST_DUE`. The handler's own exception, if any, is its
    ``__cause__``, so the recorded traceback shows where it came from.
    """


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
    #: When the execution became due (the claim returns it): queue wait is measured from it.
    execute_at: dt.datetime | None = None
    #: The job's priority: prefetched jobs start in its order.
    priority: int = 0
    #: The job is a workflow's node: its completion releases its dependents.
    workflow: bool = False


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

    @property
    def encoded(self) -> str:
        """:meth:`as_row` as JSON text, encoded once (by the handler's thread) and kept.

        Raises ``TypeError``/``ValueError`` for a value JSON cannot hold; the worker
        stores a stand-in for such a result instead (see :mod:`sqla_queue.worker.handlers`).
        """
        text: str | None = self.__dict__.get("_encoded")
        if text is None:
            bare = (
                self.result is None
                and self.error is None
                and self.execute_at is None
                and self.delay is None
            )
            # Most rows are bare (a success without a result): a format, not an encoder call.
            if bare:
                text = _BARE_ROW % (self.job_id, self.attempt, self.kind.value)
            else:
                text = encode_json(self.as_row())
            object.__setattr__(self, "_encoded", text)
        return text


#: An :class:`OutcomeRow` with only its id, attempt and kind set, as a JSON template.
_BARE_ROW = (
    "{"
    + ",".join(
        f'"{key}":' + {"id": "%d", "attempt": "%d", "kind": '"%s"'}.get(key, "null")
        for key in OutcomeRow.__annotations__
    )
    + "}"
)


def outcomes_json(outcomes: list[Outcome]) -> str:
    """The completion's ``outcomes`` parameter: each outcome's :attr:`~Outcome.encoded` row."""
    return "[" + ",".join(o.encoded for o in outcomes) + "]"


#: Characters PostgreSQL cannot store in text or jsonb: NUL, and UTF-16 surrogates (a
#: Python string holding one is not valid Unicode text).
_UNSTORABLE_CHARACTERS = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def sanitize_text(text: str) -> tuple[str, int]:
    """``text`` with every character PostgreSQL cannot store replaced by U+FFFD.

    Returns the text and how many characters were replaced (NUL and surrogates).
    """
    if _UNSTORABLE_CHARACTERS.search(text) is None:
        return text, 0
    return _UNSTORABLE_CHARACTERS.subn(REPLACEMENT, text)


def find_unstorable(value: Any) -> str | None:
    """Where ``value`` (a JSON-like document) holds a string PostgreSQL cannot store.

    Returns a description such as ``"result['a'][2] contains a NUL character ..."``, or
    ``None``. The rule for a string is enqueue's (:func:`~sqla_queue.logic.payload.text_problem`).
    Walks without recursion, so any depth the JSON encoder accepted is fine.
    """
    stack: list[tuple[Any, str]] = [(value, "result")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{path} {problem}"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                problem = text_problem(key) if isinstance(key, str) else None
                if problem is not None:
                    return f"a key of {path} {problem}"
                stack.append((child, f"{path}[{_short_repr(key)}]"))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def _short_repr(key: object) -> str:
    text = repr(key)
    text = text if len(text) <= 40 else text[:37] + "..."
    return sanitize_text(text)[0]


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as inner:  # an exception whose __str__ raises is still recorded
        return f"<str() of this {type(exc).__name__} raised {type(inner).__name__}>"


def _safe_traceback(exc: BaseException, message: str, type_name: str) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # formatting a hostile exception must not lose the attempt
        return f"{type_name}: {message}\n(the traceback could not be formatted)"


def error_entry(
    job: ClaimedJob, exc: BaseException, worker_id: uuid.UUID, now: dt.datetime
) -> dict[str, Any]:
    """The error-history record kept on the job for one failed attempt.

    Never raises: an exception whose ``__str__`` raises is recorded with a stand-in
    message. Characters PostgreSQL cannot store (NUL, lone surrogates) in the type,
    message or traceback are replaced with U+FFFD, and the message says so.
    """
    cls = type(exc)
    type_name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}"
    message = _safe_str(exc)
    tb = _safe_traceback(exc, message, type_name)[-_MAX_TRACEBACK:]
    type_name, bad_type = sanitize_text(type_name)
    message, bad_message = sanitize_text(message)
    tb, bad_tb = sanitize_text(tb)
    replaced = bad_type + bad_message + bad_tb
    if replaced:
        message += (
            f" [sqla_queue: {replaced} character(s) PostgreSQL cannot store (NUL, "
            "surrogates) were replaced with U+FFFD in this error]"
        )
    return plain_error_entry(job.attempt, type_name, message, worker_id, now, trace=tb)


def plain_error_entry(
    attempt: int,
    type_name: str,
    message: str,
    worker_id: uuid.UUID,
    now: dt.datetime,
    *,
    trace: str | None = None,
) -> dict[str, Any]:
    """An error-history record from its parts: the one shape every failure is written in.

    For failures the worker names itself (a lost job, an outcome the database refused),
    which have no exception to format. ``message`` must be text PostgreSQL can store.
    """
    return {
        "attempt": attempt,
        "type": type_name,
        "message": message,
        "traceback": trace,
        "worker": str(worker_id),
        "at": now.isoformat(),
    }


def check_outcome(outcome: Outcome, now: dt.datetime) -> None:
    """Raise :class:`InvalidOutcomeError` unless ``outcome`` can be written as it is.

    Checks the next run's due time (within [EARLIEST_DUE, LATEST_DUE), ``now`` being the worker's
    clock), encodes the outcome (caching :attr:`Outcome.encoded`), and looks for strings
    that PostgreSQL's ``jsonb`` refuses (NUL, lone surrogates). The encoder's own errors
    (``TypeError``/``ValueError`` for a value JSON cannot hold) propagate unchanged, so a
    caller may store a stand-in for such a result; too deep a result is reported here.
    """
    if outcome.kind in OutcomeKind.back_to_pending() and outcome.kind is not OutcomeKind.RELEASE:
        try:
            check_due(
                at=outcome.execute_at,
                delay=outcome.delay,
                now=now,
                what=f"this attempt's {outcome.kind.value}",
            )
        except (TypeError, ValueError) as exc:
            # No chaining: the message says it all, and the worker chains the handler's
            # own exception (a Retry, say) so the traceback shows where it was raised.
            raise InvalidOutcomeError(str(exc)) from None
    try:
        text = outcome.encoded
    except RecursionError as exc:
        raise InvalidOutcomeError(
            "the result is nested too deep to encode as JSON "
            f"(deeper than about {sys.getrecursionlimit()} levels)"
        ) from exc
    # The encoded text tells exactly whether a walk is needed; most results skip it.
    if text_suspect(text):
        where = find_unstorable(outcome.result)
        if where is not None:
            raise InvalidOutcomeError(f"the result cannot be stored: {where}")


def outcome_unwritable(
    outcome: Outcome, reason: str, *, worker_id: uuid.UUID, now: dt.datetime
) -> Outcome:
    """A plain final failure standing in for ``outcome``, which the database refused.

    The last resort when a completion keeps failing on one outcome for a reason retrying
    cannot fix (a data error): the job fails with ``reason`` (sanitized) instead of
    blocking every other outcome. The stand-in holds no result and only plain text; it
    is marked ``extra["stand_in"]`` so that a refusal of the stand-in itself is fatal.
    """
    message, _ = sanitize_text(reason)
    error = plain_error_entry(
        outcome.attempt,
        "sqla_queue.OutcomeNotWritten",
        f"the database refused this attempt's {outcome.kind.value} outcome: {message}",
        worker_id,
        now,
    )
    return Outcome(
        outcome.job_id, outcome.attempt, OutcomeKind.FAILED, error=error, extra={"stand_in": True}
    )


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
    error = plain_error_entry(
        job.attempt,
        "sqla_queue.JobLost",
        f"{reason}: its worker stopped heartbeating while running it, "
        "for example because the handler crashed the process",
        worker_id,
        now,
    )
    return Outcome(job.id, job.attempt, OutcomeKind.FAILED, error=error)
