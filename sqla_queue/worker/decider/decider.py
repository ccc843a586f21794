"""The worker's decider: what the run loop does next, and what the answers change.

The faces (:mod:`sqla_queue.worker.sync`, :mod:`sqla_queue.worker.aio`) ask
:meth:`Decider.next_action` what to do, do that one piece of I/O, and report back. Every
decision (when to claim, how much, when to flush acks, when to sweep for lost jobs, how to
shut down) is made here or in one of the parts this module composes, where a unit test
can drive it with a fake clock and no database. The parts, each in a module of its own:

* :class:`ClaimPacer`: the plain claim's tasks, size, parameters and timing;
* :class:`RateSchedule`: the rate-limited tasks, each claimed within its window;
* :class:`KeyPromotion`: the keys whose next waiting job may be due;
* :class:`OutcomeBuffer`: outcomes waiting for their ack, isolated when refused;
* :class:`RunningJobs` and :class:`Liveness`: the held executions, for the heartbeat;
* :class:`Prefetch`: the jobs held ahead of need, handed back or started in a freed seat;
* :class:`Maintenance`: the periodic reads; :class:`Intake`: the claimed rows;
* :class:`Shutdown` and :class:`Recovery`: the stop, and what database errors lead to;
* :class:`WorkerStatements`: every statement, built once.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqla_queue.errors import WorkerStoppedError
from sqla_queue.logic.outcomes import ClaimedJob, Outcome, OutcomeKind, outcomes_json
from sqla_queue.statements.claim import LimitedRatedClaimParams
from sqla_queue.statements.complete import CompleteParams
from sqla_queue.statements.controls import RateBacklogParams, RateLockParams
from sqla_queue.worker.actions import (
    Action,
    Claim,
    Flush,
    Maintain,
    Start,
    Step,
    Stop,
    Wait,
    Work,
    atomic_unit,
)
from sqla_queue.worker.decider.acks import OutcomeBuffer, tally
from sqla_queue.worker.decider.intake import ContextFactory, Intake
from sqla_queue.worker.decider.keys import KeyPromotion
from sqla_queue.worker.decider.liveness import Liveness
from sqla_queue.worker.decider.maintenance import Maintenance
from sqla_queue.worker.decider.nodes import WorkflowNodes, expansion_of
from sqla_queue.worker.decider.pacing import ClaimPacer
from sqla_queue.worker.decider.prebuilt import WorkerStatements
from sqla_queue.worker.decider.prefetch import Prefetch
from sqla_queue.worker.decider.rates import RatedClaim, RateSchedule
from sqla_queue.worker.decider.recovery import Recovery
from sqla_queue.worker.decider.running import RunningJobs
from sqla_queue.worker.decider.shutdown import Shutdown
from sqla_queue.worker.handlers import RunningJob
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.settings import MAX_SECONDS, MIN_INTERVAL, WorkerSettings
from sqla_queue.workflows.graph import Expansion

__all__ = ["Clock", "Decider", "intervals", "utcnow"]

log = logging.getLogger("sqla_queue.worker")

#: The wall clock the decider reads (error stamps, the next due time); tests pass their own.
Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    """The current time, timezone-aware."""
    return dt.datetime.now(dt.UTC)


def intervals(plan: WorkerPlan, settings: WorkerSettings) -> tuple[float, float]:
    """The heartbeat and the reclaim intervals: as set, or derived from the shortest lease.

    The reclaim interval is also how often stored limits are re-read, so that a new limit
    applies within seconds.
    """
    shortest = plan.shortest_lease
    # Derived from a lease, the intervals stay within what a setting may hold: a tiny
    # lease must not make the heartbeat spin, a huge one not outgrow a timer.
    heartbeat = settings.heartbeat_interval or min(max(shortest / 4, MIN_INTERVAL), MAX_SECONDS)
    reclaim = settings.reclaim_interval or max(min(shortest / 2, 5.0), MIN_INTERVAL)
    return heartbeat, reclaim


class Decider:
    """State and decisions of one worker process. Thread-safe where handlers report back.

    It reads no global state: the tasks come resolved in ``plan``, the wall clock is
    ``clock`` and the random seat offsets come from ``rng``, so a unit test drives it with
    a hand-made plan, a fake clock and a seeded generator. Its parts (listed in the module
    docstring) share its lock.
    """

    def __init__(
        self,
        plan: WorkerPlan,
        settings: WorkerSettings,
        *,
        burst: bool = False,
        worker_id: uuid.UUID | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.plan = plan
        self.settings = settings
        self.burst = burst
        self.worker_id = worker_id or uuid.uuid4()
        self.clock: Clock = clock or utcnow
        self.heartbeat_interval, self.reclaim_interval = intervals(plan, settings)
        built = WorkerStatements.build(plan.tables, generic_plans=settings.generic_plans)
        self.statements = built
        self.guard = built.guard
        self.complete_statement = built.complete
        self.heartbeat_statement = built.heartbeat
        self.listen = plan.notify if settings.listen is None else settings.listen
        self.stop_flag = threading.Event()
        self._lock = threading.Lock()
        self._wake: Callable[[], None] = lambda: None
        self.stats = dict.fromkeys(
            ("claimed", "succeeded", "failed", "retried", "fenced", "cancelled"), 0
        )
        rng = rng or random.Random()
        self.pacer = ClaimPacer(plan, settings, self.worker_id, rng, burst=burst)
        self.rates = RateSchedule(settings.poll_interval, self.clock, burst=burst)
        self.keys = KeyPromotion(self._lock, built.clear_done, built.promote, self.pacer)
        self.buffer = OutcomeBuffer(settings.ack_delay, settings.claim_batch)
        self.jobs = RunningJobs()
        self.liveness = Liveness(
            self._lock,
            self.jobs,
            self.buffer,
            self.worker_id,
            tasks=plan.task_names,
            concurrency=settings.concurrency,
        )
        self.intake = Intake(plan, self.worker_id, self.clock)
        self.maintenance = Maintenance(
            built,
            plan,
            settings.observers,
            self.reclaim_interval,
            pacer=self.pacer,
            rates=self.rates,
            keys=self.keys,
            worker_id=self.worker_id,
        )
        # Late-bound: the face installs its waker (set_waker) after this is built.
        wake = lambda: self._wake()  # noqa: E731, PLW0108
        self.shutdown = Shutdown(
            self._lock, self.jobs, settings.shutdown_timeout, self.stop_flag, wake
        )
        self.prefetch = Prefetch(
            self._lock,
            self.jobs,
            settings.concurrency,
            settings.prefetch,
            pacer=self.pacer,
            shutdown=self.shutdown,
            maintenance=self.maintenance,
        )
        self.nodes = WorkflowNodes(self._lock, plan.tables, plan.workflows)
        self.recovery = Recovery(
            plan.tables,
            self.worker_id,
            self.clock,
            lock=self._lock,
            buffer=self.buffer,
            pacer=self.pacer,
            shutdown=self.shutdown,
        )
        # What the faces, the heartbeat thread and the handlers' threads call, answered by
        # the parts themselves.
        self.request_stop = self.shutdown.request
        self.handler_raised = self.shutdown.handler_raised
        self.database_error = self.recovery.database_error
        self.heartbeat_failed = self.recovery.heartbeat_failed
        self.held = self.liveness.held
        self.heartbeat_params = self.liveness.heartbeat_params
        self.heartbeat_done = self.liveness.heartbeat_done
        self.deliver_cancels = self.liveness.deliver_cancels
        self.controls_read = self.maintenance.controls_read
        self.follow_on = self.prefetch.follow_on
        #: Parameters of the claim statement for a batch of ``size``.
        self.claim_params = self.pacer.params

    # -- wiring ------------------------------------------------------------------------------

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Install the face's thread-safe way of waking its run loop."""
        self._wake = wake

    @property
    def stopping(self) -> bool:
        """True once a shutdown was requested."""
        return self.shutdown.stopping

    def notified(self) -> None:
        """An enqueue notification arrived: poll at once (a rated task: once its window
        lets a start through)."""
        self.pacer.pull()
        self.rates.poll_all()
        self._wake()

    # -- the decision ------------------------------------------------------------------------

    def next_action(self, now: float) -> Action:
        """What the run loop should do next."""
        shutdown = self.shutdown
        with self._lock:
            self._release_running(self.prefetch.hand_back(now))
            running = self.jobs.count()
            waiting = self.jobs.waiting()
            has_outcomes = bool(self.buffer)
            if shutdown.deadline is not None:
                if shutdown.give_up:
                    return Stop()
                if has_outcomes:
                    return Flush()
                if running and now < shutdown.deadline:
                    return Wait(shutdown.deadline - now)
                if running:
                    self._release_running()
                    return Flush()
                return Stop()
            seats = self.prefetch.free_seats()
            if waiting and seats > 0:
                return Start(self.jobs.take_waiting(seats))
        # Held jobs count against the claim: running ones and prefetched ones alike.
        free = self.prefetch.capacity(now) - running
        pacer = self.pacer
        if has_outcomes and self.buffer.isolating:
            return Flush()  # one outcome per statement, nothing else in the unit
        if has_outcomes:
            wait = self.buffer.ack_wait(now, running)
            if wait > 0:
                return Wait(wait)
            if free > 0 and pacer.due(now):
                return Flush(claim=pacer.size(free))
            return Flush()
        if self.maintenance.due(now):
            return Maintain()
        # A rated claim takes only what free seats can start: a start it records is used.
        rated_due = self.rates.due(now) if seats > 0 else None
        if rated_due is not None:
            return Claim(pacer.size(seats), rated=rated_due)
        if free > 0 and pacer.due(now):
            return Claim(pacer.size(free))
        if self.burst and running == 0 and self._idle():
            return Stop()
        return Wait(max(0.0, min(self._wake_at(free) - now, self.settings.poll_interval)))

    def _wake_at(self, free: int) -> float:
        """When the next action falls due: the next maintenance, or sooner a claim.

        Any set of claims may be empty (every task paused, every one rated, no seat
        free): the maintenance is always there, so an idle worker idles.
        """
        times = [self.maintenance.next_at]
        if free > 0:
            if self.pacer.tasks:
                times.append(self.pacer.next_poll)
            times.extend(self.rates.times())
        return min(times)

    def _idle(self) -> bool:
        """A burst run may stop: the last claims found nothing and no key owes a promotion."""
        return self.pacer.idle and self.rates.idle() and not self.keys.owed

    # -- I/O plans -----------------------------------------------------------------------------

    def prepare(
        self,
        action: Flush | Claim | Maintain,
        now: float,
        make_context: ContextFactory,
    ) -> Work:
        """The statements an action runs, and what happens with their rows."""
        if isinstance(action, Maintain):
            held = self.liveness.held()[0]
            return self.maintenance.unit(self.guard, held, self.keys, now, self.nodes.after_reclaim)
        size = action.claim if isinstance(action, Flush) else action.size
        if isinstance(action, Claim) and action.rated is not None:
            return self._rated_unit(action.rated, size, now, make_context)
        if isinstance(action, Claim):
            claim_step = [Step(self.claim_statement, self.claim_params(size))]
            keys, key_steps = self.keys.take_steps()

            def claimed(results: list[Sequence[Any]]) -> list[RunningJob]:
                jobs = self.accept_claim(results[-1], size, now, make_context)
                self.keys.cleared(results[: len(key_steps)], now)
                return jobs

            return atomic_unit(
                self.guard, [*key_steps, *claim_step], claimed, lambda: self.keys.restore(keys)
            )
        isolated = self.buffer.isolating > 0
        outcomes, params = self.take_outcomes()
        nodes = self.nodes.follow(outcomes)
        node_steps = nodes.steps if nodes is not None else []
        claim_step = [Step(self.claim_statement, self.claim_params(size))] if size else []
        # After the outcomes: theirs are among them. An isolated outcome goes alone.
        keys, key_steps = ([], []) if isolated else self.keys.take_steps()

        def flushed(results: list[Sequence[Any]]) -> list[RunningJob]:
            if isolated:
                with self._lock:
                    self.buffer.isolated(len(outcomes))
            self.completed(outcomes, [row[0] for row in results[0]])
            jobs = self.accept_claim(results[-1], size, now, make_context) if size else []
            if nodes is not None and nodes.followed:
                # A release decided after the claim (a fan-in's last parent, an
                # expansion's first nodes) is claimed by the next claim: at once.
                self.pacer.reopen()
            # After the claim, which sets the next poll: a parked key may bring it closer.
            keys_at = 1 + len(node_steps)
            self.keys.cleared(results[keys_at : keys_at + len(key_steps)], now)
            return jobs

        def flush_failed() -> None:
            self.flush_failed(outcomes)
            self.keys.restore(keys)
            self.nodes.restore(outcomes)

        # Ack, release, keys and claim share one transaction: one commit, and the claim
        # sees what the ack freed, the release released and the promotion made pending.
        return atomic_unit(
            self.guard,
            [Step(self.complete_statement, params), *node_steps, *key_steps, *claim_step],
            flushed,
            flush_failed,
            nodes.after if nodes is not None else None,
        )

    def _rated_unit(self, task: str, size: int, now: float, make_context: ContextFactory) -> Work:
        """Claim the rate-limited ``task``: lock its control row, then claim within its
        window (see ``claim_statement(rated=True)``), in one transaction."""
        # A superset of the plain rated claim's parameters too (it ignores the rest).
        params = LimitedRatedClaimParams(**self.claim_params(size), rate_task=task)
        params["tasks"] = [task]
        statement = self.statements.rated_claim(limited=self.pacer.is_limited(task))
        self.rates.claiming(task, now)
        # A burst run asks whether a full window holds back any due job (RateSchedule).
        probe = Step(self.statements.rate_backlog, RateBacklogParams(rate_task=task))
        rated = RatedClaim(Step(statement, params), probe if self.burst else None)

        def claimed(results: list[Sequence[Any]]) -> list[RunningJob]:
            rows, left = rated.rows, rated.due_left
            accept = functools.partial(self.accept_claim, rated=task, due_left=left)
            return [] if rows is None else accept(rows, size, now, make_context)

        lock = Step(self.statements.rate_lock, RateLockParams(rate_task=task))
        return atomic_unit(self.guard, [lock], claimed, lambda: None, rated.follow)

    def _buffer(
        self, outcome: Outcome, job: ClaimedJob, expansion: Expansion | None = None
    ) -> None:
        """Queue ``outcome`` for the next ack (the caller holds the lock)."""
        self.buffer.add(outcome)
        if job.workflow:
            self.nodes.note(job.id, outcome, expansion)
        if job.queue_id is not None:
            self.keys.add(job.queue_id)

    # -- claims ------------------------------------------------------------------------------

    @property
    def claim_statement(self) -> Any:
        """The claim to run now: slot-aware only while one of this worker's tasks is limited."""
        return self.statements.claim(limited=self.pacer.limited)

    def accept_claim(
        self,
        rows: Sequence[Any],
        size: int,
        now: float,
        make_context: ContextFactory,
        *,
        rated: str | None = None,
        due_left: bool | None = None,
    ) -> list[RunningJob]:
        """Register the claimed rows and return the ones to run.

        Rows that must not run become failure outcomes at once (see :class:`Intake`).
        ``rated`` names the rate-limited task that a rated claim took; its next claim is
        then timed on its own. ``due_left`` (a burst run's rated claim) says whether due
        jobs of that task are left after it.
        """
        self.recovery.reset()
        jobs: list[RunningJob] = []
        next_due: dt.datetime | None = None
        claimed = 0
        for row in rows:
            next_due = row.next_due
            if row.id is None:
                continue
            claimed += 1
            job = self.intake.job_of(row)
            admitted = self.intake.accept(job, make_context)
            with self._lock:
                if isinstance(admitted, Outcome):
                    self._buffer(admitted, job)
                    continue
                self.jobs.hold(admitted)
        with self._lock:
            # Prefetched jobs beyond the free seats stay held, the most urgent first out.
            seats = self.prefetch.free_seats()
            jobs = self.jobs.take_waiting(max(0, seats))
        self.stats["claimed"] += claimed
        if rated is not None:
            self.rates.claimed(rated, rows, claimed, size, next_due, now, due_left)
        else:
            self.pacer.claimed(claimed, size, next_due, now, self.clock)
        return jobs

    # -- running handlers ---------------------------------------------------------------------

    def record(self, running: RunningJob, outcome: Outcome) -> None:
        """A handler finished: buffer its outcome and wake the loop. Any thread may call."""
        with self._lock:
            if not self.jobs.remove(running):
                # Released at shutdown (or replaced): the database already has it back.
                return
            self._buffer(outcome, running.job, expansion_of(running.context))
        if running.job.queue_id is not None or self.pacer.is_limited(running.job.task):
            # The flush that comes first frees this key or this seat: the next job of the
            # key, or of the limited task, may be claimable right after it.
            self.pacer.pull()
        self._wake()

    def settled(self, running: RunningJob, outcome: Outcome, applied: bool) -> None:
        """A transactional handler's outcome was committed in its own transaction
        (``applied``), or fenced off there (its execution was reclaimed). Any thread may call.

        Nothing is buffered: the job is only forgotten, and a key or seat it freed makes
        the next claim come at once (that claim also promotes the key's next job).
        """
        with self._lock:
            if not self.jobs.remove(running):
                return
            # In the same locked step as the job leaves the running ones: a burst run that
            # saw nothing running must not stop on an empty claim made before this commit,
            # which may have enqueued child jobs.
            self.pacer.last_empty = False
            self.rates.clear_empty()
            if running.job.queue_id is not None and applied:
                self.keys.add(running.job.queue_id)
            if outcome.kind is OutcomeKind.SUSPENDED and outcome.execute_at is not None:
                self.maintenance.wake_at(outcome.execute_at)
        self.completed([outcome], [running.job.id] if applied else [])
        self.pacer.pull()
        self._wake()

    def _release_running(self, jobs: list[RunningJob] | None = None) -> None:
        """Hand every running job (or ``jobs``) back at the shutdown timeout (the caller
        holds the lock)."""
        for running in self.jobs.release_all() if jobs is None else jobs:
            self._buffer(
                Outcome(running.job.id, running.job.attempt, OutcomeKind.RELEASE), running.job
            )

    @property
    def running_count(self) -> int:
        """Handlers running now."""
        with self._lock:
            return self.jobs.count()

    # -- acks --------------------------------------------------------------------------------

    def take_outcomes(self) -> tuple[list[Outcome], CompleteParams]:
        """Remove the buffered outcomes and return them with the completion parameters.

        Each outcome was encoded once, by the thread that made it; this only joins them.
        """
        with self._lock:
            outcomes = self.buffer.take()
        return outcomes, CompleteParams(outcomes=outcomes_json(outcomes), worker=self.worker_id)

    def completed(self, outcomes: Iterable[Outcome], applied: Iterable[int]) -> None:
        """The completion statement ran; log the outcomes a reclaim had fenced off."""
        self.recovery.reset()
        outcomes = list(outcomes)
        if self.burst or any(o.kind in OutcomeKind.back_to_pending() for o in outcomes):
            # Work was handed back, or finishing jobs freed the next job of a queue_id:
            # an earlier empty claim no longer says anything.
            self.pacer.reopen()
            self.rates.reopen()
        done = set(applied)
        with self._lock:  # transactional handlers' threads report here too (settled)
            tally(self.stats, outcomes, done)

    def flush_failed(self, outcomes: list[Outcome]) -> None:
        """The completion did not reach the database: keep the outcomes for the next try.

        They go back to the head of the buffer; :meth:`database_error` then decides,
        from the error, whether to retry them as they are or one by one.
        """
        with self._lock:
            self.buffer.put_back(outcomes)

    @property
    def fatal(self) -> WorkerStoppedError | None:
        """The error that stops the worker because it cannot do its job, if any."""
        return self.shutdown.fatal

    @property
    def stopped_by(self) -> BaseException | None:
        """What ``run()`` raises after its graceful stop, if the worker stopped on its own."""
        return self.shutdown.stopped_by

    # -- what the maintenance read -------------------------------------------------------------

    @property
    def paused(self) -> set[str]:
        """Tasks an operator paused (not claimed), as the last maintenance read them."""
        return self.maintenance.paused

    @property
    def rated(self) -> set[str]:
        """Rate-limited tasks (claimed alone, within their window), as last read."""
        return self.rates.tasks

    @property
    def limited(self) -> bool:
        """Whether the claim is slot-aware: one of this worker's tasks has a limit."""
        return self.pacer.limited

    @property
    def declared_limits(self) -> dict[str, int]:
        """Limits declared in code for the served tasks."""
        return self.pacer.declared_limits
