"""The worker's scheduler: enqueues the ticks of the queue's periodic schedules.

Every worker runs one (except a burst run); the database lets exactly one of them enqueue
each tick. A pass reads the database clock and each schedule's ``last_tick``, plans the
ticks with :func:`sqla_queue.periodic.plan_ticks`, and for a schedule with something to
do opens a transaction that first advances ``last_tick`` by compare-and-set
(:func:`~sqla_queue.statements.periodic.advance_schedule_statement`) and, only when that
update returned the row, enqueues the ticks' jobs. Both commit together or not at all: a
worker killed in between leaves the row as it was, and the next pass (of any worker)
enqueues those ticks.

Ticks are enqueued ahead of time, as jobs due at their tick, as soon as they are within
the horizon (two maintenance intervals) of the database clock. The job then becomes due
exactly at its tick, however late in its interval the scheduler woke.

The scheduler runs in a thread of its own and uses the service engine (a synchronous one,
for both worker faces), one connection at a time. A database error is logged and the pass
retried with backoff; nothing it raises ends the worker.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from sqla_queue.periodic import Schedule, TickPlan, latest_tick, next_tick, plan_ticks
from sqla_queue.statements.periodic import (
    AdvanceScheduleParams,
    CreateScheduleParams,
    ReadSchedulesParams,
    advance_schedule_statement,
    create_schedule_statement,
    database_now_statement,
    read_schedules_statement,
)
from sqla_queue.worker.services import ServiceEnv
from sqla_queue.worker.threads import WorkerThread, backoff

__all__ = ["HORIZON_INTERVALS", "Scheduler"]

log = logging.getLogger("sqla_queue.scheduler")

#: How far ahead of the database clock ticks are enqueued, in maintenance intervals. Also
#: the grace after which a tick that no worker enqueued counts as missed.
HORIZON_INTERVALS = 2.0
# The shortest sleep between passes, and the longest backoff after database errors.
_MIN_WAIT = 0.05
_MAX_BACKOFF = 60.0


def _transient(exc: BaseException) -> bool:
    """Whether a failed enqueue may succeed if the whole pass is tried again.

    A lost connection, a serialization failure, a lock or statement timeout: retried with
    backoff, the tick kept. Anything else (a full bounded queue, a constraint, an argument
    the task cannot take) would fail again the same way: the tick is dropped and logged.
    """
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError)


class Scheduler(WorkerThread):
    """A worker service (a :class:`~sqla_queue.worker.threads.WorkerThread`) that enqueues
    periodic ticks.

    ``run_pass()`` does one pass and returns the seconds until the next one; the thread
    started by ``start()`` loops over it until ``request_stop()`` or the worker's stop
    flag.
    """

    thread_name = "sqla-queue-scheduler"
    # A wait between passes can last minutes: the worker's stop flag ends it this soon.
    flag_poll = 0.25

    def __init__(
        self, env: ServiceEnv, schedules: Sequence[Schedule], *, rng: random.Random | None = None
    ) -> None:
        self.env = env
        self.schedules: dict[str, Schedule] = {}
        for schedule in schedules:
            if schedule.handle is None:
                log.error(
                    "schedule %r has no task handle (register it with queue.periodic or "
                    "queue.schedule); it is not run",
                    schedule.name,
                )
                continue
            self.schedules[schedule.name] = schedule
        self.interval = env.maintenance_interval
        #: Seconds ahead of the database clock that ticks are enqueued.
        self.horizon = HORIZON_INTERVALS * self.interval
        #: Seconds after its time that a tick not enqueued yet counts as missed.
        self.grace = self.horizon
        self._rng = rng or random.Random()
        self._failures_in_row = 0
        super().__init__(stop_flag=env.stop_flag)
        tables = env.tables
        self._now = database_now_statement()
        self._read = read_schedules_statement(tables)
        self._create = create_schedule_statement(tables)
        self._advance = advance_schedule_statement(tables)
        #: Ticks this scheduler enqueued, and ticks it dropped (missed, or failed to enqueue).
        self.enqueued = 0
        self.dropped = 0

    # -- the loop -----------------------------------------------------------------------

    def _wanted(self) -> bool:
        return bool(self.schedules)

    def _run(self) -> None:
        """Run passes until :meth:`request_stop` or the worker's stop flag; a pass under
        way finishes first (its transaction commits or rolls back whole)."""
        self.repeat(self._step)

    def _step(self) -> float:
        """One pass; the seconds until the next (longer after failures in a row)."""
        try:
            wait = self.run_pass()
        except Exception as exc:
            self._failures_in_row += 1
            wait = backoff(max(self.interval, 1.0), self._failures_in_row - 1, cap=_MAX_BACKOFF)
            log.warning(
                "periodic scheduler: pass failed (%s: %s); retrying in %.1f s",
                type(exc).__name__,
                exc,
                wait,
                exc_info=self._failures_in_row == 1,
            )
        else:
            self._failures_in_row = 0
        return wait

    def run_pass(self) -> float:
        """One pass over every schedule; the seconds until the next pass is due.

        Raises what the database raises (the loop logs it and backs off). Each schedule's
        ticks are written in a transaction of their own, so one schedule's failure never
        undoes another's.
        """
        if not self.schedules:
            return self.interval
        now, rows = self._read_rows()
        missing = [name for name in self.schedules if name not in rows]
        if missing:
            self._create_rows(missing, now)
            now, rows = self._read_rows()
        wait = self.interval
        for name, schedule in self.schedules.items():
            row = rows.get(name)
            if row is None:
                continue
            seen = row
            plan = plan_ticks(schedule, seen, now, horizon=self.horizon, grace=self.grace)
            if plan.last_tick > seen:
                self._fire(schedule, seen, plan)
            upcoming = next_tick(schedule, plan.last_tick)
            if upcoming is not None:
                enters = (upcoming - now).total_seconds() - self.horizon
                wait = min(wait, max(enters, _MIN_WAIT))
        # A little jitter keeps the workers' passes from falling into step.
        return max(_MIN_WAIT, wait * self._rng.uniform(0.8, 1.0))

    def _read_rows(self) -> tuple[dt.datetime, dict[str, dt.datetime]]:
        params: ReadSchedulesParams = {"names": list(self.schedules)}
        with Session(self.env.engine) as session:
            now = session.execute(self._now).scalar_one()
            rows = {name: last for name, _task, last in session.execute(self._read, params)}
            session.rollback()
        return now, rows

    def _create_rows(self, names: list[str], now: dt.datetime) -> None:
        """Store the rows of new schedules: each fires first at its next tick after now."""
        params: list[CreateScheduleParams] = []
        for name in names:
            schedule = self.schedules[name]
            params.append(
                {
                    "name": name,
                    "task": schedule.task,
                    "last_tick": latest_tick(schedule, now) or now,
                }
            )
        with Session(self.env.engine) as session, session.begin():
            session.execute(self._create, params)

    def _fire(self, schedule: Schedule, seen: dt.datetime, plan: TickPlan) -> bool:
        """Advance the row from ``seen`` and enqueue ``plan``'s ticks, in one transaction.

        Returns False when another worker advanced the row first (nothing is enqueued).
        """
        params: AdvanceScheduleParams = {
            "schedule": schedule.name,
            "task_name": schedule.task,
            "seen": seen,
            "new_tick": plan.last_tick,
        }
        dropped = 0
        with Session(self.env.engine) as session, session.begin():
            if session.execute(self._advance, params).first() is None:
                return False
            for tick in plan.enqueue:
                if not self._enqueue_tick(session, schedule, tick):
                    dropped += 1
        self.enqueued += len(plan.enqueue) - dropped
        self.dropped += plan.skipped + dropped
        if plan.skipped:
            log.warning(
                "schedule %r: %d missed tick(s) dropped (catch_up=%r); last_tick now %s",
                schedule.name,
                plan.skipped,
                schedule.catch_up,
                plan.last_tick.isoformat(),
            )
        return True

    def _enqueue_tick(self, session: Session, schedule: Schedule, tick: dt.datetime) -> bool:
        """Enqueue one tick's job, due at ``tick``, in a savepoint; False if it was dropped."""
        handle: Any = schedule.handle
        try:
            with session.begin_nested():
                handle.options(run_at=tick).enqueue(
                    session, *schedule.args, **dict(schedule.kwargs)
                )
        except Exception as exc:
            if _transient(exc):
                raise
            # Retrying could never succeed (a full bounded queue, bad arguments): the tick
            # is moved past, so the schedule goes on with its next one.
            log.error(
                "schedule %r: the job of tick %s was not enqueued and is dropped (%s: %s)",
                schedule.name,
                tick.isoformat(),
                type(exc).__name__,
                exc,
            )
            return False
        return True
