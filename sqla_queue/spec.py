"""What one enqueue call asks for: its per-call options and the job it describes.

Tasks build these (``task.options(...)``, ``task.call(...)``), the queue accepts them
(``queue.enqueue(...)``, ``queue.enqueue_many(...)``) and :mod:`sqla_queue.enqueue` turns
them into rows. This module sits below all three and imports none of them.

The per-call options are spelled once, as :class:`EnqueueKwargs`, the keywords every
enqueue entry point takes (with ``Unpack``); :class:`EnqueueOptions` is their validated
form, with ``delay`` in seconds.

Every value is checked here, where it enters, against what the database and every worker
can hold (see the bounds below), so that a bad one fails at the call with an error naming
the option and the rule, before anything is written: it never reaches the database as a
``DataError`` that aborts the caller's transaction, nor a worker as a row it cannot load.
The checks of the other settings (``@queue.task``, ``Queue(...)``) use the same helpers.
"""

from __future__ import annotations

import datetime as dt
import numbers
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, Unpack

from sqla_queue.core.payload import text_problem
from sqla_queue.core.times import check_delay, check_due_time
from sqla_queue.errors import PayloadNotSerializableError

__all__ = [
    "INT4_MAX",
    "INT4_MIN",
    "MAX_QUEUE_ID",
    "OPTION_NAMES",
    "EnqueueKwargs",
    "EnqueueOptions",
    "JobSpec",
    "check_keywords",
    "check_queue_id",
    "check_whole_number",
    "make_enqueue_options",
]

#: The range of a PostgreSQL ``integer`` column (priority, max_attempts, reclaims, ...).
INT4_MIN = -(2**31)
INT4_MAX = 2**31 - 1

#: The longest ``queue_id``, in characters: the key is indexed, and a PostgreSQL btree
#: entry must stay under 2,704 bytes (512 characters are at most 2,048 bytes of UTF-8).
MAX_QUEUE_ID = 512


def _described(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_whole_number(option: str, value: object, low: int, high: int = INT4_MAX) -> int:
    """``value`` as an ``int`` if it is a whole number from ``low`` to ``high``, else raise.

    ``TypeError`` for anything but an integer (``True`` and ``2.0`` included);
    ``ValueError`` outside the range. Both messages name ``option`` and the rule.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{option} must be a whole number (int), got {_described(value)}")
    number = int(value)
    if number < low and high == INT4_MAX:
        raise ValueError(f"{option} must be at least {low}, got {number}")
    if not low <= number <= high:
        why = " (it is stored as a PostgreSQL integer)" if high == INT4_MAX else ""
        raise ValueError(f"{option} must be from {low} to {high}{why}, got {number}")
    return number


def check_queue_id(value: object) -> str:
    """``value`` if it can be a ``queue_id``: a non-empty string PostgreSQL can index."""
    if not isinstance(value, str):
        raise TypeError(f"queue_id must be a non-empty string, got {_described(value)}")
    if not value:
        raise ValueError("queue_id must be a non-empty string, got ''")
    if len(value) > MAX_QUEUE_ID:
        raise ValueError(
            f"queue_id must be at most {MAX_QUEUE_ID} characters (it is indexed), got {len(value)}"
        )
    problem = text_problem(value)
    if problem is not None:
        raise PayloadNotSerializableError(f"queue_id {value[:60]!r} {problem}")
    return value


class EnqueueKwargs(TypedDict, total=False):
    """The per-call options, as keywords: ``task.options(delay=60, queue_id="a-42")``.

    Each may be left out or given as ``None`` (the task's default applies).
    """

    #: An aware datetime: the job is due then. From :data:`EARLIEST_DUE` to before
    #: :data:`LATEST_DUE`.
    run_at: dt.datetime | None
    #: Seconds (or a timedelta) counted on the database clock from the enqueueing
    #: statement: finite, ``>= 0``, at most :data:`MAX_DELAY`.
    delay: float | dt.timedelta | None
    #: Higher runs first; the task's priority when not given. A PostgreSQL integer.
    priority: int | None
    #: A serialization key: jobs sharing it run one at a time, in order. A non-empty
    #: string of at most :data:`MAX_QUEUE_ID` characters, without NUL or lone surrogates.
    queue_id: str | None
    #: Attempts for this job; the task's ``max_attempts`` when not given. At least 1.
    max_attempts: int | None


#: The keywords :func:`make_enqueue_options` accepts, in their documented order.
OPTION_NAMES = tuple(EnqueueKwargs.__annotations__)


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call options. They live apart from the task's arguments so names never collide.

    ``run_at`` is an aware datetime; ``delay`` is seconds (or a timedelta, stored as
    seconds) counted on the database clock from the enqueueing statement. Give at most
    one of them. Every value is checked on construction (see :class:`EnqueueKwargs` for
    the rules): ``TypeError`` for a wrong type, ``ValueError`` for a bad value, and
    :class:`~sqla_queue.PayloadNotSerializableError` for a ``queue_id`` PostgreSQL cannot
    store.
    """

    run_at: dt.datetime | None = None
    delay: float | None = None
    priority: int | None = None
    queue_id: str | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.run_at is not None:
            check_due_time("run_at", self.run_at)
        if self.delay is not None:
            seconds = check_delay("delay", self.delay)
            object.__setattr__(self, "delay", seconds)
        if self.priority is not None:
            object.__setattr__(
                self, "priority", check_whole_number("priority", self.priority, INT4_MIN)
            )
        if self.max_attempts is not None:
            object.__setattr__(
                self, "max_attempts", check_whole_number("max_attempts", self.max_attempts, 1)
            )
        if self.queue_id is not None:
            check_queue_id(self.queue_id)

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with every field that ``other`` sets taken from ``other``."""
        changes = {k: v for k, v in vars(other).items() if v is not None}
        # run_at and delay are two spellings of one setting: the newer one replaces both.
        if other.run_at is not None:
            changes["delay"] = None
        elif other.delay is not None:
            changes["run_at"] = None
        return replace(self, **changes)


#: The options of a call that sets none (frozen, so one instance serves every call).
_NO_OPTIONS = EnqueueOptions()


def check_keywords(where: str, given: Iterable[str], allowed: Collection[str]) -> None:
    """Raise the ``TypeError`` Python raises when ``where()`` gets a keyword it lacks.

    For functions that take their keywords as ``**options: Unpack[SomeTypedDict]``: a
    type checker rejects an unknown keyword, and this rejects it at run time, with the
    message of an explicit signature.
    """
    for name in given:
        if name not in allowed:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")


def make_enqueue_options(**options: Unpack[EnqueueKwargs]) -> EnqueueOptions:
    """Validate per-call options, accepting a ``timedelta`` for ``delay``.

    Raises ``TypeError`` for a keyword that is not an option (a type checker reports it
    before), and ``ValueError`` for an invalid value.
    """
    if not options:
        return _NO_OPTIONS
    check_keywords("make_enqueue_options", options, OPTION_NAMES)
    values: dict[str, Any] = dict(options)
    # EnqueueOptions checks every value, and turns a timedelta delay into seconds.
    return EnqueueOptions(**values)


@dataclass(frozen=True)
class JobSpec:
    """One call to enqueue: a task name, its arguments and per-call options.

    Build them with :meth:`Task.call` (or directly, by name) for
    :meth:`~sqla_queue.Queue.enqueue_many`.
    """

    task: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: EnqueueOptions = field(default_factory=EnqueueOptions)
