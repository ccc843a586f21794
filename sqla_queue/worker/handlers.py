"""Running handlers: the call, and its outcome.

Both faces use these. A :class:`HandlerRunner` calls a handler with the arguments the
decider decoded at claim time, turns its return value or exception into an
:class:`~sqla_queue.logic.outcomes.Outcome` (encoded here, once, off the run loop), and
hands that to the decider in one call. Where handlers run (threads, a private loop) is
:mod:`sqla_queue.worker.executors`; their sessions are :mod:`sqla_queue.worker.sessions`.

The runner is also where the worker's observers (:mod:`sqla_queue.instrumentation`) hear
an attempt start and finish, in the thread or task that runs the handler, and where every
log record about a job gets its ``job_id``, ``task`` and ``attempt`` as ``extra`` fields.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from sqla_queue.conversation import drive, drive_async
from sqla_queue.durable.run import JobSuspended
from sqla_queue.instrumentation import WorkerObserver, combine_observers, job_log_fields
from sqla_queue.logic.outcomes import (
    ClaimedJob,
    InvalidOutcomeError,
    Outcome,
    OutcomeKind,
    check_outcome,
    outcome_for_error,
    outcome_for_return,
    sanitize_text,
)
from sqla_queue.worker.attempt_ends import (
    describe,
    observer_of,
    plain_failure,
    suspended_outcome,
)
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.plan import TaskRuntime
from sqla_queue.worker.sessions import (
    InTransaction,
    aborted_or,
    close_abandoned_sessions,
    close_async_sessions,
    close_sync_sessions,
    roll_back_sync,
)

__all__ = ["HandlerRunner", "RunningJob", "stops_the_process"]

log = logging.getLogger("sqla_queue.worker")

#: Longest ``repr`` kept in place of a result that JSON cannot hold.
MAX_RESULT_REPR = 10_000


@dataclass(eq=False)
class RunningJob:
    """One claimed execution on its way through a handler.

    The decider builds it when the claim returns, with the payload already decoded, and
    forgets it when the outcome is recorded or the job is released at shutdown.
    """

    job: ClaimedJob
    runtime: TaskRuntime
    args: list[Any]
    kwargs: dict[str, Any]
    context: JobContext[Any] | None
    #: Handed back to the queue at shutdown: a late outcome is dropped.
    released: bool = field(default=False)
    #: A heartbeat brought a cancel request for this job (see :meth:`request_cancel`).
    cancel_requested: bool = field(default=False)
    #: The asyncio task running an ``async def`` handler, and its loop.
    task: asyncio.Task[None] | None = field(default=None)
    loop: asyncio.AbstractEventLoop | None = field(default=None)
    #: The handler has returned or raised: a late cancel must not interrupt the rest
    #: (its completion and commit, for a transactional task).
    handler_done: bool = field(default=False)
    #: When the claim returned it (``time.monotonic()``): the part of its queue wait
    #: spent in this worker, the only part known while the claim returns no due time.
    claimed_at: float = field(default_factory=time.monotonic)

    def request_cancel(self) -> None:
        """The job was cancelled while it ran: tell the handler. Any thread may call.

        The context's flag and event are set; an ``async def`` handler's task is also
        cancelled, so it sees ``CancelledError`` at its next ``await``. A sync handler
        only sees the flag: a thread cannot be interrupted safely.
        """
        if self.cancel_requested:
            return
        self.cancel_requested = True
        if self.context is not None:
            self.context.notify_cancel()
        loop = self.loop
        if loop is not None:
            loop.call_soon_threadsafe(self._interrupt)

    def _interrupt(self) -> None:
        # On the handler's loop, so it is ordered with the handler's return: a cancel that
        # comes after it is left to the outcome (see HandlerRunner._cancelled_or).
        if self.task is not None and not self.handler_done:
            self.task.cancel()


def stops_the_process(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a handler, asks the process to stop.

    ``KeyboardInterrupt`` and ``SystemExit`` do: the worker records the attempt, then
    stops as on SIGTERM and ``run()`` raises the exception. Any other exception, even
    another ``BaseException``, is only the attempt's failure.
    """
    return isinstance(exc, KeyboardInterrupt | SystemExit)


class HandlerRunner:
    """Calls handlers and reports each outcome to ``record``, exactly once per call.

    Nothing a handler returns or raises escapes: each call ends in one recorded outcome,
    built here and encoded once. An outcome that cannot be stored as it is (see
    :func:`~sqla_queue.logic.outcomes.check_outcome`) becomes a failed attempt that names
    the reason, and the task's retry policy and ``max_attempts`` apply to it as to any
    failure. ``clock`` stamps error entries; ``worker_id`` names the worker in them.
    ``stop`` is called (after the outcome is recorded) when a handler raised
    ``KeyboardInterrupt`` or ``SystemExit``. ``observer`` hears each call start and finish
    (see :mod:`sqla_queue.instrumentation`); by default, the observers of the settings of
    the worker decider that ``record`` belongs to.
    """

    def __init__(
        self,
        *,
        worker_id: uuid.UUID,
        clock: Callable[[], dt.datetime],
        record: Callable[[RunningJob, Outcome], None],
        stop: Callable[[BaseException], None] | None = None,
        transaction: InTransaction | None = None,
        settle: Callable[[RunningJob, Outcome, bool], None] | None = None,
        observer: WorkerObserver | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.clock = clock
        self.record = record
        self.stop = stop
        self.transaction = transaction
        self.settle = settle
        # Guarded (CompositeObserver): an observer that raises must not lose the job.
        self.observer = (
            combine_observers([observer]) if observer is not None else observer_of(record)
        )

    def call_arguments(self, running: RunningJob) -> list[Any]:
        """The positional arguments of the call: the context first when the task asks."""
        if running.runtime.pass_context:
            return [running.context, *running.args]
        return running.args

    def run_sync(self, running: RunningJob) -> None:
        """Call a ``def`` handler and record what happened. Never raises."""
        raised: BaseException | None = None
        applied: bool | None = None
        began = self._started(running)
        try:
            # A prefetched job cancelled while it was held for a seat never starts.
            held_back = running.cancel_requested
            try:
                if not held_back:
                    value = running.runtime.handler(*self.call_arguments(running), **running.kwargs)
            except JobSuspended as suspended:
                until = suspended.suspension.until
                outcome, applied = suspended_outcome(running.job, until), True
            except BaseException as exc:  # SystemExit too: recorded, then a graceful stop
                raised = exc
                outcome = self.outcome_of_error(running, exc)
            else:
                outcome = (
                    Outcome(running.job.id, running.job.attempt, OutcomeKind.CANCELLED)
                    if held_back
                    else self.outcome_of_return(running, value)
                )
            if applied is None:
                outcome = self._cancelled_or(running, outcome)
            if applied is None and self._commits_with_handler(running, outcome, raised):
                settled = self._complete_in_session_sync(running, outcome)
                if isinstance(settled, Outcome):
                    outcome = settled
                else:
                    applied = settled
        finally:
            close_sync_sessions(running.context, running.job)
        self._finished(running, outcome.kind, raised, began)
        if applied is not None:
            self._settled(running, outcome, applied)
        else:
            self._report(running, outcome, raised)

    async def run_async(self, running: RunningJob) -> None:
        """Await an ``async def`` handler and record what happened. Never raises, except
        the cancellation of its own task (the worker's shutdown), which records nothing:
        the job was released already.

        A ``CancelledError`` the handler raises on its own (its task was not cancelled) is
        a failed attempt like any other exception. ``KeyboardInterrupt`` and
        ``SystemExit`` are recorded too, then stop the worker, instead of tearing down the
        event loop under it. A run closed before it ends (``GeneratorExit``: its loop was
        stopped at shutdown and the task garbage-collected) records nothing either.
        """
        raised: BaseException | None = None
        applied: bool | None = None
        running.task = asyncio.current_task()
        running.loop = asyncio.get_running_loop()
        began = self._started(running)
        closing = False
        try:
            try:
                if running.cancel_requested:  # cancelled before it could start
                    raise asyncio.CancelledError
                value = await running.runtime.handler(
                    *self.call_arguments(running), **running.kwargs
                )
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if running.cancel_requested and task is not None:
                    # Our own cancel (the job's): the handler stopped, as asked. Take the
                    # cancellation back so that closing its session can still await.
                    while task.cancelling():
                        task.uncancel()
                elif task is not None and task.cancelling():
                    # The worker's shutdown: the job was handed back. The observers
                    # still hear the attempt end, or a span would stay open forever.
                    self._finished(running, OutcomeKind.RELEASE, exc, began, shutdown=True)
                    raise
                raised = exc
                outcome = self.outcome_of_error(running, exc)
            except GeneratorExit:
                raise  # not the handler's failure: see below
            except JobSuspended as suspended:
                until = suspended.suspension.until
                outcome, applied = suspended_outcome(running.job, until), True
            except BaseException as exc:
                raised = exc
                outcome = self.outcome_of_error(running, exc)
            else:
                outcome = self.outcome_of_return(running, value)
            running.handler_done = True
            if applied is None:
                outcome = self._cancelled_or(running, outcome)
            if applied is None and self._commits_with_handler(running, outcome, raised):
                settled = await self._complete_in_session_async(running, outcome)
                if isinstance(settled, Outcome):
                    outcome = settled
                else:
                    applied = settled
        except GeneratorExit:
            # Closed in the handler or in its commit, never to resume.
            closing = True
            self._abandoned(running, began)
            raise
        finally:
            if closing:
                close_abandoned_sessions(running.context)  # a closing coroutine may not await
            else:
                await close_async_sessions(running.context, running.job)
        self._finished(running, outcome.kind, raised, began)
        if applied is not None:
            self._settled(running, outcome, applied)
        else:
            self._report(running, outcome, raised)

    def _abandoned(self, running: RunningJob, began: float) -> None:
        """An ``async def`` handler's run is closed before it ended: its loop was stopped
        under it (a sync worker's, at shutdown, past a cancellation the handler ignored)
        and the task is being garbage-collected. The attempt did not fail: its job was
        handed back. No outcome, no failure in the log; the observers hear that the attempt
        ended as a hand-back, as for a handler that the shutdown cancelled.
        """
        log.debug(
            "job %s (%s) attempt %s: its abandoned handler was closed",
            running.job.id,
            running.job.task,
            running.job.attempt,
            extra=job_log_fields(running.job),
        )
        self._finished(running, OutcomeKind.RELEASE, None, began, shutdown=True)

    def _started(self, running: RunningJob) -> float:
        """Tell the observers an attempt starts; the clock reading its duration starts from.

        A transactional task's context watches its session for errors from here on (see
        :func:`~sqla_queue.worker.sessions.aborted_or`).
        """
        if running.runtime.transactional and running.context is not None:
            running.context._arm_error_watch()
        began = time.perf_counter()
        observer = self.observer
        if observer is not None:
            observer.job_started(running.job, self.queue_wait(running))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job %s (%s) attempt %s started",
                running.job.id,
                running.job.task,
                running.job.attempt,
                extra=job_log_fields(running.job),
            )
        return began

    def _finished(
        self,
        running: RunningJob,
        kind: OutcomeKind,
        raised: BaseException | None,
        began: float,
        *,
        shutdown: bool = False,
    ) -> None:
        """Tell the observers the attempt ended, before its outcome reaches the decider.

        Before, so that an observer's view is never behind the database's: once a job's
        outcome is written, its metrics and span are already there.
        """
        duration = time.perf_counter() - began
        observer = self.observer
        if observer is not None:
            observer.job_finished(running.job, kind, duration, raised)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job %s (%s) attempt %s: %s after %.3fs%s",
                running.job.id,
                running.job.task,
                running.job.attempt,
                kind.value,
                duration,
                " (the worker is stopping)" if shutdown else "",
                extra=job_log_fields(running.job),
            )

    def queue_wait(self, running: RunningJob) -> float:
        """Seconds ``running``'s job waited to start since it became due.

        Measured from the execution's due time when the claim returns it (a
        ``ClaimedJob.execute_at``), on this worker's clock; else only the time since
        the claim, a lower bound.
        """
        due = getattr(running.job, "execute_at", None)
        if isinstance(due, dt.datetime):
            return max(0.0, (self.clock() - due).total_seconds())
        return max(0.0, time.monotonic() - running.claimed_at)

    def _commits_with_handler(
        self, running: RunningJob, outcome: Outcome, raised: BaseException | None
    ) -> bool:
        return (
            running.runtime.transactional
            and raised is None
            and outcome.kind in InTransaction.KINDS
            and self.transaction is not None
            and running.context is not None
        )

    def _complete_in_session_sync(self, running: RunningJob, outcome: Outcome) -> Outcome | bool:
        """Commit ``outcome`` with the handler's writes; once that is settled, whether the
        completion applied (``False``: fenced off, rolled back).

        A failure to write or commit is the attempt's failure, returned for the ordinary
        (buffered) path: if the commit did happen after all, that failure is fenced off.
        """
        assert self.transaction is not None
        assert running.context is not None
        session = running.context.session
        caught = running.context._caught_error()
        try:
            rows: Sequence[Any] = []
            for statement, params in self.transaction.steps(outcome):
                rows = session.execute(statement, params).all()
            applied = self.transaction.applied(rows, running.job.id)
            if applied:
                flow = self.transaction.after(running.job, running.context)
                if flow is not None:
                    drive(session.connection(), flow)
                session.commit()
            else:
                session.rollback()
        except Exception as exc:
            roll_back_sync(session, running.job)
            return self._commit_failed(running, aborted_or(exc, caught))
        return applied

    async def _complete_in_session_async(
        self, running: RunningJob, outcome: Outcome
    ) -> Outcome | bool:
        """:meth:`_complete_in_session_sync` for an ``AsyncSession``.

        An ``async def`` handler of a sync worker has a sync ``Session``: that one is
        completed as the sync path does.
        """
        assert self.transaction is not None
        assert running.context is not None
        session = running.context.session
        if not isinstance(session, AsyncSession):
            return self._complete_in_session_sync(running, outcome)
        caught = running.context._caught_error()
        try:
            rows: Sequence[Any] = []
            for statement, params in self.transaction.steps(outcome):
                rows = (await session.execute(statement, params)).all()
            applied = self.transaction.applied(rows, running.job.id)
            if applied:
                flow = self.transaction.after(running.job, running.context)
                if flow is not None:
                    await drive_async(await session.connection(), flow)
                await session.commit()
            else:
                await session.rollback()
        except Exception as exc:
            try:
                await session.rollback()
            except Exception:
                log.debug(
                    "rolling back job %s's session failed",
                    running.job.id,
                    exc_info=True,
                    extra=job_log_fields(running.job),
                )
            return self._commit_failed(running, aborted_or(exc, caught))
        return applied

    def _commit_failed(self, running: RunningJob, exc: BaseException) -> Outcome:
        log.warning(
            "job %s (%s): its transaction could not be committed: %s",
            running.job.id,
            running.job.task,
            exc,
            extra=job_log_fields(running.job),
        )
        return self.outcome_of_error(running, exc)

    def _settled(self, running: RunningJob, outcome: Outcome, applied: bool) -> None:
        # The decider logs a fenced outcome, as it does for the buffered ones.
        if self.settle is not None:
            self.settle(running, outcome, applied)

    def _cancelled_or(self, running: RunningJob, outcome: Outcome) -> Outcome:
        """``outcome``, unless the handler ended after it was told of a cancel request.

        Then the job ends ``cancelled`` (whatever it returned or raised, even a success:
        it was told to stop, and it stopped), keeping the error the attempt raised, if
        any, in the job's history. A request the worker had not delivered yet is the
        completion statement's to apply: it ends any outcome but a success ``cancelled``.
        """
        if not running.cancel_requested or outcome.kind is OutcomeKind.CANCELLED:
            return outcome
        log.info(
            "job %s (%s) stopped after it was cancelled",
            running.job.id,
            running.job.task,
            extra=job_log_fields(running.job),
        )
        return Outcome(
            running.job.id, running.job.attempt, OutcomeKind.CANCELLED, error=outcome.error
        )

    def _report(self, running: RunningJob, outcome: Outcome, raised: BaseException | None) -> None:
        self.record(running, outcome)
        if raised is not None and stops_the_process(raised) and self.stop is not None:
            self.stop(raised)

    def outcome_of_return(self, running: RunningJob, value: Any) -> Outcome:
        """The outcome of a handler that returned ``value``, checked and encoded.

        A result JSON cannot hold (a set, a NaN) is kept as its ``repr``. A result that
        cannot be stored (a NUL, a lone surrogate, nested too deep) or a reschedule beyond
        the latest due time is a failed attempt with the reason. Never raises.
        """
        try:
            outcome = outcome_for_return(running.job, value)
            try:
                check_outcome(outcome, self.clock())
            except InvalidOutcomeError:
                raise
            except (TypeError, ValueError):
                if outcome.kind is not OutcomeKind.SUCCEEDED:
                    raise
                outcome = self._repr_stand_in(running, value)
        except Exception as exc:
            return self._failed_attempt(running, exc)
        return outcome

    def _repr_stand_in(self, running: RunningJob, value: Any) -> Outcome:
        log.warning(
            "job %s (%s) returned a value that is not JSON; storing its repr",
            running.job.id,
            running.job.task,
            extra=job_log_fields(running.job),
        )
        text, _ = sanitize_text(repr(value)[:MAX_RESULT_REPR])
        outcome = outcome_for_return(running.job, {"repr": text})
        check_outcome(outcome, self.clock())
        return outcome

    def outcome_of_error(self, running: RunningJob, exc: BaseException) -> Outcome:
        """The outcome of a handler that raised ``exc``, checked and encoded. Never raises.

        A ``Retry`` or ``Reschedule`` whose next run falls after the latest due time is a
        failed attempt with the reason instead.
        """
        try:
            outcome = outcome_for_error(
                running.job,
                exc,
                policy=running.runtime.retry,
                worker_id=self.worker_id,
                now=self.clock(),
            )
            check_outcome(outcome, self.clock())
        except Exception as problem:
            return self._failed_attempt(running, problem, cause=exc)
        self._log_error(running, outcome, type(exc).__name__)
        return outcome

    def _failed_attempt(
        self, running: RunningJob, problem: Exception, cause: BaseException | None = None
    ) -> Outcome:
        """A failed attempt of ``running``'s job, because its outcome could not be built.

        The retry policy and ``max_attempts`` apply. If even that outcome cannot be
        stored (a retry policy whose delay is out of range), the job fails for good.
        """
        if not isinstance(problem, InvalidOutcomeError):
            message = f"the outcome of this attempt could not be built: {describe(problem)}"
            reason: Exception = InvalidOutcomeError(message)
            reason.__cause__ = problem
        else:
            reason = problem
            if cause is not None and reason.__cause__ is None:
                reason.__cause__ = cause
        now = self.clock()
        try:
            outcome = outcome_for_error(
                running.job, reason, policy=running.runtime.retry, worker_id=self.worker_id, now=now
            )
            check_outcome(outcome, now)
        except Exception:
            outcome = plain_failure(running.job, reason, worker_id=self.worker_id, now=now)
        self._log_error(running, outcome, type(reason).__name__)
        return outcome

    def _log_error(self, running: RunningJob, outcome: Outcome, raised: str) -> None:
        level = logging.ERROR if outcome.kind is OutcomeKind.FAILED else logging.WARNING
        message = outcome.error["message"] if outcome.error else ""
        log.log(
            level,
            "job %s (%s) attempt %s (max_attempts %s) raised %s: %s -> %s",
            running.job.id,
            running.job.task,
            running.job.attempt,
            running.job.max_attempts,
            raised,
            message,
            outcome.kind.value,
            extra=job_log_fields(running.job),
        )
