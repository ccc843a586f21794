"""A worker beside the application's own long transactions (issue 36, section 1).

A real worker process runs 20 jobs whose lease is 2 s, beside a second one that claims
nothing and sweeps for lost jobs every second. Meanwhile the application holds
transactions open for three leases in every way a user can: a signal sent to a running job,
a lock on the row a durable job's condition waits on, a cancel, a requeue, a plain ``FOR
UPDATE`` on the row a job writes, and a ``REPEATABLE READ`` reader of the queue's tables.
None of them may make the worker's jobs look lost: no job runs twice, and every one ends.

Then one SIGTERM stops a worker whose handler waits on an application's lock, within its
shutdown timeout, and the job runs once after the application lets go.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from tests.support import beside_app
from tests.support.app import ExecutionLog, Order, Shipment
from tests.support.beside_app import LEASE, queue, shipped
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.xdist_group("processes"),
    # A worker of 24 handler seats, each with its session, its own connections, a second
    # worker, and the test's seven held transactions.
    pytest.mark.connection_budget(45),
]

EX = queue.tables.executions
JOBS = queue.tables.jobs
TARGET = "tests.support.beside_app:queue"
#: How long the application holds each transaction: three leases.
HOLD = 3 * LEASE
#: Plain jobs run longer than the holds, so they are running throughout.
RUNNING_JOBS = 18
SHUTDOWN_TIMEOUT = 3.0


def _tasks(face: str) -> tuple[Any, Any, Any]:
    """The running, linked-row and condition-waiting tasks of ``face``'s handlers."""
    if face == "async":
        return beside_app.bs_hold_async, beside_app.bs_linked_async, beside_app.bs_until_async
    return beside_app.bs_hold, beside_app.bs_linked, beside_app.bs_until


def _running(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).where(EX.c.state == "running")) or 0)


def _reclaims(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.coalesce(func.sum(EX.c.reclaims), 0))) or 0)


def _statuses(engine: Engine, job_ids: list[int]) -> dict[int, str]:
    with engine.connect() as connection:
        rows = connection.execute(select(JOBS.c.id, JOBS.c.status).where(JOBS.c.id.in_(job_ids)))
        return {row.id: row.status for row in rows}


def _executions(engine: Engine) -> dict[int, list[int]]:
    """The attempts that started, per job (one ExecutionLog row each)."""
    found: dict[int, list[int]] = {}
    with engine.connect() as connection:
        for job_id, attempt in connection.execute(
            select(ExecutionLog.job_id, ExecutionLog.attempt).order_by(ExecutionLog.id)
        ):
            found.setdefault(job_id, []).append(attempt)
    return found


def _held(engine: Engine, stack: ExitStack) -> Connection:
    """A connection whose transaction stays open until ``stack`` closes (then commits)."""
    connection = stack.enter_context(engine.connect())
    transaction = connection.begin()
    stack.callback(transaction.commit)
    return connection


def _backend_waiting_on_lock(engine: Engine, query_part: str) -> bool:
    """Whether some backend waits on a lock, running a statement that has ``query_part``."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND pid <> pg_backend_pid()"
            )
        )
        return any(query_part in row.query for row in rows)


@pytest.fixture
def worker_log(tmp_path: Path) -> Path:
    return tmp_path / "worker.log"


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes to kill at the end, whatever the test did."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_held_app_transactions_of_every_kind_never_make_a_live_workers_jobs_run_twice(
    face: str,
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    worker_log: Path,
    stopped: list[subprocess.Popen[bytes]],
) -> None:
    with SessionLocal.begin() as session:
        session.add(Order(id=1, email="new@example.com"))
        session.add(Shipment(id=7, status="new"))
    hold, linker, until = _tasks(face)
    with SessionLocal.begin() as session:
        plain = [hold.enqueue(session, seconds=HOLD + 4.0) for _ in range(RUNNING_JOBS)]
        linked = linker.enqueue(session, order_id=1)
        waiter = until.enqueue(session, shipment_id=7)
        later = hold.options(delay=dt.timedelta(hours=1)).enqueue(session, seconds=0.0)
        to_requeue = hold.options(delay=dt.timedelta(hours=1)).enqueue(session, seconds=0.0)
    # A cancelled job, for the requeue below.
    with SessionLocal.begin() as session:
        assert queue.cancel(session, [to_requeue]) == {to_requeue: "cancelled"}

    with ExitStack() as app:
        # Before the worker starts: the row the linked job writes, and the row the durable
        # job's condition reads, are locked by the application.
        order_lock = _held(engine, app)
        order_lock.execute(select(Order).where(Order.id == 1).with_for_update())
        shipment_lock = _held(engine, app)
        shipment_lock.execute(select(Shipment).where(Shipment.id == 7).with_for_update())

        tasks = ",".join(task.name for task in (hold, linker, until))
        args = ("--concurrency", "24", "--tasks", tasks, "--shutdown-timeout", "5")
        args += ("--async",) if face == "async" else ()
        stopped.append(start_worker(db_url, *args, log_path=worker_log, target=TARGET))
        # Another worker, which claims nothing, sweeps for lost jobs every second: the
        # first one's jobs are reclaimed as soon as they look lost.
        sweeper = ("--tasks", "bs_idle")
        stopped.append(start_worker(db_url, *sweeper, log_path=worker_log, target=TARGET))
        # 18 plain jobs and the linked one run; the waiter runs or waits, suspended.
        wait_for(lambda: _running(engine) >= RUNNING_JOBS + 1, timeout=30)
        wait_for(lambda: _backend_waiting_on_lock(engine, "UPDATE orders"), timeout=30)

        # The other ways a caller holds a transaction open beside the worker.
        sender = _held(engine, app)
        sent = queue.signal(sender, plain[0], "nudge", {"from": "a batch script"})
        assert sent.stored
        canceller = _held(engine, app)
        assert queue.cancel(canceller, [later]) == {later: "cancelled"}
        requeuer = _held(engine, app)
        assert queue.requeue(requeuer, [to_requeue]).requeued == [to_requeue]
        reader = app.enter_context(engine.connect())
        reader.execution_options(isolation_level="REPEATABLE READ")
        reader_tx = reader.begin()
        app.callback(reader_tx.rollback)
        assert reader.scalar(select(func.count()).select_from(EX)) >= RUNNING_JOBS
        # A running job's own execution row, locked by the application.
        row_lock = _held(engine, app)
        row_lock.execute(select(EX.c.id).where(EX.c.id == plain[1]).with_for_update())

        # Three leases: a worker whose beats waited for any of these would lose its jobs.
        deadline = time.monotonic() + HOLD
        while time.monotonic() < deadline:
            assert _reclaims(engine) == 0, "a live worker's job was reclaimed"
            time.sleep(0.25)
        # The worker is alive and claims nothing twice; the linked job still waits.
        assert _running(engine) >= RUNNING_JOBS + 1
        # A job stuck on the application's lock can be cancelled meanwhile (the cancel
        # commits on its own connection, and no lock of the worker's is in its way).
        started = time.monotonic()
        with SessionLocal.begin() as session:
            assert queue.cancel(session, [linked]) == {linked: "requested"}
        assert time.monotonic() - started < 5.0
        # The shipment ships in the transaction that held its row.
        shipment_lock.execute(
            Shipment.__table__.update().where(Shipment.id == 7).values(status="shipped")
        )
        shipped.wake(shipment_lock, 7)
    # Every transaction is over. Every job ends, each having run once.
    expected = [*plain, linked, waiter, to_requeue]
    wait_for(
        lambda: (
            set(_statuses(engine, expected).values()) <= {"succeeded", "cancelled"}
            and len(_statuses(engine, expected)) == len(expected)
        ),
        timeout=60,
    )
    statuses = _statuses(engine, expected)
    # The linked job was asked to cancel while it waited; it ends either way, once.
    assert statuses[linked] in ("succeeded", "cancelled")
    assert {s for j, s in statuses.items() if j != linked} == {"succeeded"}, statuses
    ran = _executions(engine)
    assert {job: ran.get(job) for job in [*plain, linked, to_requeue]} == {
        job: [1] for job in [*plain, linked, to_requeue]
    }, worker_log.read_text()
    assert _reclaims(engine) == 0
    with engine.connect() as connection:
        rows = connection.execute(select(JOBS.c.id, JOBS.c.attempts).where(JOBS.c.id.in_(expected)))
        attempts = {row.id: row.attempts for row in rows}
    assert set(attempts.values()) == {1}, attempts


@pytest.mark.parametrize("face", ["sync", "async"])
def test_one_sigterm_stops_a_worker_whose_handler_waits_on_an_app_lock(
    face: str,
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    worker_log: Path,
    stopped: list[subprocess.Popen[bytes]],
) -> None:
    with SessionLocal.begin() as session:
        session.add(Order(id=2, email="new@example.com"))
    _, linker, _ = _tasks(face)
    with SessionLocal.begin() as session:
        job = linker.enqueue(session, order_id=2)
    with ExitStack() as app:
        lock = _held(engine, app)
        lock.execute(select(Order).where(Order.id == 2).with_for_update())
        args = ("--tasks", linker.name, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
        args += ("--async",) if face == "async" else ()
        proc = start_worker(db_url, *args, log_path=worker_log, target=TARGET)
        stopped.append(proc)
        wait_for(lambda: _backend_waiting_on_lock(engine, "UPDATE orders"), timeout=30)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=SHUTDOWN_TIMEOUT + 30)
        elapsed = time.monotonic() - started
        # One SIGTERM: the worker hands the job back once the timeout is over, and exits.
        assert code == 0, worker_log.read_text()
        assert elapsed < SHUTDOWN_TIMEOUT + 5.0, elapsed
        with engine.connect() as connection:
            state = connection.scalar(select(EX.c.state).where(EX.c.id == job))
        assert state == "pending"
    # The application let go: the job runs (once more: the handed-back attempt never
    # committed), and ends.
    drain = ("--burst", "--tasks", linker.name, *(("--async",) if face == "async" else ()))
    assert start_worker(db_url, *drain, log_path=worker_log, target=TARGET).wait(60) == 0
    with engine.connect() as connection:
        assert connection.scalar(select(JOBS.c.status).where(JOBS.c.id == job)) == "succeeded"
        email = connection.scalar(select(Order.email).where(Order.id == 2))
    assert email == "sent@example.com"
