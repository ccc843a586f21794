"""Helpers to run a worker in a background thread and wait on database conditions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqla_queue import RunStats


@contextmanager
def worker_thread(worker: Any, *, join_timeout: float = 30.0) -> Iterator[list[RunStats]]:
    """Run ``worker.run()`` in a thread for the ``with`` block, then stop it gracefully."""
    stats: list[RunStats] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            stats.append(worker.run())
        except BaseException as exc:  # surfaced in the test thread below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        worker.stop()
        thread.join(join_timeout)
    assert not thread.is_alive(), "worker did not stop"
    if errors:
        raise errors[0]


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
