"""Running handlers: daemon threads for ``def``, an event loop for ``async def``.

Both faces use these. Handler threads are daemons on purpose: after ``shutdown_timeout``
a stuck handler must not keep the process alive; its job has been handed back already.
"""

from __future__ import annotations

import asyncio
import logging
import queue as queue_module
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from sqla_queue.core.outcomes import Outcome
from sqla_queue.worker.core import WorkerCore, _Running

__all__ = ["HandlerPool", "PrivateLoop", "run_async_handler", "run_sync_handler"]

log = logging.getLogger("sqla_queue.worker")


def run_sync_handler(core: WorkerCore, running: _Running) -> Outcome:
    """Call a ``def`` handler and turn what happened into an outcome. Never raises."""
    try:
        fn, args, kwargs = core.call_arguments(running)
        value = fn(*args, **kwargs)
    except BaseException as exc:  # a handler's SystemExit must not kill its thread silently
        return core.outcome_of_error(running, exc)
    finally:
        _close_sync_session(running)
    return core.outcome_of_return(running, value)


async def run_async_handler(core: WorkerCore, running: _Running) -> Outcome:
    """Await an ``async def`` handler and turn what happened into an outcome."""
    try:
        fn, args, kwargs = core.call_arguments(running)
        value = await fn(*args, **kwargs)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return core.outcome_of_error(running, exc)
    finally:
        await _close_async_session(running)
    return core.outcome_of_return(running, value)


def _close_sync_session(running: _Running) -> None:
    ctx = running.context
    session = ctx._take_session() if ctx is not None else None
    if session is not None:
        try:
            session.close()
        except Exception:
            log.exception("closing the handler's session of job %s failed", running.job.id)


async def _close_async_session(running: _Running) -> None:
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

    def submit(self, coro: Coroutine[Any, Any, Outcome], done: Callable[[Outcome], None]) -> None:
        """Schedule ``coro`` on the loop and call ``done`` with its outcome."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)

        def finished(f: Any) -> None:
            if not f.cancelled():
                done(f.result())

        future.add_done_callback(finished)

    def close(self) -> None:
        """Stop the loop; unfinished handlers are abandoned (their jobs were released)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
