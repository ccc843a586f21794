"""Concurrency limits held by capacity slots, raced with separate connections.

The seed's race: worker A's claim is in flight (its transaction open) when a higher-priority
job of the same limited task arrives, and worker B claims. B's snapshot cannot see A's
claim, so a count would let both through; the unique index on (task, slot) cannot be
fooled that way.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue._sqlstate import UNIQUE_VIOLATION, constraint_of, sqlstate_of
from sqla_queue.worker.base import WorkerBase
from sqla_queue.worker.settings import WorkerSettings
from tests.support.app import noop
from tests.support.limited import limited1, limited2, limited3, queue
from tests.support.running import pretend_claimed

pytestmark = pytest.mark.integration

LIMITED = statements.claim_statement(queue.tables, limited=True)
EX = queue.tables.executions
SLOT_INDEX = "sqla_queue_job_executions_slot_uq"


def params(batch: int, tasks: list[str] | None = None, offset: int = 0) -> dict[str, Any]:
    return {
        "tasks": tasks or ["limited1", "limited2", "noop"],
        "batch": batch,
        "worker": uuid.uuid4(),
        "lease": 30.0,
        "lease_map": "{}",
        "limit_map": json.dumps({"limited1": 1, "limited2": 2, "limited3": 3}),
        # Offset 0 by default: seats in order, so the tests can name them.
        "seat_offset": offset,
    }


def claim(
    connection: Connection, batch: int, tasks: list[str] | None = None, offset: int = 0
) -> list[Any]:
    rows = connection.execute(LIMITED, params(batch, tasks, offset)).all()
    return [r for r in rows if r.id is not None]


def running(engine: Engine, task: str) -> list[tuple[int, int | None]]:
    with engine.connect() as connection:
        return [
            (r.id, r.slot)
            for r in connection.execute(
                select(EX.c.id, EX.c.slot)
                .where(EX.c.task == task, EX.c.state == "running")
                .order_by(EX.c.slot)
            )
        ]


def enqueue(engine: Engine, task: Any, priority: int = 0) -> int:
    with Session(engine) as session, session.begin():
        job_id: int = task.options(priority=priority).enqueue(session)
        return job_id


def claim_in_thread(connection: Connection, batch: int) -> tuple[threading.Thread, dict[str, Any]]:
    """Start a claim that may block on another claim's seat; its rows or error land in the dict."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["rows"] = claim(connection, batch)
        except IntegrityError as exc:
            outcome["error"] = exc
            connection.rollback()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def wait_until_blocked(engine: Engine, pid: int) -> None:
    deadline = time.monotonic() + 10
    with engine.connect() as connection:
        while time.monotonic() < deadline:
            waiting = connection.execute(
                text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            ).scalar()
            if waiting == "Lock":
                return
            time.sleep(0.02)
    raise AssertionError("the second claim never waited on the first one's slot")


def test_in_flight_claim_and_higher_priority_arrival(engine: Engine) -> None:
    first = enqueue(engine, limited2)
    with engine.connect() as a, engine.connect() as b:
        # A's claim takes slot 0 and stays uncommitted.
        assert [(r.id,) for r in claim(a, 1)] == [(first,)]
        urgent = enqueue(engine, limited2, priority=10)
        b_pid = b.execute(text("SELECT pg_backend_pid()")).scalar_one()
        thread, outcome = claim_in_thread(b, 1)
        # B sees no running row in its snapshot, computes slot 0 as free, and must wait
        # on A's uncommitted entry in the slot index.
        wait_until_blocked(engine, b_pid)
        assert running(engine, "limited2") == []  # nothing committed yet
        a.commit()
        thread.join(10)
        error = outcome.get("error")
        assert error is not None, outcome
        assert sqlstate_of(error) == UNIQUE_VIOLATION
        assert constraint_of(error) == SLOT_INDEX
        # The worker reads that as a lost race: an empty batch, poll again.
        base = WorkerBase(queue, None, WorkerSettings())
        assert base._is_lost_race(error)
        assert running(engine, "limited2") == [(first, 0)]
        # Retried after A committed: B sees slot 0 held and takes slot 1.
        assert [r.id for r in claim(b, 1)] == [urgent]
        b.commit()
    assert running(engine, "limited2") == [(first, 0), (urgent, 1)]


def test_limit_one_never_admits_a_second_run(engine: Engine) -> None:
    first = enqueue(engine, limited1)
    with engine.connect() as a, engine.connect() as b:
        assert [r.id for r in claim(a, 5)] == [first]
        enqueue(engine, limited1, priority=10)
        thread, outcome = claim_in_thread(b, 5)
        thread.join(1.0)
        a.commit()
        thread.join(10)
        assert "error" in outcome or outcome.get("rows") == []
        # After A committed, the limit is full: B gets nothing, not a second run.
        assert claim(b, 5) == []
        b.commit()
    assert [job for job, _ in running(engine, "limited1")] == [first]


def test_a_rolled_back_claim_frees_its_slot(engine: Engine) -> None:
    job = enqueue(engine, limited1)
    with engine.connect() as a:
        assert [r.id for r in claim(a, 1)] == [job]
        a.rollback()
    with engine.connect() as b:
        assert [r.id for r in claim(b, 1)] == [job]
        b.commit()
    assert running(engine, "limited1") == [(job, 0)]


def test_seat_search_wraps_around_from_its_offset(engine: Engine) -> None:
    jobs = [enqueue(engine, limited3) for _ in range(4)]
    with engine.begin() as connection:
        assert len(claim(connection, 2, ["limited3"], offset=2)) == 2
    # From offset 2 of 0..2: seat 2, then wrap to seat 0.
    assert sorted(slot for _, slot in running(engine, "limited3")) == [0, 2]
    with engine.begin() as connection:
        # Any offset finds the one seat left, and then the limit is full.
        assert len(claim(connection, 5, ["limited3"], offset=1_000_001)) == 1
        assert claim(connection, 5, ["limited3"], offset=7) == []
    assert sorted(slot for _, slot in running(engine, "limited3")) == [0, 1, 2]
    assert len(jobs) == 4


def test_lowered_limit_waits_until_the_running_count_is_under_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """Seats held above a lowered limit count against it, not only the seats below it."""
    for _ in range(5):
        enqueue(engine, limited3)
    with engine.begin() as connection:
        assert len(claim(connection, 5, ["limited3"])) == 3
    with SessionLocal.begin() as session:
        queue.set_limit(session, "limited3", 1)
    for finished in range(3):
        with engine.begin() as connection:
            # Three, then two, then one still run: the limit of one is full each time.
            assert claim(connection, 5, ["limited3"]) == [], finished
            job, _ = running(engine, "limited3")[0]
            connection.execute(EX.delete().where(EX.c.id == job))
    with engine.begin() as connection:
        assert len(claim(connection, 5, ["limited3"])) == 1
    assert [slot for _, slot in running(engine, "limited3")] == [0]


def test_other_unique_violations_are_not_races(engine: Engine) -> None:
    base = WorkerBase(queue, None, WorkerSettings())
    with engine.connect() as connection, pytest.raises(IntegrityError) as info:
        connection.execute(text("INSERT INTO results (job_id) VALUES (1), (1)"))
    assert sqlstate_of(info.value) == UNIQUE_VIOLATION
    assert not base._is_lost_race(info.value)


def test_full_limited_task_does_not_starve_others(engine: Engine) -> None:
    """The capacity filter runs before the LIMIT: blocked rows never fill the batch."""
    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, [limited1.options(priority=9).call() for _ in range(50)])
        others = queue.enqueue_many(session, [noop.call() for _ in range(5)])
    with engine.begin() as connection:
        first = claim(connection, 10)
    assert len([r for r in first if r.task == "limited1"]) == 1
    assert {r.id for r in first if r.task == "noop"} == set(others)


def test_reclaimed_job_keeps_its_seat_and_is_not_gated(engine: Engine) -> None:
    lost = enqueue(engine, limited1)
    fresh = enqueue(engine, limited1, priority=10)
    with engine.begin() as connection:
        assert [r.id for r in claim(connection, 1)] == [fresh]
        # Pretend fresh's worker died long ago, and reclaim it.
        connection.execute(
            update(EX).where(EX.c.id == fresh).values(alive_at=func.now() - dt.timedelta(hours=1))
        )
        reclaimed = connection.execute(
            statements.reclaim_statement(queue.tables), {"held": []}
        ).all()
        assert [r.id for r in reclaimed] == [fresh]
    assert running(engine, "limited1") == []
    with engine.begin() as connection:
        # The reclaimed row still holds slot 0: it is claimed again, the other job is not.
        assert [r.id for r in claim(connection, 5)] == [fresh]
    assert running(engine, "limited1") == [(fresh, 0)]
    with engine.connect() as connection:
        assert connection.scalar(select(EX.c.state).where(EX.c.id == lost)) == "pending"


def test_running_rows_without_a_slot_are_counted(engine: Engine) -> None:
    """Rows claimed before the upgrade to version 2 hold no slot; the count gate covers them."""
    legacy = enqueue(engine, limited2)
    with engine.begin() as connection:
        pretend_claimed(connection, legacy)
    jobs = [enqueue(engine, limited2) for _ in range(3)]
    with engine.begin() as connection:
        got = claim(connection, 5)
    # Limit 2, one legacy run: one seat left, and it is numbered from 1.
    assert [r.id for r in got] == [jobs[0]]
    assert running(engine, "limited2") == [(jobs[0], 1), (legacy, None)]


def test_stored_limit_wins_and_applies_without_restart(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        queue.set_limit(session, "limited1", 3)
        queue.set_limit(session, "noop", 1)
    with SessionLocal() as session:
        limits = queue.limits(session)
        assert (limits["limited1"].declared, limits["limited1"].stored) == (1, 3)
        assert limits["limited1"].effective == 3
        assert limits["noop"].effective == 1
    for _ in range(4):
        enqueue(engine, limited1)
    with engine.begin() as connection:
        assert len(claim(connection, 10, ["limited1"])) == 3
    with SessionLocal.begin() as session:
        queue.set_limit(session, "limited1", None)
    with SessionLocal() as session:
        assert queue.limits(session)["limited1"].effective == 1
    with engine.connect() as connection, pytest.raises(ValueError, match="whole number"):
        queue.set_limit(connection, "limited1", 0)


def test_worker_switches_to_slots_when_a_limit_is_stored(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        queue.set_limit(session, "noop", 2)
        for _ in range(5):
            noop.enqueue(session)
    worker = queue.worker(SessionLocal, tasks=["noop"], concurrency=5)
    stats = worker.run(burst=True)
    assert stats.succeeded == 5
    assert worker.decider is not None and worker.decider.limited
