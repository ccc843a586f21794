"""What one enqueue call asks for: its per-call options and the job it describes.

Tasks build these (``task.options(...)``, ``task.call(...)``), the queue accepts them
(``queue.enqueue(...)``, ``queue.enqueue_many(...)``) and :mod:`sqla_queue.enqueue` turns
them into rows. This module sits below all three and imports none of them.

The per-call options are spelled once, as :class:`EnqueueKwargs`, the keywords every
enqueue entry point takes (with ``Unpack``); :class:`EnqueueOptions` is their validated
form, with ``delay`` in seconds.

Every value is checked here, where it enters, against what the database and every worker
can hold, so that a bad one fails at the call with an error naming the option and the
rule, before anything is written: it never reaches the database as a ``DataError`` that
aborts the caller's transaction, nor a worker as a row it cannot load. The generic number
and duration checks, which the other settings (``@queue.task``, ``Queue(...)``) share, are
in :mod:`sqla_queue.checks`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, Unpack

from sqla_queue.checks import INT4_MIN, check_seconds, check_whole_number, described
from sqla_queue.errors import PayloadNotSerializableError
from sqla_queue.links import AboutRef, about_reference
from sqla_queue.logic.payload import text_problem
from sqla_queue.logic.times import check_delay, check_due_time

__all__ = [
    "MAX_QUEUE_ID",
    "MAX_WAIT_IF_FULL",
    "ON_DUPLICATE",
    "OPTION_NAMES",
    "UNIQUE_SCOPES",
    "EnqueueKwargs",
    "EnqueueOptions",
    "JobSpec",
    "check_key_text",
    "check_keywords",
    "check_on_duplicate",
    "check_queue_id",
    "check_unique_scope",
    "check_wait_if_full",
    "make_enqueue_options",
]

#: The longest ``queue_id``, in characters: the key is indexed, and a PostgreSQL btree
#: entry must stay under 2,704 bytes (512 characters are at most 2,048 bytes of UTF-8).
MAX_QUEUE_ID = 512


def check_key_text(option: str, value: object) -> str:
    """``value`` if it can be a key (``queue_id``, ``unique_key``): a non-empty string that
    PostgreSQL can index (at most :data:`MAX_QUEUE_ID` characters, no NUL)."""
    if not isinstance(value, str):
        raise TypeError(f"{option} must be a non-empty string, got {described(value)}")
    if not value:
        raise ValueError(f"{option} must be a non-empty string, got ''")
    if len(value) > MAX_QUEUE_ID:
        raise ValueError(
            f"{option} must be at most {MAX_QUEUE_ID} characters (it is indexed), got {len(value)}"
        )
    problem = text_problem(value)
    if problem is not None:
        raise PayloadNotSerializableError(f"{option} {value[:60]!r} {problem}")
    return value


def check_queue_id(value: object) -> str:
    """``value`` if it can be a ``queue_id``: a non-empty string PostgreSQL can index."""
    return check_key_text("queue_id", value)


#: The longest ``wait_if_full``, in seconds: the waiting enqueue keeps the caller's
#: transaction open, and every other enqueue of the task waits behind it.
MAX_WAIT_IF_FULL = 3600.0


def check_wait_if_full(value: object) -> float:
    """Seconds (a number or a timedelta) an enqueue may wait for room in a bounded task:
    finite, ``>= 0``, at most :data:`MAX_WAIT_IF_FULL`."""
    return check_seconds("wait_if_full", value, maximum=MAX_WAIT_IF_FULL, timedelta=True)


#: What ``on_duplicate`` may be: return the holder's id, raise, or replace its arguments.
ON_DUPLICATE = ("ignore", "raise", "replace")
#: The named scopes of a unique key (a duration means "finished, then held that long").
UNIQUE_SCOPES = ("queued", "active")


def check_unique_scope(value: object) -> str | float:
    """``"queued"``, ``"active"``, or seconds (from a number or timedelta) held after finishing."""
    if isinstance(value, str):
        if value not in UNIQUE_SCOPES:
            raise ValueError(
                f"unique_scope must be 'queued', 'active' or a duration held after the job "
                f"finished (seconds or a timedelta), got {value!r}"
            )
        return value
    return check_delay("unique_scope", value)


def check_on_duplicate(value: object) -> str:
    """``value`` if it is one of :data:`ON_DUPLICATE`."""
    if value not in ON_DUPLICATE:
        raise ValueError(f"on_duplicate must be one of {', '.join(ON_DUPLICATE)}; got {value!r}")
    return str(value)


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
    #: A key that at most one job of the task holds at a time (see ``unique_scope``). A
    #: non-empty string of at most :data:`MAX_QUEUE_ID` characters.
    unique_key: str | None
    #: How long a job holds its ``unique_key``: ``"queued"`` (until it starts),
    #: ``"active"`` (until it finishes; the default), or a duration (seconds or a
    #: timedelta) that it keeps holding the key after it finished.
    unique_scope: str | float | dt.timedelta | None
    #: What an enqueue does when the key is held: ``"ignore"`` returns the holder's id (the
    #: default), ``"raise"`` raises :class:`~sqla_queue.DuplicateJobError`, ``"replace"``
    #: gives a still-queued holder this call's arguments and due time (and returns its id).
    on_duplicate: str | None
    #: The application row this job is about: a persistent mapped instance, or a
    #: ``(mapped class, primary key)`` pair. See :mod:`sqla_queue.links`.
    about: object | None
    #: For a task with ``max_pending``: how long an enqueue that finds the task full
    #: waits for room (seconds or a timedelta, at most :data:`MAX_WAIT_IF_FULL`) before
    #: it raises :class:`~sqla_queue.QueueFull`. Not given (or 0): it raises at once.
    #: Ignored for a task without a bound, which is never full.
    wait_if_full: float | dt.timedelta | None


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
    unique_key: str | None = None
    #: ``"queued"``, ``"active"``, or seconds the key stays held after the job finished.
    unique_scope: str | float | None = None
    on_duplicate: str | None = None
    #: ``(table, key)``: the row this job is about (see :mod:`sqla_queue.links`).
    about: AboutRef | None = None
    #: Seconds to wait for room in a bounded task before raising ``QueueFull``.
    wait_if_full: float | None = None

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
        if self.unique_key is not None:
            check_key_text("unique_key", self.unique_key)
        if self.unique_scope is not None:
            object.__setattr__(self, "unique_scope", check_unique_scope(self.unique_scope))
        if self.on_duplicate is not None:
            check_on_duplicate(self.on_duplicate)
        if self.about is not None:
            object.__setattr__(self, "about", about_reference(self.about))
        if self.wait_if_full is not None:
            object.__setattr__(self, "wait_if_full", check_wait_if_full(self.wait_if_full))

    @property
    def is_unique(self) -> bool:
        """Whether the job takes a unique key."""
        return self.unique_key is not None

    def check_combination(self) -> None:
        """Refuse ``unique_scope`` or ``on_duplicate`` without a ``unique_key`` to apply to."""
        if self.unique_key is None and (
            self.unique_scope is not None or self.on_duplicate is not None
        ):
            raise ValueError("unique_scope and on_duplicate need a unique_key")

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
    #: The queue's enqueuer, when the spec comes from a task's :meth:`~sqla_queue.Task.call`:
    #: a workflow of such specs knows its queue without being told.
    origin: Any = field(default=None, compare=False, repr=False)
