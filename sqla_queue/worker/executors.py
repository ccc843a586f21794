"""Where handlers run: a pool of daemon threads, and a private event loop for the
``async def`` handlers of a sync worker.

Handler threads are daemons on purpose: after ``shutdown_timeout`` a stuck handler must not
keep the process alive; its job has been handed back already.
"""

from __future__ import annotations

import asyncio
import logging
import queue as queue_module
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["CANCEL_GRACE", "HandlerPool", "PrivateLoop", "in_turn", "in_turn_async"]

J = TypeVar("J")

log = logging.getLogger("sqla_queue.worker")

#: Seconds a sync worker's private loop gives its cancelled handlers to end, at shutdown.
CANCEL_GRACE = 1.0


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
        self._busy: set[threading.Thread] = set()
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._tasks.get()
            if item is None:
                return
            self._busy.add(me)
            try:
                item()
            except BaseException:
                log.exception("a handler thread caught an unexpected error")
            finally:
                self._busy.discard(me)

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the next free thread."""
        self._tasks.put(fn)

    def close(self) -> None:
        """Let the threads exit once their current call returns; does not wait for them."""
        for _ in self._threads:
            self._tasks.put(None)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the idle threads to end (after
        :meth:`close`). A thread still running a handler is not waited for."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread not in self._busy:
                thread.join(max(0.0, deadline - time.monotonic()))


def in_turn(run: Callable[[J], None], follow_on: Callable[[J], J | None], first: J) -> None:
    """``run(first)``, then each job ``follow_on`` hands over as a seat frees, in this
    thread: a prefetched job starts without a trip through the run loop and a wake-up
    of another thread."""
    job: J | None = first
    while job is not None:
        run(job)
        job = follow_on(job)


async def in_turn_async(
    run: Callable[[J], Awaitable[None]], follow_on: Callable[[J], J | None], first: J
) -> None:
    """:func:`in_turn` for ``async def`` handlers, in this task."""
    job: J | None = first
    while job is not None:
        await run(job)
        job = follow_on(job)


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

    def close(self, timeout: float = 5.0) -> None:
        """Cancel the unfinished handlers, then stop the loop; wait up to ``timeout``
        seconds in all.

        Their jobs were released already; a cancelled handler ends as the asyncio worker's
        do at shutdown. One that ignores its cancellation for :data:`CANCEL_GRACE` seconds
        is abandoned: the loop stops under it.
        """
        deadline = time.monotonic() + timeout
        cancelled = asyncio.run_coroutine_threadsafe(_cancel_others(CANCEL_GRACE), self.loop)
        try:
            cancelled.result(min(timeout, CANCEL_GRACE + 0.5))
        except Exception:  # a handler blocks the loop: stop it all the same
            cancelled.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(max(0.0, deadline - time.monotonic()))


async def _cancel_others(grace: float) -> None:
    """Cancel every other task of the running loop; wait up to ``grace`` for them.

    A task still pending then is abandoned with a warning here, instead of asyncio's
    "Task was destroyed but it is pending!" error when it is garbage-collected.
    """
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        task._log_destroy_pending = False  # type: ignore[attr-defined]
    if pending:
        log.warning(
            "%d async handler(s) ignored their cancellation at shutdown; abandoned (their "
            "jobs were handed back)",
            len(pending),
        )
