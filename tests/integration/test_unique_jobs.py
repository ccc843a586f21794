"""Unique jobs against real PostgreSQL: scopes, duplicate policies, batches and races.

A job's state changes (claimed, finished) are made with the worker's own statements on a
connection of the test's (see tests/support/lifecycle.py), so a scope's edges are crossed
exactly when the test says; the last tests run real workers. Races hold one enqueuer's
transaction open while another enqueues the same key on its own connection.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import DuplicateJobError
from sqla_queue.logic.outcomes import OutcomeKind
from tests.support.app import echo, gate, gated, gated_async, queue, reset_gates
from tests.support.lifecycle import (
    JOBS,
    KEYS,
    backend_pid,
    claim,
    complete,
    execution_row,
    job_row,
    status_of,
    wait_until_blocked,
    wait_until_blocked_async,
)
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

T = TypeVar("T")
#: Runs ``fn(bind)`` in one committed transaction of the bind kind under test.
Producer = Callable[[Callable[[Any], T]], T]


@pytest.fixture(params=["session", "connection"])
def produce(request: pytest.FixtureRequest, engine: Engine) -> Producer[Any]:
    """Each sync test runs once with a Session and once with a Connection."""

    def run(fn: Callable[[Any], T]) -> T:
        if request.param == "session":
            with Session(engine) as session, session.begin():
                return fn(session)
        with engine.begin() as connection:
            return fn(connection)

    run.kind = request.param  # type: ignore[attr-defined]
    return run


@pytest.fixture(autouse=True)
def _gates() -> Iterator[None]:
    yield
    reset_gates()


def unique(key: str, **options: Any) -> Any:
    return echo.options(unique_key=key, **options)


def jobs_with_key(engine: Engine, key: str) -> list[int]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                select(JOBS.c.id).where(JOBS.c.unique_key == key).order_by(JOBS.c.id)
            ).scalars()
        )


def payload_value(engine: Engine, job_id: int) -> Any:
    row = job_row(engine, job_id)
    return row.payload["kwargs"]["value"]


def start(engine: Engine, job_id: int) -> tuple[uuid.UUID, int]:
    """Claim job ``job_id`` (the first due echo job) as a fresh worker: (worker, attempt)."""
    worker = uuid.uuid4()
    with engine.begin() as connection:
        [row] = claim(connection, worker, ["echo"], batch=1)
    assert row.id == job_id
    return worker, row.attempt


def finish(engine: Engine, job_id: int, claimed: tuple[uuid.UUID, int], kind: OutcomeKind) -> None:
    worker, attempt = claimed
    error = None if kind is OutcomeKind.SUCCEEDED else {"type": "E", "message": "no"}
    with engine.begin() as connection:
        assert complete(connection, worker, job_id, attempt, kind, error=error) == [job_id]


# -- scopes -------------------------------------------------------------------------------


def test_scope_queued_is_held_until_the_job_starts(produce: Producer[Any], engine: Engine) -> None:
    options = {"unique_scope": "queued"}
    first = produce(lambda b: unique("k", **options).enqueue(b, value=1))
    assert produce(lambda b: unique("k", **options).enqueue(b, value=2)) == first
    assert payload_value(engine, first) == 1  # "ignore" (the default) changes nothing
    start(engine, first)
    second = produce(lambda b: unique("k", **options).enqueue(b, value=3))
    assert second != first
    assert produce(lambda b: unique("k", **options).enqueue(b, value=4)) == second
    assert jobs_with_key(engine, "k") == [first, second]


def test_scope_active_is_held_until_the_job_finishes(
    produce: Producer[Any], engine: Engine
) -> None:
    for ends in (OutcomeKind.SUCCEEDED, OutcomeKind.FAILED):
        key = f"k-{ends.value}"
        first = produce(lambda b, key=key: unique(key).enqueue(b, value=1))  # the default
        again = produce(lambda b, key=key: unique(key, unique_scope="active").enqueue(b, value=2))
        assert again == first
        claimed = start(engine, first)
        assert produce(lambda b, key=key: unique(key).enqueue(b, value=3)) == first
        finish(engine, first, claimed, ends)
        assert status_of(engine, first) == ends.value
        second = produce(lambda b, key=key: unique(key).enqueue(b, value=4))
        assert second != first
        assert jobs_with_key(engine, key) == [first, second]
        queue.cancel(engine, [second])  # out of the way of the next round's claim


def test_a_retried_holder_still_holds_its_key(produce: Producer[Any], engine: Engine) -> None:
    first = produce(lambda b: unique("k", unique_scope="queued").enqueue(b))
    claimed = start(engine, first)
    with engine.begin() as connection:
        complete(connection, claimed[0], first, claimed[1], OutcomeKind.RETRY, error={"m": 1})
    # Pending again: queued once more, it holds a "queued" key again.
    assert execution_row(engine, first).state == "pending"
    assert produce(lambda b: unique("k", unique_scope="queued").enqueue(b)) == first


def test_a_duration_scope_holds_the_key_that_long_after_the_job_finished(
    produce: Producer[Any], engine: Engine
) -> None:
    # Seconds with one bind kind, a timedelta with the other.
    hold: Any = 0.5 if produce.kind == "session" else dt.timedelta(milliseconds=500)  # type: ignore[attr-defined]
    first = produce(lambda b: unique("k", unique_scope=hold).enqueue(b))
    with engine.connect() as connection:
        key = connection.execute(select(KEYS).where(KEYS.c.key == "k")).one()
    assert (key.scope, key.hold_seconds, key.job_id) == ("finished", 0.5, first)
    claimed = start(engine, first)
    assert produce(lambda b: unique("k", unique_scope=hold).enqueue(b)) == first  # running
    finish(engine, first, claimed, OutcomeKind.SUCCEEDED)

    def enqueue_and_age(bind: Any) -> tuple[int, float]:
        # The database's clock, as the statement's: how long ago the holder finished.
        age = bind.execute(
            select(func.extract("epoch", func.now() - JOBS.c.finished_at)).where(JOBS.c.id == first)
        ).scalar_one()
        return unique("k", unique_scope=hold).enqueue(bind), float(age)

    again, age = produce(enqueue_and_age)
    assert age < 0.5, f"too slow to test: the holder finished {age:.2f}s ago"
    assert again == first

    def hold_passed() -> bool:
        with engine.connect() as connection:
            return bool(
                connection.execute(
                    select(func.now() > JOBS.c.finished_at + dt.timedelta(seconds=0.5)).where(
                        JOBS.c.id == first
                    )
                ).scalar_one()
            )

    wait_for(hold_passed, timeout=5, interval=0.05)
    second, age = produce(enqueue_and_age)
    assert age >= 0.5
    assert second != first
    assert jobs_with_key(engine, "k") == [first, second]


def test_a_cancelled_holder_frees_its_key_at_once(produce: Producer[Any], engine: Engine) -> None:
    for scope in ("queued", "active", 3600.0):
        key = f"k-{scope}"
        first = produce(lambda b, key=key, scope=scope: unique(key, unique_scope=scope).enqueue(b))
        assert produce(lambda b, first=first: queue.cancel(b, [first])) == {first: "cancelled"}
        second = produce(lambda b, key=key, scope=scope: unique(key, unique_scope=scope).enqueue(b))
        assert second != first
        assert status_of(engine, first) == "cancelled"


def test_keys_are_per_task(produce: Producer[Any], engine: Engine) -> None:
    a = produce(lambda b: echo.options(unique_key="same").enqueue(b))
    b_ = produce(lambda b: gated.options(unique_key="same").enqueue(b, name="x"))
    assert a != b_
    assert produce(lambda b: echo.options(unique_key="same").enqueue(b)) == a


# -- on_duplicate ---------------------------------------------------------------------------


def test_raise_writes_nothing_and_leaves_the_transaction_usable(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        holder = unique("k").enqueue(session, value="holder")
    for make in (lambda: Session(engine), engine.connect):
        with make() as bind:
            bind.begin()
            before = bind.execute(select(func.count()).select_from(JOBS)).scalar_one()
            plain = echo.enqueue(bind, value="before")
            with pytest.raises(DuplicateJobError) as caught:
                unique("k", on_duplicate="raise").enqueue(bind, value="dup")
            assert (caught.value.task, caught.value.key, caught.value.job_id) == (
                "echo",
                "k",
                holder,
            )
            # The transaction goes on: nothing of the refused call, the rest is kept.
            after = echo.enqueue(bind, value="after")
            count = bind.execute(select(func.count()).select_from(JOBS)).scalar_one()
            assert count == before + 2
            bind.commit()
        assert {payload_value(engine, plain), payload_value(engine, after)} == {"before", "after"}
    assert jobs_with_key(engine, "k") == [holder]
    assert payload_value(engine, holder) == "holder"
    with engine.connect() as connection:
        assert connection.execute(select(KEYS.c.job_id)).scalars().all() == [holder]


def test_raise_on_a_free_key_just_enqueues(produce: Producer[Any], engine: Engine) -> None:
    job_id = produce(lambda b: unique("k", on_duplicate="raise").enqueue(b))
    assert jobs_with_key(engine, "k") == [job_id]


def test_raise_for_a_key_refused_before_it_was_bound_leaves_the_key_free(engine: Engine) -> None:
    """A batch that raises on its own duplicate has locked nothing; one that raises on an
    existing holder has taken no key: a later enqueue takes them normally."""
    with Session(engine) as session, session.begin():
        holder = unique("held").enqueue(session)
    with Session(engine) as session, session.begin():
        with pytest.raises(DuplicateJobError) as caught:
            queue.enqueue_many(
                session,
                [
                    unique("free").call(value=1),
                    unique("held", on_duplicate="raise").call(value=2),
                ],
            )
        assert caught.value.job_id == holder
    with Session(engine) as session, session.begin():
        fresh = unique("free").enqueue(session)
    assert jobs_with_key(engine, "free") == [fresh]


def test_replace_gives_a_pending_holder_new_arguments_and_due_time(
    produce: Producer[Any], engine: Engine
) -> None:
    holder = produce(lambda b: unique("k").enqueue(b, value=1))
    due = execution_row(engine, holder).execute_at
    # Without run_at or delay the due time is kept.
    assert produce(lambda b: unique("k", on_duplicate="replace").enqueue(b, value=2)) == holder
    assert (payload_value(engine, holder), execution_row(engine, holder).execute_at) == (2, due)
    # A delay moves it (on the database clock), run_at too; the job row follows.
    assert (
        produce(lambda b: unique("k", on_duplicate="replace", delay=3600).enqueue(b, value=3))
        == holder
    )
    moved = execution_row(engine, holder).execute_at
    assert dt.timedelta(minutes=59) < moved - due < dt.timedelta(minutes=61)
    later = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert (
        produce(lambda b: unique("k", on_duplicate="replace", run_at=later).enqueue(b, value=4))
        == holder
    )
    assert execution_row(engine, holder).execute_at == later
    assert job_row(engine, holder).scheduled_at == later
    assert payload_value(engine, holder) == 4
    assert jobs_with_key(engine, "k") == [holder]


def test_replace_leaves_a_running_holder_alone(produce: Producer[Any], engine: Engine) -> None:
    holder = produce(lambda b: unique("k").enqueue(b, value=1))
    start(engine, holder)
    before = execution_row(engine, holder)
    assert (
        produce(lambda b: unique("k", on_duplicate="replace", delay=60).enqueue(b, value=2))
        == holder
    )
    after = execution_row(engine, holder)
    assert payload_value(engine, holder) == 1
    assert (after.state, after.execute_at, after.attempt) == (
        "running",
        before.execute_at,
        before.attempt,
    )


def test_replace_keeps_a_waiting_holders_place_behind_its_head(
    produce: Producer[Any], engine: Engine
) -> None:
    head = produce(lambda b: echo.options(queue_id="acct").enqueue(b, value="head"))
    holder = produce(lambda b: unique("k", queue_id="acct").enqueue(b, value=1))
    assert execution_row(engine, holder).state == "waiting"
    due = execution_row(engine, holder).execute_at
    assert (
        produce(
            lambda b: unique("k", queue_id="acct", on_duplicate="replace", delay=60).enqueue(
                b, value=2
            )
        )
        == holder
    )
    row = execution_row(engine, holder)
    assert (row.state, row.execute_at, payload_value(engine, holder)) == ("waiting", due, 2)
    assert head != holder


def test_options_are_checked_at_the_call(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(ValueError, match="need a unique_key"):
            echo.options(unique_scope="queued").enqueue(session)
        with pytest.raises(ValueError, match="need a unique_key"):
            echo.options(on_duplicate="raise").enqueue(session)
        with pytest.raises(ValueError, match="on_duplicate"):
            echo.options(unique_key="k", on_duplicate="merge")
        with pytest.raises(ValueError, match="unique_scope"):
            echo.options(unique_key="k", unique_scope="forever")
        assert session.execute(select(func.count()).select_from(JOBS)).scalar_one() == 0


# -- batches and by-name calls -----------------------------------------------------------


def test_enqueue_many_settles_duplicates_in_the_batch_and_against_holders(
    produce: Producer[Any], engine: Engine
) -> None:
    held = produce(lambda b: unique("held").enqueue(b, value="old"))
    ids = produce(
        lambda b: queue.enqueue_many(
            b,
            [
                echo.call(value="plain 0"),
                unique("a").call(value="a1"),
                unique("a", on_duplicate="replace").call(value="a2"),  # the later call wins
                echo.call(value="plain 1"),
                unique("held").call(value="ignored"),
                unique("held", on_duplicate="replace").call(value="new"),
                unique("b").call(value="b1"),
                unique("a").call(value="a3"),  # ignore: a2 stays
                gated.options(unique_key="a").call(name="other task, other key"),
            ],
        )
    )
    assert len(ids) == 9
    plain0, a, a_again, plain1, held1, held2, b_, a_third, other = ids
    assert a == a_again == a_third
    assert held1 == held2 == held
    assert len({plain0, a, plain1, held, b_, other}) == 6
    # Ids follow the input order for the jobs this batch wrote.
    assert plain0 < a < plain1 < b_ < other
    assert payload_value(engine, a) == "a2"
    assert payload_value(engine, held) == "new"
    assert [payload_value(engine, i) for i in (plain0, plain1, b_)] == ["plain 0", "plain 1", "b1"]
    assert jobs_with_key(engine, "a") == [a, other]
    with engine.connect() as connection:
        rows = connection.execute(select(KEYS.c.task, KEYS.c.key, KEYS.c.job_id)).all()
    assert {(task, key): job for task, key, job in rows} == {
        ("echo", "a"): a,
        ("echo", "b"): b_,
        ("echo", "held"): held,
        ("gated", "a"): other,
    }


def test_a_batch_duplicate_with_raise_writes_nothing(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        plain = echo.enqueue(session)
        with pytest.raises(DuplicateJobError) as caught:
            queue.enqueue_many(
                session,
                [echo.call(value=1), unique("k").call(), unique("k", on_duplicate="raise").call()],
            )
        assert caught.value.job_id is None
        assert session.execute(select(JOBS.c.id)).scalars().all() == [plain]
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(KEYS)).scalar_one() == 0


def test_by_name_enqueue_takes_the_same_options(produce: Producer[Any], engine: Engine) -> None:
    first = produce(lambda b: queue.enqueue(b, "echo", {"value": 1}, unique_key="k"))
    again = produce(
        lambda b: queue.enqueue(b, "echo", {"value": 2}, unique_key="k", on_duplicate="replace")
    )
    assert again == first
    assert payload_value(engine, first) == 2
    with pytest.raises(DuplicateJobError):
        produce(lambda b: queue.enqueue(b, "echo", {}, unique_key="k", on_duplicate="raise"))


def test_an_autocommit_connection_writes_a_unique_batch_whole(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        ids = queue.enqueue_many(connection, [unique("a").call(), unique("a").call()])
        assert ids[0] == ids[1]
        assert unique("a").enqueue(connection) == ids[0]
        with pytest.raises(DuplicateJobError):
            queue.enqueue_many(
                connection, [echo.call(value="lost"), unique("a", on_duplicate="raise").call()]
            )
    assert jobs_with_key(engine, "a") == ids[:1]
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(JOBS)).scalar_one() == 1


# -- the async faces ----------------------------------------------------------------------


async def test_async_session_and_connection_take_every_option(
    async_engine: AsyncEngine, engine: Engine
) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        first = await unique("k").enqueue(session, value=1)
        assert await unique("k").enqueue(session, value=2) == first
    async with async_engine.begin() as connection:
        assert await unique("k", on_duplicate="replace").enqueue(connection, value=3) == first
        with pytest.raises(DuplicateJobError):
            await unique("k", on_duplicate="raise").enqueue(connection)
        # Still usable after the refusal.
        ids = await queue.enqueue_many(
            connection, [unique("k").call(), unique("j").call(value="j"), echo.call()]
        )
        assert ids[0] == first
        assert await queue.enqueue(connection, "echo", {}, unique_key="j") == ids[1]
    assert payload_value(engine, first) == 3
    start(engine, first)
    async with AsyncSession(async_engine) as session, session.begin():
        # Scope "active": still held while it runs.
        assert await unique("k").enqueue(session) == first
        assert await queue.cancel(session, [first]) == {first: "requested"}
    assert jobs_with_key(engine, "k") == [first]


# -- races --------------------------------------------------------------------------------


def test_a_second_enqueuer_of_a_held_open_key_blocks(engine: Engine) -> None:
    with Session(engine) as holder, holder.begin():
        unique("k").enqueue(holder)
        with engine.connect() as other:
            other.execute(text("SET lock_timeout = '200ms'"))
            with pytest.raises(OperationalError) as caught:
                unique("k").enqueue(other)
            assert getattr(caught.value.orig, "sqlstate", None) == "55P03"  # lock_not_available
            other.rollback()
        # Another key is not blocked.
        with engine.connect() as other:
            other.execute(text("SET lock_timeout = '2s'"))
            unique("other").enqueue(other)
            other.commit()


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
@pytest.mark.parametrize("bind", ["session", "connection"])
def test_a_held_open_enqueue_decides_what_the_blocked_one_gets(
    engine: Engine, first_ends: str, bind: str
) -> None:
    holder = Session(engine) if bind == "session" else engine.connect()
    holder.begin()
    first = unique("k").enqueue(holder, value="first")
    got: list[int] = []
    errors: list[BaseException] = []
    pids: list[int] = []
    ready = threading.Event()

    def second() -> None:
        try:
            with engine.connect() as other:
                pids.append(backend_pid(other))
                ready.set()
                got.append(unique("k").enqueue(other, value="second"))
                other.commit()
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=second)
    thread.start()
    try:
        assert ready.wait(10)
        assert not errors, errors
        wait_until_blocked(engine, pids[0])
        assert not got  # it really waits for the open transaction
        if first_ends == "commit":
            holder.commit()
        else:
            holder.rollback()
    finally:
        holder.close()
        thread.join(10)
    assert not thread.is_alive()
    assert not errors, errors
    [taken] = got
    if first_ends == "commit":
        assert taken == first
        assert jobs_with_key(engine, "k") == [first]
        assert payload_value(engine, first) == "first"
    else:
        assert taken != first
        assert job_row(engine, first) is None
        assert jobs_with_key(engine, "k") == [taken]
        assert payload_value(engine, taken) == "second"


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
async def test_an_async_enqueuer_waits_for_a_held_open_key_too(
    engine: Engine, async_engine: AsyncEngine, first_ends: str
) -> None:
    holder = Session(engine)
    holder.begin()
    first = unique("k").enqueue(holder)
    async with AsyncSession(async_engine) as session:
        pid = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()

        async def second() -> int:
            job_id = await unique("k").enqueue(session)
            await session.commit()
            return job_id

        task = asyncio.ensure_future(second())
        try:
            await wait_until_blocked_async(async_engine, pid)
            assert not task.done()
            if first_ends == "commit":
                holder.commit()
            else:
                holder.rollback()
        finally:
            holder.close()
        taken = await asyncio.wait_for(task, 10)
    assert (taken == first) is (first_ends == "commit")
    assert jobs_with_key(engine, "k") == [taken]


def test_a_replace_waits_for_the_holders_open_transaction_and_then_applies(
    engine: Engine,
) -> None:
    holder = Session(engine)
    holder.begin()
    first = unique("k").enqueue(holder, value=1)
    got: list[int] = []
    with engine.connect() as other:
        pid = backend_pid(other)
        thread = threading.Thread(
            target=lambda: got.append(unique("k", on_duplicate="replace").enqueue(other, value=2))
        )
        thread.start()
        wait_until_blocked(engine, pid)
        holder.commit()
        holder.close()
        thread.join(10)
        other.commit()
    assert got == [first]
    assert payload_value(engine, first) == 2


# -- cost for tasks that do not use keys --------------------------------------------------


def _key_table_activity(bind: Any) -> tuple[int, int, int, int]:
    """This transaction's reads and writes of unique_keys (pg_stat_xact_user_tables)."""
    row = bind.execute(
        text(
            "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0), n_tup_ins, n_tup_upd "
            "FROM pg_stat_xact_user_tables WHERE schemaname = :schema AND relname = :name"
        ),
        {"schema": KEYS.schema, "name": KEYS.name},
    ).one()
    return tuple(int(v) for v in row)  # type: ignore[return-value]


def test_plain_enqueues_never_touch_the_unique_keys_table(engine: Engine) -> None:
    sent: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", capture)
    try:
        with Session(engine) as session, session.begin():
            echo.enqueue(session, value=1)
            echo.options(queue_id="q", delay=5).enqueue(session, value=2)
            queue.enqueue(session, "echo", {"value": 3})
            queue.enqueue_many(session, [echo.call(value=i) for i in range(3)])
            plain_sql = list(sent)
            assert _key_table_activity(session) == (0, 0, 0, 0)
            unique("k").enqueue(session)
            # The control: a unique enqueue does show up, in the statements and the counts.
            assert _key_table_activity(session)[2] == 1
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert plain_sql
    assert not [s for s in plain_sql if KEYS.name in s]
    assert [s for s in sent[len(plain_sql) :] if KEYS.name in s]


# -- with workers -------------------------------------------------------------------------


def test_scopes_against_a_running_sync_worker(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    run = gate("active")
    with SessionLocal.begin() as session:
        active = gated.options(unique_key="a").enqueue(session, name="active", value="a")
        queued = gated.options(unique_key="q", unique_scope="queued").enqueue(
            session, name="active", value="q"
        )
    worker = queue.worker(
        SessionLocal,
        tasks=["gated"],
        concurrency=4,
        poll_interval=0.05,
        install_signal_handlers=False,
    )
    with worker_thread(worker) as stats:
        wait_for(lambda: execution_row(engine, queued).state == "running", timeout=10)
        wait_for(lambda: execution_row(engine, active).state == "running", timeout=10)
        with SessionLocal.begin() as session:
            assert gated.options(unique_key="a").enqueue(session, name="active") == active
            queued_next = gated.options(unique_key="q", unique_scope="queued").enqueue(
                session, name="active", value="q2"
            )
            assert queued_next != queued
        run.open()
        wait_for(lambda: status_of(engine, active) == "succeeded", timeout=10)
        with SessionLocal.begin() as session:
            active_next = gated.options(unique_key="a").enqueue(session, name="active")
        assert active_next != active
        wait_for(
            lambda: (
                {status_of(engine, j) for j in (queued, queued_next, active_next)} == {"succeeded"}
            ),
            timeout=10,
        )
    assert stats[0].succeeded == 4


async def test_scopes_against_a_running_async_worker(
    AsyncSessionLocal: async_sessionmaker[AsyncSession], engine: Engine
) -> None:
    run = gate("async active")
    async with AsyncSessionLocal.begin() as session:
        active = await gated_async.options(unique_key="a", unique_scope=0.2).enqueue(
            session, name="async active", value="a"
        )
    worker = queue.async_worker(
        AsyncSessionLocal,
        tasks=["gated_async"],
        poll_interval=0.05,
        install_signal_handlers=False,
    )
    runner = asyncio.ensure_future(worker.run())
    try:
        for _ in range(500):
            if run.entered.is_set():
                break
            await asyncio.sleep(0.02)
        assert run.entered.is_set()
        async with AsyncSessionLocal.begin() as session:
            assert (
                await gated_async.options(unique_key="a", unique_scope=0.2).enqueue(
                    session, name="async active"
                )
                == active
            )
        run.open()
        for _ in range(500):
            if status_of(engine, active) == "succeeded":
                break
            await asyncio.sleep(0.02)
        # Held for 0.2 s after it finished (on the database clock), then free.
        for _ in range(500):
            async with AsyncSessionLocal.begin() as session:
                again = await gated_async.options(unique_key="a", unique_scope=0.2).enqueue(
                    session, name="async active"
                )
            if again != active:
                break
            await asyncio.sleep(0.05)
        assert again != active
    finally:
        worker.stop()
        stats = await asyncio.wait_for(runner, 30)
    assert stats.succeeded >= 1
    with engine.connect() as connection:
        accepted_at = connection.execute(
            select(JOBS.c.created_at).where(JOBS.c.id == again)
        ).scalar_one()
        first_finished = connection.execute(
            select(JOBS.c.finished_at).where(JOBS.c.id == active)
        ).scalar_one()
    # The new job was only accepted once the hold had passed, on the database's clock.
    assert accepted_at - first_finished >= dt.timedelta(seconds=0.2)


# -- requeue --------------------------------------------------------------------------------


def _failed(engine: Engine, job_id: int) -> None:
    finish(engine, job_id, start(engine, job_id), OutcomeKind.FAILED)


def _key_holder(engine: Engine, key: str) -> tuple[int | None, str, float | None]:
    with engine.connect() as connection:
        row = connection.execute(select(KEYS).where(KEYS.c.key == key)).one()
    return row.job_id, row.scope, row.hold_seconds


def _queued_with_key(engine: Engine, key: str) -> list[int]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                select(JOBS.c.id)
                .where(JOBS.c.unique_key == key, JOBS.c.status == "queued")
                .order_by(JOBS.c.id)
            ).scalars()
        )


@pytest.mark.parametrize("ended", ["failed", "cancelled"])
def test_a_requeue_leaves_a_job_alone_while_another_holds_its_key(
    produce: Producer[Any], engine: Engine, ended: str
) -> None:
    first = produce(lambda b: unique("k").enqueue(b, value=1))
    if ended == "failed":
        _failed(engine, first)
    else:
        assert queue.cancel(engine, [first]) == {first: "cancelled"}
    second = produce(lambda b: unique("k").enqueue(b, value=2))
    assert second != first
    report = produce(lambda b: queue.requeue(b, [first]))
    assert report == []
    assert report.refused == {first: f"its unique key 'k' is held by job {second}"}
    assert report.held_by == {first: second}
    # Left as it was: one queued job holds the key.
    assert status_of(engine, first) == ended
    assert _queued_with_key(engine, "k") == [second]
    assert _key_holder(engine, "k")[0] == second


def test_a_requeued_job_takes_its_free_key_back_with_its_scope(
    produce: Producer[Any], engine: Engine
) -> None:
    first = produce(lambda b: unique("k", unique_scope="queued").enqueue(b))
    _failed(engine, first)
    report = produce(lambda b: queue.requeue(b, [first]))
    assert (report, report.refused, report.requeued) == ([first], {}, [first])
    assert _key_holder(engine, "k") == (first, "queued", None)
    # It holds the key again: an enqueue of the key answers it.
    assert produce(lambda b: unique("k", unique_scope="queued").enqueue(b)) == first
    assert _queued_with_key(engine, "k") == [first]


def test_a_job_still_holding_its_own_key_after_it_failed_is_requeued(
    produce: Producer[Any], engine: Engine
) -> None:
    # Scope "an hour after it finished": the failed job itself holds the key.
    first = produce(lambda b: unique("k", unique_scope=3600.0).enqueue(b))
    _failed(engine, first)
    assert produce(lambda b: unique("k", unique_scope=3600.0).enqueue(b)) == first
    assert produce(lambda b: queue.requeue(b, [first])) == [first]
    assert _key_holder(engine, "k") == (first, "finished", 3600.0)


def test_one_requeue_of_two_jobs_of_one_key_puts_back_one(
    produce: Producer[Any], engine: Engine
) -> None:
    first = produce(lambda b: unique("k").enqueue(b, value=1))
    _failed(engine, first)
    second = produce(lambda b: unique("k").enqueue(b, value=2))
    _failed(engine, second)
    plain = produce(lambda b: echo.enqueue(b, value=3))
    assert queue.cancel(engine, [plain]) == {plain: "cancelled"}
    report = produce(lambda b: queue.requeue(b, [second, plain, first]))
    assert report == [first, plain]
    assert report.held_by == {second: first}
    assert _queued_with_key(engine, "k") == [first]
    assert status_of(engine, second) == "failed"


def test_an_enqueue_waits_for_a_requeue_that_took_the_key(engine: Engine) -> None:
    first = unique_committed(engine)
    _failed(engine, first)
    with Session(engine) as requeuer, requeuer.begin():
        assert queue.requeue(requeuer, [first]) == [first]
        with engine.connect() as other:
            other.execute(text("SET lock_timeout = '200ms'"))
            with pytest.raises(OperationalError) as caught:
                unique("k").enqueue(other)
            assert getattr(caught.value.orig, "sqlstate", None) == "55P03"
            other.rollback()
    with Session(engine) as session, session.begin():
        assert unique("k").enqueue(session) == first
    assert _queued_with_key(engine, "k") == [first]


def unique_committed(engine: Engine) -> int:
    with Session(engine) as session, session.begin():
        job_id: int = unique("k").enqueue(session)
    return job_id


async def test_an_async_requeue_reports_a_held_key(
    async_engine: AsyncEngine, engine: Engine
) -> None:
    first = unique_committed(engine)
    _failed(engine, first)
    second = unique_committed(engine)
    async with AsyncSession(async_engine) as session, session.begin():
        report = await queue.requeue(session, [first])
    assert (report, report.held_by) == ([], {first: second})
    async with async_engine.begin() as connection:
        assert await queue.cancel(connection, [second]) == {second: "cancelled"}
        assert await queue.requeue(connection, [first]) == [first]
    assert _queued_with_key(engine, "k") == [first]
