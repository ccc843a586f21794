"""The one base of every thread a worker runs beside its claim loop.

The heartbeater, the LISTEN connection, the workers registry, the periodic scheduler, the
history maintainer and the daemon supervisor each run one loop on a daemon thread of their
own, and the worker drives them all alike: :meth:`WorkerThread.start` when it starts,
:meth:`WorkerThread.request_stop` and :meth:`WorkerThread.join` (with a timeout) when it
stops. Inside, a loop pauses between its steps with :meth:`WorkerThread.pause`, which ends
early on a stop request or a wake-up (:meth:`WorkerThread.wake`), and, for the threads that
end with the worker's graceful stop rather than at ``request_stop``, on the worker's stop
flag too.

How a failed step is reported stays each thread's own business (a heartbeat tells the
worker, which may stop; a registry beat is logged and retried), so the base catches
nothing: :func:`backoff` is the delay they share before trying again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

__all__ = ["MAX_BACKOFF_DOUBLINGS", "WorkerThread", "backoff"]

#: Doublings of a backoff delay after which it stops growing (before its cap).
MAX_BACKOFF_DOUBLINGS = 6


def backoff(base: float, failures: int, *, cap: float) -> float:
    """Seconds to wait after ``failures`` failures in a row: ``base`` doubled per failure
    (at most :data:`MAX_BACKOFF_DOUBLINGS` times), never over ``cap``."""
    return min(cap, base * 2.0 ** min(failures, MAX_BACKOFF_DOUBLINGS))


class WorkerThread:
    """A loop on a daemon thread of its own, started and stopped with its worker.

    A subclass names its thread (:attr:`thread_name`) and writes :meth:`_run`, the thread's
    body, which loops until :meth:`stopping` (usually through :meth:`repeat`). It may
    override :meth:`_wanted` to start no thread when it has nothing to do.

    ``stop_flag`` is the worker's: set when a graceful stop begins. A thread given it ends
    then, at its next turn (or, with :attr:`flag_poll`, within that many seconds of a
    pause); one not given it runs until :meth:`request_stop`, as the heartbeater must while
    running jobs finish.
    """

    #: The thread's name, as logs, ``threading.enumerate()`` and profiles show it.
    thread_name: ClassVar[str] = "sqla-queue-thread"
    #: While pausing, seconds between looks at the worker's stop flag; None: the flag is
    #: looked at between steps only (a pause then ends on a stop request or wake-up).
    flag_poll: ClassVar[float | None] = None

    def __init__(self, *, stop_flag: threading.Event | None = None) -> None:
        self._stop_flag = stop_flag
        #: Set by :meth:`request_stop`, never cleared.
        self._halt = threading.Event()
        #: Set by :meth:`wake` and :meth:`request_stop`; a pause that sees it clears it.
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- driven by the worker -------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (a daemon thread); return at once. Starts once, or never when
        the subclass has nothing to do."""
        if self._thread is not None or not self._wanted():
            return
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to end after the step under way; a pause under way ends at once."""
        self._halt.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end (at once if never started)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """End the pause under way (or the next one) early: there is something to do."""
        self._wake.set()

    def is_alive(self) -> bool:
        """Whether the thread has started and not yet ended."""
        return self._thread is not None and self._thread.is_alive()

    # -- used by the loop -----------------------------------------------------------------

    def stopping(self) -> bool:
        """Whether the loop should end: a stop was requested, or the worker's stop flag
        (when this thread was given it) is set."""
        return self._halt.is_set() or (self._stop_flag is not None and self._stop_flag.is_set())

    def pause(self, seconds: float) -> bool:
        """Wait up to ``seconds`` between two steps; return :meth:`stopping`.

        Ends early on a stop request or a wake-up, and, with :attr:`flag_poll`, within
        that many seconds of the worker's stop flag (without one, the flag does not end a
        pause, even when set before it began). A pause of 0 only looks.
        """
        poll = self.flag_poll if self._stop_flag is not None else None
        # Without a poll the flag waits for the next turn, even when it is set already.
        looking: Callable[[], bool] = self._halt.is_set if poll is None else self.stopping
        left = seconds
        while left > 0 and not looking():
            step = left if poll is None else min(left, poll)
            if self.wait_for_wake(step):
                break
            left -= step
        return self.stopping()

    def wait_for_wake(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up (a stop request is one), whether or
        not stopping already; True when one came. It is taken: the next wait waits."""
        if self._wake.wait(timeout):
            self._wake.clear()
            return True
        return False

    def repeat(self, step: Callable[[], float | None], *, first_pause: float = 0.0) -> None:
        """Call ``step`` until :meth:`stopping`: after ``first_pause`` seconds, then after
        the pause each call returns. A call that returns None ends the loop."""
        wait: float | None = first_pause
        while wait is not None and not self.pause(wait):
            wait = step()

    # -- written by a subclass ------------------------------------------------------------

    def _wanted(self) -> bool:
        """Whether :meth:`start` starts the thread at all."""
        return True

    def _run(self) -> None:
        """The thread's body."""
        raise NotImplementedError
