"""Rate-limited tasks: each claimed on its own, timed by what its window allows."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqla_queue.conversation import Flow, Step
from sqla_queue.worker.decider.pacing import poll_wait

__all__ = ["RateSchedule", "RatedClaim", "stored_rate"]

log = logging.getLogger("sqla_queue.worker")


def stored_rate(row: Any) -> tuple[Any, Any]:
    """A control row's stored limit, ``(rate_max, rate_seconds)``."""
    return getattr(row, "rate_max", None), getattr(row, "rate_seconds", None)


class RatedClaim:
    """The statements of one rated claim, sent only once the task's control row is locked.

    The unit locks the row with ``SKIP LOCKED``; :meth:`follow` reads that statement's
    rows. No row: another transaction holds it (another worker's claim, or an application
    changing the task's controls, for as long as it likes), and the task is claimed at its
    next poll instead of waited for. Otherwise the claim is sent, then ``backlog`` (a burst
    run's probe), if given.
    """

    def __init__(self, claim: Step, backlog: Step | None) -> None:
        self._claim = claim
        self._backlog = backlog
        self._found: list[Sequence[Any]] = []

    def follow(self, results: Sequence[Sequence[Any]]) -> Flow[None] | None:
        """The rest of the unit, given the lock statement's rows: the claim, or nothing."""
        return self._send() if results and results[0] else None

    def _send(self) -> Flow[None]:
        self._found.append((yield self._claim))
        if self._backlog is not None:
            self._found.append((yield self._backlog))

    @property
    def rows(self) -> Sequence[Any] | None:
        """The claim's rows; ``None`` if it was not sent (the row was held)."""
        return self._found[0] if self._found else None

    @property
    def due_left(self) -> bool | None:
        """Whether due jobs were left behind a full window (burst runs only)."""
        backlog = self._found[1] if len(self._found) > 1 else None
        return bool(backlog[0].due) if backlog else None


class RateSchedule:
    """When each rate-limited task is claimed next.

    A rated task is claimed alone, under its control row's lock (see
    ``claim_statement(rated=True)``). Its next claim is due when it was polled and its window
    is not full; all times are on the monotonic clock of ``next_action``, and ``clock`` is
    the wall clock the claim's rows are read against.
    """

    def __init__(
        self, poll_interval: float, clock: Callable[[], dt.datetime], *, burst: bool
    ) -> None:
        self._poll_interval = poll_interval
        self._clock = clock
        self._burst = burst
        #: The rate-limited tasks, as the last maintenance read them.
        self.tasks: set[str] = set()
        # Per rated task: when to claim it next, and until when its window is full.
        self._poll: dict[str, float] = {}
        self._full_until: dict[str, float] = {}
        # Rated tasks whose last claim found nothing due (a burst run may stop on them).
        self._empty: set[str] = set()
        # Per rated task, its stored limit (rate_max, rate_seconds) as last read: a change
        # ends the wait on a window that the old limit filled.
        self._limits: dict[str, tuple[Any, Any]] = {}

    def times(self) -> list[float]:
        """When each rated task may be claimed next: polled, and its window not full."""
        return [
            max(self._poll.get(task, 0.0), self._full_until.get(task, 0.0))
            for task in sorted(self.tasks)
        ]

    def due(self, now: float) -> str | None:
        """The rated task to claim now, if any: the one waiting longest."""
        due = [
            (at, task)
            for at, task in zip(self.times(), sorted(self.tasks), strict=True)
            if at <= now
        ]
        return min(due)[1] if due else None

    def idle(self) -> bool:
        """Every rated task's last claim found nothing due."""
        return self.tasks <= self._empty

    def poll_all(self) -> None:
        """Claim every rated task as soon as its window lets a start through."""
        # A copy: the run loop's maintenance may add or drop rated tasks meanwhile (this
        # may run on the listener's thread).
        for task in list(self._poll):
            self._poll[task] = 0.0

    def reopen(self) -> None:
        """Work may have become claimable: an empty claim no longer says anything, and
        each rated task is polled again (a full window still waits, see :meth:`times`)."""
        self._empty.clear()
        self.poll_all()

    def clear_empty(self) -> None:
        """Forget which rated tasks' claims found nothing."""
        self._empty.clear()

    def claiming(self, task: str, now: float) -> None:
        """A claim of ``task`` is on its way: not due again until it answers (a failed
        unit retries it after the error backoff, like the plain claim)."""
        self._poll[task] = now + self._poll_interval

    def update(self, rated: set[str], limits: dict[str, tuple[Any, Any]]) -> None:
        """The control rows were read: ``rated`` are the rate-limited tasks now, with their
        stored ``limits``; forget the state of the others."""
        self.tasks = rated
        for gone in set(self._poll) - rated:
            self._poll.pop(gone, None)
            self._full_until.pop(gone, None)
            self._empty.discard(gone)
            self._limits.pop(gone, None)
        for task in rated:
            self._poll.setdefault(task, 0.0)
        self._limits_changed(limits)

    def _limits_changed(self, limits: dict[str, tuple[Any, Any]]) -> None:
        """Claim a rated task whose stored limit changed at once, even if the old limit
        filled its window: the claim reads the window again under the new limit."""
        for task, limit in limits.items():
            before = self._limits.get(task)
            self._limits[task] = limit
            if before is not None and before != limit:
                log.info("task %s has a new rate limit: claiming it under that", task)
                self._full_until.pop(task, None)
                self._poll[task] = 0.0

    def claimed(
        self,
        task: str,
        rows: Sequence[Any],
        claimed: int,
        size: int,
        next_due: dt.datetime | None,
        now: float,
        due_left: bool | None = None,
    ) -> None:
        """Time the next claim of a rated task from what its claim saw of the window.

        A full window is waited for while due jobs are left behind it. A burst run
        (``due_left`` known) does not wait for a window that holds back nothing: like a
        job not yet due, a job that may come later is a later run's.
        """
        first = rows[0] if rows else None
        allowance = getattr(first, "rate_allowance", None)
        free_at = getattr(first, "rate_free_at", None)
        self._full_until.pop(task, None)
        full = free_at is not None and allowance is not None and claimed >= allowance
        if due_left is False:
            full = False
        if (claimed == 0 and not full) or due_left is False:
            self._empty.add(task)
        else:
            self._empty.discard(task)
        if full and free_at is not None:
            # The window is full: nothing starts before its oldest start leaves it.
            wait = max(0.0, (free_at - self._clock()).total_seconds())
            self._full_until[task] = now + wait
            self._poll[task] = now
        elif claimed >= size or (self._burst and claimed > 0):
            self._poll[task] = now
        else:
            self._poll[task] = now + poll_wait(self._poll_interval, next_due, self._clock)
