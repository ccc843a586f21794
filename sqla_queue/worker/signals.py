"""SIGINT/SIGTERM handling shared by both worker faces."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["graceful_signals"]

log = logging.getLogger("sqla_queue.worker")

#: The byte that ends the relay; a signal is sent as its own number, which is never 0.
_CLOSE = 0


class _Relay(threading.Thread):
    """Runs the first signal's callback on a thread of its own.

    A signal handler runs on the main thread between two bytecodes, possibly while that
    thread holds a lock the callback needs (the run loop's wake-up event, the decider's lock):
    taking it there would wait forever. The handler only writes a byte to a pipe, which
    takes no lock; this thread reads it and calls back, taking locks as any thread does.
    """

    def __init__(self, on_first: Callable[[], None]) -> None:
        super().__init__(name="sqla-queue-signals", daemon=True)
        self.on_first = on_first
        self.read_fd, self.write_fd = os.pipe()

    def run(self) -> None:
        """Call back once per signal until the close byte arrives."""
        try:
            while (byte := os.read(self.read_fd, 1)) and byte[0] != _CLOSE:
                name = signal.Signals(byte[0]).name
                log.warning("%s received: finishing running jobs (send again to exit now)", name)
                try:
                    self.on_first()
                except Exception:  # a failed stop request must not end the relay silently
                    log.exception("the graceful stop request failed")
        finally:
            os.close(self.read_fd)

    def relay(self, signum: int) -> None:
        """From the signal handler: ask for the callback (no lock taken)."""
        os.write(self.write_fd, bytes([signum]))

    def close(self) -> None:
        """Stop the relay thread and wait for it."""
        os.write(self.write_fd, bytes([_CLOSE]))
        self.join()
        os.close(self.write_fd)


@contextmanager
def graceful_signals(on_first: Callable[[], None], *, enabled: bool = True) -> Iterator[None]:
    """Call ``on_first`` on the first SIGINT/SIGTERM; exit at once on the second.

    ``on_first`` runs on a relay thread, soon after the signal, never inside the handler
    (see :class:`_Relay`). The forced exit skips the hand-back of running jobs; the
    reclaimer returns them to the queue after their lost interval. Outside the main thread
    signals cannot be handled, so nothing is installed there.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    received = 0
    relay = _Relay(on_first)
    relay.start()

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        if received == 1:
            relay.relay(signum)  # no logging here: the logging module takes locks too
        else:
            name = signal.Signals(signum).name
            message = f"{name} received again: exiting now; unfinished jobs will be reclaimed\n"
            os.write(2, message.encode())
            os._exit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        relay.close()
