"""Cancel against real PostgreSQL: queued jobs never start, running ones are asked to stop.

``queue.cancel`` commits at once, on a connection of its own: the tests of its contract
pass every kind of source and show that the caller's transaction neither carries the cancel
nor stalls a worker. Running jobs are cancelled under real workers (sync and async, with
``def`` and ``async def`` handlers that meet the test at a gate, see tests/support/app.py).

The races are forced deterministically with held-open transactions on separate
connections. Where the cancel must hold its locks while a worker's statement waits, the
test runs the cancel *statement* (``cancel_statement``) on a connection whose transaction
it keeps open, since the public API commits at once; where the cancel is the one that
waits, the public API itself waits for the held-open claim or completion.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import CancelOutcome, RunStats, statements
from sqla_queue.logic.outcomes import OutcomeKind
from sqla_queue.statements.lifecycle import cancel_statement
from tests.support.app import (
    ExecutionLog,
    echo,
    gate,
    gated,
    gated_async,
    keyed,
    queue,
    reset_gates,
)
from tests.support.lifecycle import (
    EX,
    backend_pid,
    claim,
    complete,
    execution_row,
    job_row,
    status_of,
    wait_until_blocked,
)
from tests.support.running import pretend_claimed, wait_for, worker_thread

pytestmark = pytest.mark.integration

HEARTBEAT = 0.2

#: The statement ``queue.cancel`` commits at once, for the tests that must hold it open.
CANCEL = cancel_statement(queue.tables)
#: The workers' periodic sweep of executions parked ``done``.
CLEANUP = statements.cleanup_statement(queue.tables)


@pytest.fixture(autouse=True)
def _gates() -> Iterator[None]:
    yield
    reset_gates()


def final(engine: Engine, job_id: int) -> bool:
    return status_of(engine, job_id) != "queued"


def ran(engine: Engine, job_id: int) -> bool:
    with engine.connect() as connection:
        logged = connection.execute(
            select(ExecutionLog.id).where(ExecutionLog.job_id == job_id)
        ).first()
    return logged is not None


def gone_or_parked(engine: Engine, job_id: int) -> bool:
    """The job's execution is deleted, or parked ``done`` holding nothing for the sweep."""
    row = execution_row(engine, job_id)
    return row is None or (row.state, row.worker_id, row.alive_at, row.slot) == (
        "done",
        None,
        None,
        None,
    )


def hold_cancel(engine: Engine, ids: list[int]) -> tuple[Connection, dict[int, str]]:
    """Run the cancel statement in a transaction left open: the connection and outcomes."""
    connection = engine.connect()
    connection.begin()
    outcomes = {row[0]: row[1] for row in connection.execute(CANCEL, {"ids": ids})}
    return connection, outcomes


def lock_waiter_in_this_database(engine: Engine) -> bool:
    """Whether a backend of the test's own database waits for a lock right now (the
    public API's connection, whose pid the test cannot ask)."""
    with engine.connect() as connection:
        waiting = connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return bool(waiting)


def sweep(engine: Engine) -> None:
    """Run the workers' sweep of parked executions once."""
    with engine.begin() as connection:
        connection.execute(CLEANUP, {"limit": 100})


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` without blocking the loop (a worker may run on it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


# -- the contract: its own short transaction, from any source -----------------------------


def test_a_queued_job_is_cancelled_and_never_runs(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        due = gated.enqueue(session, name="never")
        later = gated.options(delay=3600).enqueue(session, name="never")
        survivor = echo.enqueue(session, value="runs")
    outcome = queue.cancel(SessionLocal, [due, later])
    assert outcome == {due: CancelOutcome.CANCELLED, later: CancelOutcome.CANCELLED}
    for job_id in (due, later):
        job = job_row(engine, job_id)
        assert (job.status, job.attempts) == ("cancelled", 0)
        assert job.finished_at is not None
        assert execution_row(engine, job_id) is None
    stats = queue.worker(SessionLocal, poll_interval=0.05).run(burst=True)
    assert (stats.claimed, stats.succeeded) == (1, 1)
    assert not gate("never").entered.is_set()
    assert status_of(engine, survivor) == "succeeded"
    # Cancelling again says it is over; so does cancelling a finished job.
    assert queue.cancel(engine, [due, survivor]) == {due: "finished", survivor: "finished"}


def test_every_kind_of_sync_source_cancels_on_a_connection_of_its_own(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        by_engine, by_connection, by_session, by_factory = (
            echo.enqueue(session, value=n) for n in range(4)
        )
    assert queue.cancel(engine, [by_engine]) == {by_engine: "cancelled"}
    with engine.connect() as connection:
        assert queue.cancel(connection, [by_connection]) == {by_connection: "cancelled"}
        # Only its engine was used: the caller's connection began nothing.
        assert not connection.in_transaction()
    with Session(engine) as session:
        assert queue.cancel(session, [by_session]) == {by_session: "cancelled"}
        assert not session.in_transaction()
    assert queue.cancel(SessionLocal, [by_factory]) == {by_factory: "cancelled"}
    for job_id in (by_engine, by_connection, by_session, by_factory):
        assert status_of(engine, job_id) == "cancelled"
    assert queue.cancel(engine, []) == {}
    # Nothing to open a connection from: refused, whether or not there are ids.
    for source in (object(), sessionmaker()):
        for ids in ([by_engine], []):
            with pytest.raises(TypeError, match=r"queue\.cancel"):
                queue.cancel(source, ids)


def test_a_cancel_commits_at_once_whatever_the_callers_transaction_does(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = echo.enqueue(session)
    with SessionLocal() as session:
        session.begin()
        fresh = echo.enqueue(session, value="not committed")
        # A job enqueued in a transaction that has not committed is not found.
        assert queue.cancel(session, [job_id, fresh]) == {
            job_id: "cancelled",
            fresh: "not_found",
        }
        # Committed already: another connection sees it while the caller's transaction is
        # still open, and the caller's own next statement does too (read committed).
        assert session.in_transaction()
        assert status_of(engine, job_id) == "cancelled"
        assert session.get(queue.Job, job_id, populate_existing=True).status == "cancelled"  # type: ignore[union-attr]
        session.rollback()
    # The caller's rollback takes its own enqueue back, not the cancel.
    assert status_of(engine, job_id) == "cancelled"
    assert execution_row(engine, job_id) is None
    assert job_row(engine, fresh) is None
    # "not_found" changed nothing: once its enqueue commits, such a job is queued and runs.
    with SessionLocal.begin() as session:
        late = echo.enqueue(session, value="late")
        assert queue.cancel(session, [late]) == {late: "not_found"}
    assert execution_row(engine, late).state == "pending"
    assert queue.worker(SessionLocal, tasks=["echo"]).run(burst=True).succeeded == 1
    job = job_row(engine, late)
    assert (job.status, job.result) == ("succeeded", "late")


def test_a_cancel_never_waits_for_the_callers_enqueue_behind_the_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """Replace a keyed job in one transaction: enqueue its successor, cancel it. The
    enqueue holds the job's execution as its key's predecessor (KEY SHARE) until the
    caller commits; the cancel, on its own connection, must not wait for that lock, or it
    would wait for its own caller forever (PostgreSQL sees no deadlock: the caller waits
    in the client)."""
    with SessionLocal.begin() as session:
        old = keyed.options(queue_id="k").enqueue(session, key="k", seq=0)
    got: list[tuple[int, dict[int, str]]] = []

    def replace() -> None:
        with SessionLocal.begin() as session:
            new = keyed.options(queue_id="k").enqueue(session, key="k", seq=1)
            got.append((new, queue.cancel(session, [old])))

    thread = threading.Thread(target=replace, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the cancel waited for its caller's transaction"
    [(new, outcome)] = got
    assert outcome == {old: "cancelled"}
    assert execution_row(engine, new).state == "waiting"
    # The successor runs (the parked predecessor is swept), the cancelled job never does.
    stats = queue.worker(SessionLocal, tasks=["keyed"], poll_interval=0.05).run(burst=True)
    assert stats.succeeded == 1
    assert ran(engine, new) and not ran(engine, old)
    assert (status_of(engine, old), status_of(engine, new)) == ("cancelled", "succeeded")


def test_outcomes_for_every_kind_of_id(engine: Engine) -> None:
    with engine.begin() as connection:
        running, done = (echo.enqueue(connection, value=i) for i in range(2))
    worker = uuid.uuid4()
    with engine.begin() as connection:
        rows = {r.id: r for r in claim(connection, worker, ["echo"])}
        assert complete(connection, worker, done, rows[done].attempt) == [done]
        queued = echo.enqueue(connection)
    got = queue.cancel(engine, [done, running, queued, 999_999, queued])
    assert got == {
        queued: CancelOutcome.CANCELLED,
        running: CancelOutcome.REQUESTED,
        done: CancelOutcome.FINISHED,
        999_999: CancelOutcome.NOT_FOUND,
    }
    assert execution_row(engine, running).cancel_requested is True
    assert status_of(engine, running) == "queued"
    with pytest.raises((TypeError, ValueError)):
        queue.cancel(engine, [1.5])  # type: ignore[list-item]


async def test_every_kind_of_async_source_cancels_on_a_connection_of_its_own(
    async_engine: AsyncEngine, AsyncSessionLocal: async_sessionmaker[AsyncSession], engine: Engine
) -> None:
    async with AsyncSessionLocal.begin() as session:
        ids = [await echo.enqueue(session, value=n) for n in range(4)]
    by_engine, by_connection, by_session, by_factory = ids
    assert await queue.cancel(async_engine, [by_engine]) == {by_engine: "cancelled"}
    async with async_engine.connect() as connection:
        assert await queue.cancel(connection, [by_connection, by_engine]) == {
            by_engine: "finished",
            by_connection: "cancelled",
        }
        assert not connection.in_transaction()
    async with AsyncSessionLocal() as session:
        await session.begin()
        fresh = await echo.enqueue(session, value="not committed")
        assert await queue.cancel(session, [by_session, fresh]) == {
            by_session: "cancelled",
            fresh: "not_found",
        }
        await session.rollback()
    assert await queue.cancel(AsyncSessionLocal, [by_factory]) == {by_factory: "cancelled"}
    assert await queue.cancel(AsyncSessionLocal, []) == {}
    assert {status_of(engine, job_id) for job_id in ids} == {"cancelled"}
    assert job_row(engine, fresh) is None
    stats = await queue.async_worker(AsyncSessionLocal).run(burst=True)
    assert stats.claimed == 0


def test_keyed_jobs_cancelled_waiting_or_at_the_head_let_the_rest_run_in_order(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        a = [keyed.options(queue_id="a").enqueue(session, key="a", seq=n) for n in range(3)]
        b = [keyed.options(queue_id="b").enqueue(session, key="b", seq=n) for n in range(3)]
    assert execution_row(engine, a[1]).state == "waiting"
    # The head of "a" and a waiting job of "b".
    assert queue.cancel(engine, [a[0], b[1]]) == {a[0]: "cancelled", b[1]: "cancelled"}
    stats = queue.worker(SessionLocal, tasks=["keyed"], poll_interval=0.05).run(burst=True)
    assert stats.succeeded == 4
    with SessionLocal() as session:
        order = session.scalars(select(ExecutionLog.key).order_by(ExecutionLog.started_at)).all()
    assert [k for k in order if k.startswith("a")] == ["a:1", "a:2"]
    assert [k for k in order if k.startswith("b")] == ["b:0", "b:2"]
    assert {status_of(engine, j) for j in (a[0], b[1])} == {"cancelled"}
    with engine.connect() as connection:
        left = connection.execute(select(EX.c.id)).all()
    assert left == []


def test_a_cancelled_job_can_be_requeued(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = echo.enqueue(session, value="again")
    queue.cancel(engine, [job_id])
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [job_id]) == [job_id]
    assert queue.worker(SessionLocal).run(burst=True).succeeded == 1
    job = job_row(engine, job_id)
    assert (job.status, job.result) == ("succeeded", "again")


@pytest.mark.parametrize("parked_by", ["cancel of a queued keyed job", "retry of a cancelled job"])
def test_a_job_whose_execution_is_still_parked_can_be_requeued_at_once(
    engine: Engine, SessionLocal: sessionmaker[Session], parked_by: str
) -> None:
    """A cancel can leave the execution parked ``done`` until a worker's sweep deletes it:
    a keyed one (which an enqueue may hold), or one whose attempt asked to go back to
    pending. ``requeue`` revives that row instead of colliding with it."""
    with SessionLocal.begin() as session:
        if parked_by.startswith("cancel"):
            job_id = keyed.options(queue_id="k").enqueue(session, key="k", seq=0)
            behind = keyed.options(queue_id="k").enqueue(session, key="k", seq=1)
        else:
            job_id = echo.enqueue(session, value="again")
    if parked_by.startswith("cancel"):
        assert queue.cancel(engine, [job_id]) == {job_id: "cancelled"}
    else:
        worker = uuid.uuid4()
        with engine.begin() as connection:
            [row] = claim(connection, worker, ["echo"])
        assert queue.cancel(engine, [job_id]) == {job_id: "requested"}
        with engine.begin() as connection:
            error = {"type": "E", "message": "m"}
            applied = complete(
                connection, worker, job_id, row.attempt, OutcomeKind.RETRY, error=error
            )
            assert applied == [job_id]
    assert status_of(engine, job_id) == "cancelled"
    parked = execution_row(engine, job_id)
    assert (parked.state, parked.worker_id) == ("done", None)
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [job_id]) == [job_id]
    revived = execution_row(engine, job_id)
    # A requeued keyed job goes back in line: behind the job still waiting on its key.
    state = "waiting" if parked_by.startswith("cancel") else "pending"
    assert (revived.state, revived.attempt, revived.cancel_requested) == (state, 0, False)
    job = job_row(engine, job_id)
    assert (job.status, job.attempts, job.finished_at) == ("queued", 0, None)
    stats = queue.worker(SessionLocal, tasks=["echo", "keyed"], poll_interval=0.05).run(burst=True)
    assert status_of(engine, job_id) == "succeeded"
    if parked_by.startswith("cancel"):
        assert stats.succeeded == 2
        assert ran(engine, job_id) and ran(engine, behind)
        assert status_of(engine, behind) == "succeeded"
    else:
        assert stats.succeeded == 1
        assert job_row(engine, job_id).result == "again"
    with engine.connect() as connection:
        assert connection.execute(select(EX.c.id)).all() == []


# -- running jobs under real workers ------------------------------------------------------


def _sync_worker(factory: sessionmaker[Session], heartbeat: float) -> Any:
    return queue.worker(
        factory,
        tasks=["gated", "gated_async"],
        concurrency=4,
        poll_interval=0.05,
        heartbeat_interval=heartbeat,
        install_signal_handlers=False,
    )


def test_running_jobs_told_of_a_cancel_end_cancelled_in_a_sync_worker(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        polite = gated.enqueue(session, name="polite", until="cancel", value="stopped early")
        loud = gated.enqueue(session, name="loud", until="cancel", then="raise")
        sleeper = gated_async.enqueue(session, name="sleeper", until="sleep")
    names = ["polite", "loud", "sleeper"]
    with worker_thread(_sync_worker(SessionLocal, HEARTBEAT)) as stats:
        for name in names:
            assert gate(name).entered.wait(10), name
        started = time.monotonic()
        assert queue.cancel(engine, [polite, loud, sleeper]) == dict.fromkeys(
            [polite, loud, sleeper], "requested"
        )
        wait_for(lambda: all(final(engine, j) for j in (polite, loud, sleeper)), timeout=10)
        took = time.monotonic() - started
    _check_cancelled(engine, polite=polite, loud=loud, others=[sleeper])
    assert gate("polite").saw_cancel is True
    # Within a few heartbeats (plus the ack), not a poll interval or a lease.
    assert took < 5 * HEARTBEAT + 1.5, took
    assert stats[0].cancelled == 3


def _check_cancelled(engine: Engine, *, polite: int, loud: int, others: list[int]) -> None:
    for job_id in (polite, loud, *others):
        job = job_row(engine, job_id)
        assert (job.status, job.attempts) == ("cancelled", 1), job_id
        assert execution_row(engine, job_id) is None
    # Whatever it returned is not its result, and a raise is kept in the history, not retried.
    assert job_row(engine, polite).result is None
    [error] = job_row(engine, loud).errors
    assert error["type"] == "builtins.RuntimeError"


async def test_running_jobs_told_of_a_cancel_end_cancelled_in_an_async_worker(
    engine: Engine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    async with AsyncSessionLocal.begin() as session:
        polite = await gated.enqueue(session, name="polite", until="cancel")
        loud = await gated_async.enqueue(session, name="loud", until="event", then="raise")
        sleeper = await gated_async.enqueue(session, name="sleeper", until="sleep")
        watcher = await gated_async.enqueue(session, name="watcher", until="event")
    names = ["polite", "loud", "sleeper", "watcher"]
    worker = queue.async_worker(
        AsyncSessionLocal,
        tasks=["gated", "gated_async"],
        concurrency=4,
        poll_interval=0.05,
        heartbeat_interval=HEARTBEAT,
        install_signal_handlers=False,
    )
    runner = asyncio.ensure_future(worker.run())
    try:
        await until(lambda: all(gate(n).entered.is_set() for n in names))
        started = time.monotonic()
        ids = [polite, loud, sleeper, watcher]
        assert await queue.cancel(AsyncSessionLocal, ids) == dict.fromkeys(ids, "requested")
        await until(lambda: all(final(engine, j) for j in ids))
        took = time.monotonic() - started
    finally:
        worker.stop()
        stats: RunStats = await asyncio.wait_for(runner, 30)
    _check_cancelled(engine, polite=polite, loud=loud, others=[sleeper, watcher])
    assert gate("watcher").saw_cancel is True
    assert took < 5 * HEARTBEAT + 1.5, took
    assert stats.cancelled == 4


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_a_request_the_handler_never_saw_lets_a_success_stand_and_cancels_a_failure(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    face: str,
) -> None:
    """No heartbeat comes before the handlers end (a long heartbeat interval): the cancel
    request is settled by the completion statement. A success stands (its work is done);
    a raise ends the job cancelled, not retried although attempts are left."""
    task = gated if face == "sync" else gated_async
    with SessionLocal.begin() as session:
        succeeds = task.enqueue(session, name="succeeds", value="done anyway")
        raises = task.enqueue(session, name="raises", then="raise")
        untouched = task.enqueue(session, name="untouched", value="not cancelled")
    ids = [succeeds, raises, untouched]
    if face == "sync":
        worker: Any = _sync_worker(SessionLocal, heartbeat=60)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
    else:
        worker = queue.async_worker(
            AsyncSessionLocal,
            tasks=["gated_async"],
            concurrency=4,
            poll_interval=0.05,
            heartbeat_interval=60,
            install_signal_handlers=False,
        )
        runner = asyncio.ensure_future(worker.run())
    try:
        await until(
            lambda: all(gate(n).entered.is_set() for n in ("succeeds", "raises", "untouched"))
        )
        assert queue.cancel(engine, [succeeds, raises]) == {
            succeeds: "requested",
            raises: "requested",
        }
        with Session(engine) as session:
            job = session.get(queue.Job, succeeds)
            assert job is not None and job.state == "cancelling"
        for name in ("succeeds", "raises", "untouched"):
            gate(name).open()
        await until(lambda: all(final(engine, j) for j in ids))
    finally:
        worker.stop()
        if face == "async":
            await asyncio.wait_for(runner, 30)
        else:
            thread.join(30)
            assert not thread.is_alive()
    assert gate("succeeds").saw_cancel is False
    job = job_row(engine, succeeds)
    assert (job.status, job.result) == ("succeeded", "done anyway")
    job = job_row(engine, raises)
    assert (job.status, job.attempts, len(job.errors)) == ("cancelled", 1, 1)
    # Its attempt asked for a retry: the completion parked the execution 'done' rather
    # than back to pending (the workers' sweep deletes it, unless the sweep already did).
    assert gone_or_parked(engine, raises)
    assert job_row(engine, untouched).status == "succeeded"


def test_a_cancel_in_an_open_transaction_stalls_no_heartbeat_and_no_completion(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The reason a cancel commits at once: the row locks it takes last as long as its
    statement, not as long as the caller's transaction. While an app keeps a transaction
    open around repeated cancels, the worker still hears of the request, completes the
    job, and keeps every job it holds alive at its heartbeat's pace."""
    with SessionLocal.begin() as session:
        told = gated.enqueue(session, name="told", until="cancel")
        stubborn = gated.enqueue(session, name="stubborn")  # ignores the request
        bystander = gated.enqueue(session, name="bystander")
    held = [stubborn, bystander]
    hold = 10 * HEARTBEAT
    worst = 0.0
    with worker_thread(_sync_worker(SessionLocal, HEARTBEAT)) as stats:
        for name in ("told", "stubborn", "bystander"):
            assert gate(name).entered.wait(10), name
        try:
            with SessionLocal() as app:
                app.begin()
                app.execute(select(func.count()).select_from(EX))  # the app's work so far
                assert queue.cancel(app, [told, stubborn]) == {
                    told: "requested",
                    stubborn: "requested",
                }
                # Told by a heartbeat, it stops, and its completion commits, all while the
                # app's transaction is still open.
                wait_for(lambda: status_of(engine, told) == "cancelled", timeout=10)
                deadline = time.monotonic() + hold
                while time.monotonic() < deadline:
                    assert queue.cancel(app, [stubborn]) == {stubborn: "requested"}
                    worst = max(worst, _liveness_age(engine, held))
                    time.sleep(0.02)
                assert app.in_transaction()
                app.commit()
        finally:
            gate("stubborn").open()
            gate("bystander").open()
        wait_for(lambda: final(engine, stubborn) and final(engine, bystander), timeout=10)
    # A heartbeat's interval and its round trip, never the app's hold (10 intervals).
    assert worst < 5 * HEARTBEAT, worst
    assert gate("told").saw_cancel is True
    assert (status_of(engine, stubborn), status_of(engine, bystander)) == (
        "cancelled",
        "succeeded",
    )
    assert stats[0].cancelled == 2


def _liveness_age(engine: Engine, ids: list[int]) -> float:
    """Seconds since the oldest heartbeat of ``ids`` (their executions' ``alive_at``)."""
    with engine.connect() as connection:
        age = connection.execute(
            select(func.max(func.extract("epoch", func.clock_timestamp() - EX.c.alive_at))).where(
                EX.c.id.in_(ids)
            )
        ).scalar_one()
    return float(age)


# -- races, forced with held-open transactions --------------------------------------------


@pytest.mark.parametrize(
    ("kind", "ends"),
    [
        (OutcomeKind.SUCCEEDED, "succeeded"),
        (OutcomeKind.FAILED, "cancelled"),
        (OutcomeKind.RETRY, "cancelled"),
        (OutcomeKind.RESCHEDULE, "cancelled"),
        (OutcomeKind.RELEASE, "cancelled"),
    ],
)
def test_a_completion_that_waits_for_a_cancel_ends_in_one_final_state(
    engine: Engine, kind: OutcomeKind, ends: str
) -> None:
    """The cancel commits while the completion waits for the execution's row lock: the
    completion reads the flag from the row's newest version. A success stands; any other
    outcome ends the job cancelled, an attempt that asked to go back to pending included
    (its execution is parked ``done`` for the sweep)."""
    with engine.begin() as connection:
        job_id = echo.enqueue(connection, value="v")
    worker = uuid.uuid4()
    with engine.begin() as connection:
        [row] = claim(connection, worker, ["echo"])
    error = (
        {"type": "E", "message": "m"} if kind in (OutcomeKind.FAILED, OutcomeKind.RETRY) else None
    )
    applied: list[list[int]] = []
    canceller, outcome = hold_cancel(engine, [job_id])
    try:
        assert outcome == {job_id: "requested"}
        with engine.connect() as completer:
            pid = backend_pid(completer)

            def finish() -> None:
                applied.append(
                    complete(completer, worker, job_id, row.attempt, kind, result="r", error=error)
                )
                completer.commit()

            thread = threading.Thread(target=finish)
            thread.start()
            try:
                wait_until_blocked(engine, pid)
            finally:
                canceller.commit()
            thread.join(10)
    finally:
        canceller.close()
    assert applied == [[job_id]]
    job = job_row(engine, job_id)
    assert (job.status, job.attempts, len(job.errors)) == (ends, 1, 0 if error is None else 1)
    assert job.result == ("r" if ends == "succeeded" else None)
    assert job.finished_at is not None
    if kind in OutcomeKind.final():
        assert execution_row(engine, job_id) is None
    else:
        parked = execution_row(engine, job_id)
        assert (parked.state, parked.worker_id, parked.slot) == ("done", None, None)
        sweep(engine)
        assert execution_row(engine, job_id) is None
    # Nothing is left to cancel or to complete.
    assert queue.cancel(engine, [job_id]) == {job_id: "finished"}
    with engine.begin() as connection:
        assert complete(connection, worker, job_id, row.attempt) == []
    assert job_row(engine, job_id).status == ends


def test_a_cancel_that_waits_for_an_open_completion_says_finished(engine: Engine) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
    worker = uuid.uuid4()
    with engine.begin() as connection:
        [row] = claim(connection, worker, ["echo"])
    completer = engine.connect()
    completer.begin()
    got: list[dict[int, str]] = []
    try:
        assert complete(completer, worker, job_id, row.attempt, result="won") == [job_id]
        thread = threading.Thread(target=lambda: got.append(queue.cancel(engine, [job_id])))
        thread.start()
        try:
            wait_for(lambda: lock_waiter_in_this_database(engine), timeout=10, interval=0.02)
        finally:
            completer.commit()
        thread.join(10)
    finally:
        completer.close()
    assert got == [{job_id: "finished"}]
    job = job_row(engine, job_id)
    assert (job.status, job.result) == ("succeeded", "won")


def test_a_completion_committed_first_makes_the_cancel_say_finished(engine: Engine) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
    worker = uuid.uuid4()
    with engine.begin() as connection:
        [row] = claim(connection, worker, ["echo"])
        complete(connection, worker, job_id, row.attempt, result=1)
    assert queue.cancel(engine, [job_id]) == {job_id: "finished"}
    assert status_of(engine, job_id) == "succeeded"


@pytest.mark.parametrize("cancel_ends", ["commit", "rollback"])
def test_a_claim_skips_a_job_an_open_cancel_holds(engine: Engine, cancel_ends: str) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
    canceller, outcome = hold_cancel(engine, [job_id])
    worker = uuid.uuid4()
    try:
        assert outcome == {job_id: "cancelled"}
        with engine.begin() as connection:
            # The claim never waits for the cancel: it skips the locked row.
            connection.execute(text("SET LOCAL lock_timeout = '1s'"))
            assert claim(connection, worker, ["echo"]) == []
        if cancel_ends == "commit":
            canceller.commit()
        else:
            canceller.rollback()
    finally:
        canceller.close()
    with engine.begin() as connection:
        claimed = [r.id for r in claim(connection, worker, ["echo"])]
    if cancel_ends == "commit":
        assert claimed == []
        job = job_row(engine, job_id)
        assert (job.status, job.attempts) == ("cancelled", 0)
    else:
        assert claimed == [job_id]
        assert status_of(engine, job_id) == "queued"


def test_a_cancel_waits_for_an_open_claim_and_then_asks_the_job_to_stop(engine: Engine) -> None:
    with engine.begin() as connection:
        job_id = echo.enqueue(connection)
    claimer = engine.connect()
    claimer.begin()
    worker = uuid.uuid4()
    got: list[dict[int, str]] = []
    try:
        assert [r.id for r in claim(claimer, worker, ["echo"])] == [job_id]
        thread = threading.Thread(target=lambda: got.append(queue.cancel(engine, [job_id])))
        thread.start()
        try:
            wait_for(lambda: lock_waiter_in_this_database(engine), timeout=10, interval=0.02)
        finally:
            claimer.commit()
        thread.join(10)
    finally:
        claimer.close()
    assert got == [{job_id: "requested"}]
    assert execution_row(engine, job_id).cancel_requested is True


# -- lost jobs ----------------------------------------------------------------------------


def test_a_lost_job_that_was_asked_to_stop_is_cancelled_not_run_again(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        lost = gated.enqueue(session, name="lost")
        head = keyed.options(queue_id="k").enqueue(session, key="k", seq=0)
        behind = keyed.options(queue_id="k").enqueue(session, key="k", seq=1)
        fine = gated.enqueue(session, name="fine")
    with engine.begin() as connection:
        # Their worker died a minute ago, after it claimed them (the lost job on its
        # second attempt).
        pretend_claimed(connection, lost, attempt=2, alive_for=dt.timedelta(minutes=1))
        for job_id in (head, fine):
            pretend_claimed(connection, job_id, alive_for=dt.timedelta(minutes=1))
    assert queue.cancel(engine, [lost, head]) == {lost: "requested", head: "requested"}
    gate("fine").open()
    stats = queue.worker(SessionLocal, tasks=["gated", "keyed"], poll_interval=0.05).run(burst=True)
    assert not gate("lost").entered.is_set()
    # Cancelled by the reclaim, the lost attempt counted.
    assert (job_row(engine, lost).status, job_row(engine, lost).attempts) == ("cancelled", 2)
    assert (job_row(engine, head).status, job_row(engine, head).attempts) == ("cancelled", 1)
    # The lost job that nobody cancelled runs again; the key's next job runs too.
    assert (status_of(engine, fine), status_of(engine, behind)) == ("succeeded", "succeeded")
    assert not ran(engine, head) and ran(engine, behind)
    assert stats.succeeded == 2


def test_a_cancel_from_a_transaction_holding_the_job_gives_up_and_changes_nothing(
    engine: Engine, SessionLocal: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Called from a transaction that has locked the job's execution itself, the cancel
    would wait for its own caller: it gives up after the lock timeout instead, and
    cancels nothing (the job is still queued once the caller commits)."""
    from sqla_queue import CancelBlockedError, lifecycle

    monkeypatch.setattr(lifecycle, "CANCEL_LOCK_TIMEOUT", 0.5)
    with SessionLocal() as session:
        job_id = echo.enqueue(session, "held")
        session.commit()
        session.execute(text(f"UPDATE {EX} SET priority = priority WHERE id = :id"), {"id": job_id})
        started = time.monotonic()
        with pytest.raises(CancelBlockedError, match="commit it first"):
            queue.cancel(session, [job_id])
        assert time.monotonic() - started < 5
        session.commit()
    assert status_of(engine, job_id) == "queued"
    assert queue.cancel(engine, [job_id]) == {job_id: CancelOutcome.CANCELLED}
