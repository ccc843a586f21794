"""Worker settings: one frozen value shared by the sync and async faces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from sqla_queue.checks import check_seconds, check_whole_number
from sqla_queue.instrumentation import WorkerObserver, check_observers

__all__ = ["MAX_CONCURRENCY", "MAX_SECONDS", "MIN_INTERVAL", "WorkerSettings"]

#: Most handlers (and claim batch) one worker process may run at once.
MAX_CONCURRENCY = 10_000
#: Shortest poll, heartbeat and reclaim interval, in seconds: anything shorter busy-loops.
MIN_INTERVAL = 0.01
#: Longest interval or timeout a setting may hold, in seconds (a day).
MAX_SECONDS = 86_400.0
#: Longest ``ack_delay``, in seconds.
MAX_ACK_DELAY = 60.0
#: Most connections the worker's own pool may keep open (``pool_size``).
MAX_POOL_SIZE = 100


def _whole(name: str, value: object, *, low: int, high: int) -> None:
    check_whole_number(name, value, low, high)


def _seconds(name: str, value: object, *, low: float, high: float = MAX_SECONDS) -> None:
    seconds = check_seconds(name, value, maximum=high)
    if seconds < low:
        raise ValueError(f"{name} must be at least {low:g} seconds, got {value!r}")


def _background_engine(engine: object) -> None:
    if engine is None:
        return
    if not isinstance(engine, Engine):
        raise TypeError(
            f"background_engine must be a synchronous SQLAlchemy Engine (create_engine("
            f'"postgresql+psycopg://...")) or None, got {engine!r}'
        )
    if engine.dialect.name != "postgresql":
        raise ValueError(
            f"background_engine must be a PostgreSQL engine, got a {engine.dialect.name} one"
        )


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs.

    Every value is checked when the settings are made; a wrong one raises ``TypeError``
    or ``ValueError`` naming the setting and the rule. Whole numbers are ``int`` (not
    ``bool``); seconds are finite ``int`` or ``float`` values; intervals are at least
    10 ms (shorter ones busy-loop) and, like timeouts, at most a day.

    Attributes:
        concurrency: handlers running at once in this process (1 to 10,000).
        batch_size: most executions one claim takes (default: ``concurrency + prefetch``;
            1 to 10,000).
        prefetch: jobs a worker may claim ahead of need, beyond the ``concurrency`` it runs
            (0, the default, to 10,000). A prefetched job is held like a running one: its
            lease is kept alive by the heartbeat, it is reclaimed after the task's lost
            interval if the worker dies, and a graceful stop hands it back at once, as does
            a second without a free seat (it holds its ``queue_id``'s head). Claims
            then take bigger batches, and acknowledgements cover more jobs, so short jobs
            drain with fewer statements per job. Tasks with a concurrency limit or a rate
            limit are never prefetched (a held slot or a used start would sit idle), and a
            worker starts its prefetched jobs in priority order, so that a job of higher
            priority claimed later starts before them. Leave it at 0 for long jobs: a job
            prefetched by a busy worker waits for that worker's seat while another
            worker's seat may be free.
        tasks: names of the tasks this worker claims (default: every registered task): a
            list of strings, not one string. Workers of different services sharing a
            database leave each other's tasks alone.
        poll_interval: longest sleep between polls when nothing wakes the worker, seconds.
        shutdown_timeout: how long, after SIGTERM/SIGINT, running handlers may finish before
            their jobs are handed back to the queue (0 to a day).
        listen: LISTEN for enqueue notifications (default: the queue's ``notify``).
            ``False``: the worker only polls, every ``poll_interval`` at most.
        listen_url: where the worker LISTENs, a database URL of a direct connection to the
            same database (default: the engine's own URL). Set it when the engine goes
            through a pooler in transaction mode, such as PgBouncer: a LISTEN there lands on
            a server connection the pooler hands to other clients, and the worker hears
            nothing. The enqueues' NOTIFY works through the pooler (it is sent at commit),
            so a worker listening on a direct connection wakes at once; without one, set
            ``listen=False`` and the worker polls. Any driver name in the URL is ignored:
            the listener is its own psycopg connection (see docs/guides/pgbouncer.md).
        heartbeat_interval: seconds between heartbeats (default: a quarter of the shortest
            lost interval of this worker's tasks).
        reclaim_interval: seconds between maintenance sweeps: lost jobs, re-reads of the
            stored concurrency limits, and keys whose next job is owed a promotion
            (default: half the shortest lost interval of this worker's tasks, at most 5 s).
        ack_delay: longest time, in seconds, a finished job's acknowledgement waits for others
            to share its statement while more handlers are still running (0: ack at once;
            at most 60).
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
        pool_size: connections the worker keeps open for its own statements (claims, acks,
            heartbeats, reclaims, its services), in a pool of its own apart from the one
            the handlers' sessions use, so that a handler holding sessions never delays a
            heartbeat (1 to 100; default 3: the run loop, the heartbeater, the services).
            The pool is derived from the session factory's engine: same URL, connect
            arguments, events and execution options. More connections are opened, and
            closed again, when more of the worker's threads need one at once; none is
            ever waited for. An async worker keeps one of them on its event loop for the
            run loop and the rest in the synchronous pool of its heartbeater and services.
            The LISTEN connection is apart from this pool (see
            :mod:`sqla_queue.worker.pools`).
        install_signal_handlers: handle SIGINT/SIGTERM in ``run()`` (main thread only).
        observers: what hears each job attempt start and finish, and each lost job the
            worker reclaims (see :mod:`sqla_queue.instrumentation`): Prometheus metrics,
            OpenTelemetry spans. None by default, and then the worker makes no such call.
        background_engine: an async worker's synchronous engine (``create_engine(
            "postgresql+psycopg://...")``) on the same database as its session factory's,
            for its heartbeater, services and ``def`` daemons, which run in threads, and
            its LISTEN connection; the worker gives it a pool of its own. By default the
            worker derives one from the async engine: with psycopg, the same connect
            keywords (``connect_args``) and ``connect`` listeners. It needs this setting
            (and refuses to start without it, naming it) when the async engine connects
            through an ``async_creator``, or with asyncpg arguments or listeners beyond the
            URL's. A sync worker ignores it.
    """

    concurrency: int = 10
    batch_size: int | None = None
    prefetch: int = 0
    tasks: Sequence[str] | None = None
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    listen: bool | None = None
    listen_url: str | None = None
    heartbeat_interval: float | None = None
    reclaim_interval: float | None = None
    ack_delay: float = 0.005
    verify_schema: bool = True
    generic_plans: bool = True
    raw_statements: bool = True
    pool_size: int = 3
    install_signal_handlers: bool = True
    observers: Sequence[WorkerObserver] = ()
    background_engine: Engine | None = None

    def __post_init__(self) -> None:
        _whole("concurrency", self.concurrency, low=1, high=MAX_CONCURRENCY)
        _whole("pool_size", self.pool_size, low=1, high=MAX_POOL_SIZE)
        if self.batch_size is not None:
            _whole("batch_size", self.batch_size, low=1, high=MAX_CONCURRENCY)
        _whole("prefetch", self.prefetch, low=0, high=MAX_CONCURRENCY)
        if self.tasks is not None:
            if isinstance(self.tasks, str | bytes) or not isinstance(self.tasks, Sequence):
                raise TypeError(
                    f"tasks must be a list of task names (not a single string), got {self.tasks!r}"
                )
            if not self.tasks:
                raise ValueError("tasks, when given, must name at least one task")
            for name in self.tasks:
                if not isinstance(name, str):
                    raise TypeError(f"tasks must hold task names (str), got {name!r}")
        _seconds("poll_interval", self.poll_interval, low=MIN_INTERVAL)
        _seconds("shutdown_timeout", self.shutdown_timeout, low=0.0)
        if self.heartbeat_interval is not None:
            _seconds("heartbeat_interval", self.heartbeat_interval, low=MIN_INTERVAL)
        if self.reclaim_interval is not None:
            _seconds("reclaim_interval", self.reclaim_interval, low=MIN_INTERVAL)
        _seconds("ack_delay", self.ack_delay, low=0.0, high=MAX_ACK_DELAY)
        if self.listen is not None and not isinstance(self.listen, bool):
            raise TypeError(f"listen must be True, False or None, got {self.listen!r}")
        if self.listen_url is not None:
            if not isinstance(self.listen_url, str):
                raise TypeError(f"listen_url must be a str or None, got {self.listen_url!r}")
            if "://" not in self.listen_url:
                raise ValueError(
                    f"listen_url must be a database URL (postgresql://...), got {self.listen_url!r}"
                )
        for name in ("verify_schema", "generic_plans", "raw_statements", "install_signal_handlers"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        _background_engine(self.background_engine)
        object.__setattr__(self, "observers", check_observers(self.observers))

    @property
    def claim_batch(self) -> int:
        """The largest batch a single claim asks for."""
        held = self.concurrency + self.prefetch
        return min(self.batch_size or held, held)
