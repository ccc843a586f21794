"""The maintenance reads: reclaim, stored limits, controls, cleanup and the key sweep."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqla_queue.conversation import Flow
from sqla_queue.durable.compensate import compensations_flow
from sqla_queue.instrumentation import WorkerObserver, notify_lost
from sqla_queue.statements.controls import ControlledTasksParams
from sqla_queue.statements.keys import CleanupParams, SweepParams
from sqla_queue.statements.limits import LimitedTasksParams
from sqla_queue.statements.liveness import ReclaimParams
from sqla_queue.statements.signals import WakeDueParams
from sqla_queue.worker.actions import Step, Work, atomic_unit
from sqla_queue.worker.decider.keys import KeyPromotion
from sqla_queue.worker.decider.pacing import ClaimPacer
from sqla_queue.worker.decider.prebuilt import WorkerStatements
from sqla_queue.worker.decider.rates import RateSchedule, stored_rate
from sqla_queue.worker.plan import WorkerPlan

__all__ = ["CLEANUP_BATCH", "SWEEP_KEYS", "WAKE_BATCH", "Maintenance", "Reader"]

log = logging.getLogger("sqla_queue.worker")

#: Waiting keys visited per sweep, and parked executions deleted per sweep: bounds on the
#: work of one maintenance action, whatever the backlog.
SWEEP_KEYS = 100
CLEANUP_BATCH = 100
#: Suspended executions woken per maintenance, at most (the rest in the next one, at once).
WAKE_BATCH = 1000

#: Takes the rows of one maintenance statement.
Reader = Callable[[Sequence[Any]], None]


class Maintenance:
    """The statements of a :class:`~sqla_queue.worker.actions.Maintain` action, when it is
    due, and what their rows change in the claims.

    Called from the run loop only.
    """

    def __init__(
        self,
        statements: WorkerStatements,
        plan: WorkerPlan,
        observers: Sequence[WorkerObserver],
        interval: float,
        *,
        pacer: ClaimPacer,
        rates: RateSchedule,
        keys: KeyPromotion,
        worker_id: uuid.UUID | None = None,
    ) -> None:
        self._statements = statements
        # The worker's id: its own rows that it does not hold are swept by their clock.
        self._worker = worker_id
        self._plan = plan
        self._observers = observers
        self._interval = interval
        self._pacer = pacer
        self._rates = rates
        self._keys = keys
        #: When the next maintenance is due (on the monotonic clock of ``next_action``).
        self.next_at = 0.0
        #: Tasks an operator paused (not claimed), as the last maintenance read them.
        self.paused: set[str] = set()
        # Where the next sweep of the waiting keys resumes.
        self._sweep_after = ""

    def due(self, now: float) -> bool:
        """Whether maintenance runs at ``now``; if so, the next one is an interval away."""
        if now >= self.next_at:
            self.next_at = now + self._interval
            return True
        return False

    def steps(self, held: list[int]) -> list[tuple[Step, Reader]]:
        """The statements, in order, each with its reader; ``held`` are the executions this
        process holds, which are never reclaimed, even if their heartbeat is late."""
        built, plan = self._statements, self._plan
        return [
            (
                Step(built.reclaim, ReclaimParams(held=held, worker=self._worker)),
                self.reclaimed,
            ),
            (
                Step(built.limits, LimitedTasksParams(tasks=plan.task_names)),
                self._pacer.limits_read,
            ),
            (
                Step(built.controls, ControlledTasksParams(tasks=plan.task_names)),
                self.controls_read,
            ),
            (Step(built.cleanup, CleanupParams(limit=CLEANUP_BATCH)), self.cleaned_up),
            (
                Step(built.orphan_sweep, SweepParams(after=self._sweep_after, limit=SWEEP_KEYS)),
                self.swept,
            ),
            (Step(built.durable.wake_due, WakeDueParams(limit=WAKE_BATCH)), self.woke),
        ]

    def unit(
        self,
        guard: Any,
        held: list[int],
        keys: KeyPromotion,
        now: float,
        after_reclaim: Callable[[Sequence[Sequence[Any]]], Flow[Any] | None],
    ) -> Work:
        """The maintenance transaction: :meth:`steps`, then the keys' sweep; the reclaim
        comes first, and ``after_reclaim`` runs on the rows (the reclaim's first) before
        the commit."""
        steps = self.steps(held)
        taken, key_steps = keys.take_steps()

        def maintained(results: list[Sequence[Any]]) -> list[Any]:
            for (_, done), rows in zip(steps, results[: len(steps)], strict=True):
                done(rows)
            keys.cleared(results[len(steps) :], now)
            return []

        built = self._statements

        def after(results: Sequence[Sequence[Any]]) -> Flow[Any]:
            # The reclaim's follow-up, then the compensations of failed and cancelled
            # durable jobs, in the same transaction.
            first = after_reclaim(results)
            if first is not None:
                yield from first
            enqueued = yield from compensations_flow(built.durable, built.enqueue_keyed)
            if enqueued:
                log.info("enqueued %d compensation(s) of failed or cancelled jobs", len(enqueued))
                self._pacer.next_poll = 0.0

        return atomic_unit(
            guard,
            [*(step for step, _ in steps), *key_steps],
            maintained,
            lambda: keys.restore(taken),
            after,
        )

    def reclaimed(self, rows: Sequence[Any]) -> None:
        """Log what a reclaim sweep returned to the queue (its workflow nodes that it
        cancelled are the workflows part's, see :meth:`WorkflowNodes.after_reclaim`)."""
        rows = [r for r in rows if not r.ended_node]
        notify_lost(self._observers, [r.task for r in rows])
        if rows:
            log.warning(
                "reclaimed %d lost execution(s) of dead workers: %s",
                len(rows),
                [(r.id, r.task) for r in rows],
            )
            self._pacer.next_poll = 0.0

    def controls_read(self, rows: Sequence[Any]) -> None:
        """Pauses and rate limits were read: a paused task is no longer claimed (its running
        jobs finish), a rate-limited one is claimed on its own; the rest are unaffected."""
        paused = {row.task for row in rows if row.paused}
        rated = {row.task for row in rows if row.rated and not row.paused}
        for task in sorted(paused - self.paused):
            log.info("task %s is paused: not claiming it", task)
        for task in sorted(self.paused - paused):
            log.info("task %s was resumed", task)
        for task in sorted(rated - self._rates.tasks):
            log.info("task %s has a rate limit: claiming it within its window", task)
        self.paused = paused
        self._rates.update(rated, {row.task: stored_rate(row) for row in rows if row.task in rated})
        self._pacer.set_tasks(
            [name for name in self._plan.task_names if name not in paused | rated]
        )

    def woke(self, rows: Sequence[Any]) -> None:
        """Suspended durable jobs whose time came were woken: claim at once; and come
        back when the next one is due, if that is before the next maintenance."""
        row = rows[0] if rows else None
        if row is None:
            return
        if row.woken:
            log.debug("woke %d suspended job(s) whose time came", row.woken)
            self._pacer.next_poll = 0.0
            if row.woken >= WAKE_BATCH:
                self.next_at = time.monotonic()  # more are due: sweep again at once
        if row.next_in is not None:
            self.next_at = min(self.next_at, time.monotonic() + max(float(row.next_in), 0.0))

    def wake_at(self, due: dt.datetime) -> None:
        """A job this worker ran was suspended until ``due`` (the database's clock): run
        the wake sweep then, if that is before the next maintenance. Any thread may call."""
        seconds = (due - dt.datetime.now(dt.UTC)).total_seconds()
        self.next_at = min(self.next_at, time.monotonic() + max(seconds, 0.0))

    def cleaned_up(self, rows: Sequence[Any]) -> None:
        """Parked executions were deleted: their keys get a promotion in the next unit."""
        keys = {row[0] for row in rows if row[0] is not None}
        if keys:
            self._keys.restore(keys)
            self._pacer.next_poll = 0.0

    def swept(self, rows: Sequence[Any]) -> None:
        """A slice of the waiting keys was visited: resume after it, or from the start."""
        for row in rows:
            self._sweep_after = row.last_key or ""
            if row.promoted:
                log.info("promoted %d waiting job(s) whose key had nothing ahead", row.promoted)
                self._pacer.next_poll = 0.0
