"""Bounded tasks (``max_pending``) against real PostgreSQL.

The queue under test is :mod:`tests.support.bounded` (its own schema, created per test):
``capped`` holds at most 3 pending jobs, ``other_capped`` 2, ``free`` is unbounded. Room
is freed from another connection by cancelling a queued job (``queue.cancel`` commits on
its own connection), or by a real worker. Races hold one enqueuer's transaction open and
prove the other one waits by finding its backend waiting on a lock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, create_engine, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.conversation import Wait as Sleep
from sqla_queue.conversation import run_flow
from sqla_queue.errors import IsolationLevelError, QueueFull
from sqla_queue.statements.bounded import pending_count_statement
from tests.support import bounded as bq
from tests.support.lifecycle import backend_pid, wait_until_blocked
from tests.support.plans import captured_statements, explain_prepared, scans
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

T = TypeVar("T")
queue = bq.queue
EX = bq.EX
JOBS = bq.JOBS


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on this test's database, with the bounded queue's tables created."""
    eng = create_engine(db_url, pool_size=4, max_overflow=4)
    with eng.begin() as connection:
        bq.create(connection)
    yield eng
    eng.dispose()


@pytest.fixture(params=["session", "connection"])
def produce(request: pytest.FixtureRequest, engine: Engine) -> Callable[[Callable[[Any], T]], T]:
    """Each sync test runs once with a Session and once with a Connection."""

    def run(fn: Callable[[Any], T]) -> T:
        if request.param == "session":
            with Session(engine) as session, session.begin():
                return fn(session)
        with engine.begin() as connection:
            return fn(connection)

    return run


def pending(engine: Engine, task: str = "capped") -> int:
    with engine.connect() as connection:
        return bq.pending(connection, task)


def job_ids(engine: Engine, task: str = "capped") -> list[int]:
    with engine.connect() as connection:
        query = select(JOBS.c.id).where(JOBS.c.task == task).order_by(JOBS.c.id)
        return list(connection.execute(query).scalars())


def fill(engine: Engine, count: int = bq.CAPPED) -> list[int]:
    with Session(engine) as session, session.begin():
        return [bq.capped.enqueue(session, n) for n in range(count)]


def advisory_locks(engine: Engine, pid: int) -> list[tuple[str, bool]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT mode, granted FROM pg_locks WHERE locktype = 'advisory' AND pid = :pid"),
            {"pid": pid},
        )
        return [(row.mode, row.granted) for row in rows]


def waiting_for_room(engine: Engine, pid: int) -> bool:
    """Whether backend ``pid`` is a bounded enqueue waiting for room: it holds its task's
    enqueue lock, and sits idle in its transaction after counting the pending jobs (the
    count is the statement that reads ``transaction_isolation``), between two counts."""
    with engine.connect() as connection:
        row = connection.execute(
            text("SELECT state, query FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).one_or_none()
    return (
        row is not None
        and row.state == "idle in transaction"
        and "transaction_isolation" in row.query
        and advisory_locks(engine, pid) == [("ExclusiveLock", True)]
    )


def wait_until_waiting_for_room(engine: Engine, pids: list[int]) -> None:
    """Wait until the enqueue whose backend ``pids`` names (once it has one) waits for room."""
    wait_for(lambda: bool(pids) and waiting_for_room(engine, pids[0]), timeout=10, interval=0.02)


class Background:
    """Run ``fn`` in a thread; ``result()`` returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.elapsed = -1.0

        def target() -> None:
            try:
                self.value = fn()
            except BaseException as exc:
                self.error = exc
            self.elapsed = time.monotonic() - self.started

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 20.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the background call did not return"
        if self.error is not None:
            raise self.error
        return self.value


# -- the bound -----------------------------------------------------------------------------


def test_an_enqueue_past_the_bound_raises_and_the_transaction_goes_on(
    engine: Engine, produce: Any
) -> None:
    first = produce(lambda s: [bq.capped.enqueue(s, n) for n in range(bq.CAPPED)])
    assert pending(engine) == bq.CAPPED

    def over(bind: Any) -> tuple[QueueFull, int, list[int]]:
        with pytest.raises(QueueFull) as raised:
            bq.capped.enqueue(bind, 99)
        with pytest.raises(QueueFull):
            queue.enqueue(bind, "capped", {"n": 98})
        # No statement failed: the same transaction writes on, and commits.
        later = bq.free.enqueue(bind, 1)
        mine = bind.execute(text("SELECT 41 + 1")).scalar_one()
        return raised.value, later, [mine]

    error, later, mine = produce(over)
    assert (error.task, error.max_pending, error.pending, error.requested) == ("capped", 3, 3, 1)
    assert error.waited == 0.0
    assert "task 'capped' is full (max_pending=3)" in str(error)
    assert "wait_if_full" in str(error)
    assert mine == [42]
    assert job_ids(engine) == first
    assert job_ids(engine, "free") == [later]


def test_enqueue_many_counts_each_row_of_the_call(engine: Engine, produce: Any) -> None:
    produce(lambda s: bq.capped.enqueue(s, 0))
    three = [bq.capped.call(n) for n in range(3)]
    with pytest.raises(QueueFull) as raised:
        produce(lambda s: queue.enqueue_many(s, [bq.free.call(7), *three]))
    assert (raised.value.pending, raised.value.requested) == (1, 3)
    assert job_ids(engine, "free") == []  # the whole batch was refused
    ids = produce(lambda s: queue.enqueue_many(s, [bq.free.call(7), *three[:2]]))
    assert len(ids) == 3
    assert pending(engine) == bq.CAPPED
    with pytest.raises(QueueFull, match="more than the bound itself"):
        produce(lambda s: queue.enqueue_many(s, [bq.capped.call(n) for n in range(4)]))


def test_a_call_that_bounds_two_tasks_checks_both(engine: Engine, produce: Any) -> None:
    produce(lambda s: [bq.other_capped.enqueue(s, n) for n in range(2)])
    with pytest.raises(QueueFull) as raised:
        produce(lambda s: queue.enqueue_many(s, [bq.capped.call(1), bq.other_capped.call(2)]))
    assert raised.value.task == "other_capped"
    assert pending(engine) == 0
    assert len(produce(lambda s: queue.enqueue_many(s, [bq.capped.call(n) for n in range(3)]))) == 3


def test_jobs_waiting_behind_a_queue_id_count_as_pending(engine: Engine) -> None:
    keyed = bq.capped.options(queue_id="account-1")
    with Session(engine) as session, session.begin():
        ids = [keyed.enqueue(session, n) for n in range(3)]
    with engine.connect() as connection:
        states = connection.execute(select(EX.c.state).where(EX.c.id.in_(ids))).scalars()
        assert sorted(states) == ["pending", "waiting", "waiting"]
    with Session(engine) as session, session.begin(), pytest.raises(QueueFull):
        bq.capped.enqueue(session, 4)


def test_running_jobs_do_not_count(engine: Engine) -> None:
    ids = fill(engine)
    with engine.begin() as connection:
        connection.execute(EX.update().where(EX.c.id == ids[0]).values(state="running"))
    with Session(engine) as session, session.begin():
        assert bq.capped.enqueue(session, 9) > ids[-1]
    assert pending(engine) == bq.CAPPED


def test_a_rolled_back_enqueue_takes_no_room(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        bq.capped.enqueue(session, 0)
        bq.capped.enqueue(session, 1)
        session.rollback()
    assert len(fill(engine)) == bq.CAPPED


# -- waiting for room ----------------------------------------------------------------------


def test_a_waiting_enqueue_succeeds_once_another_connection_frees_room(engine: Engine) -> None:
    ids = fill(engine)
    pids: list[int] = []

    def enqueue() -> int:
        with Session(engine) as session, session.begin():
            pids.append(backend_pid(session))
            return bq.capped.options(wait_if_full=15).enqueue(session, 99)

    call = Background(enqueue)
    wait_until_waiting_for_room(engine, pids)
    waited = time.monotonic() - call.started
    assert call.thread.is_alive()  # still waiting: nothing freed room yet
    assert pending(engine) == bq.CAPPED  # and it wrote nothing
    assert queue.cancel(engine, [ids[0]]) == {ids[0]: "cancelled"}
    new_id = call.result()
    assert waited <= call.elapsed < 5.0
    assert new_id > ids[-1]
    assert pending(engine) == bq.CAPPED


def test_a_waiting_enqueue_succeeds_once_a_worker_frees_room(engine: Engine) -> None:
    fill(engine)

    pids: list[int] = []

    def enqueue() -> int:
        with Session(engine) as session, session.begin():
            pids.append(backend_pid(session))
            return bq.capped.options(wait_if_full=20).enqueue(session, 99)

    call = Background(enqueue)
    wait_until_waiting_for_room(engine, pids)
    assert call.thread.is_alive()
    worker = queue.worker(sessionmaker(engine), tasks=["capped"], poll_interval=0.1)
    with worker_thread(worker):
        call.result(30)
        wait_for(lambda: pending(engine) == 0, timeout=20)
    assert len(job_ids(engine)) == bq.CAPPED + 1


def test_a_waiting_enqueue_raises_after_its_timeout(engine: Engine, produce: Any) -> None:
    fill(engine)
    began = time.monotonic()
    with pytest.raises(QueueFull) as raised:
        produce(lambda s: bq.capped.options(wait_if_full=0.6).enqueue(s, 99))
    elapsed = time.monotonic() - began
    assert 0.6 <= raised.value.waited <= elapsed < 3.0
    assert "wait_if_full=0.6" in str(raised.value)
    assert len(job_ids(engine)) == bq.CAPPED


async def test_the_async_session_path_raises_waits_and_lets_the_loop_run(db_url: str) -> None:
    sync = create_engine(db_url)
    with sync.begin() as connection:
        bq.create(connection)
    ids = fill(sync)
    engine = create_async_engine(db_url, pool_size=3)
    try:
        async with AsyncSession(engine) as session, session.begin():
            with pytest.raises(QueueFull):
                await bq.capped.enqueue(session, 9)
            free_id = await bq.free.enqueue(session, 1)
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        async def waiting() -> int:
            async with AsyncSession(engine) as session, session.begin():
                return await bq.capped.options(wait_if_full=15).enqueue(session, 99)

        async def free_room() -> None:
            await asyncio.sleep(0.5)
            # cancel on its own sync connection, from a thread: the loop stays free
            await asyncio.to_thread(queue.cancel, sync, [ids[0]])

        tick_task = asyncio.create_task(ticker())
        began = time.monotonic()
        new_id, _ = await asyncio.gather(waiting(), free_room())
        elapsed = time.monotonic() - began
        stop.set()
        await tick_task
        # The wait slept with asyncio.sleep: the ticker ran all along.
        assert elapsed >= 0.5
        assert ticks >= 20
        assert new_id > free_id
        async with AsyncSession(engine) as session, session.begin():
            with pytest.raises(QueueFull) as raised:
                await bq.capped.options(wait_if_full=0.3).enqueue(session, 100)
        assert raised.value.waited >= 0.3
    finally:
        await engine.dispose()
    assert pending(sync) == bq.CAPPED
    sync.dispose()


# -- exactness: the race, forced -----------------------------------------------------------


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_second_enqueuer_waits_for_the_first_to_end_then_counts_its_rows(
    engine: Engine, first_commits: bool
) -> None:
    fill(engine, bq.CAPPED - 1)
    with Session(engine) as first:
        first.begin()
        last_slot = bq.capped.enqueue(first, 1)
        # Both counts would read 2 pending in a snapshot: only the lock stops the second.

        def second() -> int:
            with Session(engine) as session, session.begin():
                session.info["pid"] = backend_pid(session)
                pids.append(session.info["pid"])
                return bq.capped.enqueue(session, 2)

        pids: list[int] = []
        call = Background(second)
        wait_for(lambda: bool(pids), timeout=10)
        wait_until_blocked(engine, pids[0])
        assert advisory_locks(engine, pids[0]) == [("ExclusiveLock", False)]
        assert call.thread.is_alive()
        if first_commits:
            first.commit()
        else:
            first.rollback()
    if first_commits:
        with pytest.raises(QueueFull) as raised:
            call.result()
        assert raised.value.pending == bq.CAPPED
        assert last_slot in job_ids(engine)
    else:
        assert call.result() not in (None, last_slot)
    assert pending(engine) == bq.CAPPED


def test_an_autocommit_connection_enqueues_in_a_transaction_of_its_own(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        ids = queue.enqueue_many(connection, [bq.capped.call(n) for n in range(3)])
        with pytest.raises(QueueFull):
            bq.capped.enqueue(connection, 4)
        # The lock ended with the call's own transaction.
        assert advisory_locks(engine, backend_pid(connection)) == []
    assert job_ids(engine) == ids


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_snapshot_older_than_the_lock_is_refused(engine: Engine, level: str) -> None:
    with engine.connect().execution_options(isolation_level=level) as connection:
        with connection.begin(), pytest.raises(IsolationLevelError, match=level):
            bq.capped.enqueue(connection, 1)
        with connection.begin():
            assert bq.free.enqueue(connection, 1) > 0
    assert job_ids(engine) == []


# -- unbounded tasks pay nothing -----------------------------------------------------------


def test_an_unbounded_enqueue_sends_one_statement_and_takes_no_advisory_lock(
    engine: Engine,
) -> None:
    with captured_statements(engine) as seen, Session(engine) as session, session.begin():
        pid = backend_pid(session)
        seen.clear()
        bq.free.enqueue(session, 1)
        queue.enqueue_many(session, [bq.free.call(2), bq.free.call(3)])
        plain = [sql for sql, _ in seen]
        # Held open: another connection sees no advisory lock of this transaction.
        assert advisory_locks(engine, pid) == []
        seen.clear()
        bq.capped.enqueue(session, 1)
        bounded = [sql for sql, _ in seen]
        assert advisory_locks(engine, pid) == [("ExclusiveLock", True)]
    assert len(plain) == 2
    assert all(sql.startswith("WITH new_jobs AS") for sql in plain)
    assert "advisory" not in " ".join(plain)
    # The same check fails for a bounded task: lock, count, then the same insert.
    assert len(bounded) == 3
    assert "pg_advisory_xact_lock" in bounded[0]
    assert bounded[2] == plain[1]


def test_wait_if_full_on_an_unbounded_task_changes_nothing(engine: Engine) -> None:
    with captured_statements(engine) as seen, Session(engine) as session, session.begin():
        bq.free.options(wait_if_full=30).enqueue(session, 1)
    assert [sql[:16] for sql, _ in seen if "new_jobs" in sql] == ["WITH new_jobs AS"]
    assert not [sql for sql, _ in seen if "advisory" in sql or "current_setting" in sql]


# -- unique jobs ---------------------------------------------------------------------------


def test_a_held_unique_key_answers_its_holder_even_when_the_task_is_full(engine: Engine) -> None:
    keyed = bq.capped.options(unique_key="report-7")
    with Session(engine) as session, session.begin():
        holder = keyed.enqueue(session, 1)
        bq.capped.enqueue(session, 2)
        bq.capped.enqueue(session, 3)
    with Session(engine) as session, session.begin():
        # Full, but this call writes nothing: the key's holder answers.
        assert keyed.enqueue(session, 9) == holder
        with pytest.raises(QueueFull):
            bq.capped.options(unique_key="report-8").enqueue(session, 9)
    assert len(job_ids(engine)) == bq.CAPPED


def test_a_unique_batch_needs_room_only_for_the_jobs_it_writes(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        holder = bq.capped.options(unique_key="a").enqueue(session, 0)
        bq.capped.enqueue(session, 0)
    batch = [
        bq.capped.options(unique_key="a").call(1),  # held: writes nothing
        bq.capped.options(unique_key="b").call(2),  # writes
        bq.capped.options(unique_key="b").call(3),  # the same key within the batch
    ]
    with Session(engine) as session, session.begin():
        ids = queue.enqueue_many(session, batch)
    assert ids[0] == holder and ids[1] == ids[2] != holder
    assert pending(engine) == bq.CAPPED
    with Session(engine) as session, session.begin(), pytest.raises(QueueFull):
        queue.enqueue_many(session, [bq.capped.options(unique_key="c").call(1)])
    # The refused key was not taken: once there is room, it is free.
    queue.cancel(engine, [holder])
    with Session(engine) as session, session.begin():
        assert bq.capped.options(unique_key="c").enqueue(session, 1) > ids[1]


def test_a_waiting_unique_enqueue_holds_its_key_and_then_writes(engine: Engine) -> None:
    ids = fill(engine)
    pids: list[int] = []

    def enqueue() -> int:
        with Session(engine) as session, session.begin():
            pids.append(backend_pid(session))
            spec = bq.capped.options(unique_key="k", wait_if_full=15)
            return spec.enqueue(session, 1)

    call = Background(enqueue)
    # It is waiting for room (the task's lock held, between two counts), having written
    # nothing yet.
    wait_until_waiting_for_room(engine, pids)
    assert call.thread.is_alive()
    assert pending(engine) == bq.CAPPED
    queue.cancel(engine, [ids[0]])
    new_id = call.result()
    with Session(engine) as session, session.begin():
        assert bq.capped.options(unique_key="k").enqueue(session, 2) == new_id


# -- the count's plan ----------------------------------------------------------------------


@pytest.mark.parametrize("generic", [True, False])
def test_the_count_walks_only_the_task_indexes_whatever_the_backlog(
    engine: Engine, generic: bool
) -> None:
    """Analyzed empty, then a burst: 30,000 rows of another task, 5,000 of this one."""
    table = f"{bq.SCHEMA}.{queue.tables.prefix}job_executions"
    with engine.begin() as connection:
        connection.execute(text(f"ANALYZE {table}"))
        now = dt.datetime.now(dt.UTC)
        rows = [
            {"id": n, "task": task, "priority": 0, "state": state, "execute_at": now}
            for n, task, state in backlog()
        ]
        connection.execute(insert(EX), rows)
    sql = str(pending_count_statement(queue.tables).compile(dialect=engine.dialect))
    with engine.connect() as connection, connection.begin():
        plan = explain_prepared(
            connection, sql, {"task": "capped", "cap": 1000}, generic=generic, analyze=True
        )
        counted = connection.execute(
            pending_count_statement(queue.tables), {"task": "capped", "cap": 1000}
        ).one()
        connection.rollback()
    used = {index for _, _, index in scans(plan)}
    kinds = {kind for kind, _, _ in scans(plan)}
    prefix = f"{queue.tables.prefix}job_executions"
    assert used == {f"{prefix}_task_claim_ix", f"{prefix}_seated_ix", f"{prefix}_task_waiting_ix"}
    assert kinds <= {"Index Only Scan", "Index Scan"}, kinds
    assert counted.pending == 2000  # 1000 pending + 1000 waiting: each walk stops at the cap
    assert walked(plan["Plan"]) <= 3 * 1000


def backlog() -> Iterator[tuple[int, str, str]]:
    n = 0
    for task, state, count in (
        ("free", "pending", 30_000),
        ("capped", "pending", 2_500),
        ("capped", "waiting", 2_500),
        ("capped", "running", 50),
    ):
        for _ in range(count):
            n += 1
            yield n, task, state


def walked(node: dict[str, Any]) -> int:
    """The rows every scan node of a plan produced, all loops together."""
    own = 0
    if "Relation Name" in node:
        own = int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
        own += int(node.get("Rows Removed by Filter", 0))
    return own + sum(walked(child) for child in node.get("Plans", ()))


# -- the flow protocol's Sleep -------------------------------------------------------------


def sleepy_flow() -> Any:
    first = yield select(text("1")), {}
    rest = yield Sleep(0.25)
    last = yield select(text("2")), {}
    return [first[0][0], list(rest), last[0][0]]


def test_run_flow_sleeps_between_statements_on_a_sync_bind(engine: Engine) -> None:
    with engine.begin() as connection:
        began = time.monotonic()
        assert run_flow(connection, sleepy_flow()) == [1, [], 2]
    assert time.monotonic() - began >= 0.25


async def test_run_flow_awaits_its_sleep_on_an_async_bind(db_url: str) -> None:
    engine = create_async_engine(db_url, pool_size=1)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        for _ in range(10):
            ticks += 1
            await asyncio.sleep(0.01)

    try:
        async with engine.begin() as connection:
            began = time.monotonic()
            result, _ = await asyncio.gather(run_flow(connection, sleepy_flow()), ticker())
            assert result == [1, [], 2]
    finally:
        await engine.dispose()
    assert time.monotonic() - began >= 0.25
    assert ticks == 10
