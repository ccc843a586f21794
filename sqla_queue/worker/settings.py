"""Worker settings: one frozen value shared by the sync and async faces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs.

    Attributes:
        concurrency: handlers running at once in this process.
        batch_size: most executions one claim takes (default: ``concurrency``).
        tasks: names of the tasks this worker claims (default: every registered task).
            Workers of different services sharing a database leave each other's tasks alone.
        poll_interval: longest sleep between polls when nothing wakes the worker, seconds.
        shutdown_timeout: how long, after SIGTERM/SIGINT, running handlers may finish before
            their jobs are handed back to the queue.
        listen: LISTEN for enqueue notifications (default: the queue's ``notify``).
        heartbeat_interval: seconds between heartbeats (default: a quarter of the shortest
            lost interval of this worker's tasks).
        reclaim_interval: seconds between maintenance sweeps: lost jobs, re-reads of the
            stored concurrency limits, and keys whose next job is owed a promotion
            (default: half the shortest lost interval of this worker's tasks, at most 5 s).
        ack_delay: longest time, in seconds, a finished job's acknowledgement waits for others
            to share its statement while more handlers are still running (0: ack at once).
        verify_schema: check the database schema before the first claim.
        generic_plans: run the worker's transactions with ``plan_cache_mode =
            force_generic_plan`` (``SET LOCAL``, so it holds behind a pooler in
            transaction mode too), so its statements, prepared by the driver after a few
            runs, are planned once instead of at every claim (about a third of a claim's
            server time). Whatever this setting, each worker transaction also turns off
            sequential scans, bitmap scans, sorts and JIT (see
            :mod:`sqla_queue.statements.planner`).
        raw_statements: with psycopg, run the worker's own statements on the driver
            connection, each compiled once, instead of through ``Connection.execute``
            (about half the worker's CPU per job). The acknowledgement of a batch and the
            claim of the next, with their BEGIN and COMMIT, then go to the server in one
            round trip (psycopg's pipeline mode). They bypass SQLAlchemy's engine events:
            turn it off if a tracer hooked on those events must see them.
        install_signal_handlers: handle SIGINT/SIGTERM in ``run()`` (main thread only).
    """

    concurrency: int = 10
    batch_size: int | None = None
    tasks: Sequence[str] | None = None
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    listen: bool | None = None
    heartbeat_interval: float | None = None
    reclaim_interval: float | None = None
    ack_delay: float = 0.005
    verify_schema: bool = True
    generic_plans: bool = True
    raw_statements: bool = True
    install_signal_handlers: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout cannot be negative")
        if self.ack_delay < 0:
            raise ValueError("ack_delay cannot be negative")

    @property
    def claim_batch(self) -> int:
        """The largest batch a single claim asks for."""
        return min(self.batch_size or self.concurrency, self.concurrency)
