"""What one enqueue call asks for: its per-call options and the job it describes.

Tasks build these (``task.options(...)``, ``task.call(...)``), the queue accepts them
(``queue.enqueue(...)``, ``queue.enqueue_many(...)``) and :mod:`sqla_queue.enqueue` turns
them into rows. This module sits below all three and imports none of them.

The per-call options are spelled once, as :class:`EnqueueKwargs`, the keywords every
enqueue entry point takes (with ``Unpack``); :class:`EnqueueOptions` is their validated
form, with ``delay`` in seconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, Unpack

__all__ = [
    "OPTION_NAMES",
    "EnqueueKwargs",
    "EnqueueOptions",
    "JobSpec",
    "check_keywords",
    "make_enqueue_options",
]


class EnqueueKwargs(TypedDict, total=False):
    """The per-call options, as keywords: ``task.options(delay=60, queue_id="a-42")``.

    Each may be left out or given as ``None`` (the task's default applies).
    """

    #: An aware datetime: the job is due then.
    run_at: dt.datetime | None
    #: Seconds (or a timedelta) counted on the database clock from the enqueueing statement.
    delay: float | dt.timedelta | None
    #: Higher runs first; the task's priority when not given.
    priority: int | None
    #: A serialization key: jobs sharing it run one at a time, in order.
    queue_id: str | None
    #: Attempts for this job; the task's ``max_attempts`` when not given.
    max_attempts: int | None


#: The keywords :func:`make_enqueue_options` accepts, in their documented order.
OPTION_NAMES = tuple(EnqueueKwargs.__annotations__)


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call options. They live apart from the task's arguments so names never collide.

    ``run_at`` is an aware datetime; ``delay`` is seconds (or a timedelta) counted on the
    database clock from the enqueueing statement. Give at most one of them.
    """

    run_at: dt.datetime | None = None
    delay: float | None = None
    priority: int | None = None
    queue_id: str | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware (for example datetime.now(UTC))")
        if self.delay is not None and self.delay < 0:
            raise ValueError("delay cannot be negative")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.queue_id is not None and (not isinstance(self.queue_id, str) or not self.queue_id):
            raise ValueError("queue_id must be a non-empty string")

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with every field that ``other`` sets taken from ``other``."""
        changes = {k: v for k, v in vars(other).items() if v is not None}
        # run_at and delay are two spellings of one setting: the newer one replaces both.
        if other.run_at is not None:
            changes["delay"] = None
        elif other.delay is not None:
            changes["run_at"] = None
        return replace(self, **changes)


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
    check_keywords("make_enqueue_options", options, OPTION_NAMES)
    values: dict[str, Any] = dict(options)
    delay = values.get("delay")
    if isinstance(delay, dt.timedelta):
        values["delay"] = delay.total_seconds()
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
