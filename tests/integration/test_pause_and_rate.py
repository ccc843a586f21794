"""Pause and resume, and rate limits: stored per task, applied by every worker.

The rate limit's exactness rests on one thing: a claim of a rate-limited task reads its
window only after it holds the task's control row, so it sees every start that the previous
holder recorded. The race is forced here with two connections and a held-open transaction;
the control shows that without the lock the window is overrun.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import UnknownTaskError, statements
from sqla_queue.controls import RateLimit
from sqla_queue.statements.controls import rate_lock_statement
from tests.support.app import ExecutionLog, noop, queue, record, sleepy
from tests.support.limited import limited1
from tests.support.running import states, wait_for, worker_thread

pytestmark = pytest.mark.integration

EX = queue.tables.executions
STARTS = queue.tables.rate_starts
RATED = statements.claim_statement(queue.tables, rated=True)
LOCK = rate_lock_statement(queue.tables)
# Fast maintenance: pauses and rate limits reach a running worker within 0.2 s.
FAST = {"reclaim_interval": 0.2, "poll_interval": 0.1, "install_signal_handlers": False}


def enqueue_noops(SessionLocal: sessionmaker[Session], n: int) -> list[int]:
    with SessionLocal.begin() as session:
        return [noop.enqueue(session) for _ in range(n)]


def start_times(engine: Engine, task: str) -> list[float]:
    with engine.connect() as connection:
        return [
            float(t)
            for t in connection.scalars(
                select(func.extract("epoch", STARTS.c.started_at))
                .where(STARTS.c.task == task)
                .order_by(STARTS.c.started_at)
            )
        ]


def busiest_window(times: list[float], period: float) -> int:
    """The most starts in any window ``(t - period, t]``, t being a recorded start."""
    best = 0
    for i, end in enumerate(times):
        best = max(best, sum(1 for t in times[: i + 1] if t > end - period))
    return best


# -- pause and resume -----------------------------------------------------------------------


def test_a_paused_task_waits_while_others_run_and_resume_releases_it(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.pause(session, "noop")
    noops = enqueue_noops(SessionLocal, 5)  # enqueue still works while paused
    with SessionLocal.begin() as session:
        records = [record.enqueue(session, value=str(i)) for i in range(3)]
    worker = queue.worker(SessionLocal, **FAST)
    with worker_thread(worker):
        wait_for(lambda: states(SessionLocal, records) == {"succeeded": 3})
        time.sleep(0.5)  # more than two maintenance intervals
        assert states(SessionLocal, noops) == {"queued": 5}
        with SessionLocal.begin() as session:
            assert queue.controls(session)["noop"].paused
            queue.resume(session, "noop")
        wait_for(lambda: states(SessionLocal, noops) == {"succeeded": 5}, timeout=10)
    with SessionLocal() as session:
        assert queue.controls(session) == {}


def test_pausing_reaches_a_running_worker_and_running_jobs_finish(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        long_job = sleepy.enqueue(session, seconds=1.0)
    worker = queue.worker(SessionLocal, **FAST)
    with worker_thread(worker) as stats:
        wait_for(lambda: worker.decider is not None and worker.decider.running_count == 1)
        with SessionLocal.begin() as session:
            queue.pause(session, "sleepy")
        time.sleep(0.5)
        with SessionLocal.begin() as session:
            later = sleepy.enqueue(session, seconds=0.0)
        wait_for(lambda: states(SessionLocal, [long_job]) == {"succeeded": 1})
        time.sleep(0.5)
        assert states(SessionLocal, [later]) == {"queued": 1}
        assert worker.decider is not None and "sleepy" in worker.decider.paused
    assert stats[0].succeeded == 1


def test_pause_and_rate_limit_check_their_input(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        with pytest.raises(UnknownTaskError, match="cannot pause"):
            queue.pause(session, "no_such_task")
        with pytest.raises(UnknownTaskError, match="cannot store a rate limit"):
            queue.set_rate_limit(session, "no_such_task", 5)
        for bad in (0, -1, 1.5, True, "5"):
            with pytest.raises(ValueError, match="max_starts must be a whole number"):
                queue.set_rate_limit(session, "noop", bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="positive"):
            queue.set_rate_limit(session, "noop", 5, per=0)
        with pytest.raises(TypeError, match="a number of seconds"):
            queue.set_rate_limit(session, "noop", 5, per="1s")  # type: ignore[arg-type]
        # Nothing was stored by the refused calls.
        assert queue.controls(session) == {}
        queue.set_rate_limit(session, "noop", 5, per=dt.timedelta(minutes=1))
        assert queue.controls(session)["noop"].rate_limit == RateLimit(5, 60.0)
        queue.set_rate_limit(session, "noop", None)
        assert queue.controls(session) == {}


# -- rate limits ----------------------------------------------------------------------------


def test_a_rate_limit_spreads_starts_and_no_window_holds_more(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 4, per=0.5)
    ids = enqueue_noops(SessionLocal, 14)
    with SessionLocal.begin() as session:
        others = [record.enqueue(session, value=str(i)) for i in range(20)]
    started = time.monotonic()
    worker = queue.worker(SessionLocal, concurrency=10, **FAST)
    with worker_thread(worker):
        # Unthrottled tasks are not held back by the rated one.
        wait_for(lambda: states(SessionLocal, others) == {"succeeded": 20}, timeout=10)
        others_done = time.monotonic() - started
        wait_for(lambda: states(SessionLocal, ids) == {"succeeded": 14}, timeout=20)
    times = start_times(engine, "noop")
    assert len(times) == 14
    assert busiest_window(times, 0.5) <= 4
    # 14 starts at 4 per half second need at least three more windows after the first.
    assert times[-1] - times[0] >= 1.5 - 0.01
    assert others_done < times[-1] - times[0]


def test_a_rated_claim_skips_the_task_while_another_transaction_holds_its_window(
    engine: Engine,
) -> None:
    """The race, forced: A's rated claim holds its transaction open; B's lock statement
    returns no row at once (it never waits), so B claims nothing; once A committed, B's
    lock is granted and its claim sees A's starts."""
    with Session(engine) as session, session.begin():
        queue.set_rate_limit(session, "noop", 3, per=60)
        for _ in range(8):
            noop.enqueue(session)
    with engine.connect() as a, engine.connect() as b:
        a.begin()
        assert a.execute(LOCK, {"rate_task": "noop"}).all() == [("noop",)]
        first = rated_claim(a, 5)
        assert len([r for r in first if r.id is not None]) == 3
        b.begin()
        assert b.execute(LOCK, {"rate_task": "noop"}).all() == [], "B got A's control row"
        b.rollback()
        a.commit()
        b.begin()
        assert b.execute(LOCK, {"rate_task": "noop"}).all() == [("noop",)]
        rows = rated_claim(b, 5)
        b.commit()
        assert [r.id for r in rows] == [None]
        assert rows[0].rate_allowance == 0
        assert rows[0].rate_free_at is not None
    assert len(start_times(engine, "noop")) == 3


def test_an_app_transaction_holding_a_rated_tasks_controls_never_stalls_the_worker(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """An application changes a rated task's limit in a transaction it keeps open: the
    worker goes on with everything else meanwhile, and claims the task once it commits."""
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 100, per=1)
        rated = [noop.enqueue(session) for _ in range(3)]
    with Session(engine) as app:
        app.begin()
        queue.set_rate_limit(app, "noop", 50, per=1)  # holds the control row
        with SessionLocal.begin() as session:
            others = [record.enqueue(session, value=str(i)) for i in range(5)]
        worker = queue.worker(SessionLocal, **FAST)
        with worker_thread(worker):
            wait_for(lambda: states(SessionLocal, others) == {"succeeded": 5}, timeout=10)
            # The rated task waits for the application, and nothing else did.
            assert states(SessionLocal, rated) == {"queued": 3}
            app.commit()
            wait_for(lambda: states(SessionLocal, rated) == {"succeeded": 3}, timeout=10)


def test_without_the_lock_two_claims_overrun_the_window(engine: Engine) -> None:
    """The control: the same two claims without the lock statement. B's snapshot cannot
    see A's uncommitted starts, so both find the window empty and together start twice
    the limit."""
    with Session(engine) as session, session.begin():
        queue.set_rate_limit(session, "noop", 3, per=60)
        for _ in range(8):
            noop.enqueue(session)
    with engine.connect() as a, engine.connect() as b:
        a.begin()
        first = [r for r in rated_claim(a, 5) if r.id is not None]
        b.begin()
        second = [r for r in rated_claim(b, 5) if r.id is not None]
        a.commit()
        b.commit()
    assert len(first) == 3
    assert len(second) == 3, "without the lock the second claim overruns the window"
    assert len(start_times(engine, "noop")) == 6


def rated_claim(connection: Connection, batch: int) -> list[Any]:
    return connection.execute(RATED, rated_params(batch)).all()


def rated_params(batch: int) -> dict[str, Any]:
    return {
        "tasks": ["noop"],
        "batch": batch,
        "worker": uuid.uuid4(),
        "lease": 30.0,
        "lease_map": "{}",
        "rate_task": "noop",
    }


def test_a_rate_limit_combines_with_a_concurrency_limit(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "limited1", 20, per=1.0)
        ids = [limited1.enqueue(session, pause=0.05) for _ in range(10)]
    worker = queue.worker(SessionLocal, concurrency=5, tasks=["limited1"], **FAST)
    with worker_thread(worker):
        wait_for(lambda: states(SessionLocal, ids) == {"succeeded": 10}, timeout=20)
    with SessionLocal() as session:
        runs = session.execute(
            select(
                func.extract("epoch", ExecutionLog.started_at),
                func.extract("epoch", ExecutionLog.finished_at),
            ).where(ExecutionLog.key == "limited1")
        ).all()
    # Never two at once (the concurrency limit), every start recorded (the rate limit).
    spans = sorted((float(s), float(e)) for s, e in runs)
    assert len(spans) == 10
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    assert len(start_times(engine, "limited1")) == 10


async def test_an_async_worker_honours_pause_and_rate_limits(
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    SessionLocal: sessionmaker[Session],
    engine: Engine,
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "noop", 3, per=0.4)
        queue.pause(session, "record")
    ids = enqueue_noops(SessionLocal, 7)
    with SessionLocal.begin() as session:
        paused = record.enqueue(session, value="x")
    worker = queue.async_worker(AsyncSessionLocal, concurrency=5, **FAST)
    stats = await worker.run(burst=True)
    assert stats.succeeded == 7
    assert states(SessionLocal, ids) == {"succeeded": 7}
    assert states(SessionLocal, [paused]) == {"queued": 1}
    times = start_times(engine, "noop")
    assert len(times) == 7 and busiest_window(times, 0.4) <= 3


def test_the_plain_claim_leaves_out_paused_and_rated_tasks_only(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.pause(session, "noop")
        queue.set_rate_limit(session, "record", 10)
    worker = queue.worker(SessionLocal, **FAST)
    with worker_thread(worker):
        wait_for(lambda: worker.decider is not None and bool(worker.decider.rated))
        core = worker.decider
        assert core is not None
        claimed = core.claim_params(1)["tasks"]
    assert "noop" not in claimed and "record" not in claimed
    assert set(claimed) == set(queue.tasks) - {"noop", "record"}
    assert json.loads(core.claim_params(1)["limit_map"]) == core.declared_limits


# -- command line ---------------------------------------------------------------------------


def test_pause_resume_and_rate_limit_commands(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqla_queue.cli.controls import parse_rate
    from sqla_queue.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    target = "tests.support.app:queue"
    assert main(["pause", target, "--url", db_url, "noop"]) == 0
    assert capsys.readouterr().out.strip() == "noop: paused"
    assert main(["rate-limit", target, "--url", db_url, "set", "record", "100/10s"]) == 0
    assert "record: rate limit now 100/10s" in capsys.readouterr().out
    with SessionLocal() as session:
        controls = queue.controls(session)
    assert controls["noop"].paused and controls["noop"].rate_limit is None
    assert controls["record"].rate_limit == RateLimit(100, 10.0)

    assert main(["rate-limit", target, "--url", db_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"task": "record", "max_starts": 100, "per_seconds": 10.0, "paused": False}
    ]
    assert main(["rate-limit", target, "--url", db_url]) == 0
    assert "100/10s" in capsys.readouterr().out

    # Bad input is refused with exit 2 and changes nothing.
    assert main(["pause", target, "--url", db_url, "nope"]) == 2
    assert "cannot pause" in capsys.readouterr().err
    assert main(["rate-limit", target, "--url", db_url, "set", "record", "fast"]) == 2
    assert "N/PERIOD" in capsys.readouterr().err
    assert main(["rate-limit", target, "--url", db_url, "set", "record", "0/s"]) == 2
    assert "max_starts" in capsys.readouterr().err
    with SessionLocal() as session:
        assert queue.controls(session)["record"].rate_limit == RateLimit(100, 10.0)

    assert main(["resume", target, "--url", db_url, "noop", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"task": "noop", "paused": False}
    assert main(["rate-limit", target, "--url", db_url, "unset", "record"]) == 0
    assert "record: rate limit now none" in capsys.readouterr().out
    with SessionLocal() as session:
        assert queue.controls(session) == {}
    assert parse_rate("50/s") == (50, 1.0) and parse_rate("1000/h") == (1000, 3600.0)
    assert parse_rate("3/1.5m") == (3, 90.0)
