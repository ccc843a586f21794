"""The graceful stop: asked for (a signal, ``stop()``), or made because the run must end."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqla_queue.errors import WorkerStoppedError
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.decider.running import RunningJobs

__all__ = ["Shutdown"]

log = logging.getLogger("sqla_queue.worker")


class Shutdown:
    """When the run stops claiming, how long its handlers get, and why it stopped.

    Thread-safe: it takes the decider's ``lock``; ``wake`` wakes the run loop.
    """

    def __init__(
        self,
        lock: threading.Lock,
        jobs: RunningJobs,
        timeout: float,
        stop_flag: threading.Event,
        wake: Callable[[], None],
    ) -> None:
        self._lock = lock
        self._jobs = jobs
        self._timeout = timeout
        self._stop_flag = stop_flag
        self._wake = wake
        #: Until when running handlers may finish, once a stop was requested.
        self.deadline: float | None = None
        #: Stop at once: the outcomes left cannot be written (their jobs return to the
        #: queue after their lost interval).
        self.give_up = False
        #: Why the worker stops on its own: a WorkerStoppedError (it cannot do its job) ...
        self.fatal: WorkerStoppedError | None = None
        #: ... or the KeyboardInterrupt/SystemExit a handler raised. ``run()`` raises it
        #: once every thread has stopped.
        self.raised: BaseException | None = None

    @property
    def stopping(self) -> bool:
        """True once a shutdown was requested."""
        return self.deadline is not None

    @property
    def stopped_by(self) -> BaseException | None:
        """What ``run()`` raises after its graceful stop, if the worker stopped on its own."""
        return self.raised or self.fatal

    def request(self, now: float) -> None:
        """Begin a graceful shutdown: stop claiming, tell handlers, start the timeout."""
        contexts: list[JobContext[Any]] = []
        with self._lock:
            if self.deadline is None:
                self.deadline = now + self._timeout
                self._stop_flag.set()
                contexts = self._jobs.contexts()
        for ctx in contexts:
            ctx.notify_shutdown()
        self._wake()

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
                self.give_up = True
        if first:
            log.error("%s", error)
        self.request(now)

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
        self.request(now)
