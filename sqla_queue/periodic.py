"""Periodic schedules: when each tick falls, and which ticks to enqueue after a gap.

Everything here is pure, no I/O and no clock of its own, apart from
:func:`read_schedules`, which reads the stored schedules for a listing. The worker's scheduler
(:mod:`sqla_queue.worker.scheduler`) reads the database clock and each schedule's last
tick, asks :func:`plan_ticks` what to enqueue, and lets the database decide which worker
does it (a compare-and-set on the schedule's row, see :mod:`sqla_queue.statements.periodic`).

A schedule is either a five-field cron expression evaluated in a time zone, or a fixed
interval (``every=``) whose ticks are the multiples of the interval since the Unix epoch,
in UTC. Cron expressions are evaluated by `cronsim <https://pypi.org/project/cronsim/>`_,
which follows Debian's cron across daylight-saving changes: a job whose time falls in the
hour skipped in spring runs right after the change; one whose time falls in the hour that
repeats in autumn runs once; ``*``-hour expressions (``*/15 * * * *``) tick on the real
clock through both. Every tick is returned as an aware datetime in UTC, so ticks compare
by the instant they name (two aware datetimes sharing a ``ZoneInfo`` compare by wall time,
which would make 01:30 EDT equal 01:30 EST).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sqla_queue._durations import format_duration
from sqla_queue._identifiers import validate_task_name
from sqla_queue.checks import is_whole_number
from sqla_queue.errors import InvalidIdentifierError
from sqla_queue.logic.payload import check_storable, make_payload
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.periodic import all_schedules_statement, database_now_statement

if TYPE_CHECKING:
    from sqla_queue.task import Task

__all__ = [
    "CATCH_UP_POLICIES",
    "DEFAULT_CATCH_UP_LIMIT",
    "MAX_CATCH_UP_LIMIT",
    "MAX_EVERY",
    "MIN_EVERY",
    "CatchUp",
    "Schedule",
    "ScheduleState",
    "TickPlan",
    "check_timezone",
    "latest_tick",
    "next_tick",
    "plan_ticks",
    "read_schedules",
    "ticks_between",
]

#: What happens to ticks that were missed (no worker ran while they were due):
#: ``"skip"`` drops them, ``"one"`` runs the latest of them, ``"all"`` runs each of them
#: (at most ``catch_up_limit``, the most recent ones).
CatchUp = Literal["skip", "one", "all"]
CATCH_UP_POLICIES: tuple[str, ...] = ("skip", "one", "all")
#: How many missed ticks ``catch_up="all"`` runs at most, unless the schedule says.
DEFAULT_CATCH_UP_LIMIT = 100
#: The largest ``catch_up_limit``: one catch-up enqueues at most this many jobs.
MAX_CATCH_UP_LIMIT = 10_000
#: The shortest and longest ``every=`` interval.
MIN_EVERY = dt.timedelta(seconds=1)
MAX_EVERY = dt.timedelta(days=366)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# One step of the tick grid: a whole number of microseconds, like a timedelta.
_MICRO = dt.timedelta(microseconds=1)
_CRON_FIELDS = 5


# A zone's name as the IANA database spells it: "UTC", "Europe/Riga", "Etc/GMT+5",
# "America/Argentina/Buenos_Aires". No dots, no leading slash: never a path.
_IANA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9_+\-]+)*")
# Files of a zone directory that load as zones but are none of the IANA zones: the host's
# own setting ("localtime", "posixrules" follow whatever the machine is set to, so two
# workers on two hosts would tick at different instants), a placeholder ("Factory"), and
# the "posix/" and "right/" copies of the database ("right/" counts leap seconds).
_HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})
_COPIES = ("posix/", "right/")


def check_timezone(name: object) -> ZoneInfo:
    """The zone named ``name`` if it is an IANA zone name (``"UTC"``, ``"Europe/Riga"``).

    Every worker must tick at the same instants, so a name whose meaning depends on the
    host (``"localtime"``, ``"posixrules"``, a path) is refused, as are ``"Factory"`` and
    the ``posix/`` and ``right/`` copies: ``TypeError`` for a non-string, ``ValueError``
    naming the rule otherwise (also for a name this system's zone database lacks).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"timezone must be an IANA zone name such as 'Europe/Riga', got {name!r}")
    if not _IANA_NAME.fullmatch(name) or name in _HOST_ZONES or name.startswith(_COPIES):
        raise ValueError(
            f"timezone {name!r} is not an IANA zone name: give one such as 'UTC', "
            "'Europe/Riga' or 'America/New_York' (not a path, nor a host's own zone such "
            "as 'localtime', which differs from one machine to the next)"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown timezone {name!r}: give an IANA zone name such as "
            f"'UTC', 'Europe/Riga' or 'America/New_York'"
        ) from None


def _utc(value: dt.datetime, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got {value!r}")
    return value.astimezone(dt.UTC)


@dataclass(frozen=True)
class Schedule:
    """One periodic schedule: a task to enqueue at every tick of a cron expression or interval.

    Build it with :meth:`Queue.periodic <sqla_queue.Queue.periodic>` or
    :meth:`Queue.schedule <sqla_queue.Queue.schedule>`, which also attach the task handle
    that enqueues it. Every value is checked on construction: ``TypeError`` for a wrong
    type, ``ValueError`` (or :class:`~sqla_queue.InvalidIdentifierError` for a name) for a
    bad value, each naming the option and the rule.

    Attributes:
        name: the schedule's stored name (the key of its row); task-name rules.
        task: the name of the task each tick enqueues.
        cron: a five-field cron expression (``"*/5 * * * *"``), evaluated in ``timezone``.
        every: a fixed interval instead, at least a second: ticks at the multiples of it
            since 1970-01-01 00:00 UTC (``every=timedelta(hours=1)`` ticks on the hour).
        timezone: an IANA zone name (``"Europe/Riga"``) for ``cron``; only ``"UTC"`` with
            ``every``.
        args, kwargs: the task's arguments at every tick (JSON-serializable).
        catch_up: ``"skip"``, ``"one"`` (the default) or ``"all"``; see :func:`plan_ticks`.
        catch_up_limit: with ``"all"``, at most this many missed ticks run (1 to
            :data:`MAX_CATCH_UP_LIMIT`).
        handle: the :class:`~sqla_queue.Task` whose enqueue the scheduler calls (with its
            per-call options, e.g. ``task.options(priority=5)``); not part of equality.
    """

    name: str
    task: str
    cron: str | None = None
    every: dt.timedelta | None = None
    timezone: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = "one"
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    handle: Task[Any, Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        try:
            validate_task_name(self.name)
        except InvalidIdentifierError as exc:
            raise InvalidIdentifierError(f"schedule name: {exc}") from None
        validate_task_name(self.task)
        if (self.cron is None) == (self.every is None):
            raise TypeError(
                f"schedule {self.name!r} needs exactly one of a cron expression "
                f'("*/5 * * * *") or every=timedelta(...)'
            )
        check_timezone(self.timezone)
        if self.every is not None:
            self._check_every(self.every)
        else:
            self._check_cron(self.cron)
        if isinstance(self.args, str | bytes) or not isinstance(self.args, Sequence):
            raise TypeError(
                f"args must be a list or tuple of the task's positional arguments, "
                f"got {self.args!r}"
            )
        if not isinstance(self.kwargs, Mapping):
            raise TypeError(
                f"kwargs must be a mapping of the task's keyword arguments, got {self.kwargs!r}"
            )
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))
        # Checked now, so a bad argument fails at registration, not at the first tick.
        check_storable(make_payload(self.args, self.kwargs), task=self.task)
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ValueError(
                f"catch_up must be one of {', '.join(map(repr, CATCH_UP_POLICIES))}, "
                f"got {self.catch_up!r}"
            )
        limit = self.catch_up_limit
        if not is_whole_number(limit):
            raise TypeError(f"catch_up_limit must be a whole number (int), got {limit!r}")
        if not 1 <= int(limit) <= MAX_CATCH_UP_LIMIT:
            raise ValueError(
                f"catch_up_limit must be from 1 to {MAX_CATCH_UP_LIMIT}, got {int(limit)}"
            )
        object.__setattr__(self, "catch_up_limit", int(limit))

    def _check_every(self, every: object) -> None:
        if not isinstance(every, dt.timedelta):
            raise TypeError(f"every must be a datetime.timedelta, got {every!r}")
        if not MIN_EVERY <= every <= MAX_EVERY:
            raise ValueError(
                f"every must be from {MIN_EVERY} to {MAX_EVERY.days} days, got {every}"
            )
        if self.timezone != "UTC":
            raise ValueError(
                f"every= ticks at multiples of the interval since the epoch, in UTC: a "
                f"timezone ({self.timezone!r}) only applies to a cron expression; for "
                f"'every day at 06:00 in {self.timezone}' use \"0 6 * * *\""
            )

    def _check_cron(self, cron: object) -> None:
        if not isinstance(cron, str):
            raise TypeError(f"the cron expression must be a string, got {cron!r}")
        fields = cron.split()
        if len(fields) != _CRON_FIELDS:
            raise ValueError(
                f"invalid cron expression {cron!r}: it needs 5 fields (minute hour "
                f"day-of-month month day-of-week), got {len(fields)}"
            )
        zone = self.zone
        start = dt.datetime(2000, 1, 1, tzinfo=zone)
        try:
            # cronsim looks 50 years ahead at most: an expression with no tick in that
            # span (``0 0 30 2 *``) stops at once.
            next(CronSim(cron, start))
        except CronSimError as exc:
            raise ValueError(f"invalid cron expression {cron!r}: {exc}") from None
        except StopIteration:
            raise ValueError(f"cron expression {cron!r} never fires") from None

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone (checked by :func:`check_timezone`)."""
        return check_timezone(self.timezone)

    @property
    def describe(self) -> str:
        """The schedule as a person reads it: ``*/5 * * * * (Europe/Riga)``, ``every 1 s``
        or ``every 1 h 30 min``."""
        if self.every is not None:
            return f"every {format_duration(self.every)}"
        return f"{self.cron} ({self.timezone})"


def _grid_ticks(every: dt.timedelta, after: dt.datetime) -> Iterator[dt.datetime]:
    """Multiples of ``every`` since the epoch, strictly after ``after``, in order."""
    step = every // _MICRO
    elapsed = (after - _EPOCH) // _MICRO
    index = elapsed // step + 1
    while True:
        yield _EPOCH + index * step * _MICRO
        index += 1


def _cron_ticks(schedule: Schedule, start: dt.datetime, reverse: bool) -> Iterator[dt.datetime]:
    assert schedule.cron is not None
    local = start.astimezone(schedule.zone)
    for tick in CronSim(schedule.cron, local, reverse=reverse):
        yield tick.astimezone(dt.UTC)


def _forward(schedule: Schedule, after: dt.datetime) -> Iterator[dt.datetime]:
    """The ticks strictly after ``after`` (UTC), in order; stops where cronsim gives up."""
    if schedule.every is not None:
        return _grid_ticks(schedule.every, after)
    return _cron_ticks(schedule, after, reverse=False)


def next_tick(schedule: Schedule, after: dt.datetime) -> dt.datetime | None:
    """The first tick strictly after ``after`` (an aware datetime), in UTC.

    ``None`` when a cron expression has no tick in the 50 years after it.
    """
    return next(_forward(schedule, _utc(after, "after")), None)


def latest_tick(schedule: Schedule, at: dt.datetime) -> dt.datetime | None:
    """The last tick at or before ``at``, in UTC; ``None`` when there is none in 50 years.

    A new schedule's row starts here, so that it first fires at its next tick, never for
    the past.
    """
    at = _utc(at, "at")
    if schedule.every is not None:
        step = schedule.every // _MICRO
        return _EPOCH + ((at - _EPOCH) // _MICRO // step) * step * _MICRO
    found = next(_cron_ticks(schedule, at, reverse=True), None)
    # cronsim's reverse iteration is strictly before its start (and some releases drop
    # the start's sub-seconds first): step forward while the next tick is still due.
    while found is not None:
        later = next(_cron_ticks(schedule, found, reverse=False), None)
        if later is None or later > at:
            break
        found = later
    return found


def ticks_between(
    schedule: Schedule, after: dt.datetime, until: dt.datetime, *, limit: int | None = None
) -> list[dt.datetime]:
    """The ticks in ``(after, until]``, in order, in UTC; at most ``limit`` (the first ones)."""
    after, until = _utc(after, "after"), _utc(until, "until")
    found: list[dt.datetime] = []
    if until <= after:
        return found
    for tick in _forward(schedule, after):
        if tick > until or (limit is not None and len(found) >= limit):
            break
        found.append(tick)
    return found


def _latest_ticks(
    schedule: Schedule, after: dt.datetime, until: dt.datetime, count: int
) -> list[dt.datetime]:
    """The last ``count`` ticks in ``(after, until]``, in order: found backwards from
    ``until``, so a long gap costs ``count`` steps, not one per tick it spans."""
    if count <= 0 or until <= after:
        return []
    newest = latest_tick(schedule, until)
    found: list[dt.datetime] = []
    if newest is None or newest <= after:
        return found
    found.append(newest)
    if schedule.every is not None:
        while len(found) < count:
            earlier = found[-1] - schedule.every
            if earlier <= after:
                break
            found.append(earlier)
    else:
        for tick in _cron_ticks(schedule, newest, reverse=True):
            if tick <= after or len(found) >= count:
                break
            found.append(tick)
    found.reverse()
    return found


@dataclass(frozen=True)
class TickPlan:
    """What one scheduler pass does for one schedule (see :func:`plan_ticks`)."""

    #: The ticks to enqueue, oldest first: each becomes a job due at the tick.
    enqueue: tuple[dt.datetime, ...]
    #: Missed ticks that the catch-up policy drops (not enqueued).
    skipped: int
    #: The schedule row's new ``last_tick``; equal to ``last_tick`` when nothing changes.
    last_tick: dt.datetime


#: At most this many upcoming ticks per pass: a one-second schedule with a long horizon
#: still writes a bounded transaction (the next pass goes on from the last one).
MAX_TICKS_PER_PASS = 1_000


def plan_ticks(
    schedule: Schedule,
    last_tick: dt.datetime,
    now: dt.datetime,
    *,
    horizon: float,
    grace: float,
) -> TickPlan:
    """Which ticks to enqueue now, given the last tick enqueued and the database clock.

    A tick ``t`` after ``last_tick`` is **on time** when ``now - grace < t <= now +
    horizon``: it is enqueued now, as a job due at ``t`` (ahead of time, so the job becomes
    due exactly at its tick whenever the scheduler woke). It is **missed** when ``t <= now
    - grace``: no worker enqueued it while it was due. Missed ticks follow
    ``schedule.catch_up``:

    - ``"skip"``: none of them is enqueued;
    - ``"one"``: only the latest of them is enqueued (it runs at once);
    - ``"all"``: each of them is, but at most ``catch_up_limit`` (the most recent ones).

    Missed ticks are found backwards from the cutoff, so a long outage costs at most
    ``catch_up_limit`` steps. The new ``last_tick`` is the latest tick enqueued or passed
    over; ticks after it are left for the next pass.
    """
    last_tick, now = _utc(last_tick, "last_tick"), _utc(now, "now")
    if not (math.isfinite(horizon) and horizon >= 0 and math.isfinite(grace) and grace >= 0):
        raise ValueError(f"horizon and grace must be seconds >= 0, got {horizon}, {grace}")
    cutoff = now - dt.timedelta(seconds=grace)
    kept: list[dt.datetime] = []
    skipped = 0
    newest_missed = latest_tick(schedule, cutoff) if last_tick < cutoff else None
    if newest_missed is not None and newest_missed > last_tick:
        wanted = {"skip": 0, "one": 1, "all": schedule.catch_up_limit}[schedule.catch_up]
        kept = _latest_ticks(schedule, last_tick, cutoff, wanted)
        skipped = _count_ticks(schedule, last_tick, cutoff) - len(kept)
    else:
        newest_missed = None
    upcoming = ticks_between(
        schedule,
        max(last_tick, cutoff),
        now + dt.timedelta(seconds=horizon),
        limit=MAX_TICKS_PER_PASS,
    )
    enqueue = tuple(kept + upcoming)
    new_last = max([last_tick, *enqueue, *([newest_missed] if newest_missed else [])])
    return TickPlan(enqueue=enqueue, skipped=max(skipped, 0), last_tick=new_last)


#: A cron schedule's dropped ticks are counted up to this many (for the log only).
_COUNT_CAP = 10_000


def _count_ticks(schedule: Schedule, after: dt.datetime, until: dt.datetime) -> int:
    """How many ticks fall in ``(after, until]``: exact for an interval; for a cron
    expression, up to :data:`_COUNT_CAP` (it only tells the log how many were dropped)."""
    if schedule.every is not None:
        step = schedule.every // _MICRO
        first = (after - _EPOCH) // _MICRO // step
        last = (until - _EPOCH) // _MICRO // step
        return int(last - first)
    return len(ticks_between(schedule, after, until, limit=_COUNT_CAP))


@dataclass(frozen=True)
class ScheduleState:
    """A schedule as the database knows it: for listings (``sqla-queue periodic``)."""

    name: str
    task: str
    #: ``*/5 * * * * (UTC)`` or ``every 30 s``.
    schedule: str
    catch_up: str
    #: The latest tick enqueued (or passed over); None before any worker stored the row.
    last_tick: dt.datetime | None
    #: The next tick not enqueued yet; None when a cron expression has none in 50 years.
    next_tick: dt.datetime | None
    #: False for a row stored by a schedule that this code no longer registers.
    registered: bool = True

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict, times in ISO 8601."""
        return {
            "name": self.name,
            "task": self.task,
            "schedule": self.schedule,
            "catch_up": self.catch_up,
            "last_tick": self.last_tick.isoformat() if self.last_tick else None,
            "next_tick": self.next_tick.isoformat() if self.next_tick else None,
            "registered": self.registered,
        }


def read_schedules(
    session: Session | Connection, tables: QueueTables, schedules: Mapping[str, Schedule]
) -> list[ScheduleState]:
    """Every schedule with its last tick (from the database) and its next one, by name.

    The registered ``schedules`` come first; a row stored by a schedule this code no
    longer registers follows, with ``registered=False`` (its row stays until deleted
    by hand; a schedule registered again under its name goes on from its last tick).
    A schedule no worker has run yet has ``last_tick=None`` and its next tick after now.
    Reads on ``session``'s transaction; writes nothing.
    """
    now = session.execute(database_now_statement()).scalar_one()
    stored = {
        row_name: (row_task, last)
        for row_name, row_task, last in session.execute(all_schedules_statement(tables))
    }
    states: list[ScheduleState] = []
    for schedule_name in sorted(schedules):
        entry = schedules[schedule_name]
        last = stored[schedule_name][1] if schedule_name in stored else None
        states.append(
            ScheduleState(
                name=schedule_name,
                task=entry.task,
                schedule=entry.describe,
                catch_up=entry.catch_up,
                last_tick=last,
                next_tick=next_tick(entry, last if last is not None else now),
            )
        )
    for row_name, (row_task, last) in stored.items():
        if row_name not in schedules:
            states.append(
                ScheduleState(
                    name=row_name,
                    task=row_task,
                    schedule="-",
                    catch_up="-",
                    last_tick=last,
                    next_tick=None,
                    registered=False,
                )
            )
    return states
