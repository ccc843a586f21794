"""Durable jobs at their edges (issue 36, section 3 and the durable items of section 5),
on a real PostgreSQL: a requeue after compensations, nested and repeated steps, typed
condition keys and ORM inserts, a timed-out wait re-raised, a condition's row locked by
the application, and the input that must be refused before anything is written."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import re
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue.cli.main import main
from sqla_queue.cli.scaffold import EXIT_OK, EXIT_USAGE
from sqla_queue.conversation import run_flow
from sqla_queue.dashboard.durable_views import signal_payload
from sqla_queue.dashboard.params import RequestRefused
from sqla_queue.durable.compensate import compensations_flow
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.errors import PayloadNotSerializableError
from tests.support.app import Shipment, StepWrite
from tests.support.durable_app import dj_saga, dj_signal_then_sleep
from tests.support.durable_checks import drain, outcome
from tests.support.durable_edges_app import (
    Crate,
    EdgeBase,
    Invoice,
    Parcel,
    edge_after_break,
    edge_async_nested,
    edge_bad_compensation,
    edge_bad_wait,
    edge_def_touches_session,
    edge_nested,
    edge_plain,
    edge_repeated,
    edge_saga,
    edge_timeout_reraised,
    edge_wait_crate,
    edge_wait_invoice,
    edge_wait_parcel,
    invoice_paid,
    queue,
)
from tests.support.lifecycle import backend_pid, wait_until_blocked

pytestmark = pytest.mark.integration

TARGET = "tests.support.durable_app:queue"
JOBS = queue.tables.jobs
EXECUTIONS = queue.tables.executions


def rows_of(engine: Engine, job_id: int) -> list[str]:
    """The ``StepWrite`` rows of job ``job_id`` (and of its compensations), sorted."""
    with engine.connect() as connection:
        return sorted(
            connection.execute(select(StepWrite.step).where(StepWrite.job_id == job_id)).scalars()
        )


# -- a requeue after the compensations ran ------------------------------------------------


def _failed_and_compensated(engine: Engine, factory: sessionmaker[Session]) -> tuple[int, int]:
    """A saga that failed, whose compensation ran; (its id, its shipment's id)."""
    with factory.begin() as session:
        session.add(Shipment(id=1, status="new"))
        job = edge_saga.enqueue(session, 1)
    drain(factory)
    assert outcome(engine, job)[0] == "failed"
    drain(factory)  # the maintenance enqueued the compensation: run it
    assert rows_of(engine, job) == ["charge@1", "log@1", "undo:charge@1"]
    with factory() as session:
        steps = {s.name: s for s in queue.job_steps(session, job)}
    assert steps["charge"].compensated_by is not None
    with factory.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 1).values(status="ok"))
    return job, 1


def _reruns_the_compensated_step(engine: Engine, factory: sessionmaker[Session], job: int) -> None:
    with factory() as session:
        steps = {s.name: s for s in queue.job_steps(session, job)}
    # Reopened: the compensated step is gone, the plain one stays done.
    assert set(steps) == {"log"}
    drain(factory)
    # charge ran again (its first run was undone); log was not compensated: replayed.
    assert outcome(engine, job) == ("succeeded", ["charge 2", "log 1"])
    assert rows_of(engine, job) == ["charge@1", "charge@2", "log@1", "undo:charge@1"]
    with factory() as session:
        steps = {s.name: s for s in queue.job_steps(session, job)}
    assert steps["charge"].compensated_by is None and steps["charge"].has_compensation


def test_requeue_after_compensation_reruns_the_compensated_steps_api(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    job, _ = _failed_and_compensated(engine, SessionLocal)
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [job]) == [job]
    _reruns_the_compensated_step(engine, SessionLocal, job)


def test_requeue_after_compensation_reruns_the_compensated_steps_cli(
    engine: Engine, db_url: str, SessionLocal: sessionmaker[Session], capsys: Any
) -> None:
    job, _ = _failed_and_compensated(engine, SessionLocal)
    status = main(["requeue", TARGET, "--url", db_url, str(job), "--json"])
    assert status == EXIT_OK, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)[0]["outcome"] == "requeued"
    _reruns_the_compensated_step(engine, SessionLocal, job)


def test_requeue_after_compensation_reruns_the_compensated_steps_dashboard(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient

    job, _ = _failed_and_compensated(engine, SessionLocal)
    with TestClient(queue.dashboard(engine, auth=lambda request: "ops")) as client:
        client.follow_redirects = False
        page = client.get(f"/jobs/{job}")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        done = client.post(f"/jobs/{job}/requeue", data={"csrf_token": token[1]})
        assert done.status_code == 303
        assert done.headers["location"] == f"/jobs/{job}?done=requeued"
    _reruns_the_compensated_step(engine, SessionLocal, job)


def test_requeue_before_the_sweep_keeps_the_uncompensated_steps(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A requeue that comes before the compensation sweep: nothing was undone, so the
    steps stay done, and the sweep never undoes them afterwards."""
    with SessionLocal.begin() as session:
        session.add(Shipment(id=2, status="new"))
        job = edge_saga.enqueue(session, 2)
    drain(SessionLocal)  # fails; its compensation is not swept before the next drain
    assert outcome(engine, job)[0] == "failed"
    with SessionLocal.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 2).values(status="ok"))
        assert queue.requeue(session, [job]) == [job]
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", ["charge 1", "log 1"])
    assert rows_of(engine, job) == ["charge@1", "log@1"]


def test_a_requeue_waits_for_a_sweep_in_flight_then_reruns_what_it_compensated(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The sweep holds the failed job (it has read its steps, not committed): the requeue
    waits for it, then sees the step it marked, and reopens it. Without the wait, the
    requeue would keep the step done while the sweep undoes it."""
    with SessionLocal.begin() as session:
        session.add(Shipment(id=3, status="ok"))
        job = edge_saga.enqueue(session, 3)
        session.flush()
        session.execute(update(Shipment).where(Shipment.id == 3).values(status="new"))
    drain(SessionLocal)
    assert outcome(engine, job)[0] == "failed"
    with SessionLocal.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 3).values(status="ok"))
    tables = queue.tables
    with engine.connect() as sweeper:
        sweeper.begin()
        enqueued = run_flow(
            sweeper,
            compensations_flow(
                DurableStatements.of(tables),
                statements.enqueue_statement(tables, keyed=True, notify=True),
            ),
        )
        assert len(enqueued) == 1
        with ThreadPoolExecutor(1) as pool, engine.connect() as requeuer:
            pid = backend_pid(requeuer)
            requeuer.commit()

            def requeue() -> list[int]:
                with requeuer.begin():
                    return list(queue.requeue(requeuer, [job]))

            done = pool.submit(requeue)
            wait_until_blocked(engine, pid)
            sweeper.commit()
            assert done.result(timeout=30) == [job]
    _reruns_the_compensated_step(engine, SessionLocal, job)


# -- steps and cursors do not nest, and each name runs once per run -----------------------


@pytest.mark.parametrize("inner", ["step", "cursor", "in-batch"])
def test_a_step_or_cursor_inside_another_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session], inner: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_nested.enqueue(session, inner)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded"
    assert "do not nest" in message and "'inner'" in message, message
    assert "'outer'" in message
    # Nothing of the outer block was committed by the inner one.
    assert rows_of(engine, job) == []
    with SessionLocal() as session:
        assert queue.job_steps(session, job) == []


@pytest.mark.parametrize("inner", ["step", "in-batch"])
def test_async_nesting_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session], inner: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_async_nested.enqueue(session, inner)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded" and "do not nest" in message, message


def test_a_step_after_a_cursor_left_with_break_is_not_nested(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = edge_after_break.enqueue(session)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", [7])


@pytest.mark.parametrize("kind", ["step", "run_step", "cursor"])
def test_a_name_used_twice_in_one_run_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session], kind: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_repeated.enqueue(session, kind)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded"
    name = "import" if kind == "cursor" else "charge"
    assert f"{name!r} runs twice in one run" in message, message


def test_a_step_that_raised_may_run_again_under_its_name(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = edge_repeated.enqueue(session, "retry")
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "retried 2")


# -- conditions: typed keys, ORM inserts, a row the application holds ---------------------


@pytest.fixture
def edge_tables(owner_engine: Engine) -> None:
    """The tables of tests/support/durable_edges_app.py's conditions."""
    EdgeBase.metadata.create_all(owner_engine)


def _wait(engine: Engine, job_id: int) -> str | None:
    with engine.connect() as connection:
        return connection.execute(
            select(EXECUTIONS.c.wait).where(EXECUTIONS.c.id == job_id)
        ).scalar_one_or_none()


@pytest.mark.parametrize("given", ["upper", "lower"])
def test_a_uuid_key_wakes_its_waiter_whatever_its_case(
    engine: Engine, SessionLocal: sessionmaker[Session], edge_tables: None, given: str
) -> None:
    key = uuid.uuid4()
    text_key = str(key).upper() if given == "upper" else str(key)
    with SessionLocal.begin() as session:
        session.add(Parcel(id=key, status="new"))
        job = edge_wait_parcel.enqueue(session, text_key)
    drain(SessionLocal)
    assert _wait(engine, job) == f"row:edge_parcel:{key}"
    with SessionLocal.begin() as session:
        parcel = session.get(Parcel, key)
        assert parcel is not None
        parcel.status = "delivered"
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "delivered")


@pytest.mark.parametrize("given", [5, "5", "5.0", "5.00"])
def test_a_numeric_key_wakes_its_waiter_however_it_is_written(
    engine: Engine, SessionLocal: sessionmaker[Session], edge_tables: None, given: Any
) -> None:
    with SessionLocal.begin() as session:
        session.add(Invoice(id=Decimal("5"), status="open"))
        job = edge_wait_invoice.enqueue(session, given)
    drain(SessionLocal)
    assert _wait(engine, job) == "row:edge_invoice:5.00"
    with SessionLocal.begin() as session:
        invoice = session.get(Invoice, Decimal("5.00"))
        assert invoice is not None
        invoice.status = "paid"
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "paid")
    # The wake of a write outside the ORM, by a key given as an int.
    with SessionLocal.begin() as session:
        session.add(Invoice(id=Decimal("7.5"), status="open"))
        job = edge_wait_invoice.enqueue(session, "7.50")
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        session.execute(update(Invoice).where(Invoice.id == 7.5).values(status="paid"))
        assert invoice_paid.wake(session, 7.5) == [job]


@pytest.mark.parametrize("key", ["uuid", "numeric", "integer"])
def test_an_orm_insert_of_a_row_that_meets_the_condition_wakes_its_waiter(
    engine: Engine, SessionLocal: sessionmaker[Session], edge_tables: None, key: str
) -> None:
    """The job waits on a row that does not exist yet; the ORM inserts it, meeting the
    condition: the flush wakes the job (the row had no identity at the flush)."""
    parcel = uuid.uuid4()
    with SessionLocal.begin() as session:
        if key == "uuid":
            job = edge_wait_parcel.enqueue(session, str(parcel))
        elif key == "numeric":
            job = edge_wait_invoice.enqueue(session, 12)
        else:
            job = edge_wait_crate.enqueue(session, 40)
    drain(SessionLocal)
    assert _wait(engine, job) is not None
    with SessionLocal.begin() as session:
        if key == "uuid":
            session.add(Parcel(id=parcel, status="delivered"))
        elif key == "numeric":
            session.add(Invoice(id=12, status="paid"))
        else:
            session.add(Crate(id=40, status="shipped"))
    assert _wait(engine, job) is None  # woken by the insert's flush
    drain(SessionLocal)
    assert outcome(engine, job)[0] == "succeeded"


def _drain_until_finished(factory: sessionmaker[Session], engine: Engine, job_id: int) -> None:
    """Burst drains until job ``job_id`` finished (its recheck is due within a second)."""
    deadline = time.monotonic() + 20
    while outcome(engine, job_id)[0] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, f"job {job_id} did not finish"
        drain(factory)
        time.sleep(0.1)


@pytest.mark.parametrize("change", ["before", "after"])
def test_wait_until_never_waits_for_a_row_the_app_holds(
    engine: Engine, SessionLocal: sessionmaker[Session], edge_tables: None, change: str
) -> None:
    """An application transaction holds the condition's row (``FOR UPDATE``, or its
    update not committed yet: ``change="before"``) while the worker runs the waiting job
    and others: the handler does not wait for the lock, the other jobs finish, and the
    job completes once the application's transaction commits the change."""
    with SessionLocal.begin() as session:
        session.add(Crate(id=1, status="new"))
    with SessionLocal.begin() as session:
        job = edge_wait_crate.enqueue(session, 1)
        others = [edge_plain.enqueue(session, i) for i in range(5)]
    app = SessionLocal()
    try:
        crate = app.execute(select(Crate).where(Crate.id == 1).with_for_update()).scalar_one()
        if change == "before":
            crate.status = "shipped"
            app.flush()  # its wake finds no waiter yet: the recheck must find the row
        with ThreadPoolExecutor(1) as pool:
            burst = pool.submit(drain, SessionLocal)
            try:
                burst.result(timeout=30)  # never hangs on the app's lock
            except FuturesTimeout:
                app.rollback()  # let the hung handler go, so the pool can shut down
                raise AssertionError("the worker waited for the app's lock") from None
        assert [outcome(engine, other) for other in others] == [("succeeded", i) for i in range(5)]
        assert _wait(engine, job) == "row:edge_crate:1"
        if change == "after":
            crate.status = "shipped"
        app.commit()
    finally:
        app.close()
    _drain_until_finished(SessionLocal, engine, job)
    assert outcome(engine, job) == ("succeeded", "shipped")


# -- a timed-out wait re-raised: the retry waits again --------------------------------------


def test_a_retry_after_a_timed_out_wait_waits_again_with_a_fresh_deadline(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The handler lets SignalTimeoutError go up: its attempt fails. The retry waits for
    the signal again, with a fresh deadline (it used to time out at once, spending every
    attempt within a second)."""
    with SessionLocal.begin() as session:
        job = edge_timeout_reraised.enqueue(session, 3600.0)
    drain(SessionLocal)
    assert _wait(engine, job) == "signal:go"
    with SessionLocal.begin() as session:
        assert queue.fire_timers(session, [job]) == [job]  # the deadline passes
    _drain_until(SessionLocal, engine, job, lambda: _wait(engine, job) == "signal:go")
    with engine.connect() as connection:
        row = connection.execute(
            select(JOBS.c.status, JOBS.c.attempts, EXECUTIONS.c.execute_at)
            .join(EXECUTIONS, EXECUTIONS.c.id == JOBS.c.id)
            .where(JOBS.c.id == job)
        ).one()
        now = connection.execute(select(func.now())).scalar_one()
    # Attempt 1 timed out and failed; attempt 2 waits again, a whole timeout long.
    assert (row.status, row.attempts) == ("queued", 1)
    assert row.execute_at > now + dt.timedelta(seconds=3500)
    assert rows_of(engine, job) == ["start1@1", "start1@2", "start2@1"]
    with SessionLocal.begin() as session:
        assert queue.signal(session, job, "go", "late but fine").woke
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "late but fine")


def test_a_timed_out_wait_replays_as_timed_out_within_its_attempt(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """Within one attempt, a replay (after a later sleep) takes the timed-out branch
    again, even if the signal came since."""
    with SessionLocal.begin() as session:
        job = dj_signal_then_sleep.enqueue(session)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        queue.fire_timers(session, [job])
    drain(SessionLocal)  # timed out; now sleeps an hour
    with SessionLocal.begin() as session:
        queue.signal(session, job, "approved", 1)
        queue.fire_timers(session, [job])
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "timed out")


def _drain_until(factory: sessionmaker[Session], engine: Engine, job_id: int, done: Any) -> None:
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, f"job {job_id} did not get there"
        drain(factory)
        time.sleep(0.05)


# -- a def handler on the async worker -------------------------------------------------------


@pytest.mark.parametrize("durable", [False, True])
def test_a_def_handler_on_the_async_worker_leaves_no_unawaited_close(
    engine: Engine, AsyncSessionLocal: Any, durable: bool
) -> None:
    async def scenario() -> list[int]:
        async with AsyncSessionLocal.begin() as session:
            jobs = [await edge_def_touches_session.enqueue(session, durable) for _ in range(3)]
        await queue.async_worker(AsyncSessionLocal, concurrency=2).run(burst=True)
        return jobs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jobs = asyncio.run(scenario())
        gc.collect()
    never_awaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []
    for job in jobs:
        status, result = outcome(engine, job)
        assert status == "succeeded"
        assert result.startswith("refused: ") if durable else result == "AsyncSession"


# -- what a suspended job and its steps read as ----------------------------------------------


def test_a_suspended_job_reads_as_in_the_attempt_its_steps_name_cli_and_dashboard(
    engine: Engine,
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A saga waiting for a signal, its steps committed by attempt 1: the job reads
    "attempt 1 of 1" (it used to read 0), and a compensation not enqueued reads
    "declared" (it read "pending", as if a refund were under way)."""
    with SessionLocal.begin() as session:
        job = dj_saga.enqueue(session, False, wait=True)
    drain(SessionLocal)
    monkeypatch.setenv("COLUMNS", "200")
    status = main(["job", TARGET, "--url", db_url, str(job)])
    out = capsys.readouterr().out
    assert status == EXIT_OK
    assert "attempt 1 of 1 (suspended in it)" in out, out
    assert "attempt 0" not in out
    assert "declared" in out and "pending" not in out
    steps = [line.split() for line in out.splitlines() if line.startswith("charge ")]
    assert steps and "1" in steps[0]
    # The listing counts the same attempt.
    assert main(["jobs", TARGET, "--url", db_url, "--status", "suspended"]) == EXIT_OK
    listed_out = capsys.readouterr().out
    row_line = next(line for line in listed_out.splitlines() if line.split()[:1] == [str(job)])
    assert "1 of 1" in row_line and "0 of 1" not in row_line, listed_out

    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient

    with TestClient(queue.dashboard(engine)) as client:
        page = client.get(f"/jobs/{job}").text
        listed = client.get("/jobs", params={"state": "suspended"}).text
    attempts = re.search(r'<dd id="job-attempts">(.*?)</dd>', page)
    assert attempts is not None and attempts[1].startswith("1 of 1"), attempts
    assert ">declared<" in page and ">pending<" not in page
    row = re.search(rf'<tr data-job="{job}">(.*?)</tr>', listed, re.S)
    assert row is not None and '<td class="num">1/1</td>' in row[1]


# -- bad input gets a clear error and writes nothing (section 5) -----------------------------


@pytest.mark.parametrize(
    ("kind", "value", "words"),
    [
        ("sleep", "inf", "at most 100 years"),
        ("sleep", 1e12, "at most 100 years"),
        ("sleep", "nan", "must be seconds"),
        ("sleep", -1, "must not be negative"),
        ("timeout", "inf", "at most 100 years"),
        ("timeout", 10**13, "at most 100 years"),
        ("signal", "nul", "NUL"),
        ("signal", "surrogate", "must be valid Unicode text"),
        ("signal", "", "1 to 200 characters"),
    ],
)
def test_a_bad_wait_is_refused_before_anything_is_written(
    engine: Engine, SessionLocal: sessionmaker[Session], kind: str, value: Any, words: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_bad_wait.enqueue(session, kind, value)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded" and words in message, message
    with SessionLocal() as session:
        assert queue.job_steps(session, job) == []
    assert _wait(engine, job) is None


@pytest.mark.parametrize(
    ("job_id", "error"),
    [(1.5, TypeError), (True, TypeError), ("2", TypeError), (2**63, ValueError)],
)
def test_a_bad_job_id_signals_nothing(
    engine: Engine, SessionLocal: sessionmaker[Session], job_id: Any, error: type
) -> None:
    """``signal(job_id=1.5)`` used to signal job 2 (the driver truncated the float)."""
    with SessionLocal.begin() as session:
        edge_plain.enqueue(session, 1)
        edge_plain.enqueue(session, 2)
    with SessionLocal.begin() as session:
        with pytest.raises(error, match="job id"):
            queue.signal(session, job_id, "go", 1)
        with pytest.raises(error, match="job id"):
            queue.job_steps(session, job_id)
        with pytest.raises(error, match="job id"):
            queue.fire_timers(session, [job_id])
        session.execute(select(1))  # the transaction was not aborted
    with engine.connect() as connection:
        assert connection.execute(select(queue.tables.job_signals)).all() == []


@pytest.mark.parametrize("name", ["go\x00", "go\ud800", "", "x" * 201, None])
def test_a_bad_signal_name_is_refused_and_the_transaction_goes_on(
    engine: Engine, SessionLocal: sessionmaker[Session], name: Any
) -> None:
    with SessionLocal.begin() as session:
        job = edge_plain.enqueue(session, 1)
    with SessionLocal.begin() as session:
        with pytest.raises(ValueError, match="signal"):
            queue.signal(session, job, name, 1)
        assert queue.signal(session, job, "fine", 1).stored  # not aborted
    with engine.connect() as connection:
        names = connection.execute(select(queue.tables.job_signals.c.name)).scalars().all()
    assert names == ["fine"]


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "10"])
def test_a_bad_listing_limit_is_refused(SessionLocal: sessionmaker[Session], limit: Any) -> None:
    with SessionLocal() as session, pytest.raises((TypeError, ValueError), match="suspended"):
        queue.suspended_jobs(session, limit=limit)


def test_a_huge_listing_limit_lists_everything(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal() as session:
        assert queue.suspended_jobs(session, limit=2**63) == []


def test_bad_step_versions_and_condition_names_are_refused(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal() as session:
        for bad in (0, 1.5, True, 2**31):
            with pytest.raises(ValueError, match="version"):
                queue.migrate_steps(session, task="t", step="s", from_version=bad, to_version=2)
        with pytest.raises(ValueError, match="NUL"):
            queue.migrate_steps(session, task="t", step="s\x00", from_version=1, to_version=2)
    with pytest.raises(ValueError, match="NUL"):
        queue.condition(Crate, Crate.status == "x", name="bad\x00")


@pytest.mark.parametrize("bad", ["nan", "nul", "object"])
def test_a_compensation_that_cannot_be_stored_fails_its_step_by_name(
    engine: Engine, SessionLocal: sessionmaker[Session], bad: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_bad_compensation.enqueue(session, bad)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded"
    assert message.startswith("PayloadNotSerializableError: ") and "edge_undo" in message
    assert rows_of(engine, job) == []  # the step's write was rolled back
    with SessionLocal() as session:
        assert queue.job_steps(session, job) == []


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_deeply_nested_signal_payload_is_refused_by_the_api_the_cli_and_the_dashboard(
    engine: Engine,
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: Any,
) -> None:
    with SessionLocal.begin() as session:
        job = edge_plain.enqueue(session, 1)
    deep: list[Any] = []
    inner = deep
    for _ in range(1000):
        inner.append([])
        inner = inner[0]
    with SessionLocal.begin() as session, pytest.raises(PayloadNotSerializableError, match="deep"):
        queue.signal(session, job, "go", deep)

    status = main(["signal", TARGET, "--url", db_url, str(job), "go", "--payload", _nested(1001)])
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    assert "too deeply" in captured.err and "Traceback" not in captured.err

    with pytest.raises(RequestRefused) as refused:
        signal_payload(_nested(1001))
    assert refused.value.status == 400
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient

    with TestClient(queue.dashboard(engine, auth=lambda request: "ops")) as client:
        client.follow_redirects = False
        page = client.get(f"/jobs/{job}")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        for payload in (_nested(1001), _nested(300)):
            sent = client.post(
                f"/jobs/{job}/signal",
                data={"name": "go", "payload": payload, "csrf_token": token[1]},
            )
            assert sent.status_code == 400, sent.text
    with engine.connect() as connection:
        assert connection.execute(select(queue.tables.job_signals)).all() == []
