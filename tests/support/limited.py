"""Concurrency-limited tasks of the test app, on the same queue.

Worker subprocesses use ``tests.support.limited:queue`` so that importing this module
registers these tasks before the worker starts.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from sqla_queue import JobContext
from tests.support.app import log_interval, queue

__all__ = ["limited1", "limited2", "limited3", "queue"]


def _timed(ctx: JobContext[Session], pause: float) -> None:
    started = time.time()
    if pause:
        time.sleep(pause)
    log_interval(ctx.session, ctx, started, key=ctx.task)


@queue.task(name="limited1", pass_context=True, concurrency_limit=1)
def limited1(ctx: JobContext[Session], pause: float = 0.0) -> None:
    """At most one at a time, across all workers."""
    _timed(ctx, pause)


@queue.task(name="limited2", pass_context=True, concurrency_limit=2)
def limited2(ctx: JobContext[Session], pause: float = 0.0) -> None:
    """At most two at a time."""
    _timed(ctx, pause)


@queue.task(name="limited3", pass_context=True, concurrency_limit=3)
def limited3(ctx: JobContext[Session], pause: float = 0.0) -> None:
    """At most three at a time."""
    _timed(ctx, pause)
