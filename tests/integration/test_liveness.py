"""Heartbeats, reclaim of lost executions and fenced completion, with real connections."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, queue, sleepy, slow_first
from tests.support.running import pretend_claimed, wait_for, worker_thread

pytestmark = pytest.mark.integration

EX = queue.tables.executions


def execution(session: Session, job_id: int) -> object:
    return session.execute(select(EX).where(EX.c.id == job_id)).one_or_none()


def test_heartbeat_keeps_a_long_job_alive(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        job_id = sleepy.enqueue(session, seconds=1.5)
    worker = queue.worker(SessionLocal, heartbeat_interval=0.2, install_signal_handlers=False)
    with worker_thread(worker):
        wait_for(lambda: _state(SessionLocal, job_id) == "running")
        with SessionLocal() as session:
            first = session.scalar(select(EX.c.alive_at).where(EX.c.id == job_id))
        wait_for(lambda: _alive_at(SessionLocal, job_id) not in (None, first), timeout=5)
        wait_for(lambda: _status(SessionLocal, job_id) == "succeeded", timeout=10)


def _state(factory: sessionmaker[Session], job_id: int) -> str | None:
    with factory() as session:
        return session.scalar(select(EX.c.state).where(EX.c.id == job_id))


def _alive_at(factory: sessionmaker[Session], job_id: int) -> dt.datetime | None:
    with factory() as session:
        return session.scalar(select(EX.c.alive_at).where(EX.c.id == job_id))


def _status(factory: sessionmaker[Session], job_id: int) -> str | None:
    with factory() as session:
        return session.scalar(select(queue.Job.status).where(queue.Job.id == job_id))


def test_a_dead_workers_execution_is_reclaimed_and_run_again(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = sleepy.enqueue(session, seconds=0.0)
    # A worker claimed it a minute ago and then vanished without a heartbeat.
    with engine.begin() as connection:
        pretend_claimed(connection, job_id, alive_for=dt.timedelta(minutes=1))
    stats = queue.worker(SessionLocal).run(burst=True)
    assert stats.succeeded == 1
    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None and job.status == "succeeded"
        assert job.attempts == 2  # the lost attempt counted
        log = session.execute(select(ExecutionLog.attempt).where(ExecutionLog.job_id == job_id))
        assert [a for (a,) in log] == [2]


def test_fresh_heartbeat_is_not_reclaimed(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = sleepy.enqueue(session, seconds=0.0)
    with engine.begin() as connection:
        pretend_claimed(connection, job_id)
    stats = queue.worker(SessionLocal).run(burst=True)
    assert stats.claimed == 0
    assert _state(SessionLocal, job_id) == "running"


def test_late_completion_of_a_reclaimed_job_is_fenced_off(
    SessionLocal: sessionmaker[Session],
) -> None:
    """A's first attempt outlives its 1 s lease (A sends no heartbeat in time); B reclaims
    and finishes it; A's late result must not overwrite B's."""
    with SessionLocal.begin() as session:
        job_id = slow_first.enqueue(session, seconds=3.0)
    # Neither A's heartbeat nor its registry (which beats at the maintenance interval,
    # at most every 5 s) stamps its row again before B looks.
    worker_a = queue.worker(
        SessionLocal,
        tasks=["slow_first"],
        heartbeat_interval=60,
        reclaim_interval=60,
        install_signal_handlers=False,
    )
    with worker_thread(worker_a) as stats_a:
        wait_for(lambda: _state(SessionLocal, job_id) == "running")
        worker_b = queue.worker(
            SessionLocal,
            tasks=["slow_first"],
            reclaim_interval=0.2,
            poll_interval=0.1,
            install_signal_handlers=False,
        )
        with worker_thread(worker_b) as stats_b:
            wait_for(lambda: _status(SessionLocal, job_id) == "succeeded", timeout=10)
            # Wait for A to finish its stale attempt and try to ack it.
            wait_for(
                lambda: worker_a.decider is not None and worker_a.decider.stats["fenced"] == 1,
                timeout=10,
            )
    assert stats_a[0].fenced == 1
    assert stats_a[0].succeeded == 0
    assert stats_b[0].succeeded == 1
    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None
        assert (job.status, job.result, job.attempts) == ("succeeded", "attempt 2", 2)
        attempts = sorted(
            a
            for (a,) in session.execute(
                select(ExecutionLog.attempt).where(ExecutionLog.job_id == job_id)
            )
        )
        assert attempts == [1, 2]


def test_heartbeat_of_a_reclaimed_execution_changes_nothing(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from sqla_queue import statements

    with SessionLocal.begin() as session:
        job_id = sleepy.enqueue(session, seconds=0.0)
    old = uuid.uuid4()
    with engine.begin() as connection:
        new = pretend_claimed(
            connection, job_id, attempt=2, alive_for=dt.timedelta(hours=1), lease_seconds=None
        )
        stale = statements.heartbeat_statement(queue.tables)

        def beat(worker: uuid.UUID, attempt: int) -> list[object]:
            params = {"worker": worker, "ids": [job_id], "attempts": [attempt]}
            params |= {"hostname": "h", "pid": 1, "tasks": ["sleepy"], "concurrency": 1}
            return list(connection.execute(stale, params).all())

        alive = select(EX.c.alive_at).where(EX.c.id == job_id)
        before = connection.scalar(alive)
        # The old owner (attempt 1) and a wrong attempt of the new owner both miss, and
        # neither moves the execution's clock.
        assert beat(old, 1) == []
        assert beat(new, 1) == []
        assert connection.scalar(alive) == before
        # The holder's own beat returns the id, with no cancel request, and stamps it.
        assert beat(new, 2) == [(job_id, False)]
        assert connection.scalar(alive) != before


def test_a_worker_transaction_left_idle_is_ended_by_the_server(engine: Engine) -> None:
    """The guard that opens every worker transaction also sets
    ``idle_in_transaction_session_timeout``: a worker cut off between two round trips of a
    transaction does not hold its rows locked (out of the reclaim sweep's reach) until the
    server notices the lost client. Outside the transaction the setting is the server's."""
    from sqlalchemy import text

    from sqla_queue.statements import planner_guard
    from sqla_queue.statements.planner import IDLE_IN_TRANSACTION

    show = text("SHOW idle_in_transaction_session_timeout")
    with engine.connect() as connection:
        outside = connection.scalar(show)
        connection.commit()
        connection.execute(planner_guard())
        inside = connection.scalar(show)
        connection.commit()
        after = connection.scalar(show)
    assert inside == IDLE_IN_TRANSACTION
    assert outside == after != inside
