"""The worker's I/O-free core, shared by the sync and async faces.

The faces ask :meth:`WorkerCore.next_action` what to do, do that one piece of I/O, and
report back. Every decision (when to claim, how much, when to flush acks, when to sweep
for lost jobs, how to shut down) lives here, where a unit test can drive it with a fake
clock and no database.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqla_queue import statements
from sqla_queue.errors import UnknownTaskError, WorkerStoppedError
from sqla_queue.instrumentation import job_log_fields, notify_lost
from sqla_queue.logic.outcomes import (
    ClaimedJob,
    Outcome,
    OutcomeKind,
    outcome_lost_too_often,
    outcome_refused,
    outcome_unwritable,
    outcomes_json,
)
from sqla_queue.logic.payload import decode_arguments
from sqla_queue.statements.claim import LimitedClaimParams, LimitedRatedClaimParams
from sqla_queue.statements.complete import CompleteParams
from sqla_queue.statements.controls import (
    ControlledTasksParams,
    RateBacklogParams,
    RateLockParams,
    controlled_tasks_statement,
    rate_backlog_statement,
    rate_lock_statement,
)
from sqla_queue.statements.keys import CleanupParams, KeysParams, SweepParams
from sqla_queue.statements.limits import LimitedTasksParams
from sqla_queue.statements.liveness import HeartbeatParams, ReclaimParams
from sqla_queue.worker.actions import (
    Action,
    Claim,
    Flush,
    Maintain,
    Step,
    Stop,
    Wait,
    Work,
    claims,
)
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.failures import Fault, classify, database_message, explain
from sqla_queue.worker.handlers import RunningJob
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.settings import MAX_SECONDS, MIN_INTERVAL, WorkerSettings

__all__ = ["Clock", "WorkerCore", "utcnow"]

log = logging.getLogger("sqla_queue.worker")

#: Longest pause after a database error before trying again, in seconds.
MAX_ERROR_BACKOFF = 10.0

#: Waiting keys visited per sweep, and parked executions deleted per sweep: bounds on the
#: work of one maintenance action, whatever the backlog.
SWEEP_KEYS = 100
CLEANUP_BATCH = 100
#: Seconds before a key whose finished execution an enqueue in flight holds is tried again.
PARKED_RETRY = 0.2
#: Failed tries of the last flush, once the shutdown timeout has passed, before a stopping
#: worker gives up on writing its outcomes (the lost interval then returns those jobs).
STOP_FLUSH_TRIES = 3

#: The wall clock the core reads (error stamps, the next due time); tests pass their own.
Clock = Callable[[], dt.datetime]

#: Builds a handler's context for a claimed job (None when the task takes none).
ContextFactory = Callable[[ClaimedJob], JobContext[Any] | None]


def utcnow() -> dt.datetime:
    """The current time, timezone-aware."""
    return dt.datetime.now(dt.UTC)


class WorkerCore:
    """State and decisions of one worker process. Thread-safe where handlers report back.

    It reads no global state: the tasks come resolved in ``plan``, the wall clock is
    ``clock`` and the random seat offsets come from ``rng``, so a unit test drives it with
    a hand-made plan, a fake clock and a seeded generator.
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
        self._rng = rng or random.Random()
        shortest = plan.shortest_lease
        # Derived from a lease, the intervals stay within what a setting may hold: a tiny
        # lease must not make the heartbeat spin, a huge one not outgrow a timer.
        self.heartbeat_interval = settings.heartbeat_interval or min(
            max(shortest / 4, MIN_INTERVAL), MAX_SECONDS
        )
        # Also how often stored limits are re-read, so a new limit applies within seconds.
        self.reclaim_interval = settings.reclaim_interval or max(
            min(shortest / 2, 5.0), MIN_INTERVAL
        )
        self.declared_limits = plan.declared_limits
        # Until the stored limits are read, assume a limit can apply whenever one is
        # declared; the first maintenance step settles it before the first claim.
        self.limited = bool(self.declared_limits)
        self.stored_limits: set[str] = set()
        tables = plan.tables
        self._claim_plain = statements.claim_statement(tables)
        self._claim_limited = statements.claim_statement(tables, limited=True)
        self._claim_rated = statements.claim_statement(tables, rated=True)
        self._claim_rated_limited = statements.claim_statement(tables, limited=True, rated=True)
        self._rate_lock = rate_lock_statement(tables)
        self._rate_backlog = rate_backlog_statement(tables)
        self._controls_statement = controlled_tasks_statement(tables)
        #: Tasks an operator paused (not claimed), and rate-limited ones (claimed alone,
        #: under their control row's lock), as the last maintenance read them.
        self.paused: set[str] = set()
        self.rated: set[str] = set()
        # Per rated task: when to claim it next, and until when its window is full (both
        # on the monotonic clock of next_action).
        self._rated_poll: dict[str, float] = {}
        self._rated_full_until: dict[str, float] = {}
        # Rated tasks whose last claim found nothing due (a burst run may stop on them).
        self._rated_empty: set[str] = set()
        # Per rated task, its stored limit (rate_max, rate_seconds) as last read: a change
        # ends the wait on a window that the old limit filled.
        self._rate_limits: dict[str, tuple[Any, Any]] = {}
        self._limits_statement = statements.limited_tasks_statement(tables)
        self.complete_statement = statements.complete_statement(tables)
        self.heartbeat_statement = statements.heartbeat_statement(tables)
        self.reclaim_statement = statements.reclaim_statement(tables)
        self.promote_statement = statements.promote_statement(tables)
        self._cleanup_statement = statements.cleanup_statement(tables)
        self._clear_done_statement = statements.clear_done_statement(tables)
        self._orphan_sweep_statement = statements.orphan_sweep_statement(tables)
        self.guard = statements.planner_guard(generic_plans=settings.generic_plans)
        # Only leases that differ from the queue's travel in the map; the SQL falls back.
        leases = {name: t.lease for name, t in plan.tasks.items() if t.lease != plan.default_lease}
        self._claim_params = LimitedClaimParams(
            tasks=plan.task_names,
            batch=0,
            worker=self.worker_id,
            lease=plan.default_lease,
            lease_map=json.dumps(leases),
            limit_map=json.dumps(self.declared_limits),
            seat_offset=0,
        )
        self.listen = plan.notify if settings.listen is None else settings.listen
        self.stop_flag = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[int, RunningJob] = {}
        self._outcomes: list[Outcome] = []
        # Keys whose next waiting job may be due for promotion: those of buffered outcomes,
        # and those a cleanup freed (promoted by the next unit, in a statement of its own).
        self._keys: set[str] = set()
        self._sweep_after = ""
        self._wake: Callable[[], None] = lambda: None
        self._next_poll = 0.0
        self._next_reclaim = 0.0
        self._stop_deadline: float | None = None
        self._outcomes_seen_at: float | None = None
        self._last_claim_empty = False
        self._errors_in_row = 0
        # Unique indexes whose violation by a claim means another worker won a race.
        self._race_indexes = {str(ix.name) for ix in tables.executions.indexes if ix.unique}
        # Outcomes at the head of the buffer to write one per statement: a completion of
        # theirs failed with a data error, and one of them is at fault.
        self._isolating = 0
        self._last_flush: list[Outcome] = []
        self._give_up = False
        #: Why the worker stops on its own: a WorkerStoppedError (it cannot do its job) ...
        self.fatal: WorkerStoppedError | None = None
        #: ... or the KeyboardInterrupt/SystemExit a handler raised. ``run()`` raises it
        #: once every thread has stopped.
        self.raised: BaseException | None = None
        self.stats = {
            "claimed": 0,
            "succeeded": 0,
            "failed": 0,
            "retried": 0,
            "fenced": 0,
            "cancelled": 0,
        }

    # -- wiring ------------------------------------------------------------------------------

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Install the face's thread-safe way of waking its run loop."""
        self._wake = wake

    def request_stop(self, now: float) -> None:
        """Begin a graceful shutdown: stop claiming, tell handlers, start the timeout."""
        contexts: list[JobContext[Any]] = []
        with self._lock:
            if self._stop_deadline is None:
                self._stop_deadline = now + self.settings.shutdown_timeout
                self.stop_flag.set()
                contexts = [r.context for r in self._running.values() if r.context is not None]
        for ctx in contexts:
            ctx.notify_shutdown()
        self._wake()

    @property
    def stopping(self) -> bool:
        """True once a shutdown was requested."""
        return self._stop_deadline is not None

    def notified(self) -> None:
        """An enqueue notification arrived: poll at once (a rated task: once its window
        lets a start through)."""
        self._next_poll = 0.0
        # A copy: the run loop's maintenance may add or drop rated tasks meanwhile (this
        # runs on the listener's thread).
        for task in list(self._rated_poll):
            self._rated_poll[task] = 0.0
        self._wake()

    # -- the decision ------------------------------------------------------------------------

    def next_action(self, now: float) -> Action:
        """What the run loop should do next."""
        with self._lock:
            running = sum(1 for r in self._running.values() if not r.released)
            has_outcomes = bool(self._outcomes)
            if self._stop_deadline is not None:
                if self._give_up:
                    return Stop()
                if has_outcomes:
                    return Flush()
                if running and now < self._stop_deadline:
                    return Wait(self._stop_deadline - now)
                if running:
                    self._release_running()
                    return Flush()
                return Stop()
        free = self.settings.concurrency - running
        if has_outcomes and self._isolating:
            return Flush()  # one outcome per statement, nothing else in the unit
        if has_outcomes:
            wait = self._ack_wait(now, running)
            if wait > 0:
                return Wait(wait)
            if free > 0 and now >= self._next_poll and self._claim_params["tasks"]:
                return Flush(claim=min(free, self.settings.claim_batch))
            return Flush()
        if now >= self._next_reclaim:
            self._next_reclaim = now + self.reclaim_interval
            return Maintain()
        rated_due = self._rated_due(now) if free > 0 else None
        if rated_due is not None:
            return Claim(min(free, self.settings.claim_batch), rated=rated_due)
        if free > 0 and now >= self._next_poll and self._claim_params["tasks"]:
            return Claim(min(free, self.settings.claim_batch))
        if self.burst and running == 0 and self._idle():
            return Stop()
        return Wait(max(0.0, min(self._wake_at(free) - now, self.settings.poll_interval)))

    def _wake_at(self, free: int) -> float:
        """When the next action falls due: the next maintenance, or sooner a claim.

        Any set of claims may be empty (every task paused, every one rated, no seat
        free): the maintenance is always there, so an idle worker idles.
        """
        times = [self._next_reclaim]
        if free > 0:
            if self._claim_params["tasks"]:
                times.append(self._next_poll)
            times.extend(self._rated_times())
        return min(times)

    def _rated_times(self) -> list[float]:
        """When each rated task may be claimed next: polled, and its window not full."""
        return [
            max(self._rated_poll.get(task, 0.0), self._rated_full_until.get(task, 0.0))
            for task in sorted(self.rated)
        ]

    def _rated_due(self, now: float) -> str | None:
        """The rated task to claim now, if any: the one waiting longest."""
        due = [
            (at, task)
            for at, task in zip(self._rated_times(), sorted(self.rated), strict=True)
            if at <= now
        ]
        return min(due)[1] if due else None

    def _idle(self) -> bool:
        """A burst run may stop: the last claims found nothing and no key owes a promotion."""
        plain_idle = self._last_claim_empty or not self._claim_params["tasks"]
        return plain_idle and self.rated <= self._rated_empty and not self._keys

    def _ack_wait(self, now: float, running: int) -> float:
        """How long to hold buffered outcomes so that more join the same ack.

        Handlers of one batch tend to finish together; acking each as it comes would cost
        a statement (and a commit) per job. Outcomes wait at most ``ack_delay`` seconds,
        and not at all once nothing else runs or a batch's worth has gathered.
        """
        if self._outcomes_seen_at is None:
            self._outcomes_seen_at = now
        if running == 0 or len(self._outcomes) >= self.settings.claim_batch:
            return 0.0
        return max(0.0, self._outcomes_seen_at + self.settings.ack_delay - now)

    # -- I/O plans -----------------------------------------------------------------------------

    def prepare(
        self,
        action: Flush | Claim | Maintain,
        now: float,
        make_context: ContextFactory,
    ) -> Work:
        """The statements an action runs, and what happens with their rows."""
        if isinstance(action, Maintain):
            steps = self.maintenance()
            keys, key_steps = self._key_steps()

            def maintained(results: list[Sequence[Any]]) -> list[RunningJob]:
                for (_, done), rows in zip(steps, results[: len(steps)], strict=True):
                    done(rows)
                self._keys_cleared(results[len(steps) :], now)
                return []

            return self._unit(
                [*(step for step, _ in steps), *key_steps],
                maintained,
                lambda: self._restore_keys(keys),
            )
        size = action.claim if isinstance(action, Flush) else action.size
        if isinstance(action, Claim) and action.rated is not None:
            return self._rated_unit(action.rated, size, now, make_context)
        claim_step = [Step(self.claim_statement, self.claim_params(size))] if size else []
        if isinstance(action, Claim):
            keys, key_steps = self._key_steps()

            def claimed(results: list[Sequence[Any]]) -> list[RunningJob]:
                jobs = self.accept_claim(results[-1], size, now, make_context)
                self._keys_cleared(results[: len(key_steps)], now)
                return jobs

            return self._unit([*key_steps, *claim_step], claimed, lambda: self._restore_keys(keys))
        isolated = self._isolating > 0
        outcomes, params = self.take_outcomes()
        # After the outcomes: theirs are among them. An isolated outcome goes alone.
        keys, key_steps = ([], []) if isolated else self._key_steps()

        def flushed(results: list[Sequence[Any]]) -> list[RunningJob]:
            if isolated:
                with self._lock:
                    self._isolating = max(0, self._isolating - len(outcomes))
            self.completed(outcomes, [row[0] for row in results[0]])
            jobs = self.accept_claim(results[-1], size, now, make_context) if size else []
            # After the claim, which sets the next poll: a parked key may bring it closer.
            self._keys_cleared(results[1 : 1 + len(key_steps)], now)
            return jobs

        def flush_failed() -> None:
            self.flush_failed(outcomes)
            self._restore_keys(keys)

        # Ack, keys and claim share one transaction: one commit, and the claim sees what
        # the ack freed and the promotion made pending.
        return self._unit(
            [Step(self.complete_statement, params), *key_steps, *claim_step],
            flushed,
            flush_failed,
        )

    def _rated_unit(self, task: str, size: int, now: float, make_context: ContextFactory) -> Work:
        """Claim the rate-limited ``task``: lock its control row, then claim within its
        window (see ``claim_statement(rated=True)``), in one transaction."""
        # A superset of the plain rated claim's parameters too (it ignores the rest).
        params = LimitedRatedClaimParams(**self.claim_params(size), rate_task=task)
        params["tasks"] = [task]
        statement = self._claim_rated_limited if self._is_limited(task) else self._claim_rated
        # Until this claim answers, the task is not due again (a failed unit retries it
        # after the error backoff, like the plain claim).
        self._rated_poll[task] = now + self.settings.poll_interval
        steps = [Step(self._rate_lock, RateLockParams(rate_task=task)), Step(statement, params)]
        if self.burst:
            # Whether the window, if full, holds back any due job (see _rated_claimed).
            steps.append(Step(self._rate_backlog, RateBacklogParams(rate_task=task)))

        def claimed(results: list[Sequence[Any]]) -> list[RunningJob]:
            backlog = results[2] if len(results) > 2 else None
            due_left = bool(backlog[0].due) if backlog else None
            return self.accept_claim(
                results[1], size, now, make_context, rated=task, due_left=due_left
            )

        return self._unit(steps, claimed, lambda: None)

    def _key_steps(self) -> tuple[list[str], list[Step]]:
        """The keys owed a promotion, and the two statements that give it.

        First the ``done`` executions of those keys are deleted where nobody holds them,
        then, as a statement of its own (it must see the waiting jobs that enqueues
        committed meanwhile), each key's next job is made pending where its turn has come.
        """
        with self._lock:
            keys, self._keys = sorted(self._keys), set()
        if not keys:
            return keys, []
        params = KeysParams(keys=keys)
        return keys, [
            Step(self._clear_done_statement, params),
            Step(self.promote_statement, params),
        ]

    def _keys_cleared(self, results: Sequence[Sequence[Any]], now: float) -> None:
        """Keys whose ``done`` row an enqueue in flight still holds are tried again soon."""
        if not results:
            return
        parked = {row[0] for row in results[0]}
        if parked:
            self._restore_keys(parked)
            self._next_poll = min(self._next_poll, now + PARKED_RETRY)

    def _unit(
        self,
        steps: list[Step],
        done: Callable[[list[Sequence[Any]]], list[RunningJob]],
        failed: Callable[[], None],
    ) -> Work:
        """One transaction: the planner guard, then ``steps``; ``done`` sees their rows only."""
        return Work(
            [Step(self.guard, {}), *steps],
            True,
            lambda results: done(results[1:]),
            failed,
        )

    def _restore_keys(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(keys)

    def _buffer(self, outcome: Outcome, job: ClaimedJob) -> None:
        """Queue ``outcome`` for the next ack (the caller holds the lock)."""
        self._outcomes.append(outcome)
        if job.queue_id is not None:
            self._keys.add(job.queue_id)

    # -- claims ------------------------------------------------------------------------------

    def _is_limited(self, task: str) -> bool:
        return task in self.declared_limits or task in self.stored_limits

    @property
    def claim_statement(self) -> Any:
        """The claim to run now: slot-aware only while one of this worker's tasks is limited."""
        return self._claim_limited if self.limited else self._claim_plain

    def claim_params(self, size: int) -> LimitedClaimParams:
        """Parameters of the claim statement for a batch of ``size``.

        The plain claim reads a subset of them; the limited one reads them all.
        """
        params = self._claim_params.copy()
        params["batch"] = size
        params["seat_offset"] = self._rng.randrange(1 << 30)
        return params

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

        Rows that must not run (lost too often, malformed) become failure outcomes at once.
        Each payload is decoded here, once. ``rated`` names the rate-limited task that a
        rated claim took; its next claim is then timed on its own. ``due_left`` (a burst
        run's rated claim) says whether due jobs of that task are left after it.
        """
        self._errors_in_row = 0
        jobs: list[RunningJob] = []
        next_due: dt.datetime | None = None
        claimed = 0
        for row in rows:
            next_due = row.next_due
            if row.id is None:
                continue
            claimed += 1
            job = ClaimedJob(
                id=row.id,
                task=row.task,
                attempt=row.attempt,
                # None only for an orphan (see _admit), which fails at this attempt.
                max_attempts=row.attempt if row.max_attempts is None else row.max_attempts,
                reclaims=row.reclaims,
                queue_id=row.queue_id,
                payload=row.payload,
                execute_at=getattr(row, "execute_at", None),
            )
            try:
                admitted = self._admit(job)
                if not isinstance(admitted, Outcome):
                    args, kwargs = admitted
                    context = make_context(job)
            except Exception as exc:  # committed as running: it must end, not linger
                log.exception(
                    "job %s (%s) could not be prepared to run",
                    job.id,
                    job.task,
                    extra=job_log_fields(job),
                )
                admitted = self._refused(job, exc)
            if isinstance(admitted, Outcome):
                with self._lock:
                    self._buffer(admitted, job)
                continue
            running = RunningJob(job, self.plan.tasks[job.task], args, kwargs, context)
            with self._lock:
                self._running[job.id] = running
            jobs.append(running)
        self.stats["claimed"] += claimed
        if rated is not None:
            self._rated_claimed(rated, rows, claimed, size, next_due, now, due_left)
            return jobs
        self._last_claim_empty = claimed == 0
        if claimed >= size or (self.burst and claimed > 0):
            # A full batch means more is likely waiting; a burst run must see one empty
            # claim before it may stop.
            self._next_poll = now
        else:
            wait = self.settings.poll_interval
            if next_due is not None:
                wait = min(wait, max(0.0, (next_due - self.clock()).total_seconds()))
            self._next_poll = now + wait
        return jobs

    def _rated_claimed(
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
        self._rated_full_until.pop(task, None)
        full = free_at is not None and allowance is not None and claimed >= allowance
        if due_left is False:
            full = False
        if (claimed == 0 and not full) or due_left is False:
            self._rated_empty.add(task)
        else:
            self._rated_empty.discard(task)
        if full and free_at is not None:
            # The window is full: nothing starts before its oldest start leaves it.
            wait = max(0.0, (free_at - self.clock()).total_seconds())
            self._rated_full_until[task] = now + wait
            self._rated_poll[task] = now
        elif claimed >= size or (self.burst and claimed > 0):
            self._rated_poll[task] = now
        else:
            wait = self.settings.poll_interval
            if next_due is not None:
                wait = min(wait, max(0.0, (next_due - self.clock()).total_seconds()))
            self._rated_poll[task] = now + wait

    def claim_lost_race(self, now: float) -> None:
        """Another worker won a uniqueness race during the claim: an empty batch, retry."""
        self._next_poll = now

    def _admit(self, job: ClaimedJob) -> Outcome | tuple[list[Any], dict[str, Any]]:
        """The decoded arguments of a row that may run, or the failure of one that may not."""
        if job.payload is None:
            # The jobs table has no row for it (deleted by hand: there is no foreign key).
            log.error(
                "execution %s (%s) has no job row; removing it",
                job.id,
                job.task,
                extra=job_log_fields(job),
            )
            return self._refused(job, LookupError(f"job {job.id} has no row in the jobs table"))
        runtime = self.plan.tasks.get(job.task)
        if runtime is None:  # the claim filters by task; this guards a hand-edited row
            return self._refused(job, UnknownTaskError(f"no handler for task {job.task!r}"))
        lost = outcome_lost_too_often(
            job, max_reclaims=runtime.max_reclaims, worker_id=self.worker_id, now=self.clock()
        )
        if lost is not None:
            log.error(
                "job %s (%s) failed: %s", job.id, job.task, lost.error, extra=job_log_fields(job)
            )
            return lost
        try:
            return decode_arguments(job.payload)
        except ValueError as exc:
            return self._refused(job, exc)

    def _refused(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        return outcome_refused(job, exc, worker_id=self.worker_id, now=self.clock())

    # -- running handlers ---------------------------------------------------------------------

    def record(self, running: RunningJob, outcome: Outcome) -> None:
        """A handler finished: buffer its outcome and wake the loop. Any thread may call."""
        with self._lock:
            current = self._running.get(running.job.id)
            if current is not running or running.released:
                # Released at shutdown (or replaced): the database already has it back.
                return
            del self._running[running.job.id]
            self._buffer(outcome, running.job)
        if running.job.queue_id is not None or self._is_limited(running.job.task):
            # The flush that comes first frees this key or this seat: the next job of the
            # key, or of the limited task, may be claimable right after it.
            self._next_poll = 0.0
        self._wake()

    def settled(self, running: RunningJob, outcome: Outcome, applied: bool) -> None:
        """A transactional handler's outcome was committed in its own transaction
        (``applied``), or fenced off there (its execution was reclaimed). Any thread may call.

        Nothing is buffered: the job is only forgotten, and a key or seat it freed makes
        the next claim come at once (that claim also promotes the key's next job).
        """
        with self._lock:
            current = self._running.get(running.job.id)
            if current is not running or running.released:
                return
            # In the same locked step as the job leaves ``_running``: a burst run that saw
            # nothing running must not stop on an empty claim made before this commit,
            # which may have enqueued child jobs.
            self._last_claim_empty = False
            self._rated_empty.clear()
            del self._running[running.job.id]
            if running.job.queue_id is not None and applied:
                self._keys.add(running.job.queue_id)
        self.completed([outcome], [running.job.id] if applied else [])
        self._next_poll = 0.0
        self._wake()

    def _release_running(self) -> None:
        for running in self._running.values():
            if not running.released:
                running.released = True
                self._buffer(
                    Outcome(running.job.id, running.job.attempt, OutcomeKind.RELEASE),
                    running.job,
                )
                log.warning(
                    "job %s (%s) did not finish within shutdown_timeout; returned to the queue",
                    running.job.id,
                    running.job.task,
                    extra=job_log_fields(running.job),
                )
        self._running = {k: v for k, v in self._running.items() if not v.released}

    # -- acks --------------------------------------------------------------------------------

    def take_outcomes(self) -> tuple[list[Outcome], CompleteParams]:
        """Remove the buffered outcomes and return them with the completion parameters.

        Each outcome was encoded once, by the thread that made it; this only joins them.
        """
        with self._lock:
            if self._isolating:
                outcomes, self._outcomes = self._outcomes[:1], self._outcomes[1:]
            else:
                outcomes, self._outcomes = self._outcomes, []
            self._outcomes_seen_at = None
        return outcomes, CompleteParams(outcomes=outcomes_json(outcomes), worker=self.worker_id)

    def completed(self, outcomes: Iterable[Outcome], applied: Iterable[int]) -> None:
        """The completion statement ran; log the outcomes a reclaim had fenced off."""
        self._errors_in_row = 0
        outcomes = list(outcomes)
        if self.burst or any(o.kind in OutcomeKind.back_to_pending() for o in outcomes):
            # Work was handed back, or finishing jobs freed the next job of a queue_id:
            # an earlier empty claim no longer says anything.
            self._next_poll = 0.0
            self._last_claim_empty = False
            self._rated_empty.clear()
            for task in list(self._rated_poll):  # a full window still waits (_rated_times)
                self._rated_poll[task] = 0.0
        done = set(applied)
        with self._lock:  # transactional handlers' threads report here too (settled)
            self._count(outcomes, done)

    def _count(self, outcomes: list[Outcome], done: set[int]) -> None:
        for outcome in outcomes:
            if outcome.job_id not in done:
                self.stats["fenced"] += 1
                log.warning(
                    "job %s attempt %s: result discarded, the job was reclaimed by another "
                    "worker meanwhile (its newer attempt wins)",
                    outcome.job_id,
                    outcome.attempt,
                    extra={"job_id": outcome.job_id, "attempt": outcome.attempt},
                )
            elif outcome.kind is OutcomeKind.SUCCEEDED:
                self.stats["succeeded"] += 1
            elif outcome.kind is OutcomeKind.FAILED:
                self.stats["failed"] += 1
            elif outcome.kind is OutcomeKind.RETRY:
                self.stats["retried"] += 1
            elif outcome.kind is OutcomeKind.CANCELLED:
                self.stats["cancelled"] += 1

    def flush_failed(self, outcomes: list[Outcome]) -> None:
        """The completion did not reach the database: keep the outcomes for the next try.

        They go back to the head of the buffer; :meth:`database_error` then decides,
        from the error, whether to retry them as they are or one by one.
        """
        with self._lock:
            self._outcomes[:0] = outcomes
            self._last_flush = list(outcomes)

    def database_error(self, action: Action, exc: BaseException, now: float) -> float:
        """Handle a failed unit of ``action``; return how long to back off before the next.

        A claim that lost a uniqueness race retries at once. An error retrying cannot fix
        (see :mod:`sqla_queue.worker.failures`) either isolates the outcomes of a failed
        completion or stops the worker with a :class:`WorkerStoppedError`; anything else
        is logged and retried after an exponential backoff.
        """
        fault = classify(exc, self._race_indexes)
        doing = type(action).__name__.lower()
        if fault is Fault.RACE and claims(action):
            self.claim_lost_race(now)
            return 0.0
        if fault is Fault.DATA and isinstance(action, Flush) and self._last_flush:
            self._isolate(exc, now)
            return 0.0
        if fault in (Fault.DATA, Fault.PRIVILEGE, Fault.MISSING, Fault.POOLER):
            self.fail(WorkerStoppedError(explain(fault, exc, self.plan.tables, doing)), now)
            return 0.0
        self._errors_in_row += 1
        if self._stop_deadline is not None and (
            self.fatal is not None
            or (now >= self._stop_deadline and self._errors_in_row >= STOP_FLUSH_TRIES)
        ):
            log.error(
                "database error during %s while stopping (%s); giving up: the jobs this "
                "worker still holds return to the queue after their lost interval",
                doing,
                exc,
            )
            self._give_up = True
            return 0.0
        delay = min(MAX_ERROR_BACKOFF, 0.1 * 2.0 ** min(self._errors_in_row - 1, 10))
        log.warning("database error during %s (retrying in %.1fs): %s", doing, delay, exc)
        self._next_poll = now + delay
        return delay

    def _isolate(self, exc: BaseException, now: float) -> None:
        """A completion failed with a data error: find the outcome at fault and fail it.

        A batch is written again one outcome per statement. A single outcome that still
        fails is replaced by a plain failure of its job that names the database's reason;
        if even that is refused, the worker stops.
        """
        reason = database_message(exc)
        with self._lock:
            failed, self._last_flush = self._last_flush, []
            if len(failed) > 1:
                self._isolating = max(self._isolating, len(failed))
                log.warning(
                    "a completion of %d outcomes failed (%s); writing them one by one to "
                    "find the one at fault",
                    len(failed),
                    reason,
                )
                return
            (outcome,) = failed
            replace = not outcome.extra.get("stand_in")
            if replace and self._outcomes and self._outcomes[0] is outcome:
                self._outcomes[0] = outcome_unwritable(
                    outcome, reason, worker_id=self.worker_id, now=self.clock()
                )
            self._isolating = max(self._isolating, 1)
        if replace:
            log.error(
                "job %s attempt %s: the database refused its %s outcome (%s); failing the "
                "job with that reason instead",
                outcome.job_id,
                outcome.attempt,
                outcome.kind.value,
                reason,
            )
            return
        self.fail(
            WorkerStoppedError(
                f"the worker stopped: the database refused even a plain failure of job "
                f"{outcome.job_id} attempt {outcome.attempt} ({reason}); check that job's "
                "row and the queue's tables, then start the worker again"
            ),
            now,
        )

    def fail(self, error: WorkerStoppedError, now: float) -> None:
        """Stop as on SIGTERM because the worker cannot do its job; ``run()`` raises ``error``.

        Running handlers get the shutdown timeout and their outcomes one more write; a
        database error during that stop ends it at once.
        """
        with self._lock:
            first = self.fatal is None
            if first:
                self.fatal = error
            else:
                self._give_up = True
        if first:
            log.error("%s", error)
        self.request_stop(now)

    def handler_raised(self, exc: BaseException, now: float) -> None:
        """A handler raised KeyboardInterrupt or SystemExit: stop as on SIGTERM.

        Its attempt is recorded already. ``run()`` raises ``exc`` (the first one, if
        several handlers raise) once every thread has stopped.
        """
        with self._lock:
            first = self.raised is None
            if first:
                self.raised = exc
        if first:
            log.error(
                "a handler raised %s: stopping the worker as on SIGTERM (running jobs "
                "finish or are handed back), then raising it",
                type(exc).__name__,
            )
        self.request_stop(now)

    @property
    def stopped_by(self) -> BaseException | None:
        """What ``run()`` raises after its graceful stop, if the worker stopped on its own."""
        return self.raised or self.fatal

    def heartbeat_failed(self, exc: BaseException, now: float) -> None:
        """A heartbeat failed: stop when retrying cannot help, else the next beat retries."""
        fault = classify(exc, self._race_indexes)
        if fault in (Fault.PRIVILEGE, Fault.MISSING, Fault.POOLER):
            self.fail(WorkerStoppedError(explain(fault, exc, self.plan.tables, "heartbeat")), now)

    # -- liveness ----------------------------------------------------------------------------

    def held(self) -> tuple[list[int], list[int]]:
        """(ids, attempts) of the executions this process runs or has yet to ack."""
        with self._lock:
            pairs = [(r.job.id, r.job.attempt) for r in self._running.values()]
            pairs += [(o.job_id, o.attempt) for o in self._outcomes]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def mark_lost(self, sent: Iterable[int], still_held: Iterable[int]) -> None:
        """A heartbeat found some executions no longer ours: they were reclaimed."""
        lost = set(sent) - set(still_held)
        if not lost:
            return
        with self._lock:
            # Executions acked meanwhile are gone from the table but were not lost.
            lost &= set(self._running) | {o.job_id for o in self._outcomes}
            for job_id in lost:
                running = self._running.get(job_id)
                if running is not None and running.context is not None:
                    running.context.notify_lost()
        if lost:
            log.warning(
                "executions %s were reclaimed by another worker while held here", sorted(lost)
            )

    def heartbeat_done(self, sent: Iterable[int], rows: Sequence[Any]) -> None:
        """A heartbeat returned ``(id, cancel_requested)`` rows: note the lost and the
        cancelled executions. Called by the heartbeat thread."""
        sent = list(sent)
        self.mark_lost(sent, [row[0] for row in rows])
        cancelled = [row[0] for row in rows if row[1]]
        if cancelled:
            self.deliver_cancels(cancelled)

    def deliver_cancels(self, job_ids: Iterable[int]) -> None:
        """Tell the handlers of ``job_ids`` that their jobs were cancelled (once each)."""
        with self._lock:
            targets = [self._running.get(job_id) for job_id in job_ids]
        for running in targets:
            if running is not None and not running.released and not running.cancel_requested:
                log.info(
                    "job %s (%s) was cancelled while running",
                    running.job.id,
                    running.job.task,
                    extra=job_log_fields(running.job),
                )
                running.request_cancel()

    def heartbeat_params(self) -> HeartbeatParams | None:
        """Parameters of the next heartbeat, or None when nothing is held."""
        ids, attempts = self.held()
        if not ids:
            return None
        return HeartbeatParams(worker=self.worker_id, ids=ids, attempts=attempts)

    def maintenance(self) -> list[tuple[Step, Callable[[Sequence[Any]], None]]]:
        """The statements of a :class:`Maintain` action, in order, each with its reader."""
        ids, _ = self.held()
        return [
            # Never reclaim what runs here, even if its heartbeat is late.
            (Step(self.reclaim_statement, ReclaimParams(held=ids)), self.reclaimed),
            (
                Step(self._limits_statement, LimitedTasksParams(tasks=self.plan.task_names)),
                self.limits_read,
            ),
            (
                Step(self._controls_statement, ControlledTasksParams(tasks=self.plan.task_names)),
                self.controls_read,
            ),
            (Step(self._cleanup_statement, CleanupParams(limit=CLEANUP_BATCH)), self.cleaned_up),
            (
                Step(
                    self._orphan_sweep_statement,
                    SweepParams(after=self._sweep_after, limit=SWEEP_KEYS),
                ),
                self.swept,
            ),
        ]

    def cleaned_up(self, rows: Sequence[Any]) -> None:
        """Parked executions were deleted: their keys get a promotion in the next unit."""
        keys = {row[0] for row in rows if row[0] is not None}
        if keys:
            self._restore_keys(keys)
            self._next_poll = 0.0

    def swept(self, rows: Sequence[Any]) -> None:
        """A slice of the waiting keys was visited: resume after it, or from the start."""
        for row in rows:
            self._sweep_after = row.last_key or ""
            if row.promoted:
                log.info("promoted %d waiting job(s) whose key had nothing ahead", row.promoted)
                self._next_poll = 0.0

    def limits_read(self, rows: Sequence[Any]) -> None:
        """Stored limits were read: claim with slots while any of our tasks has a limit."""
        self.stored_limits = {row.task for row in rows}
        limited = bool(self.declared_limits) or bool(rows)
        if limited != self.limited:
            log.info(
                "concurrency limits %s for this worker's tasks",
                "apply" if limited else "no longer apply",
            )
        self.limited = limited

    def controls_read(self, rows: Sequence[Any]) -> None:
        """Pauses and rate limits were read: a paused task is no longer claimed (its running
        jobs finish), a rate-limited one is claimed on its own; the rest are unaffected."""
        paused = {row.task for row in rows if row.paused}
        rated = {row.task for row in rows if row.rated and not row.paused}
        for task in sorted(paused - self.paused):
            log.info("task %s is paused: not claiming it", task)
        for task in sorted(self.paused - paused):
            log.info("task %s was resumed", task)
        for task in sorted(rated - self.rated):
            log.info("task %s has a rate limit: claiming it within its window", task)
        self.paused, self.rated = paused, rated
        for gone in set(self._rated_poll) - rated:
            self._rated_poll.pop(gone, None)
            self._rated_full_until.pop(gone, None)
            self._rated_empty.discard(gone)
            self._rate_limits.pop(gone, None)
        for task in rated:
            self._rated_poll.setdefault(task, 0.0)
        self._limits_changed({row.task: _stored_rate(row) for row in rows if row.task in rated})
        tasks = [name for name in self.plan.task_names if name not in paused | rated]
        if tasks != self._claim_params["tasks"]:
            self._claim_params["tasks"] = tasks
            # A task back in the plain claim may have work waiting.
            self._next_poll = 0.0
            self._last_claim_empty = False

    def _limits_changed(self, limits: dict[str, tuple[Any, Any]]) -> None:
        """Claim a rated task whose stored limit changed at once, even if the old limit
        filled its window: the claim reads the window again under the new limit."""
        for task, limit in limits.items():
            before = self._rate_limits.get(task)
            self._rate_limits[task] = limit
            if before is not None and before != limit:
                log.info("task %s has a new rate limit: claiming it under that", task)
                self._rated_full_until.pop(task, None)
                self._rated_poll[task] = 0.0

    def reclaimed(self, rows: Sequence[Any]) -> None:
        """Log what a reclaim sweep returned to the queue."""
        notify_lost(self.settings.observers, [r.task for r in rows])
        if rows:
            log.warning(
                "reclaimed %d lost execution(s) of dead workers: %s",
                len(rows),
                [(r.id, r.task) for r in rows],
            )
            self._next_poll = 0.0

    @property
    def running_count(self) -> int:
        """Handlers running now."""
        with self._lock:
            return sum(1 for r in self._running.values() if not r.released)


def _stored_rate(row: Any) -> tuple[Any, Any]:
    """A control row's stored limit, ``(rate_max, rate_seconds)``."""
    return getattr(row, "rate_max", None), getattr(row, "rate_seconds", None)
