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


@contextmanager
def graceful_signals(on_first: Callable[[], None], *, enabled: bool = True) -> Iterator[None]:
    """Call ``on_first`` on the first SIGINT/SIGTERM; exit at once on the second.

    The forced exit skips the hand-back of running jobs; the reclaimer returns them to the
    queue after their lost interval. Outside the main thread signals cannot be handled, so
    nothing is installed there.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    received = 0

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        name = signal.Signals(signum).name
        if received == 1:
            log.warning("%s received: finishing running jobs (send again to exit now)", name)
            on_first()
        else:
            log.error("%s received again: exiting now; unfinished jobs will be reclaimed", name)
            os._exit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
