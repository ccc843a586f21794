"""Periodic schedules on a real PostgreSQL: the scheduler's passes, the race, catch-up, CLI.

Each test builds its own queue (or uses ``tests.support.periodic_app``) on fresh metadata,
so that no schedule leaks into the shared test queue, and creates its tables on the test's
fresh database.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, func, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import Queue
from sqla_queue.cli.periodic import add_periodic_parser, run_periodic
from sqla_queue.periodic import Schedule, latest_tick, plan_ticks
from sqla_queue.statements.periodic import advance_schedule_statement
from sqla_queue.worker.scheduler import Scheduler
from sqla_queue.worker.services import ServiceEnv
from tests.support import periodic_app
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration


@pytest.fixture
def pengine(db_url: str) -> Iterator[Engine]:
    """An engine on this test's database with the periodic test queue's tables."""
    eng = create_engine(db_url, pool_size=3, max_overflow=2)
    with eng.begin() as connection:
        periodic_app.queue.create_all(connection)
    yield eng
    eng.dispose()


def new_queue(engine: Engine, prefix: str = "pq_") -> Queue:
    q = Queue(metadata=MetaData(), prefix=prefix)
    with engine.begin() as connection:
        q.create_all(connection)
    return q


def env_for(q: Queue, engine: Engine, interval: float = 1.0) -> ServiceEnv:
    return ServiceEnv(
        tables=q.tables,
        engine=engine,
        worker_id=uuid.uuid4(),
        session_factory=sessionmaker(engine),
        maintenance_interval=interval,
        lease=30.0,
        shutdown_timeout=5.0,
        stop_flag=threading.Event(),
    )


def jobs_of(engine: Engine, q: Queue, task: str | None = None) -> list[dt.datetime]:
    """The due times (``scheduled_at``) of the queue's jobs, sorted."""
    jobs = q.tables.jobs
    stmt = select(jobs.c.scheduled_at).order_by(jobs.c.scheduled_at)
    if task is not None:
        stmt = stmt.where(jobs.c.task == task)
    with engine.connect() as connection:
        return list(connection.scalars(stmt))


def row_of(engine: Engine, q: Queue, name: str) -> dt.datetime | None:
    s = q.tables.schedules
    with engine.connect() as connection:
        return connection.scalar(select(s.c.last_tick).where(s.c.name == name))


def db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as connection:
        return connection.execute(select(func.clock_timestamp())).scalar_one()


# -- a pass ---------------------------------------------------------------------------------


def test_first_pass_stores_the_row_and_enqueues_ticks_ahead(engine: Engine) -> None:
    q = new_queue(engine)

    @q.periodic(every=dt.timedelta(seconds=1), name="beat", kwargs={"n": 7})
    def beat(n: int) -> None:
        del n

    scheduler = Scheduler(env_for(q, engine, interval=1.0), q.worker_plan().schedules)
    before = db_now(engine)
    wait = scheduler.run_pass()
    after = db_now(engine)
    assert 0 < wait <= 1.0
    due = jobs_of(engine, q)
    # The row starts at the latest tick at or before now: nothing for the past.
    first = latest_tick(q.worker_plan().schedules[0], before)
    assert first is not None
    assert all(t > first for t in due)
    # Enqueued ahead up to the horizon (2 intervals): one job per whole second.
    assert len(due) >= 2
    assert all(t.microsecond == 0 for t in due)
    assert [b - a for a, b in itertools.pairwise(due)] == [dt.timedelta(seconds=1)] * (len(due) - 1)
    assert due[-1] <= after + dt.timedelta(seconds=2)
    assert row_of(engine, q, "beat") == due[-1]
    with engine.connect() as connection:
        payload = connection.scalar(select(q.tables.jobs.c.payload).limit(1))
    assert payload["kwargs"] == {"n": 7}
    # A second pass at once has nothing new to enqueue.
    scheduler.run_pass()
    assert len(jobs_of(engine, q)) in (len(due), len(due) + 1)


def test_the_cas_race_enqueues_each_tick_once(engine: Engine) -> None:
    """Worker A holds the row's update open; worker B plans the same ticks and waits on
    A's row lock. When A commits, B's update finds last_tick changed and enqueues nothing."""
    q = new_queue(engine)

    @q.task(name="raced")
    def raced() -> None:
        pass

    schedule = q.schedule(raced, every=dt.timedelta(seconds=10), catch_up="all")
    now = db_now(engine)
    seen = now - dt.timedelta(seconds=35)
    seen = seen.replace(second=seen.second - seen.second % 10, microsecond=0)
    with engine.begin() as connection:
        connection.execute(
            q.tables.schedules.insert().values(name=schedule.name, task="raced", last_tick=seen)
        )
    plan = plan_ticks(schedule, seen, now, horizon=20, grace=5)
    assert len(plan.enqueue) >= 4

    scheduler_a = Scheduler(env_for(q, engine), [schedule])
    scheduler_b = Scheduler(env_for(q, engine), [schedule])
    session_a = Session(engine)
    won_a = session_a.execute(
        advance_schedule_statement(q.tables),
        {
            "schedule": schedule.name,
            "task_name": "raced",
            "seen": seen,
            "new_tick": plan.last_tick,
        },
    ).first()
    assert won_a is not None
    for tick in plan.enqueue:
        assert scheduler_a._enqueue_tick(session_a, schedule, tick)

    results: list[bool] = []
    b = threading.Thread(target=lambda: results.append(scheduler_b._fire(schedule, seen, plan)))
    b.start()

    # B is waiting on A's row lock, not done and not failed.
    def b_waits() -> bool:
        with engine.connect() as connection:
            return bool(
                connection.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"
                    )
                )
            )

    wait_for(b_waits, timeout=10)
    assert b.is_alive() and results == []
    session_a.commit()
    session_a.close()
    b.join(10)
    assert results == [False]
    due = jobs_of(engine, q)
    assert due == list(plan.enqueue)
    assert len(set(due)) == len(due)
    assert row_of(engine, q, schedule.name) == plan.last_tick


def test_a_stale_plan_never_moves_the_row_back(engine: Engine) -> None:
    q = new_queue(engine)

    @q.task(name="stale")
    def stale() -> None:
        pass

    schedule = q.schedule(stale, every=dt.timedelta(seconds=1))
    now = db_now(engine).replace(microsecond=0)
    with engine.begin() as connection:
        connection.execute(
            q.tables.schedules.insert().values(name="stale", task="stale", last_tick=now)
        )
    scheduler = Scheduler(env_for(q, engine), [schedule])
    plan = plan_ticks(schedule, now - dt.timedelta(seconds=5), now, horizon=0, grace=10)
    # Seen is not what the row holds: nothing happens.
    assert scheduler._fire(schedule, now - dt.timedelta(seconds=5), plan) is False
    assert jobs_of(engine, q) == []
    assert row_of(engine, q, "stale") == now


# -- catch-up ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "limit", "missed"),
    [("skip", 100, 0), ("one", 100, 1), ("all", 5, 5), ("all", 100, 60)],
)
def test_catch_up_after_downtime(engine: Engine, policy: str, limit: int, missed: int) -> None:
    # A minute's tick is "missed" once it is more than the grace (2 s here) old: run the
    # passes away from a minute boundary, where the newest tick could be either.
    second = db_now(engine).second
    if second < 5 or second > 50:
        time.sleep((65 - second) % 60)
    q = new_queue(engine)

    @q.task(name="minutely")
    def minutely() -> None:
        pass

    schedule = q.schedule(
        minutely, every=dt.timedelta(minutes=1), catch_up=policy, catch_up_limit=limit
    )
    scheduler = Scheduler(env_for(q, engine, interval=1.0), [schedule])
    scheduler.run_pass()  # stores the row
    now = db_now(engine)
    last = latest_tick(schedule, now)
    assert last is not None
    # Simulated downtime: the row says the last tick was an hour ago.
    down_since = last - dt.timedelta(hours=1)
    with engine.begin() as connection:
        connection.execute(
            update(q.tables.schedules)
            .where(q.tables.schedules.c.name == "minutely")
            .values(last_tick=down_since)
        )
        connection.execute(q.tables.jobs.delete())
        connection.execute(q.tables.executions.delete())
    scheduler.run_pass()
    cutoff = db_now(engine) - dt.timedelta(seconds=scheduler.grace)
    due = jobs_of(engine, q)
    late = [t for t in due if t <= cutoff]
    assert len(late) == missed
    # The most recent missed ticks, one minute apart, ending at the last one.
    assert late == [last - dt.timedelta(minutes=k) for k in reversed(range(missed))]
    assert len(set(due)) == len(due)
    assert row_of(engine, q, "minutely") >= last  # type: ignore[operator]
    assert scheduler.dropped == 60 - missed


def test_an_enqueue_that_fails_for_good_moves_the_tick_on(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    q = new_queue(engine)

    @q.task(name="full")
    def full() -> None:
        pass

    class Full(Exception):
        pass

    class Refusing:
        """A handle whose enqueue raises as a full bounded queue would."""

        name = "full"

        def options(self, **_: Any) -> Refusing:
            return self

        def enqueue(self, *_: Any, **__: Any) -> int:
            raise Full("task 'full' is full")

    schedule = Schedule(
        "full",
        "full",
        every=dt.timedelta(seconds=1),
        handle=Refusing(),  # type: ignore[arg-type]
    )
    scheduler = Scheduler(env_for(q, engine, interval=1.0), [schedule])
    scheduler.run_pass()
    row = row_of(engine, q, "full")
    assert row is not None and row > db_now(engine)
    assert jobs_of(engine, q) == []
    assert scheduler.enqueued == 0 and scheduler.dropped >= 2
    assert "was not enqueued and is dropped (Full: task 'full' is full)" in caplog.text


def test_a_transient_error_keeps_the_ticks_for_the_next_pass(engine: Engine) -> None:
    q = new_queue(engine)

    @q.task(name="flaky")
    def flaky() -> None:
        pass

    calls: list[int] = []

    class Flaky:
        """The real handle, except that the second enqueue loses its connection."""

        name = "flaky"

        def options(self, **options: Any) -> Flaky:
            self.real = flaky.options(**options)
            return self

        def enqueue(self, session: Session, *args: Any, **kwargs: Any) -> int:
            calls.append(1)
            if len(calls) == 2:
                raise OperationalError("SELECT 1", {}, Exception("connection lost"))
            return self.real.enqueue(session, *args, **kwargs)

    schedule = Schedule("flaky", "flaky", every=dt.timedelta(seconds=1), handle=Flaky())  # type: ignore[arg-type]
    scheduler = Scheduler(env_for(q, engine, interval=1.0), [schedule])
    scheduler._create_rows(["flaky"], db_now(engine))
    stored = row_of(engine, q, "flaky")
    with pytest.raises(OperationalError):
        scheduler.run_pass()
    # The whole transaction rolled back: the row and the jobs are as they were.
    assert row_of(engine, q, "flaky") == stored
    assert jobs_of(engine, q) == []
    scheduler.run_pass()
    due = jobs_of(engine, q)
    assert due and due[0] == stored + dt.timedelta(seconds=1)  # type: ignore[operator]
    assert len(set(due)) == len(due)


# -- workers ----------------------------------------------------------------------------


def _assert_every_second_once(due: list[dt.datetime]) -> None:
    assert due, "no tick was enqueued"
    assert len(set(due)) == len(due), "a tick was enqueued twice"
    assert all(t.microsecond == 0 for t in due)
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert set(gaps) <= {dt.timedelta(seconds=1)}, f"gaps: {gaps}"


def test_a_sync_worker_runs_the_schedule(pengine: Engine) -> None:
    q = periodic_app.queue
    worker = q.worker(sessionmaker(pengine), reclaim_interval=0.5, poll_interval=0.1)
    with worker_thread(worker):

        def ran_three() -> bool:
            with pengine.connect() as connection:
                jobs = q.tables.jobs
                done = select(func.count()).where(jobs.c.status == "succeeded")
                return (connection.scalar(done) or 0) >= 3

        wait_for(ran_three, timeout=15)
    _assert_every_second_once(jobs_of(pengine, q))
    with pengine.connect() as connection:
        jobs = q.tables.jobs
        late = connection.execute(
            select(jobs.c.scheduled_at, jobs.c.finished_at).where(jobs.c.status == "succeeded")
        ).all()
    # Each job ran at (not before) its tick.
    assert all(finished >= due for due, finished in late)


async def test_an_async_worker_runs_the_schedule(db_url: str, pengine: Engine) -> None:
    q = periodic_app.queue
    async_engine = create_async_engine(db_url, pool_size=3)
    try:
        worker = q.async_worker(
            async_sessionmaker(async_engine), reclaim_interval=0.5, poll_interval=0.1
        )
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            with pengine.connect() as connection:
                jobs = q.tables.jobs
                done = connection.scalar(select(func.count()).where(jobs.c.status == "succeeded"))
            if (done or 0) >= 3:
                break
        worker.stop()
        await asyncio.wait_for(task, 30)
    finally:
        await async_engine.dispose()
    assert (done or 0) >= 3
    _assert_every_second_once(jobs_of(pengine, q))


def test_a_burst_run_starts_no_scheduler(pengine: Engine) -> None:
    q = periodic_app.queue
    q.worker(sessionmaker(pengine)).run(burst=True)
    assert jobs_of(pengine, q) == []
    assert row_of(pengine, q, "tick") is None


# -- listing and CLI --------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sqla-queue")
    sub = parser.add_subparsers(dest="command", required=True)
    add_periodic_parser(sub)
    return parser.parse_args(argv)


def test_queue_schedules_lists_last_and_next_ticks(pengine: Engine) -> None:
    q = periodic_app.queue
    with Session(pengine) as session:
        (state,) = q.schedules(session)
    assert (state.name, state.task, state.schedule, state.catch_up) == (
        "tick",
        "tick",
        "every 1 s",
        "all",
    )
    assert state.last_tick is None and state.next_tick is not None
    Scheduler(env_for(q, pengine), q.worker_plan().schedules).run_pass()
    with pengine.begin() as connection:
        connection.execute(
            q.tables.schedules.insert().values(
                name="retired", task="old_task", last_tick=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
            )
        )
    with Session(pengine) as session:
        states = q.schedules(session)
    assert [s.name for s in states] == ["tick", "retired"]
    assert states[0].last_tick == row_of(pengine, q, "tick")
    assert states[0].next_tick == states[0].last_tick + dt.timedelta(seconds=1)  # type: ignore[operator]
    assert states[1].registered is False and states[1].next_tick is None


def test_cli_periodic_table_and_json(
    pengine: Engine,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich would wrap the table at 80 columns
    q = periodic_app.queue
    Scheduler(env_for(q, pengine), q.worker_plan().schedules).run_pass()
    last = row_of(pengine, q, "tick")
    assert last is not None

    assert (
        run_periodic(_parse(["periodic", "tests.support.periodic_app:queue", "--url", db_url])) == 0
    )
    out = capsys.readouterr().out
    assert "tick" in out and "every 1 s" in out and "all" in out
    assert last.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ") in out

    args = _parse(["periodic", "tests.support.periodic_app:queue", "--url", db_url, "--json"])
    assert run_periodic(args) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["name"] == "tick" and entry["registered"] is True
    assert dt.datetime.fromisoformat(entry["last_tick"]) == last
    assert dt.datetime.fromisoformat(entry["next_tick"]) == last + dt.timedelta(seconds=1)


def test_cli_periodic_help_explains_the_columns() -> None:
    parser = argparse.ArgumentParser(prog="sqla-queue")
    sub = parser.add_subparsers(dest="command", required=True)
    add_periodic_parser(sub)
    help_text = sub.choices["periodic"].format_help()
    assert "last tick" in help_text and "catch-up policy" in help_text and "--json" in help_text


def test_a_full_bounded_task_drops_the_tick_and_goes_on(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    q = new_queue(engine)

    @q.periodic(every=dt.timedelta(seconds=1), name="bounded", max_pending=1)
    def bounded() -> None:
        pass

    scheduler = Scheduler(env_for(q, engine, interval=1.0), q.worker_plan().schedules)
    scheduler.run_pass()
    # The first tick's job fits; the others found the task full and were dropped.
    due = jobs_of(engine, q)
    assert len(due) == 1
    assert scheduler.enqueued == 1 and scheduler.dropped >= 1
    assert row_of(engine, q, "bounded") > due[0]  # type: ignore[operator]
    assert "QueueFull" in caplog.text


def test_main_runs_the_periodic_command(
    pengine: Engine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sqla_queue.cli.main import main

    assert main(["periodic", "tests.support.periodic_app:queue", "--url", db_url, "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["name"] == "tick" and entry["last_tick"] is None
    assert main(["periodic", "no.such.module:queue", "--url", db_url]) == 2


def test_the_scheduler_survives_database_errors_and_stops_promptly(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    q = Queue(metadata=MetaData(), prefix="late_")  # its tables do not exist yet

    @q.periodic(every=dt.timedelta(seconds=1), name="late")
    def late() -> None:
        pass

    scheduler = Scheduler(env_for(q, engine, interval=0.2), q.worker_plan().schedules)
    scheduler.start()
    try:
        wait_for(lambda: "periodic scheduler: pass failed" in caplog.text, timeout=10)
        assert scheduler._thread is not None and scheduler._thread.is_alive()
        with engine.begin() as connection:
            q.create_all(connection)
        # The retry (after a backoff of about a second) finds the tables and goes on.
        wait_for(lambda: bool(jobs_of(engine, q)), timeout=10)
    finally:
        began = time.monotonic()
        scheduler.request_stop()
        scheduler.join(5)
    assert scheduler._thread is not None and not scheduler._thread.is_alive()
    assert time.monotonic() - began < 2
    assert row_of(engine, q, "late") is not None
