"""The due times a job may have, and the checks of every due time and delay it is given.

PostgreSQL stores a ``timestamptz`` up to the year 294,276, but Python's ``datetime`` stops
at the end of the year 9999, and a worker reads a due time back in the database session's
``TimeZone``: a due time near ``datetime.max`` in UTC is already in the year 10,000 east of
UTC. Such a job can be written but not read, and was once enough to stop every worker. So
a due time must lie from :data:`EARLIEST_DUE` to before :data:`LATEST_DUE`: a year inside
Python's range at each end, which keeps the value loadable even at the session offsets of
up to 167:59 hours that PostgreSQL accepts.

Enqueue checks ``run_at`` and ``delay`` against these bounds; the worker checks every due
time a handler asks for (``Retry``, ``Reschedule``, the retry policy's delay) before it
writes an outcome. Nothing here does I/O.
"""

from __future__ import annotations

import datetime as dt
import math

from sqla_queue.checks import check_seconds, described

__all__ = [
    "EARLIEST_DUE",
    "LATEST_DUE",
    "MAX_DELAY",
    "MAX_LOST_INTERVAL",
    "check_delay",
    "check_due",
    "check_due_time",
]

#: Due times must be earlier than this: a year before Python's ``datetime.max``, in UTC.
LATEST_DUE = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
#: Due times must be this or later: a year after Python's ``datetime.min``, in UTC.
EARLIEST_DUE = dt.datetime(2, 1, 1, tzinfo=dt.UTC)
#: The longest lost interval (a task's lease), in seconds: a year. The reclaimer subtracts
#: it from the database clock, which a much larger value would take out of PostgreSQL's
#: range.
MAX_LOST_INTERVAL = 365 * 86_400.0
#: The longest delay: 1,000 years. Counted from now, it keeps a due time before
#: :data:`LATEST_DUE` for the next six thousand years.
MAX_DELAY = dt.timedelta(days=365_250)


def check_delay(option: str, value: object) -> float:
    """A delay (seconds or a ``timedelta``) as seconds: finite, ``>= 0``, at most
    :data:`MAX_DELAY`."""
    return check_seconds(option, value, maximum=MAX_DELAY.total_seconds(), timedelta=True)


def check_due_time(option: str, value: object) -> dt.datetime:
    """``value`` if it is an aware ``datetime`` from :data:`EARLIEST_DUE` to before
    :data:`LATEST_DUE`.

    ``TypeError`` for anything but a ``datetime``; ``ValueError`` for a naive one (the
    database would read it in its session's time zone, rarely what the caller meant) or
    one out of range, which a worker could not load in every time zone.
    """
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{option} must be a timezone-aware datetime, got {described(value)}")
    if value.utcoffset() is None:
        raise ValueError(
            f"{option} must be timezone-aware (for example datetime.now(UTC)), got {value!r}"
        )
    # Aware comparisons work on the UTC instants without building a datetime, so they
    # cannot overflow even for datetime.max in a zone west of UTC.
    if not EARLIEST_DUE <= value < LATEST_DUE:
        raise ValueError(
            f"{option} must be from {EARLIEST_DUE.isoformat()} to before "
            f"{LATEST_DUE.isoformat()}, so that every time zone can load it as a Python "
            f"datetime; got {value.isoformat()}, outside the due times a job may have"
        )
    return value


def check_due(*, at: dt.datetime | None, delay: float | None, now: dt.datetime, what: str) -> None:
    """Raise ``ValueError`` unless the next run, at ``at`` or ``delay`` seconds after ``now``,
    falls before :data:`LATEST_DUE` (and ``at`` on or after :data:`EARLIEST_DUE`).

    ``now`` is the worker's clock; the database measures a delay on its own, and the year
    of margin in the bounds covers any sane difference between the two.
    """
    if at is not None:
        check_due_time(what, at)
    if delay is None:
        return
    seconds = check_seconds(what, delay, maximum=math.inf, timedelta=True)
    room = (LATEST_DUE - now).total_seconds()
    if seconds >= room:
        years = seconds / (365.25 * 86_400)
        raise ValueError(
            f"{what}: a delay of {seconds:g} s (about {years:,.0f} years) would put the "
            f"next run after {LATEST_DUE.isoformat()}, the latest due time a job may have "
            "(what both PostgreSQL and Python can hold in every time zone)"
        )
