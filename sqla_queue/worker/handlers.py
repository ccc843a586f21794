"""Running handlers: the call, its outcome, and the threads and loop they run on.

Both faces use these. A :class:`HandlerRunner` calls a handler with the arguments the core
decoded at claim time, turns its return value or exception into an
:class:`~sqla_queue.core.outcomes.Outcome` (encoded here, once, off the run loop), and
hands that to the core in one call. Handler threads are daemons on purpose: after
``shutdown_timeout`` a stuck handler must not keep the process alive; its job has been
handed back already.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import queue as queue_module
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sqla_queue.core.outcomes import (
    ClaimedJob,
    Outcome,
    OutcomeKind,
    outcome_for_error,
    outcome_for_return,
    outcome_refused,
)
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.plan import TaskRuntime

__all__ = ["HandlerPool", "HandlerRunner", "PrivateLoop", "RunningJob"]

log = logging.getLogger("sqla_queue.worker")

#: Longest ``repr`` kept in place of a result that JSON cannot hold.
MAX_RESULT_REPR = 10_000


@dataclass(eq=False)
class RunningJob:
    """One claimed execution on its way through a handler.

    The core builds it when the claim returns, with the payload already decoded, and
    forgets it when the outcome is recorded or the job is released at shutdown.
    """

    job: ClaimedJob
    runtime: TaskRuntime
    args: list[Any]
    kwargs: dict[str, Any]
    context: JobContext[Any] | None
    #: Handed back to the queue at shutdown: a late outcome is dropped.
    released: bool = field(default=False)


class HandlerRunner:
    """Calls handlers and reports each outcome to ``record``, exactly once per call.

    ``clock`` stamps error entries; ``worker_id`` names the worker in them.
    """

    def __init__(
        self,
        *,
        worker_id: uuid.UUID,
        clock: Callable[[], dt.datetime],
        record: Callable[[RunningJob, Outcome], None],
    ) -> None:
        self.worker_id = worker_id
        self.clock = clock
        self.record = record

    def call_arguments(self, running: RunningJob) -> list[Any]:
        """The positional arguments of the call: the context first when the task asks."""
        if running.runtime.pass_context:
            return [running.context, *running.args]
        return running.args

    def run_sync(self, running: RunningJob) -> None:
        """Call a ``def`` handler and record what happened. Never raises."""
        try:
            value = running.runtime.handler(*self.call_arguments(running), **running.kwargs)
        except BaseException as exc:  # a handler's SystemExit must not kill its thread silently
            outcome = self.outcome_of_error(running, exc)
        else:
            outcome = self.outcome_of_return(running, value)
        finally:
            _close_sync_session(running)
        self.record(running, outcome)

    async def run_async(self, running: RunningJob) -> None:
        """Await an ``async def`` handler and record what happened.

        A cancellation (the worker's loop shutting down) propagates and records nothing:
        the job was released already.
        """
        try:
            value = await running.runtime.handler(*self.call_arguments(running), **running.kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outcome = self.outcome_of_error(running, exc)
        else:
            outcome = self.outcome_of_return(running, value)
        finally:
            await _close_async_session(running)
        self.record(running, outcome)

    def outcome_of_return(self, running: RunningJob, value: Any) -> Outcome:
        """The outcome of a handler that returned ``value``, encoded for the completion.

        A result JSON cannot hold is kept as its ``repr``.
        """
        outcome = outcome_for_return(running.job, value)
        try:
            outcome.encoded  # noqa: B018 - encode now, in this thread, exactly once
        except (TypeError, ValueError):
            if outcome.kind is not OutcomeKind.SUCCEEDED:
                return self._unencodable(running, outcome)
            log.warning(
                "job %s (%s) returned a value that is not JSON; storing its repr",
                running.job.id,
                running.job.task,
            )
            outcome = outcome_for_return(running.job, {"repr": repr(value)[:MAX_RESULT_REPR]})
            return self._encoded(running, outcome)
        return outcome

    def outcome_of_error(self, running: RunningJob, exc: BaseException) -> Outcome:
        """The outcome of a handler that raised ``exc``, encoded for the completion."""
        outcome = outcome_for_error(
            running.job,
            exc,
            policy=running.runtime.retry,
            worker_id=self.worker_id,
            now=self.clock(),
        )
        level = logging.ERROR if outcome.kind is OutcomeKind.FAILED else logging.WARNING
        log.log(
            level,
            "job %s (%s) attempt %s (max_attempts %s) raised %s: %s -> %s",
            running.job.id,
            running.job.task,
            running.job.attempt,
            running.job.max_attempts,
            type(exc).__name__,
            exc,
            outcome.kind.value,
        )
        return self._encoded(running, outcome)

    def _encoded(self, running: RunningJob, outcome: Outcome) -> Outcome:
        try:
            outcome.encoded  # noqa: B018 - encode now, in this thread, exactly once
        except (TypeError, ValueError):
            return self._unencodable(running, outcome)
        return outcome

    def _unencodable(self, running: RunningJob, outcome: Outcome) -> Outcome:
        """An outcome JSON cannot hold (a NaN delay, say) becomes the job's failure."""
        error = ValueError(f"the {outcome.kind.value} outcome of this attempt cannot be stored")
        log.error("job %s (%s): %s", running.job.id, running.job.task, error)
        return outcome_refused(running.job, error, worker_id=self.worker_id, now=self.clock())


def _close_sync_session(running: RunningJob) -> None:
    ctx = running.context
    session = ctx._take_session() if ctx is not None else None
    if session is not None:
        try:
            session.close()
        except Exception:
            log.exception("closing the handler's session of job %s failed", running.job.id)


async def _close_async_session(running: RunningJob) -> None:
    ctx = running.context
    session = ctx._take_session() if ctx is not None else None
    if session is not None:
        try:
            result = session.close()
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            log.exception("closing the handler's session of job %s failed", running.job.id)


class HandlerPool:
    """A fixed set of daemon threads running submitted callables."""

    def __init__(self, size: int, name: str = "sqla-queue-handler") -> None:
        self._tasks: queue_module.SimpleQueue[Callable[[], None] | None] = (
            queue_module.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            try:
                item()
            except BaseException:
                log.exception("a handler thread caught an unexpected error")

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the next free thread."""
        self._tasks.put(fn)

    def close(self) -> None:
        """Let the threads exit once their current call returns; does not wait for them."""
        for _ in self._threads:
            self._tasks.put(None)


class PrivateLoop:
    """An event loop in its own daemon thread, for ``async def`` handlers of a sync worker."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="sqla-queue-async-handlers", daemon=True
        )
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, None]) -> None:
        """Schedule ``coro`` (a handler run that records its own outcome) on the loop."""
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Stop the loop; unfinished handlers are abandoned (their jobs were released)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
