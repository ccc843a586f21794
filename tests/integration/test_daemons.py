"""Daemons against real PostgreSQL: one instance cluster-wide, restarts, fencing, shutdown.

Each test builds its own Queue (on the test app's schema, so the template's tables serve)
and runs workers in threads, each on an engine of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, func, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from sqla_queue import Queue
from sqla_queue.daemons import MIN_RESTART_DELAY, DaemonBackoff, DaemonContext
from sqla_queue.worker.daemons import DaemonSupervisor
from sqla_queue.worker.services import ServiceEnv
from tests.support.app import QUEUE_SCHEMA
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

#: A short lost interval keeps the tests quick: renewals every 0.5 s.
LEASE = 2.0


@pytest.fixture(autouse=True)
def daemons_table(owner_engine: Engine) -> None:
    """The ``daemons`` table, in case the template's DDL predates it."""
    with owner_engine.begin() as connection:
        new_queue().tables.daemons.create(connection, checkfirst=True)


def new_queue(lost_interval: float = LEASE) -> Queue:
    queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, lost_interval=lost_interval)

    @queue.task(name="daemon_test_noop")
    def noop() -> None:
        """An ordinary job: a worker needs at least one task."""

    return queue


@dataclass
class Tracker:
    """Which daemon runs are live, where, and whether two of one instance ever overlapped."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    active: Counter[tuple[str, int]] = field(default_factory=Counter)
    most: Counter[tuple[str, int]] = field(default_factory=Counter)
    starts: list[tuple[str, int, uuid.UUID, float]] = field(default_factory=list)
    ends: list[tuple[str, int, uuid.UUID, bool]] = field(default_factory=list)

    def enter(self, ctx: DaemonContext) -> None:
        key = (ctx.name, ctx.instance)
        with self.lock:
            self.active[key] += 1
            self.most[key] = max(self.most[key], self.active[key])
            self.starts.append((ctx.name, ctx.instance, ctx.worker_id, time.monotonic()))

    def leave(self, ctx: DaemonContext) -> None:
        with self.lock:
            self.active[(ctx.name, ctx.instance)] -= 1
            self.ends.append((ctx.name, ctx.instance, ctx.worker_id, ctx.shutdown_requested))

    def live(self) -> int:
        with self.lock:
            return sum(self.active.values())

    def runs_of(self, name: str) -> int:
        with self.lock:
            return sum(1 for start in self.starts if start[0] == name)


def looping(tracker: Tracker) -> Any:
    """A well-behaved daemon: ticks until asked to stop."""

    def run(ctx: DaemonContext) -> None:
        tracker.enter(ctx)
        try:
            while not ctx.wait(0.02):
                pass
        finally:
            tracker.leave(ctx)

    return run


@pytest.fixture
def engines(db_url: str) -> Iterator[list[Engine]]:
    """Two engines, one per worker: no pool or connection is shared between workers."""
    made = [create_engine(db_url, pool_size=3, max_overflow=5) for _ in range(2)]
    yield made
    for engine in made:
        engine.dispose()


def worker_of(queue: Queue, engine: Engine, **settings: Any) -> Any:
    settings.setdefault("concurrency", 2)
    settings.setdefault("poll_interval", 0.2)
    settings.setdefault("shutdown_timeout", 5.0)
    return queue.worker(sessionmaker(engine), **settings)


def rows(engine: Engine, queue: Queue) -> list[Any]:
    with engine.connect() as connection:
        return queue.daemon_status(connection)


def test_one_instance_runs_cluster_wide_on_two_workers(
    engines: list[Engine], engine: Engine
) -> None:
    queue = new_queue()
    tracker = Tracker()
    queue.daemon(name="solo")(looping(tracker))
    workers = [worker_of(queue, e) for e in engines]
    with ExitStack() as stack:
        for worker in workers:
            stack.enter_context(worker_thread(worker))
        wait_for(lambda: tracker.live() == 1, timeout=10)
        time.sleep(3 * LEASE)  # several renewals and acquire rounds on both workers
        assert tracker.live() == 1
        assert tracker.runs_of("solo") == 1, tracker.starts
        (status,) = rows(engine, queue)
        assert (status.name, status.instance, status.running) == ("solo", 0, True)
        assert status.worker_id in {w.decider.worker_id for w in workers}
        assert status.worker_id == tracker.starts[0][2]
        for worker in workers:  # both at once: neither takes over from the other
            worker.stop()
    assert tracker.most[("solo", 0)] == 1
    # The graceful stop told the daemon, which returned, and released its row.
    assert tracker.ends == [("solo", 0, status.worker_id, True)]
    (after,) = rows(engine, queue)
    assert (after.worker_id, after.lease_until, after.running) == (None, None, False)


def test_n_instances_each_run_once_across_two_workers(
    engines: list[Engine], engine: Engine
) -> None:
    queue = new_queue()
    tracker = Tracker()
    queue.daemon(name="fleet", instances=3)(looping(tracker))
    with ExitStack() as stack:
        for e in engines:
            stack.enter_context(worker_thread(worker_of(queue, e)))
        wait_for(lambda: tracker.live() == 3, timeout=10)
        time.sleep(2 * LEASE)
        assert tracker.live() == 3
        assert sorted(s[1] for s in tracker.starts) == [0, 1, 2]
        status = rows(engine, queue)
        assert [(s.instance, s.running) for s in status] == [(0, True), (1, True), (2, True)]
    assert set(tracker.most.values()) == {1}
    assert tracker.live() == 0


def test_a_crashing_daemon_restarts_with_backoff(SessionLocal: sessionmaker[Session]) -> None:
    queue = new_queue()
    starts: list[float] = []
    healthy = threading.Event()

    @queue.daemon(name="crashy", backoff=DaemonBackoff(min_delay=0.3, factor=2, max_delay=5))
    def crashy(ctx: DaemonContext) -> None:
        starts.append(time.monotonic())
        if len(starts) <= 3:
            raise RuntimeError(f"crash number {len(starts)}")
        healthy.set()
        ctx.wait(60)

    with worker_thread(worker_of(queue, SessionLocal.kw["bind"])):
        assert healthy.wait(15), starts
        with SessionLocal() as session:
            (status,) = queue.daemon_status(session)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert len(starts) == 4
    # 0.3 s, 0.6 s, 1.2 s: doubling; the supervisor sees a crash at once (the thread wakes it).
    for gap, delay in zip(gaps, [0.3, 0.6, 1.2], strict=True):
        assert delay <= gap < delay + 0.5, gaps
    assert status.restarts == 3
    assert status.last_error == "RuntimeError: crash number 3"


@pytest.mark.parametrize("returns", [False, True], ids=["crashes", "returns"])
def test_the_fastest_backoff_allowed_restarts_at_a_bounded_rate(
    SessionLocal: sessionmaker[Session], returns: bool
) -> None:
    """A daemon that fails (or returns) at once, on the shortest backoff there is, restarts
    at most 1 / MIN_RESTART_DELAY times a second, each crash one write: never a hot loop."""
    queue = new_queue()
    starts: list[float] = []
    fastest = DaemonBackoff(min_delay=MIN_RESTART_DELAY, max_delay=MIN_RESTART_DELAY, factor=1)

    @queue.daemon(name="hot", backoff=fastest)
    def hot(ctx: DaemonContext) -> None:
        starts.append(time.monotonic())
        if not returns:
            raise RuntimeError("fails at once")

    with worker_thread(worker_of(queue, SessionLocal.kw["bind"])):
        wait_for(lambda: len(starts) >= 2, timeout=10)
        time.sleep(1.5)
        with SessionLocal() as session:
            (status,) = queue.daemon_status(session)
    window = starts[-1] - starts[0]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert min(gaps) >= MIN_RESTART_DELAY * 0.95, gaps
    assert len(starts) <= window / MIN_RESTART_DELAY + 1, (len(starts), window)
    assert len(starts) >= 5  # it does restart, over and over
    assert status.restarts == (0 if returns else len(starts))


def test_a_daemon_that_returns_is_started_again(SessionLocal: sessionmaker[Session]) -> None:
    queue = new_queue()
    runs: list[float] = []

    @queue.daemon(name="oneshot", backoff=DaemonBackoff(min_delay=0.2))
    def oneshot(ctx: DaemonContext) -> None:
        runs.append(time.monotonic())

    with worker_thread(worker_of(queue, SessionLocal.kw["bind"])):
        wait_for(lambda: len(runs) >= 3, timeout=10)
        with SessionLocal() as session:
            (status,) = queue.daemon_status(session)
    assert all(later - earlier >= 0.2 for earlier, later in itertools.pairwise(runs))
    assert status.restarts == 0 and status.last_error is None  # returning is not a crash


def test_a_stolen_instance_is_told_to_stop_and_not_restarted_here(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    queue = new_queue()
    tracker = Tracker()
    queue.daemon(name="stolen")(looping(tracker))
    daemons = queue.tables.daemons
    thief = uuid.uuid4()
    worker = worker_of(queue, SessionLocal.kw["bind"])
    with worker_thread(worker):
        wait_for(lambda: tracker.live() == 1, timeout=10)
        owner = tracker.starts[0][2]
        # Another worker takes the row over, as after this worker's lease had run out.
        with engine.begin() as connection:
            connection.execute(
                update(daemons)
                .where(daemons.c.name == "stolen")
                .values(worker_id=thief, lease_until=func.now() + text("interval '1 minute'"))
            )
        stolen_at = time.monotonic()
        wait_for(lambda: tracker.live() == 0, timeout=5)
        told_in = time.monotonic() - stolen_at
        assert tracker.ends == [("stolen", 0, owner, True)]
        assert told_in < LEASE / 4 + 0.5, told_in  # at the next renewal
        time.sleep(LEASE)
        assert tracker.runs_of("stolen") == 1  # not restarted here while the thief holds it
        # The thief hands it back: this worker takes it again.
        with engine.begin() as connection:
            connection.execute(
                update(daemons)
                .where(daemons.c.name == "stolen")
                .values(worker_id=None, lease_until=None)
            )
        wait_for(lambda: tracker.live() == 1, timeout=5)
    assert tracker.most[("stolen", 0)] == 1


def test_an_instance_whose_lease_cannot_be_renewed_stops_before_the_lease_ends(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    queue = new_queue()
    stopped: list[float] = []
    started = threading.Event()

    @queue.daemon(name="cutoff", lost_interval=LEASE)
    def cutoff(ctx: DaemonContext) -> None:
        started.set()
        while not ctx.wait(0.01):
            pass
        stopped.append(time.monotonic())

    env = ServiceEnv(
        tables=queue.tables,
        engine=engine,
        worker_id=uuid.uuid4(),
        session_factory=SessionLocal,
        maintenance_interval=0.5,
        lease=LEASE,
        shutdown_timeout=2.0,
        stop_flag=threading.Event(),
    )
    supervisor = DaemonSupervisor(env, list(queue.daemons.values()))
    real_execute = supervisor._execute
    cut_off = threading.Event()
    sent: list[float] = []

    def execute(statement: Any, params: Any) -> list[Any]:
        if cut_off.is_set():
            raise OperationalError("renew", {}, Exception("the database is unreachable"))
        sent.append(time.monotonic())  # before the database's now(): its lease ends later
        return real_execute(statement, params)

    supervisor._execute = execute  # type: ignore[method-assign]
    supervisor.start()
    try:
        assert started.wait(10)
        time.sleep(LEASE / 2)  # a renewal or two
        cut_off.set()
        wait_for(lambda: bool(stopped), timeout=2 * LEASE)
        last_renewal = sent[-1]
        # Told to stop a tenth of a lease before the lease ends, by its own clock: while
        # the database still says the instance is this worker's, so nobody else runs it.
        assert stopped[0] < last_renewal + LEASE
        assert stopped[0] >= last_renewal + 0.9 * LEASE - 0.05
        with engine.connect() as connection:
            holder = connection.scalar(select(queue.tables.daemons.c.worker_id))
        assert holder == env.worker_id  # the local fence, not a takeover
        assert supervisor.running() == []
    finally:
        supervisor.request_stop()
        cut_off.clear()
        supervisor.join(10)
    assert not supervisor._thread.is_alive()
    assert len(stopped) == 1  # not restarted while its lease was in doubt


def test_a_graceful_stop_hands_the_instance_to_another_worker_at_once(
    engines: list[Engine], engine: Engine
) -> None:
    queue = new_queue()
    tracker = Tracker()
    queue.daemon(name="handover", lost_interval=30)(looping(tracker))
    first, second = (worker_of(queue, e) for e in engines)
    with worker_thread(second):
        with worker_thread(first):
            wait_for(lambda: tracker.live() == 1, timeout=10)
            holder = tracker.starts[0][2]
        # Whichever held it, stop the holder (the other keeps running).
        if holder == second.decider.worker_id:
            with worker_thread(first):
                wait_for(lambda: first.decider is not None and first.decider.worker_id, timeout=5)
                second.stop()
                stopped_at = time.monotonic()
                wait_for(lambda: tracker.runs_of("handover") == 2, timeout=10)
                taken_in = time.monotonic() - stopped_at
                survivor = first.decider.worker_id
        else:
            stopped_at = time.monotonic()
            wait_for(lambda: tracker.runs_of("handover") == 2, timeout=10)
            taken_in = time.monotonic() - stopped_at
            survivor = second.decider.worker_id
        assert tracker.starts[1][2] == survivor
        # Released rows are free at once: far sooner than the 30 s lease.
        assert taken_in < 5, taken_in
    assert tracker.most[("handover", 0)] == 1


@pytest.mark.usefixtures("daemons_table")
async def test_async_daemon_on_an_async_worker(
    AsyncSessionLocal: async_sessionmaker[AsyncSession], engine: Engine
) -> None:
    queue = new_queue()
    seen: list[Any] = []
    stopped = asyncio.Event()
    main_loop = asyncio.get_running_loop()

    @queue.daemon(name="async_daemon")
    async def beat(ctx: DaemonContext) -> None:
        seen.append(asyncio.get_running_loop() is not main_loop)
        while not ctx.shutdown_requested:
            session = ctx.session
            seen.append(await session.scalar(text("select 40 + 2")))
            await session.rollback()
            if await ctx.async_wait(0.05):
                break
        assert ctx.shutdown_event.is_set()
        main_loop.call_soon_threadsafe(stopped.set)

    worker = queue.async_worker(AsyncSessionLocal, poll_interval=0.2, shutdown_timeout=5.0)
    run = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            if len(seen) >= 3:
                break
            await asyncio.sleep(0.05)
        assert seen[0] is True  # a loop of its own, never the worker's
        assert seen[1:3] == [42, 42]
        status = await asyncio.to_thread(rows, engine, queue)
        assert [(s.name, s.running) for s in status] == [("async_daemon", True)]
    finally:
        worker.stop()
        await asyncio.wait_for(run, timeout=20)
    assert stopped.is_set()
    (after,) = await asyncio.to_thread(rows, engine, queue)
    assert after.worker_id is None


def test_daemons_take_no_handler_seat(SessionLocal: sessionmaker[Session]) -> None:
    queue = new_queue()
    tracker = Tracker()
    queue.daemon(name="busy", instances=3)(looping(tracker))
    both_running = threading.Barrier(2, timeout=10)
    met: list[int] = []

    @queue.task(name="daemon_test_meet")
    def meet(n: int) -> None:
        # Passes only if both jobs run at the same time: two seats, with 3 daemons running.
        both_running.wait()
        met.append(n)

    with worker_thread(worker_of(queue, SessionLocal.kw["bind"], concurrency=2)) as stats:
        wait_for(lambda: tracker.live() == 3, timeout=10)
        with SessionLocal.begin() as session:
            meet.enqueue(session, 1)
            meet.enqueue(session, 2)
        wait_for(lambda: len(met) == 2, timeout=15)
        assert tracker.live() == 3
    assert sorted(met) == [1, 2]
    assert stats[0].succeeded == 2 and stats[0].failed == 0


def test_cli_lists_instances_with_their_state(
    db_url: str,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps cells to the terminal's width
    import argparse
    import json

    from sqla_queue.cli.daemons import add_daemons_parser, run_daemons
    from tests.support.daemon_app import queue as app_queue

    daemons = app_queue.tables.daemons
    holder = uuid.uuid4()
    with engine.begin() as connection:
        connection.execute(
            daemons.insert(),
            [
                {"name": "ticker_a", "instance": 0, "worker_id": holder, "restarts": 2},
                {"name": "ticker_b", "instance": 0, "worker_id": None, "restarts": 0},
                {"name": "ticker_b", "instance": 1, "worker_id": None, "restarts": 0},
            ],
        )
        connection.execute(
            update(daemons)
            .where(daemons.c.name == "ticker_b", daemons.c.instance == 0)
            .values(last_error="ValueError: no")
        )
        connection.execute(
            update(daemons)
            .where(daemons.c.name == "ticker_a")
            .values(lease_until=func.now() + text("interval '1 minute'"))
        )
    parser = argparse.ArgumentParser()
    add_daemons_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["daemons", "tests.support.daemon_app:queue", "--url", db_url, "--json"]
    )
    assert run_daemons(args) == 0
    listed = {(d["name"], d["instance"]): d for d in json.loads(capsys.readouterr().out)}
    assert set(listed) == {("ticker_a", 0), ("ticker_b", 0), ("ticker_b", 1), ("ticker_c", 0)}
    a = listed[("ticker_a", 0)]
    assert (a["running"], a["worker_id"], a["restarts"], a["registered"]) == (
        True,
        str(holder),
        2,
        True,
    )
    assert listed[("ticker_b", 0)]["last_error"] == "ValueError: no"
    assert listed[("ticker_b", 1)]["registered"] is False  # above the declared count
    assert listed[("ticker_c", 0)] == {
        "name": "ticker_c",
        "instance": 0,
        "running": False,
        "registered": True,
    }

    args = parser.parse_args(["daemons", "tests.support.daemon_app:queue", "--url", db_url])
    assert run_daemons(args) == 0
    table = capsys.readouterr().out
    assert "ticker_b (unregistered)" in table and "never started" in table
    assert "running" in table and str(holder)[:8] in table


def test_async_daemon_on_a_sync_worker_gets_its_own_loop(
    SessionLocal: sessionmaker[Session],
) -> None:
    queue = new_queue()
    seen: list[Any] = []
    done = threading.Event()

    @queue.daemon(name="async_on_sync")
    async def beat(ctx: DaemonContext) -> None:
        seen.append(threading.current_thread().name)
        # A sync worker's factory gives a sync Session, as for async handlers.
        seen.append(ctx.session.scalar(text("select 7")))
        while not await ctx.async_wait(0.05):
            pass
        done.set()

    with worker_thread(worker_of(queue, SessionLocal.kw["bind"])):
        wait_for(lambda: len(seen) == 2, timeout=10)
    assert seen == ["sqla-queue-daemon-async_on_sync-0", 7]
    assert done.is_set()


# -- the daemon's connections are the worker's ---------------------------------------------

#: What the engine's own configuration sets on each connection: ``connect_args`` (or the
#: creator) its search_path and application name, a ``connect`` listener a custom setting.
PROBE = "select current_setting('search_path'), current_setting('application_name'), " + (
    "current_setting('sqlaq.probe', true)"
)
SEARCH_PATH = "daemon_probe_schema,public"


def _configured(engine: Any, marker: str) -> list[str]:
    """Add a ``connect`` listener and an engine event to ``engine``; return what they saw."""
    from sqlalchemy import event

    statements: list[str] = []

    @event.listens_for(engine, "connect")
    def set_probe(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"set sqlaq.probe = '{marker}'")
        cursor.close()
        dbapi_connection.commit()  # a connection leaves the creator idle, not in a transaction

    @event.listens_for(engine, "before_cursor_execute")
    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "sqlaq.probe" in statement:
            statements.append(marker)

    return statements


def _async_engine_with_options(db_url: str, how: str) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine

    options = f"-c search_path={SEARCH_PATH}"
    if how == "connect_args":
        return create_async_engine(
            db_url, pool_size=2, connect_args={"options": options, "application_name": "dprobe"}
        )
    import psycopg

    plain = db_url.replace("postgresql+psycopg://", "postgresql://")

    async def creator() -> Any:
        return await psycopg.AsyncConnection.connect(
            plain, options=options, application_name="dprobe"
        )

    return create_async_engine(db_url, pool_size=2, async_creator=creator)


@pytest.mark.usefixtures("daemons_table")
@pytest.mark.parametrize("how", ["connect_args", "async_creator"])
async def test_an_async_daemon_connects_as_the_workers_engine_does(db_url: str, how: str) -> None:
    """connect_args / async_creator, events and execution options reach the daemon's loop."""
    queue = new_queue()
    engine = _async_engine_with_options(db_url, how)
    statements = _configured(engine.sync_engine, "async-daemon")
    seen: list[Any] = []

    @queue.daemon(name="probe")
    async def probe(ctx: DaemonContext) -> None:
        async with ctx.session_factory() as session:
            row = (await session.execute(text(PROBE))).one()
            seen.append((tuple(row), session.bind.get_execution_options().get("logging_token")))
        await ctx.async_wait(30)

    tagged = engine.execution_options(logging_token="tenant-b")
    # An async_creator cannot be repeated by the worker's threads: they need their own engine.
    background = (
        {"background_engine": create_engine(db_url, poolclass=NullPool)}
        if how == "async_creator"
        else {}
    )
    worker = queue.async_worker(
        async_sessionmaker(tagged), poll_interval=0.2, shutdown_timeout=5.0, **background
    )
    run = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, timeout=20)
        await engine.dispose()
    assert seen == [((SEARCH_PATH, "dprobe", "async-daemon"), "tenant-b")]
    assert statements == ["async-daemon"]  # the engine's own events ran for the daemon


def test_a_sync_daemon_connects_as_the_workers_engine_does(db_url: str) -> None:
    """A ``def`` daemon of a sync worker uses the worker's engine, options and events."""
    queue = new_queue()
    options = f"-c search_path={SEARCH_PATH}"
    engine = create_engine(
        db_url, pool_size=2, connect_args={"options": options, "application_name": "dprobe"}
    )
    statements = _configured(engine, "sync-daemon")
    seen: list[Any] = []

    @queue.daemon(name="probe")
    def probe(ctx: DaemonContext) -> None:
        with ctx.session_factory() as session:
            seen.append(tuple(session.execute(text(PROBE)).one()))
        ctx.wait(30)

    try:
        with worker_thread(worker_of(queue, engine)):
            wait_for(lambda: bool(seen), timeout=15)
    finally:
        engine.dispose()
    assert seen == [(SEARCH_PATH, "dprobe", "sync-daemon")]
    assert statements == ["sync-daemon"]


async def test_a_daemon_loop_engine_from_a_bound_connection_keeps_its_options(
    db_url: str,
) -> None:
    """A factory bound to an AsyncConnection: the daemon's engine is its engine's, with the
    connection's execution options (a tenant's map) and its engine's connect_args."""
    from sqla_queue.worker.daemon_runs import loop_engine as _loop_engine

    engine = _async_engine_with_options(db_url, "connect_args")
    tenant = {"tenant": "tenant_b"}
    try:
        async with engine.connect() as connection:
            bound = await connection.execution_options(schema_translate_map=tenant)
            derived = _loop_engine(bound)
            try:
                assert derived.get_execution_options()["schema_translate_map"] == tenant
                async with derived.connect() as other:
                    row = (await other.execute(text(PROBE))).one()
                assert tuple(row)[:2] == (SEARCH_PATH, "dprobe")
                assert derived.sync_engine.pool is not engine.sync_engine.pool
            finally:
                await derived.dispose()
        with pytest.raises(TypeError, match="bound to an AsyncEngine or AsyncConnection"):
            _loop_engine(create_engine(db_url))
    finally:
        await engine.dispose()
